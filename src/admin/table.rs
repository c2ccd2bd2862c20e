//! The admin port's route table: every endpoint's method, path, the role it needs, whether
//! its success changes the store, and its handler. The router built from it answers an
//! unknown path 404, a known one asked with another method 405 with `Allow` (under `/v1/`
//! and at `/mcp` only once a token is shown), and `HEAD` wherever `GET` goes; the API's
//! tools (`/mcp`) call the same table inside the process.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::middleware::{self, Next};
use axum::{Extension, Router};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower::ServiceExt;

use super::access::{Need, Role};
use super::endpoint::{Endpoint, QueryParam, Success, Takes, optional, required};
use super::extract::{self, Inside, Live, WithBody};
use super::state::AdminState;
use super::{answers, charts, console, deliveries, dry_run, keys, mcp, openapi, overview, probes};
use super::{queue, routes, scopes};
use crate::body::ProxyBody;
use crate::config::McpAccess;
use crate::delivery_log::query;
use crate::response::{AdminRefusal, json_response};
use crate::store::StateFilter;
use crate::store::queue::DeadReason;

/// A JSON object, as MCP gives a tool's schemas.
type JsonObject = serde_json::Map<String, serde_json::Value>;

/// `GET /v1/keys`'s parameters.
const KEYS_QUERY: &[QueryParam] = &[
    required("route", Takes::Text),
    optional("prefix", Takes::Text),
    optional("state", Takes::OneOf(&StateFilter::NAMES)),
    optional("limit", Takes::Count(keys::LIST_LIMIT_MAX)),
    optional("after", Takes::Text),
];

/// `GET /v1/charts`'s parameters.
const CHARTS_QUERY: &[QueryParam] = &[
    optional("range", Takes::OneOf(&charts::RANGE_NAMES)),
    optional("route", Takes::Text),
];

/// The delivery log's filter.
const DELIVERIES_FILTER: &[QueryParam] = &[
    optional("route", Takes::Text),
    optional("key", Takes::Text),
    optional("key_prefix", Takes::Text),
    optional("outcome", Takes::SomeOf(&query::OUTCOME_NAMES)),
    optional("status", Takes::StatusOrClass),
    optional("upstream_status", Takes::StatusOrClass),
    optional("since", Takes::Time),
    optional("until", Takes::Time),
];

/// A page of the delivery log.
const DELIVERIES_PAGE: &[QueryParam] = &[
    optional("limit", Takes::Count(query::LIMIT_MAX)),
    optional("cursor", Takes::Text),
];

/// The dead letters' filter.
const DEAD_FILTER: &[QueryParam] = &[
    optional("status", Takes::Status),
    optional("reason", Takes::OneOf(&DeadReason::NAMES)),
    optional("key_prefix", Takes::Text),
    optional("since", Takes::Time),
    optional("until", Takes::Time),
];

/// A page of dead letters.
const DEAD_PAGE: &[QueryParam] = &[
    optional("limit", Takes::Count(queue::DEAD_LIMIT_MAX)),
    optional("after", Takes::Text),
];

/// Every endpoint; `/mcp` only if `mcp` is on.
#[rustfmt::skip]
pub(super) fn endpoints(mcp: McpAccess) -> Vec<Endpoint> {
    use Method as M;
    use Need::{Anyone, Operator, Viewer};
    let page = Success::Text("text/html");
    let mut table = vec![
        Endpoint::new(M::GET, "/healthz", Anyone, "The process answers.", probes::health)
            .returns::<answers::Status>(),
        Endpoint::new(M::GET, "/readyz", Anyone, "The store is open, no drain begun.", probes::readiness)
            .answers(Success::Probe).returns::<answers::Status>(),
        Endpoint::new(M::GET, "/metrics", Anyone, "Every metric, in OpenMetrics' text.", probes::metrics)
            .answers(Success::Text("application/openmetrics-text")),
        Endpoint::new(M::GET, "/", Anyone, "Sends the browser on to the console.", console::serve)
            .answers(Success::Redirect),
        Endpoint::new(M::GET, "/console", Anyone, "The console's page.", console::serve).answers(page),
        Endpoint::new(M::GET, "/console/", Anyone, "The console's page.", console::serve).answers(page),
        Endpoint::new(M::GET, "/console/app.js", Anyone, "The console's script.", console::serve)
            .answers(Success::Text("text/javascript")),
        Endpoint::new(M::GET, "/console/app.css", Anyone, "The console's style.", console::serve)
            .answers(Success::Text("text/css")),
        Endpoint::new(M::GET, "/v1/openapi.json", Viewer, "This API, described in OpenAPI 3.1.", openapi_document),
        Endpoint::new(M::GET, "/v1/overview", Viewer, "The proxy at a glance, and who asks.", overview::overview)
            .returns::<answers::Overview>(),
        Endpoint::new(M::GET, "/v1/charts", Viewer, "The last hour or day, minute by minute.", charts::charts)
            .query(CHARTS_QUERY).returns::<answers::Charts>(),
        Endpoint::new(M::GET, "/v1/routes", Viewer, "Every route's resolved settings.", routes::routes)
            .returns::<answers::RouteList>(),
        Endpoint::new(M::POST, "/v1/reload", Operator, "Reads the configuration file again.", routes::reload)
            .returns::<answers::Reloaded>(),
        Endpoint::new(M::POST, "/v1/try", Viewer, "A dry run of a request on the running routes.", dry_run::dry_run)
            .body::<dry_run::Tried>().returns::<crate::dry_run::Report>(),
        Endpoint::new(M::GET, "/v1/scopes", Viewer, "Every scope, its keys counted by state.", scopes::list)
            .returns::<answers::Scopes>(),
        Endpoint::new(M::POST, "/v1/scopes/{scope}/clear", Operator, "Removes a scope's keys.", scopes::clear)
            .body::<scopes::Clearing>().body_optional().returns::<answers::Cleared>().syncs(),
        Endpoint::new(M::GET, "/v1/keys", Viewer, "A route's keys, a page at a time.", keys::list)
            .query(KEYS_QUERY).returns::<answers::KeyPage>(),
        Endpoint::new(M::GET, "/v1/keys/{route}/{key}", Viewer, "A key, with the answer it recorded.", keys::one)
            .returns::<answers::KeyView>(),
        Endpoint::new(M::DELETE, "/v1/keys/{route}/{key}", Operator, "Forgets a key.", keys::one)
            .answers(Success::NoContent).syncs(),
        Endpoint::new(M::PATCH, "/v1/keys/{route}/{key}", Operator, "Gives a key another expiry.", keys::one)
            .body::<keys::NewExpiry>().returns::<answers::KeyView>().syncs(),
        Endpoint::new(M::POST, "/v1/keys/{route}/{key}/resolve", Operator, "Resolves a held key.", keys::resolve)
            .body::<keys::HeldResolution>().returns::<answers::KeyView>().syncs(),
        Endpoint::new(M::GET, "/v1/entities/{route}/{entity}", Viewer, "An entity's newest version done.", keys::entity)
            .returns::<answers::EntityVersion>(),
        Endpoint::new(M::DELETE, "/v1/entities/{route}/{entity}", Operator, "Forgets an entity's version.", keys::entity)
            .answers(Success::NoContent).syncs(),
        Endpoint::new(M::GET, "/v1/queue", Viewer, "Every queued route's counts.", queue::overview)
            .returns::<answers::QueueList>(),
        Endpoint::new(M::POST, "/v1/queue/{route}/pause", Operator, "Pauses a route's deliveries.", queue::pause)
            .returns::<answers::Paused>().syncs(),
        Endpoint::new(M::POST, "/v1/queue/{route}/resume", Operator, "Resumes a route's deliveries.", queue::resume)
            .returns::<answers::Paused>().syncs(),
        Endpoint::new(M::GET, "/v1/queue/{route}/dead", Viewer, "A route's dead letters, filtered.", queue::dead)
            .query(DEAD_FILTER).query(DEAD_PAGE).returns::<answers::DeadLetterPage>(),
        Endpoint::new(M::POST, "/v1/queue/{route}/replays", Operator, "Replays the dead letters a filter picks.", queue::replay_dead)
            .query(DEAD_FILTER).answers(Success::Json(202)).returns::<answers::ReplayProgress>(),
        Endpoint::new(M::GET, "/v1/queue/{route}/jobs/{key}", Viewer, "A queued or dead job.", queue::job)
            .returns::<answers::JobDetail>(),
        Endpoint::new(M::DELETE, "/v1/queue/{route}/jobs/{key}", Operator, "Discards a dead letter.", queue::job)
            .answers(Success::NoContent).syncs(),
        Endpoint::new(M::POST, "/v1/queue/{route}/jobs/{key}/replay", Operator, "Replays a dead letter.", queue::replay)
            .returns::<answers::ReplayedJob>().syncs(),
        Endpoint::new(M::GET, "/v1/replays/{id}", Viewer, "A bulk replay's progress.", queue::replay_progress)
            .returns::<answers::ReplayProgress>(),
        Endpoint::new(M::DELETE, "/v1/replays/{id}", Operator, "Cancels a bulk replay.", queue::cancel_replay)
            .returns::<answers::ReplayProgress>(),
        Endpoint::new(M::GET, "/v1/deliveries", Viewer, "The delivery log, filtered.", deliveries::list)
            .query(DELIVERIES_FILTER).query(DELIVERIES_PAGE).returns::<answers::DeliveryPage>(),
        Endpoint::new(M::GET, "/v1/deliveries/tail", Viewer, "The log's entries from now on.", deliveries::tail)
            .query(DELIVERIES_FILTER).answers(Success::Events),
        Endpoint::new(M::GET, "/v1/deliveries/{id}", Viewer, "One entry of the delivery log.", deliveries::get)
            .returns::<answers::DeliveryDetail>(),
    ];
    if mcp != McpAccess::Off {
        // A POST that may only read: its tools are limited to the caller's role instead.
        table.push(Endpoint::new(M::POST, "/mcp", Viewer, "The Model Context Protocol.", mcp_message));
    }
    table
}

/// The router of the whole port. `/mcp`'s tools call the `/v1/` endpoints through a
/// router of their own, made once here.
pub(super) fn port(state: &Arc<AdminState>) -> Router {
    let inside = InProcess(api(state));
    router(state, endpoints(state.mcp)).layer(Extension(inside))
}

/// The router of the API under `/v1/`, as a tool calls it inside the process.
fn api(state: &Arc<AdminState>) -> Router {
    let table = endpoints(McpAccess::Off).into_iter();
    let api = table.filter(|endpoint| endpoint.path.starts_with("/v1/"));
    router(state, api.collect())
}

/// The router of `table`: each endpoint behind its role's rule, and a change's success
/// synced to disk before it is answered.
fn router(state: &Arc<AdminState>, table: Vec<Endpoint>) -> Router {
    let mut router = Router::new();
    for endpoint in table {
        let mut handler = endpoint.handler;
        if endpoint.syncs {
            let state = Arc::clone(state);
            handler = handler.layer(middleware::from_fn(
                move |request: axum::extract::Request, next: Next| {
                    synced(Arc::clone(&state), request, next)
                },
            ));
        }
        let (state, need) = (Arc::clone(state), endpoint.need);
        handler = handler.layer(middleware::from_fn(
            move |request: axum::extract::Request, next: Next| {
                extract::admit(Arc::clone(&state), need, request, next)
            },
        ));
        router = router.route(endpoint.path, handler);
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .with_state(Arc::clone(state))
}

/// The answer of a change: a success is synced to stable storage first.
async fn synced(
    state: Arc<AdminState>,
    request: axum::extract::Request,
    next: Next,
) -> axum::response::Response {
    let answer = next.run(request).await;
    if !answer.status().is_success() {
        return answer;
    }
    let Some(serving) = state.serving.get() else {
        return answer;
    };
    match serving.proxy.store().flush().await {
        Ok(()) => answer,
        Err(error) => {
            tracing::error!(%error, "an operator's change could not be synced to disk");
            axum::response::IntoResponse::into_response(AdminRefusal::from(error))
        }
    }
}

/// An unknown path: `404`, under `/v1/` and at `/mcp` only once a token is shown.
async fn not_found(
    State(state): State<Arc<AdminState>>,
    request: axum::extract::Request,
) -> AdminRefusal {
    token_first(&state, &request).unwrap_or(AdminRefusal::NotFound)
}

/// A known path asked with another method: `405` (the router adds `Allow`), under `/v1/`
/// and at `/mcp` only once a token is shown.
async fn not_allowed(
    State(state): State<Arc<AdminState>>,
    request: axum::extract::Request,
) -> AdminRefusal {
    let method = request.method().clone();
    token_first(&state, &request).unwrap_or(AdminRefusal::MethodNotAllowed(method))
}

/// The refusal of a request to the API that shows no token, so that no one without one
/// learns which paths and methods it has.
fn token_first(state: &AdminState, request: &axum::extract::Request) -> Option<AdminRefusal> {
    let path = request.uri().path();
    let of_the_api = path.starts_with("/v1/") || path == "/v1" || path == "/mcp";
    if !of_the_api || request.extensions().get::<Inside>().is_some() {
        return None;
    }
    let headers = request.headers();
    state.rules.admit(Need::Viewer, &Method::GET, headers).err()
}

/// `GET /v1/openapi.json`: the document of this port's endpoints, made once.
async fn openapi_document(State(state): State<Arc<AdminState>>) -> Response<ProxyBody> {
    let document = state
        .openapi
        .get_or_init(|| openapi::document(&endpoints(state.mcp)).to_string());
    json_response(StatusCode::OK, document.clone())
}

/// `POST /mcp`: one message, its tools answered by the `/v1/` endpoints in process under
/// the message's role; the tools that change keys only for a role that may change, with
/// `admin.mcp: read_write`.
async fn mcp_message(
    State(state): State<Arc<AdminState>>,
    Live(_): Live,
    Extension(role): Extension<Role>,
    Extension(inside): Extension<InProcess>,
    WithBody(request): WithBody<{ mcp::REQUEST_BODY_MAX }>,
) -> Response<ProxyBody> {
    let writes = state.mcp == McpAccess::ReadWrite && role.may_change();
    mcp::serve(Arc::new(inside), writes, role, request).await
}

/// The API as `/mcp`'s tools call it: a request answered inside the process by the
/// table's `/v1/` endpoints.
#[derive(Clone)]
struct InProcess(Router);

impl mcp::Api for InProcess {
    fn answer(&self, request: Request<Bytes>) -> BoxFuture<'_, Response<ProxyBody>> {
        let router = self.0.clone();
        Box::pin(async move {
            match router.oneshot(request.map(Full::new)).await {
                Ok(answer) => extract::into_port_body(answer),
                Err(never) => match never {},
            }
        })
    }

    fn answer_schema(&self, method: &Method, path: &str) -> Option<Arc<JsonObject>> {
        static SCHEMAS: OnceLock<HashMap<(Method, &'static str), Arc<JsonObject>>> =
            OnceLock::new();
        let schemas = SCHEMAS.get_or_init(|| {
            let table = endpoints(McpAccess::Off).into_iter();
            let typed = table.filter_map(|endpoint| {
                let schema = openapi::answer_schema(&endpoint)?;
                Some(((endpoint.method, endpoint.path), Arc::new(schema)))
            });
            typed.collect()
        });
        schemas.get(&(method.clone(), path)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the access rules rely on: the paths open to anyone only read, every change
    /// needs the operator, and only `/mcp` and a dry run are `POST`s a viewer may send
    /// (they change nothing).
    #[test]
    fn only_the_operator_changes_anything() {
        for endpoint in endpoints(McpAccess::ReadWrite) {
            let (path, need) = (endpoint.path, endpoint.need);
            if need == Need::Anyone {
                assert_eq!(endpoint.method, Method::GET, "{path}");
                assert!(!path.starts_with("/v1/") && path != "/mcp", "{path}");
            }
            if endpoint.method != Method::GET && need != Need::Operator {
                assert!(
                    ["/mcp", "/v1/try"].contains(&path),
                    "{path} changes without the operator"
                );
                assert!(!endpoint.syncs, "{path}");
            }
            if endpoint.syncs {
                assert_eq!(need, Need::Operator, "{path}");
            }
        }
    }

    /// No fixed segment stands where a path of the same shape has a name: the router
    /// prefers the fixed one, so a key called `count` would reach `/v1/keys/{route}/count`
    /// rather than itself. The one such pair is safe: a delivery's id is `<ms>-<n>`, never
    /// `tail`.
    #[test]
    fn no_fixed_segment_hides_a_name() {
        let named = |segment: &str| segment.starts_with('{');
        let table = endpoints(McpAccess::ReadWrite);
        for a in &table {
            for b in &table {
                let (a, b): (Vec<&str>, Vec<&str>) =
                    (a.path.split('/').collect(), b.path.split('/').collect());
                let overlap = a.len() == b.len()
                    && a.iter()
                        .zip(&b)
                        .all(|(x, y)| x == y || named(x) || named(y));
                let hidden = a.iter().zip(&b).any(|(x, y)| named(x) && !named(y));
                let (a, b) = (a.join("/"), b.join("/"));
                if overlap
                    && hidden
                    && (a.as_str(), b.as_str()) != ("/v1/deliveries/{id}", "/v1/deliveries/tail")
                {
                    panic!("{b} hides a name of {a}");
                }
            }
        }
    }

    #[test]
    fn each_method_and_path_is_in_the_table_once() {
        let table = endpoints(McpAccess::ReadWrite);
        let mut seen = std::collections::BTreeSet::new();
        for endpoint in &table {
            assert!(
                seen.insert((endpoint.path, endpoint.method.as_str())),
                "{}",
                endpoint.path
            );
        }
        assert!(
            !endpoints(McpAccess::Off)
                .iter()
                .any(|endpoint| endpoint.path == "/mcp")
        );
    }
}
