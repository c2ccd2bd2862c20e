//! The proxy's background tasks while it runs: the sweeper that removes expired records,
//! the count of held keys behind `dedupe_keys_held`, this replica's report to a shared
//! store (`store::replicas`), and each minute's figures for the charts (`store::minutes`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::metrics::RouteCounters;
use crate::proxy::Proxy;
use crate::route::DeliveryMode;
use crate::store::minutes::{MINUTE, minute_of};
use crate::store::replicas::{REPORT_EVERY, ReplicaReport};
use crate::store::{ClaimStore, Clock, SystemClock};

/// How often the sweeper looks for expired records, and how many one sweep call reads
/// before yielding.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const SWEEP_BATCH: usize = 1000;

/// Removes expired records in the background, a batch at a time.
pub(crate) async fn sweep_forever(store: Arc<dyn ClaimStore>, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(SWEEP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        loop {
            let started = Instant::now();
            match store.sweep(SWEEP_BATCH).await {
                Ok(swept) => {
                    if swept.removed > 0 {
                        metrics.swept(swept.removed);
                        tracing::debug!(removed = swept.removed, "swept expired keys");
                    }
                    if swept.examined < SWEEP_BATCH {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default();
                        metrics.sweep_succeeded(now.as_secs());
                        break;
                    }
                }
                Err(error) => {
                    metrics.store_error();
                    tracing::warn!(%error, "sweep failed");
                    break;
                }
            }
            // A large backlog (a million keys expiring together) is swept at half of one
            // core at most, so that deliveries keep their latency meanwhile.
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

/// How often `dedupe_keys_held` is counted again.
const COUNT_HELD_EVERY: Duration = Duration::from_secs(5);

/// Keeps `dedupe_keys_held` current: counts the store's held keys every
/// [`COUNT_HELD_EVERY`], for each route by its namespace.
pub(crate) async fn count_held_forever(proxy: Arc<Proxy>, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(COUNT_HELD_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match proxy.store().count_held().await {
            Ok(counts) => {
                let counts: std::collections::HashMap<String, u64> = counts.into_iter().collect();
                for route in proxy.routing().table.routes() {
                    let held = counts.get(&route.namespace).copied().unwrap_or(0);
                    metrics.keys_held(&route.name, held);
                }
            }
            Err(error) => {
                metrics.store_error();
                tracing::warn!(%error, "counting the held keys failed");
            }
        }
    }
}

/// This replica's name among others: the host's (a pod's name on Kubernetes), the
/// process's id and a number drawn once, so that replicas sharing a host name (host
/// networking) and a pid (1, in containers) differ.
pub(crate) fn replica_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let id = ID.get_or_init(|| {
        let host = crate::delivery_log::replica_name();
        let drawn: u32 = rand::random();
        format!(
            "{}:{}:{drawn:08x}",
            host.as_deref().unwrap_or("host"),
            std::process::id()
        )
    });
    id.clone()
}

/// Reports this replica to a shared store at once and every [`REPORT_EVERY`]: its
/// identity, version, start and requests so far. A failed report is tried at the next.
pub(crate) async fn report_forever(proxy: Arc<Proxy>, metrics: Arc<Metrics>) {
    let clock = SystemClock;
    let (id, started_at) = (replica_id(), clock.now());
    let mut ticks = tokio::time::interval(REPORT_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let mut requests = BTreeMap::new();
        for route in proxy.routing().table.routes() {
            for (outcome, count) in metrics.requests_of(&route.name) {
                *requests.entry(outcome.to_owned()).or_insert(0) += count;
            }
        }
        let report = ReplicaReport {
            id: id.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at,
            seen_at: clock.now(),
            requests,
        };
        if let Err(error) = proxy.store().report_replica(&report).await {
            metrics.store_error();
            tracing::debug!(%error, "this replica's report to the store failed");
        }
    }
}

/// At each minute's end, keeps what this replica's counters gained in it, then writes the
/// minutes the store has not taken yet (a day of them at most, while it fails).
pub(crate) async fn record_minutes_forever(proxy: Arc<Proxy>, metrics: Arc<Metrics>) {
    // The counters start at zero with the process, as the book's last reading does.
    let replica = replica_id();
    let mut last_ended = None;
    loop {
        let now = SystemClock.now();
        let next = minute_of(now) + MINUTE;
        tokio::time::sleep(Duration::from_millis(next - now)).await;
        // The sleep's clock is not the wall's: a minute is ended once the wall says it
        // ended, and never twice (a clock stepped back waits for it again).
        let ended = minute_of(SystemClock.now()).checked_sub(MINUTE);
        if ended.is_none() || ended <= last_ended {
            continue;
        }
        last_ended = ended;
        let counters = route_counters(&proxy, &metrics);
        (metrics.minutes).end_minute(&replica, ended.unwrap_or_default(), counters);
        write_minutes(&proxy, &metrics).await;
    }
}

/// At shutdown: ends the minute running (what it holds so far) and writes what waits,
/// giving the store `within`.
pub(crate) async fn record_last_minute(proxy: &Proxy, metrics: &Metrics, within: Duration) {
    let counters = route_counters(proxy, metrics);
    let minute = minute_of(SystemClock.now());
    metrics.minutes.end_minute(&replica_id(), minute, counters);
    if tokio::time::timeout(within, write_minutes(proxy, metrics))
        .await
        .is_err()
    {
        tracing::warn!("the charts' last minutes were not stored in time at shutdown");
    }
}

/// Each route's counters now.
pub(crate) fn route_counters(
    proxy: &Proxy,
    metrics: &Metrics,
) -> std::collections::HashMap<String, RouteCounters> {
    let routing = proxy.routing();
    let routes = routing.table.routes();
    metrics.counters_of(routes.map(|route| {
        let queued = route.policy.delivery == DeliveryMode::Queued;
        (route.name.as_str(), queued)
    }))
}

/// Writes the ended minutes newest first (at shutdown, after an outage, the last minute
/// is the one only this process has), up to the first the store does not take.
async fn write_minutes(proxy: &Proxy, metrics: &Metrics) {
    let mut written = Vec::new();
    for figures in metrics.minutes.unwritten().into_iter().rev() {
        if let Err(error) = proxy.store().record_minute(&figures).await {
            metrics.store_error();
            tracing::debug!(%error, "the store did not take a minute of the charts' figures");
            break;
        }
        written.push(figures);
    }
    metrics.minutes.forget_written(&written);
    metrics.minutes_unwritten(metrics.minutes.backlog());
}
