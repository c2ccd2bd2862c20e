//! The admin listener: liveness, readiness, and inspection and removal of keys. Kept on
//! its own port (127.0.0.1 by default) so that providers never reach it.
//!
//! With `admin.token_env` set, every `/v1/*` request needs `Authorization: Bearer
//! <token>`, compared in constant time; health and readiness stay open for probes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use subtle::ConstantTimeEq;

use crate::body::{ProxyBody, empty};
use crate::config::values::Secret;
use crate::proxy::Proxy;
use crate::response::json_response;
use crate::store::{Forgotten, KeyState, Millis, store_key};

/// The admin service's state, shared by its connections.
pub struct Admin {
    /// Set once the store is open and the routes loaded.
    proxy: OnceLock<Arc<Proxy>>,
    shutting_down: AtomicBool,
    token: Option<Secret>,
}

impl Admin {
    pub fn new(token: Option<Secret>) -> Admin {
        Admin {
            proxy: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            token,
        }
    }

    /// Reports ready from now on.
    pub fn ready(&self, proxy: Arc<Proxy>) {
        let _ = self.proxy.set(proxy);
    }

    /// Reports not ready from now on, so that traffic moves elsewhere during the drain.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
        _peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let path = request.uri().path();
        match (request.method(), path) {
            (&Method::GET, "/healthz") => {
                json_response(StatusCode::OK, json!({"status": "ok"}).to_string())
            }
            (&Method::GET, "/readyz") => self.readiness(),
            (_, path) if path.starts_with("/v1/") => {
                if !self.authorized(&request) {
                    let mut response = error(
                        StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        "a valid bearer token is required",
                    );
                    response
                        .headers_mut()
                        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                    return response;
                }
                match path
                    .strip_prefix("/v1/keys/")
                    .and_then(|rest| rest.split_once('/'))
                {
                    Some((route, key)) => self.key(request.method(), route, key).await,
                    None => error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
                }
            }
            _ => error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
        }
    }

    fn readiness(&self) -> Response<ProxyBody> {
        let ready = self.proxy.get().is_some() && !self.shutting_down.load(Ordering::SeqCst);
        let (status, text) = if ready {
            (StatusCode::OK, "ready")
        } else if self.shutting_down.load(Ordering::SeqCst) {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "starting")
        };
        json_response(status, json!({ "status": text }).to_string())
    }

    fn authorized(&self, request: &Request<Incoming>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let presented = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or("");
        presented.as_bytes().ct_eq(token.expose().as_bytes()).into()
    }

    /// `GET` or `DELETE /v1/keys/{route}/{key}`; the key is percent-decoded.
    async fn key(&self, method: &Method, route_name: &str, raw_key: &str) -> Response<ProxyBody> {
        let Some(proxy) = self.proxy.get() else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "starting",
                "the store is not open yet",
            );
        };
        let Some(route) = proxy.routes().by_name(route_name) else {
            return error(
                StatusCode::NOT_FOUND,
                "no_such_route",
                &format!("no route named `{route_name}`"),
            );
        };
        let key = percent_encoding::percent_decode_str(raw_key).decode_utf8_lossy();
        let full_key = store_key(&route.namespace, &key);
        let store = proxy.store();
        match *method {
            Method::GET => match store.inspect(&full_key).await {
                Ok(Some(state)) => json_response(
                    StatusCode::OK,
                    describe(route_name, &key, &state).to_string(),
                ),
                Ok(None) => error(
                    StatusCode::NOT_FOUND,
                    "absent",
                    "the key is absent, released or expired",
                ),
                Err(failure) => error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    &failure.to_string(),
                ),
            },
            Method::DELETE => match store.forget(&full_key).await {
                Ok(Forgotten::Removed) => {
                    tracing::info!(route = route_name, key = %key, "key forgotten through the admin API");
                    let mut response = Response::new(empty());
                    *response.status_mut() = StatusCode::NO_CONTENT;
                    response
                }
                Ok(Forgotten::Absent) => error(
                    StatusCode::NOT_FOUND,
                    "absent",
                    "the key is absent, released or expired",
                ),
                Ok(Forgotten::InFlight) => error(
                    StatusCode::CONFLICT,
                    "in_flight",
                    "the key is being processed; forgetting it could run the event twice at once",
                ),
                Err(failure) => error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    &failure.to_string(),
                ),
            },
            _ => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "use GET or DELETE",
            ),
        }
    }
}

fn error(status: StatusCode, code: &str, detail: &str) -> Response<ProxyBody> {
    json_response(
        status,
        json!({ "error": code, "detail": detail }).to_string(),
    )
}

fn timestamp(at: Millis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at)).to_string()
}

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
            "claimed_at": timestamp(*claimed_at),
            "completed_at": null,
            "expires_at": timestamp(*lease_until),
            "upstream_status": null,
            "body_sha256": hex::encode(fingerprint),
        }),
        KeyState::Done(done) => json!({
            "route": route,
            "key": key,
            "state": "done",
            "claimed_at": timestamp(done.claimed_at),
            "completed_at": timestamp(done.completed_at),
            "expires_at": timestamp(done.expires_at),
            "upstream_status": done.upstream_status,
            "body_sha256": hex::encode(done.fingerprint),
        }),
    }
}
