//! The endpoints open to anyone, for load balancers and scrapers: liveness, readiness
//! and the metrics.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::answers::{Status, answer_json};
use super::state::AdminState;
use crate::body::{ProxyBody, full};
use crate::metrics::KeyCounts;
use axum::extract::State;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

/// `GET /healthz`: the process answers.
pub(super) async fn health() -> Response<ProxyBody> {
    let status = "ok".to_owned();
    answer_json(StatusCode::OK, &Status { status })
}

/// `GET /readyz`: the store is open and the routes loaded, and no drain has begun.
pub(super) async fn readiness(State(state): State<Arc<AdminState>>) -> Response<ProxyBody> {
    let (status, text) = if state.shutting_down.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else if state.serving.get().is_none() {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    } else {
        (StatusCode::OK, "ready")
    };
    answer_json(
        status,
        &Status {
            status: text.to_owned(),
        },
    )
}

/// `GET /metrics`: every metric, in OpenMetrics' text.
pub(super) async fn metrics(State(state): State<Arc<AdminState>>) -> Response<ProxyBody> {
    let keys = state
        .serving
        .get()
        .map_or(KeyCounts::default(), |serving| serving.proxy.key_counts());
    let mut response = Response::new(full(state.metrics.encode(keys)));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
