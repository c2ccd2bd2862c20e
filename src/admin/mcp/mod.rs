//! `/mcp`: the admin API for coding agents, over the Model Context Protocol (Streamable
//! HTTP transport, served by the official SDK, `rmcp`).
//!
//! Each tool is one admin API request: the tool's arguments fill in the path, the query
//! and the body, and its result is the API's JSON answer (a refusal's JSON with
//! `isError`). So an agent sees exactly what `/v1/*` answers, and one implementation
//! serves both. `/mcp` itself meets the port's rules first (the Host and Origin checks,
//! the bearer token); the tools that change something are listed, and run, only when
//! `admin.mcp` is `read_write` and the caller is no viewer (`admin.viewer_token_env`). Arguments the tool does not take, a missing one, a
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
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

mod tools;

use self::tools::{ApiCall, TOOLS, ToolSpec};
use super::access::Role;
use super::extract::{Caller, Inside};
use crate::body::ProxyBody;
use crate::response::AdminRefusal;

/// The largest JSON-RPC message `/mcp` reads: tool arguments are a few names and values.
pub(super) const REQUEST_BODY_MAX: u64 = 64 * 1024;

/// How long a tool's request may take: every one reads a page or changes a key.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin API as the tools call it: a request answered inside the process as the
/// port answers one that met its rules. Boxed, because `/mcp`'s own answer is inside
/// the port's answer, and a future that holds itself needs a box to have a size.
pub(super) trait Api: Send + Sync + 'static {
    fn answer(&self, request: Request<Bytes>) -> BoxFuture<'_, Response<ProxyBody>>;

    /// The JSON Schema of the success of the endpoint at `method` and `path` (as the route
    /// table writes it), if that answer is a typed object: a tool's `outputSchema`.
    fn answer_schema(&self, method: &Method, path: &str) -> Option<Arc<JsonObject>>;
}

/// Serves one message to `/mcp` (the port's rules met, its body read whole within bounds,
/// its [`Caller`] and `role` named), its tools answered by `api`; `writes` offers the
/// tools that change keys.
pub(super) async fn serve(
    api: Arc<dyn Api>,
    writes: bool,
    role: Role,
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
        role,
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
    /// Its role, which the API's own rules apply to each tool's request too.
    role: Role,
}

impl McpServer {
    fn offered(&self) -> impl Iterator<Item = &'static ToolSpec> + '_ {
        TOOLS.iter().filter(|tool| tool.read_only || self.writes)
    }

    /// A tool as the client sees it, with the schema of its endpoint's answer.
    fn described(&self, tool: &ToolSpec) -> Tool {
        let (method, path) = &tool.endpoint;
        let described = tool.tool();
        match self.api.answer_schema(method, path) {
            Some(schema) => described.with_raw_output_schema(schema),
            None => described,
        }
    }

    /// Runs the tool `call` names and gives the API's answer.
    async fn run(&self, call: CallToolRequestParams) -> Result<CallToolResult, ErrorData> {
        let refused = |reason: String| ErrorData::invalid_params(reason, None);
        let Some(tool) = self.offered().find(|tool| tool.name == call.name) else {
            return Err(refused(
                if TOOLS.iter().any(|tool| tool.name == call.name) {
                    format!(
                        "tool `{}` changes keys: admin.mcp is read_only, or the token is the viewer's",
                        call.name
                    )
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
        let (status, answer) = answer_in_process(
            self.api.as_ref(),
            api_call,
            (self.caller.clone(), self.role),
        )
        .await;
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
                format!("Inspect a webhook deduplication proxy: its routes, the keys it holds per route, and the log of every delivery it took. Tools that change keys are offered only when the operator configured admin.mcp: read_write, and never to the viewer's token. {}", tools::UNTRUSTED),
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.offered().map(|tool| self.described(tool)).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.offered()
            .find(|tool| tool.name == name)
            .map(|tool| self.described(tool))
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
    (caller, role): (Option<Caller>, Role),
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
    request.extensions_mut().insert(Inside(role));
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
