//! `GET /v1/overview`: the state of the proxy at a glance, as the console's first page
//! shows it: who asks (and whether they may change anything), the version and uptime, the
//! store's health, the last reload, and each route's counts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::{Response, StatusCode};

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;

use super::access::Role;
use super::answers::{
    AccessView, Overview, QueueRoute, ReplicaList, ReplicaView, RouteOverview, StoreHealth,
    answer_json,
};
use super::extract::Live;
use super::state::AdminState;
use crate::body::ProxyBody;
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::reload::Reloader;
use crate::store::log::Fate;
use crate::store::replicas::SILENT_AFTER;
use crate::store::{Clock, SystemClock, millis, rfc3339};

/// How long the store's health check waits for an answer.
const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A key no delivery has, read to see whether the store answers.
const PROBE_KEY: &str = "dedupe-proxy:overview-probe";

pub(super) async fn overview(
    State(state): State<Arc<AdminState>>,
    Live(serving): Live,
    Extension(role): Extension<Role>,
) -> Response<ProxyBody> {
    let (proxy, reloader): (&Proxy, &Reloader) = (&serving.proxy, &serving.reloader);
    let role_credential = role.credential();
    let (metrics, started): (&Metrics, Instant) = (&state.metrics, state.started);
    let answered = tokio::time::timeout(STORE_CHECK_TIMEOUT, proxy.store().inspect(PROBE_KEY));
    // A store's message may quote what its driver was given: masked, as every answer's.
    let store_error = match answered.await {
        Ok(Ok(_)) => None,
        Ok(Err(failure)) => Some(crate::redact::text(&failure.to_string()).into_owned()),
        Err(_) => Some(format!("no answer in {STORE_CHECK_TIMEOUT:?}")),
    };
    let counts = proxy.key_counts();
    let queues = queue_counts(proxy).await;
    let routing = proxy.routing();
    let routes = routing
        .table
        .routes()
        .map(|route| RouteOverview {
            route: route.name.clone(),
            scope: route.namespace.clone(),
            delivery: route.policy.delivery,
            requests: metrics
                .requests_of(&route.name)
                .into_iter()
                .map(|(outcome, count)| (outcome.to_owned(), count))
                .collect(),
            held_keys: metrics.held_of(&route.name),
            queue: queues
                .iter()
                .find(|queue| queue.route == route.name)
                .cloned(),
        })
        .collect();
    let role = match role {
        Role::Operator { .. } => "operator",
        Role::Viewer | Role::Anyone => "viewer",
    };
    let answer = Overview {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_seconds: started.elapsed().as_secs_f64(),
        access: AccessView {
            role: role.to_owned(),
            credential: role_credential.to_owned(),
        },
        store: StoreHealth {
            kind: reloader.store_kind().to_owned(),
            healthy: store_error.is_none(),
            error: store_error,
            done_keys: counts.done,
            errors: metrics.store_errors(),
            outcomes_announced: proxy.store().announces_outcomes(),
        },
        claims_in_flight: counts.in_flight as u64,
        reload: reloader.last(),
        delivery_log: proxy.recorder().log().is_some(),
        outcomes: Fate::ALL
            .iter()
            .map(|fate| fate.as_str().to_owned())
            .collect(),
        routes,
        replicas: replicas(proxy).await,
    };
    answer_json(StatusCode::OK, &answer)
}

/// The replicas sharing the store as they last reported; none on a store that is not
/// shared, an empty list where it did not answer.
async fn replicas(proxy: &Proxy) -> Option<ReplicaList> {
    let asked = tokio::time::timeout(STORE_CHECK_TIMEOUT, proxy.store().replicas());
    let reported = match asked.await {
        Ok(Ok(None)) => return None,
        Ok(Ok(Some(reported))) => reported,
        Ok(Err(_)) | Err(_) => Vec::new(),
    };
    let now = SystemClock.now();
    let mut totals = BTreeMap::new();
    let mut replicas: Vec<ReplicaView> = reported
        .into_iter()
        .map(|report| {
            for (outcome, count) in &report.requests {
                let total: &mut u64 = totals.entry(outcome.clone()).or_insert(0);
                *total = total.saturating_add(*count);
            }
            ReplicaView {
                silent: now.saturating_sub(report.seen_at) > millis(SILENT_AFTER),
                started_at: rfc3339(report.started_at),
                last_seen: rfc3339(report.seen_at),
                id: report.id,
                version: report.version,
                requests: report.requests,
            }
        })
        .collect();
    replicas.sort_by(|a, b| a.id.cmp(&b.id));
    Some(ReplicaList {
        this: crate::background::replica_id(),
        replicas,
        totals,
    })
}

/// Each queued route's counts, or none where the store keeps no queue or did not say.
async fn queue_counts(proxy: &Proxy) -> Vec<QueueRoute> {
    let Some(deliveries) = proxy.deliveries() else {
        return Vec::new();
    };
    let Ok(Ok(routes)) = tokio::time::timeout(STORE_CHECK_TIMEOUT, deliveries.routes()).await
    else {
        return Vec::new();
    };
    routes.iter().map(super::queue::described).collect()
}
