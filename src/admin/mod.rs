//! The admin listener: liveness, readiness, metrics, the resolved routes, live reload,
//! keys and entities (`keys.rs`), scopes counted and cleared (`scopes.rs`), queued
//! delivery's routes, paused and resumed, and its dead letters (`queue.rs`, `bulk.rs`),
//! the delivery log (`deliveries.rs`), `/mcp` (`mcp/`), and the console (`console/`,
//! with `/v1/overview` from `overview.rs`). Kept on its own port (127.0.0.1 by default)
//! so that providers never reach it.
//!
//! Every request first meets [`access`]'s rules (the Host and Origin that keep web pages
//! out); then [`table`], the route table, finds its endpoint, whose own rule asks for the
//! token its role needs and a `POST`'s type ([`extract::admit`]) before its handler runs.
//! Under `/v1/` and at `/mcp`, a path or method the table lacks asks for the token before
//! its `404` or `405`.

mod access;
pub(crate) mod answers;
mod bulk;
mod charts;
mod console;
mod deliveries;
mod dry_run;
mod endpoint;
mod extract;
mod keys;
mod mcp;
mod openapi;
mod overview;
mod places;
mod probes;
mod queue;
mod routes;
mod scopes;
mod state;
mod table;
mod tails;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::ServiceExt;

use crate::body::ProxyBody;
use crate::config::{AdminConfig, Limits};
use crate::metrics::Metrics;
use crate::server::{Ends, RequestPermit};
use access::{Access, Rules};
use state::AdminState;

pub use state::Serving;

/// The admin API described in OpenAPI 3.1, every endpoint included (`/mcp` too): the
/// document `docs/openapi.json` holds.
pub fn openapi_document() -> serde_json::Value {
    openapi::document(&table::endpoints(crate::config::McpAccess::ReadWrite))
}

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

/// The admin port: its state, and the router that answers its requests.
pub struct Admin {
    state: Arc<AdminState>,
    router: axum::Router,
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
        let rules = Rules {
            access,
            hosts: config.hosts.iter().map(|host| host.0.clone()).collect(),
        };
        let state = Arc::new(AdminState::new(rules, metrics, config.mcp));
        let router = table::port(&state);
        Admin { state, router }
    }

    /// Reports ready from now on.
    pub fn ready(&self, serving: Serving) {
        let _ = self.state.serving.set(serving);
    }

    /// Reports not ready from now on, so that traffic moves elsewhere during the drain.
    pub fn shutting_down(&self) {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        self.state.tails.close();
    }

    /// Serves one admin request that came on `ends`, holding `_permit` (a place among the
    /// listener's requests) while it runs: the Host and Origin rules first, then the
    /// route table's router.
    pub async fn handle(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        ends: Ends,
        _permit: RequestPermit,
    ) -> Response<ProxyBody> {
        if let Err(refusal) = self.state.rules.check(&request, ends.local) {
            return refusal.into_response();
        }
        request.extensions_mut().insert(ends);
        match self.router.clone().oneshot(request).await {
            Ok(answer) => extract::into_port_body(answer),
            Err(never) => match never {},
        }
    }
}
