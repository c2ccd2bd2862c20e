//! The admin listener: liveness, readiness, metrics, the resolved routes, live reload,
//! keys and entities (`keys.rs`), scopes counted and cleared (`scopes.rs`), queued
//! delivery's routes, paused and resumed, and its dead letters (`queue.rs`, `bulk.rs`),
//! the delivery log (`deliveries.rs`), `/mcp` (`mcp/`), and the console (`console/`,
//! with `/v1/overview` from `overview.rs`). Kept on its own port (127.0.0.1 by default) so that providers never reach
//! it.
//!
//! Every request first meets [`access`]: the Host and Origin rules that keep web pages
//! out, and the bearer token of `/v1/*`; then [`endpoint`] names what it asks for.

mod access;
mod bulk;
mod console;
mod deliveries;
mod dry_run;
mod endpoint;
mod keys;
mod mcp;
mod overview;
mod places;
mod queue;
mod scopes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::body::{self, ProxyBody, empty, full};
use crate::config::{AdminConfig, Limits, McpAccess};
use crate::metrics::{KeyCounts, Metrics};
use crate::proxy::Proxy;
use crate::reload::Reloader;
use crate::response::{AdminRefusal, json_response};
use crate::server::{Ends, RequestPermit};
use access::{Access, Role, Rules};
use endpoint::{Api, Endpoint, Probe};
use keys::Caller;

/// The largest request body the API reads (a resolution, an expiry), and how long it
/// waits for one (a `/mcp` message's too).
const BODY_MAX: u64 = 1024;
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Requests whose body is being read at once at most, in all and per credential: one that
/// holds its body back holds a place for [`BODY_READ_TIMEOUT`] at most, and the port's
/// other connections stay free for the probes and other clients.
const BODIES_MAX: usize = 16;
const BODIES_PER_CREDENTIAL: usize = 8;

/// Request places kept for `/healthz` and `/readyz` once the others are taken, so that
/// no flood of other requests fails a probe.
const PROBE_PLACES: usize = 8;

/// The most connections the admin port takes: probes, a scraper and a few operators need
/// few, and the descriptors they take are set aside from the proxy's.
pub const MAX_CONNECTIONS: usize = 64;

/// The admin listener's limits: [`MAX_CONNECTIONS`], [`PROBE_PLACES`], and `limits`'
/// default deadlines.
pub fn listener_limits() -> Limits {
    Limits {
        max_connections: MAX_CONNECTIONS,
        max_requests: MAX_CONNECTIONS,
        probe_places: PROBE_PLACES,
        ..Limits::default()
    }
}

/// What the admin API serves once the store is open and the routes loaded.
pub struct Serving {
    pub proxy: Arc<Proxy>,
    pub reloader: Arc<Reloader>,
}

/// The admin service's state, shared by its connections.
pub struct Admin {
    serving: OnceLock<Serving>,
    shutting_down: AtomicBool,
    rules: Rules,
    metrics: Arc<Metrics>,
    /// Bulk replays of dead letters started here.
    replays: bulk::Replays,
    /// Live tails of the delivery log.
    tails: deliveries::Tails,
    /// Requests whose body is being read.
    bodies: places::Places,
    /// What `/mcp` offers.
    mcp: McpAccess,
    started: std::time::Instant,
}

impl Admin {
    pub fn new(config: &AdminConfig, metrics: Arc<Metrics>) -> Admin {
        if let Some(env) = &config.token_env {
            crate::cursor_mark::share_key(env.secret.expose().as_bytes());
        }
        let access = match &config.token_env {
            Some(env) => Access::Token {
                operator: env.secret.clone(),
                viewer: (config.viewer_token_env.as_ref()).map(|env| env.secret.clone()),
            },
            None if config.listen.ip().is_loopback() => Access::Local,
            None => {
                tracing::warn!(
                    listen = %config.listen,
                    "the admin API (/v1/*) is off: it listens beyond loopback without admin.token_env; health, readiness and metrics are served"
                );
                Access::Closed
            }
        };
        Admin {
            serving: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            rules: Rules {
                access,
                hosts: config.hosts.iter().map(|host| host.0.clone()).collect(),
            },
            metrics,
            replays: bulk::Replays::default(),
            tails: deliveries::Tails::default(),
            bodies: places::Places::new(BODIES_MAX, BODIES_PER_CREDENTIAL),
            mcp: config.mcp,
            started: std::time::Instant::now(),
        }
    }

    /// Reports ready from now on.
    pub fn ready(&self, serving: Serving) {
        let _ = self.serving.set(serving);
    }

    /// Reports not ready from now on, so that traffic moves elsewhere during the drain.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.tails.close();
    }

    /// Serves one admin request that came on `ends`, holding `_permit` (a place among the
    /// listener's requests) while it runs.
    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
        ends: Ends,
        _permit: RequestPermit,
    ) -> Response<ProxyBody> {
        let role = match self.rules.check(&request, ends.local) {
            Ok(role) => role,
            Err(refusal) => return refusal.into_response(),
        };
        // Owned: the endpoint names parts of the path while the request moves on.
        let path = request.uri().path().to_owned();
        let endpoint = match Endpoint::parse(&path) {
            Some(Endpoint::Mcp) if self.mcp == McpAccess::Off => None,
            found => found,
        };
        let Some(endpoint) = endpoint else {
            return AdminRefusal::NotFound.into_response();
        };
        if !endpoint.takes(request.method()) {
            return AdminRefusal::MethodNotAllowed(endpoint.allow()).into_response();
        }
        // Only a request that changes something has a body: a probe's or a read's is never
        // waited for, so that a sender holding one back cannot hold the port's places.
        let (mut head, body) = request.into_parts();
        let body = if matches!(head.method, Method::POST | Method::PATCH) {
            let _place = match self.bodies.take(role.credential()) {
                Ok(place) => place,
                Err(places::Full::All) => {
                    return AdminRefusal::TooMany(format!(
                        "{BODIES_MAX} requests' bodies are being read already; try again"
                    ))
                    .into_response();
                }
                Err(places::Full::Credential) => {
                    return AdminRefusal::TooMany(format!(
                        "this credential's {BODIES_PER_CREDENTIAL} requests' bodies are being read already, its share; try again"
                    ))
                    .into_response();
                }
            };
            let limit = match endpoint {
                Endpoint::Mcp => mcp::REQUEST_BODY_MAX,
                Endpoint::Api(Api::Try) => dry_run::REQUEST_BODY_MAX,
                _ => BODY_MAX,
            };
            match body::read_limited(&head.headers, body, limit, BODY_READ_TIMEOUT).await {
                Ok(body) => body,
                Err(error) => return AdminRefusal::BadRequest(error.to_string()).into_response(),
            }
        } else {
            Bytes::new()
        };
        let through = if matches!(endpoint, Endpoint::Mcp) {
            "mcp"
        } else {
            "api"
        };
        head.extensions.insert(Caller {
            by: format!("{through}:{}", role.credential()),
            client: Some(ends.peer),
        });
        head.extensions.insert(role);
        let request = Request::from_parts(head, body);
        if matches!(endpoint, Endpoint::Mcp) {
            if self.serving.get().is_none() {
                return AdminRefusal::Starting.into_response();
            }
            let writes = self.mcp == McpAccess::ReadWrite && role.may_change();
            return mcp::serve(self as Arc<dyn mcp::Api>, writes, request).await;
        }
        self.serve(endpoint, request).await
    }

    /// Answers a request made inside the process (a tool's), as the port answers one
    /// that met its rules.
    async fn answer(&self, request: Request<Bytes>) -> Response<ProxyBody> {
        let path = request.uri().path().to_owned();
        match Endpoint::parse(&path) {
            // A tool never names `/mcp` or the console.
            None | Some(Endpoint::Mcp | Endpoint::Console(_)) => {
                AdminRefusal::NotFound.into_response()
            }
            Some(endpoint) if !endpoint.takes(request.method()) => {
                AdminRefusal::MethodNotAllowed(endpoint.allow()).into_response()
            }
            Some(endpoint) => self.serve(endpoint, request).await,
        }
    }

    /// Answers a request to `endpoint`, which takes its method.
    async fn serve(&self, endpoint: Endpoint<'_>, request: Request<Bytes>) -> Response<ProxyBody> {
        let head = request.method() == Method::HEAD;
        let answer = match endpoint {
            Endpoint::Probe(probe) => self.probe(probe),
            Endpoint::Console(asset) => asset.response(),
            Endpoint::Api(api) => match self.serving.get() {
                Some(serving) => self.serve_api(serving, api, request).await,
                None => AdminRefusal::Starting.into_response(),
            },
            Endpoint::Mcp => AdminRefusal::NotFound.into_response(),
        };
        if head { without_body(answer) } else { answer }
    }

    fn probe(&self, probe: Probe) -> Response<ProxyBody> {
        match probe {
            Probe::Health => json_response(StatusCode::OK, json!({"status": "ok"}).to_string()),
            Probe::Ready => self.readiness(),
            Probe::Metrics => self.metrics(),
        }
    }

    fn metrics(&self) -> Response<ProxyBody> {
        let keys = self
            .serving
            .get()
            .map_or(KeyCounts::default(), |serving| serving.proxy.key_counts());
        let mut response = Response::new(full(self.metrics.encode(keys)));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        response
    }

    fn readiness(&self) -> Response<ProxyBody> {
        let ready = self.serving.get().is_some() && !self.shutting_down.load(Ordering::SeqCst);
        let (status, text) = if ready {
            (StatusCode::OK, "ready")
        } else if self.shutting_down.load(Ordering::SeqCst) {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "starting")
        };
        json_response(status, json!({ "status": text }).to_string())
    }
}

impl mcp::Api for Admin {
    fn answer(&self, request: Request<Bytes>) -> BoxFuture<'_, Response<ProxyBody>> {
        Box::pin(Admin::answer(self, request))
    }
}

impl Admin {
    /// Answers a request to the API (`GET` for a `HEAD`: its body is left out after).
    async fn serve_api(
        &self,
        serving: &Serving,
        api: Api<'_>,
        request: Request<Bytes>,
    ) -> Response<ProxyBody> {
        let recorder = serving.proxy.recorder();
        let query = request.uri().query();
        match api {
            Api::Overview => {
                let sources = overview::Sources {
                    proxy: &serving.proxy,
                    reloader: &serving.reloader,
                    metrics: &self.metrics,
                    started: self.started,
                };
                // A request without a role came from inside (a tool's): it only reads.
                let role = request.extensions().get::<Role>().copied();
                overview::overview(sources, role.unwrap_or(Role::Viewer)).await
            }
            Api::Deliveries => deliveries::list(recorder, query).await,
            Api::DeliveriesTail => {
                let role = request.extensions().get::<Role>().copied();
                let credential = role.unwrap_or(Role::Viewer).credential();
                deliveries::tail(&self.tails, recorder, query, credential)
            }
            Api::Delivery { id } => deliveries::get(recorder, id).await,
            other => serve_store_api(serving, &self.replays, other, request).await,
        }
    }
}

/// Answers a request to the API about routes, keys and the queue. A change it answers
/// with success is on stable storage first: the answer says it is saved.
async fn serve_store_api(
    serving: &Serving,
    replays: &bulk::Replays,
    api: Api<'_>,
    request: Request<Bytes>,
) -> Response<ProxyBody> {
    let changes_the_store = changes_the_store(&api, request.method());
    let answer = answer_store_api(serving, replays, api, request).await;
    if changes_the_store
        && answer.status().is_success()
        && let Err(error) = serving.proxy.store().flush().await
    {
        tracing::error!(%error, "an operator's change could not be synced to disk");
        return AdminRefusal::from(error).into_response();
    }
    answer
}

/// Whether `method` on `api` changes what the store keeps (an operator's change). A new
/// endpoint must say.
fn changes_the_store(api: &Api<'_>, method: &Method) -> bool {
    let writes = !matches!(*method, Method::GET | Method::HEAD);
    match api {
        Api::ClearScope { .. }
        | Api::Key { .. }
        | Api::Resolve { .. }
        | Api::Entity { .. }
        | Api::Pause { .. }
        | Api::Job { .. } => writes,
        // A bulk replay's revivals run after its answer; cancelling one changes nothing.
        Api::Replays { .. } | Api::Replay { .. } => false,
        Api::Overview
        | Api::Routes
        | Api::Reload
        | Api::Scopes
        | Api::Keys
        | Api::Queue
        | Api::Dead { .. }
        | Api::Try
        | Api::Deliveries
        | Api::DeliveriesTail
        | Api::Delivery { .. } => false,
    }
}

/// The answer of one request to the API about routes, keys and the queue.
async fn answer_store_api(
    serving: &Serving,
    replays: &bulk::Replays,
    api: Api<'_>,
    request: Request<Bytes>,
) -> Response<ProxyBody> {
    // Owned: a key's request takes the request's body along.
    let method = &request.method().clone();
    match api {
        Api::Routes => routes(serving),
        Api::Reload => reload(serving).await,
        Api::Scopes => scopes::list(&serving.proxy).await,
        Api::ClearScope { scope } => scopes::clear(&serving.proxy, scope, request).await,
        Api::Keys => keys::list(&serving.proxy, request.uri().query()).await,
        Api::Key { route, key } => keys::one(&serving.proxy, route, key, request).await,
        Api::Entity { route, entity } => {
            keys::entity(&serving.proxy, route, entity, &request).await
        }
        Api::Resolve { route, key } => keys::resolve(&serving.proxy, route, key, request).await,
        Api::Queue => queue::overview(&serving.proxy).await,
        Api::Pause { route, paused } => queue::pause(&serving.proxy, route, paused).await,
        Api::Dead { route } => queue::dead(&serving.proxy, route, request.uri().query()).await,
        Api::Job { route, key, replay } => {
            queue::job(&serving.proxy, method, route, key, replay).await
        }
        Api::Replays { route } => start_replay(serving, replays, route, request.uri().query()),
        Api::Replay { id } => replay_request(replays, method, id),
        Api::Try => dry_run::dry_run(&serving.proxy, request.body()),
        Api::Overview | Api::Deliveries | Api::DeliveriesTail | Api::Delivery { .. } => {
            AdminRefusal::NotFound.into_response()
        }
    }
}

/// `POST /v1/queue/{route}/replays?<filter>`: starts replaying the dead letters the
/// filter picks (the filter of `GET .../dead`).
fn start_replay(
    serving: &Serving,
    replays: &bulk::Replays,
    route: &str,
    query: Option<&str>,
) -> Response<ProxyBody> {
    let (route, deliveries) = match queue::queued_route(&serving.proxy, route) {
        Ok(found) => found,
        Err(refusal) => return refusal.into_response(),
    };
    let filter = match bulk::DeadFilter::parse(query, 1, 1) {
        Ok((filter, _, None)) => filter,
        Ok((_, _, Some(_))) => {
            return AdminRefusal::BadRequest("a replay takes no `after`".into()).into_response();
        }
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    match replays.start(deliveries, route, filter) {
        Ok(started) => json_response(StatusCode::ACCEPTED, started.to_string()),
        Err(reason) => AdminRefusal::TooMany(reason).into_response(),
    }
}

/// `GET /v1/replays/{id}`: a bulk replay's progress; `DELETE` cancels it.
fn replay_request(replays: &bulk::Replays, method: &Method, id: &str) -> Response<ProxyBody> {
    let Ok(id) = id.parse::<u64>() else {
        return AdminRefusal::NotFound.into_response();
    };
    let found = if *method == Method::DELETE {
        replays.cancel(id)
    } else {
        replays.get(id)
    };
    match found {
        Some(replay) => json_response(StatusCode::OK, replay.to_string()),
        None => AdminRefusal::NotFound.into_response(),
    }
}

/// A `HEAD` answer: the `GET` answer's status and headers, its length, no body. hyper
/// leaves the body out over HTTP/1.1 but sends it over HTTP/2.
fn without_body(answer: Response<ProxyBody>) -> Response<ProxyBody> {
    let (mut head, body) = answer.into_parts();
    if let Some(length) = hyper::body::Body::size_hint(&body).exact() {
        head.headers
            .insert(CONTENT_LENGTH, HeaderValue::from(length));
    }
    Response::from_parts(head, empty())
}

/// `GET /v1/routes`: every route with its resolved settings, and where unmatched
/// requests go.
fn routes(serving: &Serving) -> Response<ProxyBody> {
    let routing = serving.proxy.routing();
    let routes: Vec<_> = routing.table.routes().collect();
    let body = json!({
        "routes": routes,
        "unmatched": routing.unmatched,
        "upstream": routing.fallback_upstream.to_string(),
    });
    json_response(StatusCode::OK, body.to_string())
}

/// `POST /v1/reload`: reads the configuration file again.
async fn reload(serving: &Serving) -> Response<ProxyBody> {
    match serving.reloader.reload().await {
        Ok(reloaded) => json_response(StatusCode::OK, json!({ "reloaded": true, "routes": reloaded.routes, "restart_needed": reloaded.restart_needed }).to_string()),
        Err(invalid) => AdminRefusal::InvalidConfig(invalid.on_one_line()).into_response(),
    }
}
