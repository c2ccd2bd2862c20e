//! `/mcp`: the admin API for coding agents, over the Model Context Protocol (Streamable
//! HTTP transport, served by the official SDK, `rmcp`).
//!
//! Each tool is one admin API request: the tool's arguments name the path, the query and
//! the body, and its result is the API's JSON answer (a refusal's JSON with `isError`).
//! So an agent sees exactly what `/v1/*` answers, and one implementation serves both.
//! `/mcp` itself meets the port's rules first (the Host and Origin checks, the bearer
//! token of `/v1/*`); the tools that change something are listed, and run, only when
//! `admin.mcp` is `read_write`.
//!
//! The transport runs stateless (no session kept between requests) with JSON answers, so
//! `/mcp` holds nothing once a request is answered.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Map, Value, json};

use super::Admin;
use super::endpoint::path_segment;
use crate::body::ProxyBody;
use crate::config::McpAccess;

/// The largest JSON-RPC message `/mcp` reads: tool arguments are a few names and values.
const REQUEST_BODY_MAX: usize = 64 * 1024;

/// Serves one request to `/mcp` (the port's rules already met).
pub(super) async fn serve(admin: Arc<Admin>, request: Request<Incoming>) -> Response<ProxyBody> {
    let writes = admin.mcp == McpAccess::ReadWrite;
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(REQUEST_BODY_MAX)
        // The port's own rules checked Host and Origin, with `admin.hosts`.
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_sse_keep_alive(None);
    let tools = Tools { admin, writes };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    service
        .handle(request)
        .await
        .map(|body| body.map_err(|never: Infallible| match never {}).boxed())
}

/// The tools of one `/mcp` request.
#[derive(Clone)]
struct Tools {
    admin: Arc<Admin>,
    writes: bool,
}

/// A tool: what it is called, says and takes, and the API request it makes.
struct Spec {
    name: &'static str,
    description: &'static str,
    /// Changes nothing; listed and run whatever `admin.mcp` says (unless `off`).
    read_only: bool,
    /// Its arguments: `(name, JSON Schema type, description, required)`.
    arguments: &'static [(&'static str, &'static str, &'static str, bool)],
    request: fn(&Map<String, Value>) -> Result<ApiCall, String>,
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

const ROUTE: (&str, &str, &str, bool) = ("route", "string", "The route's name.", true);
const KEY: (&str, &str, &str, bool) = (
    "key",
    "string",
    "The event's key, as the route extracts it (without the route's namespace).",
    true,
);

/// Every tool, in the order `tools/list` gives them.
const SPECS: &[Spec] = &[
    Spec {
        name: "list_routes",
        description: "The proxy's routes with their resolved settings (secrets masked): each route's name is what the key tools take.",
        read_only: true,
        arguments: &[],
        request: |_| Ok(ApiCall::get("/v1/routes".into())),
    },
    Spec {
        name: "list_keys",
        description: "A page of a route's live keys (in flight, done or held), with each key's state, times and the app's recorded status; pass `next` back as `after` for the next page.",
        read_only: true,
        arguments: &[
            ROUTE,
            (
                "state",
                "string",
                "Only keys in this state: in_flight, done or held.",
                false,
            ),
            (
                "limit",
                "integer",
                "Keys in the page, 1 to 1000 (100 if left out).",
                false,
            ),
            (
                "after",
                "string",
                "The `next` cursor of the page before.",
                false,
            ),
        ],
        request: |arguments| {
            let query = query(arguments, &["route", "state", "limit", "after"])?;
            Ok(ApiCall::get(format!("/v1/keys?{query}")))
        },
    },
    Spec {
        name: "get_key",
        description: "One key of a route: its state (in_flight, done, held), when it was claimed, finished or held and why, when it expires, and the app's recorded status.",
        read_only: true,
        arguments: &[ROUTE, KEY],
        request: |arguments| Ok(ApiCall::get(key_path(arguments, "")?)),
    },
    Spec {
        name: "list_deliveries",
        description: "The delivery log, newest first: every request a route took, with its outcome (forwarded, duplicate, in_flight, waited, held, stale, replayed, signature_refused, bad_request, store_error, upstream_error, queued states), the app's status and latency. Filters combine; pass `next` back as `cursor`.",
        read_only: true,
        arguments: &[
            ("route", "string", "Only this route's deliveries.", false),
            ("key", "string", "Only deliveries of this key.", false),
            (
                "key_prefix",
                "string",
                "Only deliveries whose key starts with this.",
                false,
            ),
            (
                "outcome",
                "string",
                "Only these outcomes, comma-separated.",
                false,
            ),
            (
                "status",
                "string",
                "The proxy's answer: a status (409) or a class (4xx).",
                false,
            ),
            (
                "upstream_status",
                "string",
                "The app's answer: a status or a class (5xx).",
                false,
            ),
            (
                "since",
                "string",
                "Only deliveries at or after this RFC 3339 time.",
                false,
            ),
            (
                "until",
                "string",
                "Only deliveries before this RFC 3339 time.",
                false,
            ),
            (
                "limit",
                "integer",
                "Entries in the page, 1 to 500 (50 if left out).",
                false,
            ),
            (
                "cursor",
                "string",
                "The `next` cursor of the page before, with the same filters.",
                false,
            ),
        ],
        request: |arguments| {
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
    Spec {
        name: "get_delivery",
        description: "One delivery log entry whole, with the headers and body its route records (if any).",
        read_only: true,
        arguments: &[(
            "id",
            "string",
            "The entry's id, as list_deliveries gives it.",
            true,
        )],
        request: |arguments| {
            let id = text(arguments, "id")?;
            Ok(ApiCall::get(format!(
                "/v1/deliveries/{}",
                path_segment(&id)
            )))
        },
    },
    Spec {
        name: "forget_key",
        description: "Forgets a done key, so that the next delivery of that event is forwarded to the app again (its work runs again). Refused for a key in flight or held.",
        read_only: false,
        arguments: &[ROUTE, KEY],
        request: |arguments| {
            Ok(ApiCall {
                method: Method::DELETE,
                path_and_query: key_path(arguments, "")?,
                body: None,
            })
        },
    },
    Spec {
        name: "set_key_expiry",
        description: "Moves a done key's expiry, sooner or later (give expires_at or expires_in): until then its deliveries are duplicates, after it the next one is forwarded again. Refused for a key in flight or held.",
        read_only: false,
        arguments: &[
            ROUTE,
            KEY,
            (
                "expires_at",
                "string",
                "The new expiry, an RFC 3339 time in the future.",
                false,
            ),
            (
                "expires_in",
                "string",
                "The new expiry from now, as a duration like 48h.",
                false,
            ),
        ],
        request: |arguments| {
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
    Spec {
        name: "resolve_key",
        description: "Resolves a held key (one whose forward may or may not have run): `done` if the work happened (duplicates get the duplicate answer), `release` if it did not (the next delivery runs it).",
        read_only: false,
        arguments: &[
            ROUTE,
            KEY,
            ("outcome", "string", "done or release.", true),
            (
                "held_at",
                "string",
                "The hold looked into, as get_key gave it: a key held again since is left alone.",
                false,
            ),
        ],
        request: |arguments| {
            let mut body = json!({ "outcome": text(arguments, "outcome")? });
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

/// `/v1/keys/{route}/{key}` and `then`.
fn key_path(arguments: &Map<String, Value>, then: &str) -> Result<String, String> {
    let (route, key) = (text(arguments, "route")?, text(arguments, "key")?);
    Ok(format!(
        "/v1/keys/{}/{}{then}",
        path_segment(&route),
        path_segment(&key)
    ))
}

/// A required text argument.
fn text(arguments: &Map<String, Value>, name: &str) -> Result<String, String> {
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

impl Spec {
    fn tool(&self) -> Tool {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for (name, kind, description, needed) in self.arguments {
            properties.insert(
                (*name).into(),
                json!({ "type": kind, "description": description }),
            );
            if *needed {
                required.push(*name);
            }
        }
        let schema = json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        });
        let Value::Object(schema) = schema else {
            unreachable!("a JSON object")
        };
        let annotations = ToolAnnotations::new()
            .read_only(self.read_only)
            .destructive(!self.read_only)
            .idempotent(true)
            .open_world(false);
        Tool::new(self.name, self.description, Arc::new(schema)).annotate(annotations)
    }

    /// The arguments' names this tool takes, for refusing others.
    fn takes(&self, name: &str) -> bool {
        self.arguments.iter().any(|(taken, ..)| *taken == name)
    }
}

impl Tools {
    fn offered(&self) -> impl Iterator<Item = &'static Spec> + '_ {
        SPECS.iter().filter(|spec| spec.read_only || self.writes)
    }

    /// Runs the tool named in `call` and gives the API's answer.
    async fn run(&self, call: CallToolRequestParams) -> Result<CallToolResult, ErrorData> {
        let Some(spec) = self.offered().find(|spec| spec.name == call.name) else {
            let reason = if SPECS.iter().any(|spec| spec.name == call.name) {
                format!(
                    "tool `{}` changes the store: admin.mcp is read_only",
                    call.name
                )
            } else {
                format!("no tool is called `{}`", call.name)
            };
            return Err(ErrorData::invalid_params(reason, None));
        };
        let arguments = call.arguments.unwrap_or_default();
        if let Some(unknown) = arguments.keys().find(|name| !spec.takes(name)) {
            let reason = format!("`{}` takes no argument `{unknown}`", spec.name);
            return Err(ErrorData::invalid_params(reason, None));
        }
        let api_call =
            (spec.request)(&arguments).map_err(|reason| ErrorData::invalid_params(reason, None))?;
        if !spec.read_only {
            tracing::info!(tool = spec.name, path = %api_call.path_and_query, "admin change asked through MCP");
        }
        let (status, answer) = self.admin.call(api_call).await;
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

impl ServerHandler for Tools {
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
            self.offered().map(Spec::tool).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.offered()
            .find(|spec| spec.name == name)
            .map(Spec::tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.run(request).await.map(CallToolResponse::Complete)
    }
}

impl Admin {
    /// Answers an admin API request made inside the process (by a tool), as the port
    /// answers one that met its rules: the status and the JSON body. Boxed: this future
    /// is inside the one of `/mcp` that the port's own answer holds, and the compiler
    /// proves it `Send` only where it is made.
    fn call(&self, call: ApiCall) -> BoxFuture<'_, (StatusCode, Bytes)> {
        Box::pin(async move {
            let body = call.body.map(|body| body.to_string()).unwrap_or_default();
            let request = Request::builder()
                .method(call.method)
                .uri(call.path_and_query)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Bytes::from(body));
            let response = match request {
                Ok(request) => self.answer(request).await,
                Err(_) => {
                    let refusal = crate::response::AdminRefusal::BadRequest(
                        "the arguments do not make a valid request".into(),
                    );
                    refusal.into_response()
                }
            };
            // Held whole: the API's answers are bounded (a page is 1 000 keys at most).
            let (head, body) = response.into_parts();
            match body.collect().await {
                Ok(collected) => (head.status, collected.to_bytes()),
                Err(error) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Bytes::from(
                        json!({ "error": "internal", "message": error.to_string() }).to_string(),
                    ),
                ),
            }
        })
    }
}
