//! `/mcp`: the admin API for coding agents, over the Model Context Protocol (Streamable
//! HTTP transport, served by the official SDK, `rmcp`).
//!
//! Each tool is one admin API request: the tool's arguments fill in the path, the query
//! and the body, and its result is the API's JSON answer (a refusal's JSON with
//! `isError`). So an agent sees exactly what `/v1/*` answers, and one implementation
//! serves both. `/mcp` itself meets the port's rules first (the Host and Origin checks,
//! the bearer token); the tools that change something are listed, and run, only when
//! `admin.mcp` is `read_write`. Arguments the tool does not take, a missing one, a
//! changing tool under `read_only` and an unknown tool are the protocol's errors.
//!
//! The transport runs stateless (no session kept between requests) with JSON answers, so
//! `/mcp` holds nothing once a request is answered.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};

use super::keys::Caller;
use crate::body::ProxyBody;
use crate::cli::api::path_segment;
use crate::response::AdminRefusal;
use crate::store::log::LogId;

/// The largest JSON-RPC message `/mcp` reads: tool arguments are a few names and values.
pub(super) const REQUEST_BODY_MAX: u64 = 64 * 1024;

/// How long a tool's request may take: every one reads a page or changes a key.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin API as the tools call it: a request answered inside the process as the
/// port answers one that met its rules. Boxed, because `/mcp`'s own answer is inside
/// the port's answer, and a future that holds itself needs a box to have a size.
pub(super) trait Api: Send + Sync + 'static {
    fn answer(&self, request: Request<Bytes>) -> BoxFuture<'_, Response<ProxyBody>>;
}

/// Serves one request to `/mcp` (the port's rules met, its body read whole within
/// bounds, its [`Caller`] named); `writes` offers the tools that change keys.
pub(super) async fn serve(
    api: Arc<dyn Api>,
    writes: bool,
    request: Request<Bytes>,
) -> Response<ProxyBody> {
    let caller = request.extensions().get::<Caller>().cloned();
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(REQUEST_BODY_MAX as usize)
        // The port's own rules checked Host and Origin, with `admin.hosts`.
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_sse_keep_alive(None);
    let server = McpServer {
        api,
        writes,
        caller,
    };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    service
        .handle(request.map(Full::new))
        .await
        .map(|body| body.map_err(|never: Infallible| match never {}).boxed())
}

/// The MCP server of one `/mcp` request.
#[derive(Clone)]
struct McpServer {
    api: Arc<dyn Api>,
    writes: bool,
    /// Who sent the request, named in the log of what its tools change.
    caller: Option<Caller>,
}

/// One argument of a tool.
struct Argument {
    name: &'static str,
    /// Its JSON Schema type.
    kind: &'static str,
    description: &'static str,
    required: bool,
}

/// A tool: what it is called, says and takes, and the API request it makes.
struct ToolSpec {
    name: &'static str,
    description: &'static str,
    /// Changes nothing; offered whatever `admin.mcp` says (unless `off`).
    read_only: bool,
    /// A second call with the same arguments changes nothing more.
    idempotent: bool,
    arguments: &'static [Argument],
    api_call: fn(&Map<String, Value>) -> Result<ApiCall, String>,
}

/// An admin API request a tool makes.
struct ApiCall {
    method: Method,
    path_and_query: String,
    body: Option<Value>,
}

impl ApiCall {
    fn get(path_and_query: String) -> ApiCall {
        ApiCall {
            method: Method::GET,
            path_and_query,
            body: None,
        }
    }
}

const fn argument(
    name: &'static str,
    kind: &'static str,
    description: &'static str,
    required: bool,
) -> Argument {
    Argument {
        name,
        kind,
        description,
        required,
    }
}

const ROUTE: Argument = argument("route", "string", "The route's name.", true);
const KEY: Argument = argument(
    "key",
    "string",
    "The event's key, as the route extracts it (without the route's namespace).",
    true,
);

/// Every tool, in the order `tools/list` gives them. The limits in the descriptions are
/// the API's (a test holds them to it).
const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "list_routes",
        description: "The proxy's routes with their resolved settings (secrets masked): each route's name is what the key tools take.",
        read_only: true,
        idempotent: true,
        arguments: &[],
        api_call: |_| Ok(ApiCall::get("/v1/routes".into())),
    },
    ToolSpec {
        name: "list_keys",
        description: "A page of a route's live keys (in flight, done or held), with each key's state, times and the app's recorded status; pass `next` back as `after` for the next page. The embedded store lists keys in flight and held only.",
        read_only: true,
        idempotent: true,
        arguments: &[
            ROUTE,
            argument(
                "state",
                "string",
                "Only keys in this state: in_flight, done or held.",
                false,
            ),
            argument(
                "limit",
                "integer",
                "Keys in the page, 1 to 1000 (100 if left out).",
                false,
            ),
            argument(
                "after",
                "string",
                "The `next` cursor of the page before.",
                false,
            ),
        ],
        api_call: |arguments| {
            let query = query(arguments, &["route", "state", "limit", "after"])?;
            Ok(ApiCall::get(format!("/v1/keys?{query}")))
        },
    },
    ToolSpec {
        name: "get_key",
        description: "One key of a route: its state (in_flight, done, held), when it was claimed, finished or held and why, when it expires, and the answer it recorded for duplicates.",
        read_only: true,
        idempotent: true,
        arguments: &[ROUTE, KEY],
        api_call: |arguments| Ok(ApiCall::get(key_path(arguments, "")?)),
    },
    ToolSpec {
        name: "list_deliveries",
        description: "The delivery log, newest first: every request a route took, with its outcome, the app's status and latency. Filters combine; pass `next` back as `cursor` with the same filters.",
        read_only: true,
        idempotent: true,
        arguments: &[
            argument("route", "string", "Only this route's deliveries.", false),
            argument("key", "string", "Only deliveries of this key.", false),
            argument(
                "key_prefix",
                "string",
                "Only deliveries whose key starts with this.",
                false,
            ),
            argument(
                "outcome",
                "string",
                "Only these outcomes, comma-separated: forwarded, duplicate, in_flight, held, stale, queued, upstream_error, store_error, unkeyed, signature_refused, bad_request, unmatched, delivered, retrying, dead, changed; or waited, replayed.",
                false,
            ),
            argument(
                "status",
                "string",
                "The proxy's answer: a status (409) or a class (4xx).",
                false,
            ),
            argument(
                "upstream_status",
                "string",
                "The app's answer: a status or a class (5xx).",
                false,
            ),
            argument(
                "since",
                "string",
                "Only deliveries at or after this RFC 3339 time.",
                false,
            ),
            argument(
                "until",
                "string",
                "Only deliveries before this RFC 3339 time.",
                false,
            ),
            argument(
                "limit",
                "integer",
                "Entries in the page, 1 to 500 (50 if left out).",
                false,
            ),
            argument(
                "cursor",
                "string",
                "The `next` cursor of the page before.",
                false,
            ),
        ],
        api_call: |arguments| {
            let names = [
                "route",
                "key",
                "key_prefix",
                "outcome",
                "status",
                "upstream_status",
                "since",
                "until",
                "limit",
                "cursor",
            ];
            let query = query(arguments, &names)?;
            Ok(ApiCall::get(format!("/v1/deliveries?{query}")))
        },
    },
    ToolSpec {
        name: "get_delivery",
        description: "One delivery log entry whole, with the headers and body its route records (if any).",
        read_only: true,
        idempotent: true,
        arguments: &[argument(
            "id",
            "string",
            "The entry's id, as list_deliveries gives it.",
            true,
        )],
        api_call: |arguments| {
            let id = required_string(arguments, "id")?;
            // Only an id: `tail` would name the endless live tail.
            let id: LogId = id
                .parse()
                .map_err(|_| format!("`{id}` is not a delivery's id"))?;
            Ok(ApiCall::get(format!("/v1/deliveries/{id}")))
        },
    },
    ToolSpec {
        name: "forget_key",
        description: "Forgets a done key, so that the next delivery of that event is forwarded to the app again (its work runs again). Refused for a key in flight or held.",
        read_only: false,
        idempotent: true,
        arguments: &[ROUTE, KEY],
        api_call: |arguments| {
            Ok(ApiCall {
                method: Method::DELETE,
                path_and_query: key_path(arguments, "")?,
                body: None,
            })
        },
    },
    ToolSpec {
        name: "set_key_expiry",
        description: "Moves a done key's expiry, sooner or later (give expires_at or expires_in): until then its deliveries are duplicates, after it the next one is forwarded again. Refused for a key in flight or held.",
        read_only: false,
        idempotent: false,
        arguments: &[
            ROUTE,
            KEY,
            argument(
                "expires_at",
                "string",
                "The new expiry, an RFC 3339 time in the future.",
                false,
            ),
            argument(
                "expires_in",
                "string",
                "The new expiry from now, as a duration like 48h.",
                false,
            ),
        ],
        api_call: |arguments| {
            let mut body = Map::new();
            for name in ["expires_at", "expires_in"] {
                if let Some(value) = arguments.get(name) {
                    body.insert(name.into(), value.clone());
                }
            }
            Ok(ApiCall {
                method: Method::PATCH,
                path_and_query: key_path(arguments, "")?,
                body: Some(Value::Object(body)),
            })
        },
    },
    ToolSpec {
        name: "resolve_key",
        description: "Resolves a held key (one whose forward may or may not have run): `done` if the work happened (duplicates get the duplicate answer), `release` if it did not (the next delivery runs it).",
        read_only: false,
        idempotent: true,
        arguments: &[
            ROUTE,
            KEY,
            argument("outcome", "string", "done or release.", true),
            argument(
                "held_at",
                "string",
                "The hold looked into, as get_key gave it: a key held again since is left alone.",
                false,
            ),
        ],
        api_call: |arguments| {
            let mut body = json!({ "outcome": required_string(arguments, "outcome")? });
            if let Some(held_at) = arguments.get("held_at") {
                body["held_at"] = held_at.clone();
            }
            Ok(ApiCall {
                method: Method::POST,
                path_and_query: key_path(arguments, "/resolve")?,
                body: Some(body),
            })
        },
    },
];

/// `/v1/keys/{route}/{key}` and `then`, each name escaped as one path segment.
fn key_path(arguments: &Map<String, Value>, then: &str) -> Result<String, String> {
    let route = required_string(arguments, "route")?;
    let key = required_string(arguments, "key")?;
    Ok(format!(
        "/v1/keys/{}/{}{then}",
        path_segment(&route),
        path_segment(&key)
    ))
}

fn required_string(arguments: &Map<String, Value>, name: &str) -> Result<String, String> {
    match arguments.get(name) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(format!("`{name}` must be a string")),
        None => Err(format!("`{name}` is required")),
    }
}

/// The query string of the arguments named in `names` that are given (a number or a
/// string each).
fn query(arguments: &Map<String, Value>, names: &[&str]) -> Result<String, String> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for name in names {
        match arguments.get(*name) {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => {
                query.append_pair(name, text);
            }
            Some(Value::Number(number)) => {
                query.append_pair(name, &number.to_string());
            }
            Some(_) => return Err(format!("`{name}` must be a string or a number")),
        }
    }
    Ok(query.finish())
}

impl ToolSpec {
    fn tool(&self) -> Tool {
        let mut properties = Map::new();
        for argument in self.arguments {
            properties.insert(
                argument.name.into(),
                json!({ "type": argument.kind, "description": argument.description }),
            );
        }
        let required: Vec<_> = self
            .arguments
            .iter()
            .filter(|argument| argument.required)
            .map(|argument| argument.name)
            .collect();
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), Value::Object(properties));
        schema.insert("required".into(), json!(required));
        schema.insert("additionalProperties".into(), json!(false));
        let annotations = ToolAnnotations::new()
            .read_only(self.read_only)
            .destructive(!self.read_only)
            .idempotent(self.idempotent)
            .open_world(false);
        Tool::new(self.name, self.description, Arc::new(schema)).annotate(annotations)
    }

    fn takes(&self, name: &str) -> bool {
        self.arguments.iter().any(|argument| argument.name == name)
    }
}

impl McpServer {
    fn offered(&self) -> impl Iterator<Item = &'static ToolSpec> + '_ {
        TOOLS.iter().filter(|tool| tool.read_only || self.writes)
    }

    /// Runs the tool `call` names and gives the API's answer.
    async fn run(&self, call: CallToolRequestParams) -> Result<CallToolResult, ErrorData> {
        let refused = |reason: String| ErrorData::invalid_params(reason, None);
        let Some(tool) = self.offered().find(|tool| tool.name == call.name) else {
            return Err(refused(
                if TOOLS.iter().any(|tool| tool.name == call.name) {
                    format!("tool `{}` changes keys: admin.mcp is read_only", call.name)
                } else {
                    format!("no tool is called `{}`", call.name)
                },
            ));
        };
        let arguments = call.arguments.unwrap_or_default();
        if let Some(unknown) = arguments.keys().find(|name| !tool.takes(name)) {
            return Err(refused(format!(
                "`{}` takes no argument `{unknown}`",
                tool.name
            )));
        }
        let api_call = (tool.api_call)(&arguments).map_err(refused)?;
        if !tool.read_only {
            tracing::info!(tool = tool.name, path = %api_call.path_and_query, "admin change asked through MCP");
        }
        let (status, answer) =
            answer_in_process(self.api.as_ref(), api_call, self.caller.clone()).await;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let structured = serde_json::from_slice::<Value>(&answer).ok();
        let mut result = if status.is_success() {
            CallToolResult::success(vec![ContentBlock::text(text)])
        } else {
            CallToolResult::error(vec![ContentBlock::text(text)])
        };
        result.structured_content = structured.filter(Value::is_object);
        Ok(result)
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("dedupe-proxy", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Inspect a webhook deduplication proxy: its routes, the keys it holds per route, and the log of every delivery it took. Tools that change keys are offered only when the operator configured admin.mcp: read_write.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.offered().map(ToolSpec::tool).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.offered()
            .find(|tool| tool.name == name)
            .map(ToolSpec::tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp runs a call in a task of its own: it ends with its request, so that a client
        // that goes away leaves nothing running past the port's limit on requests.
        tokio::select! {
            ran = self.run(request) => ran.map(CallToolResponse::Complete),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("the request ended", None)),
        }
    }
}

/// The status and JSON body of `call` sent by `caller`, answered by `api`, within
/// [`CALL_TIMEOUT`].
async fn answer_in_process(
    api: &dyn Api,
    call: ApiCall,
    caller: Option<Caller>,
) -> (StatusCode, Bytes) {
    let body = call.body.map(|body| body.to_string()).unwrap_or_default();
    let request = Request::builder()
        .method(call.method)
        .uri(call.path_and_query)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Bytes::from(body));
    let Ok(mut request) = request else {
        let refused = AdminRefusal::BadRequest("the arguments do not make a valid path".into());
        return answer_whole(refused.into_response()).await;
    };
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    match tokio::time::timeout(CALL_TIMEOUT, async {
        answer_whole(api.answer(request).await).await
    })
    .await
    {
        Ok(answered) => answered,
        Err(_) => {
            let failed = AdminRefusal::Internal("the request took too long".into());
            answer_whole(failed.into_response()).await
        }
    }
}

/// An answer's status and whole body. The tools' requests have bounded answers (a page
/// is 1 000 keys at most; no tool names the live tail).
async fn answer_whole(response: Response<ProxyBody>) -> (StatusCode, Bytes) {
    let (head, body) = response.into_parts();
    match body.collect().await {
        Ok(collected) => (head.status, collected.to_bytes()),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from(json!({ "error": "internal", "message": error.to_string() }).to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::log::Fate;

    fn tool(name: &str) -> &'static ToolSpec {
        TOOLS.iter().find(|tool| tool.name == name).unwrap()
    }

    fn described(tool: &ToolSpec, argument: &str) -> &'static str {
        let found = tool.arguments.iter().find(|taken| taken.name == argument);
        found.unwrap().description
    }

    #[test]
    fn descriptions_state_the_apis_limits_and_every_outcome() {
        let keys = described(tool("list_keys"), "limit");
        let (max, default) = (
            super::super::keys::LIST_LIMIT_MAX,
            super::super::keys::LIST_LIMIT_DEFAULT,
        );
        assert!(
            keys.contains(&format!("1 to {max} ({default} if")),
            "{keys}"
        );
        let deliveries = described(tool("list_deliveries"), "limit");
        let (max, default) = (
            crate::delivery_log::query::LIMIT_MAX,
            crate::delivery_log::query::LIMIT_DEFAULT,
        );
        assert!(
            deliveries.contains(&format!("1 to {max} ({default} if")),
            "{deliveries}"
        );
        let outcomes = described(tool("list_deliveries"), "outcome");
        for fate in Fate::ALL {
            assert!(
                outcomes.contains(fate.as_str()),
                "{outcomes} lacks {}",
                fate.as_str()
            );
        }
    }

    #[test]
    fn a_tools_arguments_stay_inside_the_path_segment_they_fill() {
        let arguments = |pairs: &[(&str, &str)]| -> Map<String, Value> {
            pairs
                .iter()
                .map(|(name, value)| ((*name).into(), json!(value)))
                .collect()
        };
        let forget = (tool("forget_key").api_call)(&arguments(&[
            ("route", "../queue"),
            ("key", "a/b?c=1#d%2F/resolve"),
        ]))
        .unwrap();
        assert_eq!(
            forget.path_and_query,
            "/v1/keys/%2E%2E%2Fqueue/a%2Fb%3Fc%3D1%23d%252F%2Fresolve"
        );
        let listed =
            (tool("list_keys").api_call)(&arguments(&[("route", "a&state=held")])).unwrap();
        assert_eq!(listed.path_and_query, "/v1/keys?route=a%26state%3Dheld");
        for id in ["tail", "1-2/../tail", ""] {
            let refused = (tool("get_delivery").api_call)(&arguments(&[("id", id)]));
            assert!(refused.is_err(), "{id}");
        }
        let one = (tool("get_delivery").api_call)(&arguments(&[("id", "12-0")])).unwrap();
        assert_eq!(one.path_and_query, "/v1/deliveries/12-0");
    }
}
