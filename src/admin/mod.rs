//! The admin listener: liveness, readiness, metrics, the resolved routes, live reload,
//! keys: listed, inspected, forgotten, and held ones resolved; and the newest version done
//! for an entity (`order:`), inspected or forgotten; queued delivery's routes, paused and
//! resumed, and its dead letters (`queue.rs`, `bulk.rs`). Kept on its own port
//! (127.0.0.1 by default) so that providers never reach it.
//!
//! Every request first meets [`access`]: the Host and Origin rules that keep web pages
//! out, and the bearer token of `/v1/*`; then [`endpoint`] names what it asks for.

mod access;
mod bulk;
mod deliveries;
mod endpoint;
mod queue;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::body::{self, ProxyBody, empty, full};
use crate::config::{AdminConfig, Limits};
use crate::metrics::{KeyCounts, Metrics};
use crate::proxy::Proxy;
use crate::proxy::operator::{self, Resolving};
use crate::reload::Reloader;
use crate::response::{AdminRefusal, json_response};
use crate::route::Route;
use crate::server::{Ends, RequestPermit};
use crate::store::{
    Forgotten, HeldRecord, KeyState, QUEUED_STATUS, RESOLVED_STATUS, Resolution,
    STALE_SKIPPED_STATUS, StateFilter, StoreError, entity_key, rfc3339, store_key,
};
use access::{Access, Rules};
use endpoint::{Api, Endpoint, Probe};

/// The most connections the admin port takes: probes, a scraper and a few operators need
/// few, and the descriptors they take are set aside from the proxy's.
pub const MAX_CONNECTIONS: usize = 64;

/// The admin listener's limits: [`MAX_CONNECTIONS`], and `limits`' default deadlines.
pub fn listener_limits() -> Limits {
    Limits {
        max_connections: MAX_CONNECTIONS,
        max_requests: MAX_CONNECTIONS,
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
}

impl Admin {
    pub fn new(config: &AdminConfig, metrics: Arc<Metrics>) -> Admin {
        let access = match &config.token_env {
            Some(env) => Access::Token(env.secret.clone()),
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
        if let Err(refusal) = self.rules.check(&request, ends.local) {
            return refusal.into_response();
        }
        // Owned: a resolution takes the request's body along with the path's parts.
        let path = request.uri().path().to_owned();
        let Some(endpoint) = Endpoint::parse(&path) else {
            return AdminRefusal::NotFound.into_response();
        };
        if !endpoint.takes(request.method()) {
            return AdminRefusal::MethodNotAllowed(endpoint.allow()).into_response();
        }
        let head = request.method() == Method::HEAD;
        let answer = match endpoint {
            Endpoint::Probe(probe) => self.probe(probe),
            Endpoint::Api(api) => match self.serving.get() {
                Some(serving) => self.serve_api(serving, api, request).await,
                None => AdminRefusal::Starting.into_response(),
            },
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

impl Admin {
    /// Answers a request to the API (`GET` for a `HEAD`: its body is left out after).
    async fn serve_api(
        &self,
        serving: &Serving,
        api: Api<'_>,
        request: Request<Incoming>,
    ) -> Response<ProxyBody> {
        let recorder = serving.proxy.recorder();
        let query = request.uri().query();
        match api {
            Api::Deliveries => deliveries::list(recorder, query).await,
            Api::DeliveriesTail => deliveries::tail(&self.tails, recorder, query),
            Api::Delivery { id } => deliveries::get(recorder, id).await,
            other => serve_store_api(serving, &self.replays, other, request).await,
        }
    }
}

/// Answers a request to the API about routes, keys and the queue.
async fn serve_store_api(
    serving: &Serving,
    replays: &bulk::Replays,
    api: Api<'_>,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let method = request.method();
    match api {
        Api::Routes => routes(serving),
        Api::Reload => reload(serving).await,
        Api::Keys => list_keys(serving, request.uri().query()).await,
        Api::Key { route, key } => key_request(serving, method, route, key).await,
        Api::Entity { route, entity } => entity_request(serving, method, route, entity).await,
        Api::Resolve { route, key } => resolve(serving, route, key, request).await,
        Api::Queue => queue::overview(&serving.proxy).await,
        Api::Pause { route, paused } => queue::pause(&serving.proxy, route, paused).await,
        Api::Dead { route } => queue::dead(&serving.proxy, route, request.uri().query()).await,
        Api::Job { route, key, replay } => {
            queue::job(&serving.proxy, method, route, key, replay).await
        }
        Api::Replays { route } => start_replay(serving, replays, route, request.uri().query()),
        Api::Replay { id } => replay_request(replays, method, id),
        Api::Deliveries | Api::DeliveriesTail | Api::Delivery { .. } => {
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
    let reloader = Arc::clone(&serving.reloader);
    let reloaded = tokio::task::spawn_blocking(move || reloader.reload()).await;
    match reloaded {
        Ok(Ok(reloaded)) => json_response(StatusCode::OK, json!({ "reloaded": true, "routes": reloaded.routes, "restart_needed": reloaded.restart_needed }).to_string()),
        Ok(Err(invalid)) => AdminRefusal::InvalidConfig(invalid.on_one_line()).into_response(),
        Err(failed) => AdminRefusal::Internal(failed.to_string()).into_response(),
    }
}

/// `GET` or `DELETE /v1/keys/{route}/{key}`; the key is percent-decoded.
async fn key_request(
    serving: &Serving,
    method: &Method,
    route_name: &str,
    raw_key: &str,
) -> Response<ProxyBody> {
    let proxy = &serving.proxy;
    let routing = proxy.routing();
    let Some(route) = routing.table.by_name(route_name) else {
        return AdminRefusal::NoSuchRoute(route_name.to_owned()).into_response();
    };
    let key = percent_encoding::percent_decode_str(raw_key).decode_utf8_lossy();
    let full_key = store_key(&route.namespace, &key);
    let store = proxy.store();
    match *method {
        Method::DELETE => {
            match operator::forget(store.as_ref(), &routing, route, &full_key).await {
                Ok(Forgotten::Removed) => {
                    tracing::info!(route = route_name, key = %key, "key forgotten through the admin API");
                    let mut response = Response::new(empty());
                    *response.status_mut() = StatusCode::NO_CONTENT;
                    response
                }
                Ok(Forgotten::Absent) => AdminRefusal::Absent.into_response(),
                Ok(Forgotten::InFlight) => AdminRefusal::InFlight.into_response(),
                Ok(Forgotten::Held) => AdminRefusal::Held.into_response(),
                Err(failure) => AdminRefusal::from(failure).into_response(),
            }
        }
        // GET, or HEAD answered as one: the endpoint takes no other.
        _ => match store.inspect(&full_key).await {
            Ok(Some(state)) => json_response(
                StatusCode::OK,
                describe(route_name, &key, &state).to_string(),
            ),
            Ok(None) => AdminRefusal::Absent.into_response(),
            Err(failure) => AdminRefusal::from(failure).into_response(),
        },
    }
}

/// `GET /v1/entities/{route}/{entity}`: the newest version done for an entity of a route
/// with `order:`; `DELETE` forgets it (after a version far ahead made real events stale).
async fn entity_request(
    serving: &Serving,
    method: &Method,
    route_name: &str,
    raw_entity: &str,
) -> Response<ProxyBody> {
    let routing = serving.proxy.routing();
    let Some(route) = routing.table.by_name(route_name) else {
        return AdminRefusal::NoSuchRoute(route_name.to_owned()).into_response();
    };
    if route.order.is_none() {
        return AdminRefusal::NoOrder(route_name.to_owned()).into_response();
    }
    let entity = percent_encoding::percent_decode_str(raw_entity).decode_utf8_lossy();
    let full_key = entity_key(&route.namespace, &entity);
    let store = serving.proxy.store();
    match *method {
        Method::DELETE => match store.forget_entity(&full_key).await {
            Ok(true) => {
                tracing::info!(route = route_name, entity = %entity, "entity's version forgotten through the admin API");
                let mut response = Response::new(empty());
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            Ok(false) => AdminRefusal::NoVersion.into_response(),
            Err(failure) => AdminRefusal::from(failure).into_response(),
        },
        // GET, or HEAD answered as one: the endpoint takes no other.
        _ => match store.newest_version(&full_key).await {
            Ok(Some(record)) => {
                let body = json!({
                    "route": route_name,
                    "entity": entity,
                    "newest_version": record.newest.text,
                    "recorded_at": rfc3339(record.recorded_at),
                    "expires_at": rfc3339(record.expires_at),
                });
                json_response(StatusCode::OK, body.to_string())
            }
            Ok(None) => AdminRefusal::NoVersion.into_response(),
            Err(failure) => AdminRefusal::from(failure).into_response(),
        },
    }
}

/// The most keys one page of `GET /v1/keys` lists, and how many without `limit`.
const LIST_LIMIT_MAX: usize = 1000;
const LIST_LIMIT_DEFAULT: usize = 100;

/// `GET /v1/keys?route=R[&state=in_flight|done|held][&limit=N][&after=CURSOR]`: a page of
/// a route's keys, and the cursor of the next page (`null` after the last).
async fn list_keys(serving: &Serving, query: Option<&str>) -> Response<ProxyBody> {
    let (mut route_name, mut state, mut limit, mut after) = (None, None, LIST_LIMIT_DEFAULT, None);
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let bad = |reason: String| AdminRefusal::BadRequest(reason).into_response();
        match &*name {
            "route" => route_name = Some(value.into_owned()),
            "state" => match StateFilter::parse(&value) {
                Some(filter) => state = Some(filter),
                None => {
                    return bad(format!(
                        "state `{value}` is not one of in_flight, done, held"
                    ));
                }
            },
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=LIST_LIMIT_MAX).contains(&n) => limit = n,
                _ => return bad(format!("limit must be a number from 1 to {LIST_LIMIT_MAX}")),
            },
            "after" => after = Some(value.into_owned()),
            other => return bad(format!("unknown query parameter `{other}`")),
        }
    }
    let Some(route_name) = route_name else {
        return AdminRefusal::BadRequest("`route` is required".into()).into_response();
    };
    let routing = serving.proxy.routing();
    let Some(route) = routing.table.by_name(&route_name) else {
        return AdminRefusal::NoSuchRoute(route_name).into_response();
    };
    let store = serving.proxy.store();
    let page = match store
        .list(&route.namespace, state, after.as_deref(), limit)
        .await
    {
        Ok(page) => page,
        Err(StoreError::BadRequest(reason)) => {
            return AdminRefusal::BadRequest(reason).into_response();
        }
        Err(failure) => {
            return AdminRefusal::from(failure).into_response();
        }
    };
    let namespace = format!("{}:", route.namespace);
    let keys: Vec<_> = page
        .keys
        .iter()
        .map(|(full_key, state)| {
            let key = full_key.strip_prefix(&namespace).unwrap_or(full_key);
            describe(&route_name, key, state)
        })
        .collect();
    let body = json!({ "keys": keys, "next": page.next });
    json_response(StatusCode::OK, body.to_string())
}

/// The largest body `POST .../resolve` reads.
const RESOLVE_BODY_MAX: u64 = 1024;

/// `POST /v1/keys/{route}/{key}/resolve` with `{"outcome":"done"}` (the work happened:
/// duplicates get the duplicate answer) or `{"outcome":"release"}` (the next delivery runs
/// it), and `"held_at"` if wanted (the hold the operator looked into, as `GET` showed it: a
/// key held again since is left alone).
async fn resolve(
    serving: &Serving,
    route_name: &str,
    raw_key: &str,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let routing = serving.proxy.routing();
    let Some(route) = routing.table.by_name(route_name) else {
        return AdminRefusal::NoSuchRoute(route_name.to_owned()).into_response();
    };
    let (resolution, expected_hold) = match asked_resolution(route, request).await {
        Ok(asked) => asked,
        Err(refusal) => return refusal.into_response(),
    };
    let key = percent_encoding::percent_decode_str(raw_key).decode_utf8_lossy();
    let full_key = store_key(&route.namespace, &key);
    let store = serving.proxy.store();
    let is_the_hold = |held: &HeldRecord| {
        expected_hold
            .as_ref()
            .is_none_or(|expected| *expected == rfc3339(held.held_at))
    };
    let resolved = operator::resolve(
        store.as_ref(),
        &routing,
        route,
        &full_key,
        resolution,
        is_the_hold,
    );
    match resolved.await {
        Ok(Resolving::Resolved) => {
            let outcome = match resolution {
                Resolution::Done { .. } => "done",
                Resolution::Release => "release",
            };
            tracing::info!(route = route_name, key = %key, outcome, "held key resolved through the admin API");
            match store.inspect(&full_key).await {
                Ok(Some(state)) => json_response(
                    StatusCode::OK,
                    describe(route_name, &key, &state).to_string(),
                ),
                _ => json_response(
                    StatusCode::OK,
                    json!({ "route": route_name, "key": key, "state": "absent" }).to_string(),
                ),
            }
        }
        Ok(Resolving::NotHeld) => AdminRefusal::NotHeld.into_response(),
        Ok(Resolving::HeldAgain) => AdminRefusal::HeldAgain.into_response(),
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// The resolution a `POST .../resolve` body asks for, and the hold it names if any.
async fn asked_resolution(
    route: &Route,
    request: Request<Incoming>,
) -> Result<(Resolution, Option<String>), AdminRefusal> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Asked {
        outcome: String,
        held_at: Option<String>,
    }
    let (head, body) = request.into_parts();
    let body = body::read_limited(&head.headers, body, RESOLVE_BODY_MAX, RESOLVE_READ_TIMEOUT)
        .await
        .map_err(|error| AdminRefusal::BadRequest(error.to_string()))?;
    let asked = serde_json::from_slice::<Asked>(&body).ok();
    let resolution = match asked.as_ref().map(|asked| asked.outcome.as_str()) {
        Some("done") => Resolution::Done {
            retention: route.policy.retention,
        },
        Some("release") => Resolution::Release,
        _ => {
            return Err(AdminRefusal::BadRequest(
                r#"the body must be {"outcome":"done"} or {"outcome":"release"}, with "held_at" if wanted"#.into(),
            ));
        }
    };
    Ok((resolution, asked.and_then(|asked| asked.held_at)))
}

/// How long `POST .../resolve` waits for its (small) body.
const RESOLVE_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin API's view of a key.
fn describe(route: &str, key: &str, state: &KeyState) -> serde_json::Value {
    match state {
        KeyState::InFlight {
            claimed_at,
            lease_until,
            fingerprint,
        } => json!({
            "route": route,
            "key": key,
            "state": "in_flight",
            "claimed_at": rfc3339(*claimed_at),
            "completed_at": null,
            "expires_at": rfc3339(*lease_until),
            "upstream_status": null,
            "body_sha256": hex::encode(fingerprint),
        }),
        KeyState::Done(done) => json!({
            "route": route,
            "key": key,
            "state": "done",
            "claimed_at": rfc3339(done.claimed_at),
            "completed_at": rfc3339(done.completed_at),
            "expires_at": rfc3339(done.expires_at),
            // None where no answer from the app was seen.
            "upstream_status": (!matches!(done.upstream_status, RESOLVED_STATUS | STALE_SKIPPED_STATUS | QUEUED_STATUS)).then_some(done.upstream_status),
            "done_because": match done.upstream_status {
                RESOLVED_STATUS => "resolved",
                STALE_SKIPPED_STATUS => "stale_skipped",
                QUEUED_STATUS => "queued",
                _ => "upstream_success",
            },
            "body_sha256": hex::encode(done.fingerprint),
        }),
        KeyState::Held(held) => json!({
            "route": route,
            "key": key,
            "state": "held",
            "claimed_at": rfc3339(held.claimed_at),
            "held_at": rfc3339(held.held_at),
            "completed_at": null,
            "expires_at": rfc3339(held.expires_at),
            "upstream_status": null,
            "held_because": held.reason.as_str(),
            "body_sha256": hex::encode(held.fingerprint),
        }),
    }
}
