//! Metrics: every metric's name, help text and labels in one place, recorded by the
//! proxy, the store sweeper and the configuration reloader, and encoded for `GET /metrics`
//! (prometheus-client's text exposition).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

mod log;
mod per_minute;
mod queue;

pub(crate) use log::{LogDrop, LogMetrics};
pub(crate) use per_minute::{LATENCY_BUCKETS, MinuteBook, RouteCounters, quantile_ms};
pub(crate) use queue::{AttemptResult, QueueGauges, QueueMetrics};

use crate::response::DedupeStatus;
use crate::store::DiskSyncs;
use crate::verify::VerifyError;

/// Spans not exported because the export queue was full (`crate::telemetry`), for
/// `dedupe_trace_spans_dropped_total`: process-wide, as the tracer is.
pub static SPANS_DROPPED: std::sync::LazyLock<Counter> = std::sync::LazyLock::new(Counter::default);

/// Span exports that failed (the collector refused them, or did not answer in time), for
/// `dedupe_trace_exports_failed_total`.
pub static SPAN_EXPORTS_FAILED: std::sync::LazyLock<Counter> =
    std::sync::LazyLock::new(Counter::default);

/// The `route` label of requests no route matched.
const UNMATCHED: &str = "(unmatched)";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteOutcome {
    route: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteResult {
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// What the stale-event guard (`order:`) found, for `dedupe_order_checks_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderCheck {
    /// No newer version was done for the entity: forwarded as it is.
    InOrder,
    /// Older than a version done: forwarded with `Dedupe-Stale`.
    StaleMarked,
    /// Older than a version done: answered, not forwarded.
    StaleSkipped,
    /// The event has no usable entity or version: forwarded unguarded.
    Unversioned,
    /// The store could not say: forwarded unguarded, or refused (`on_store_error`).
    StoreError,
}

impl OrderCheck {
    pub const ALL: [OrderCheck; 5] = [
        OrderCheck::InOrder,
        OrderCheck::StaleMarked,
        OrderCheck::StaleSkipped,
        OrderCheck::Unversioned,
        OrderCheck::StoreError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderCheck::InOrder => "in_order",
            OrderCheck::StaleMarked => "stale_marked",
            OrderCheck::StaleSkipped => "stale_skipped",
            OrderCheck::Unversioned => "unversioned",
            OrderCheck::StoreError => "store_error",
        }
    }
}

/// Why a claim was released, for `dedupe_claims_released_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    UpstreamStatus,
    UpstreamUnreachable,
    UpstreamTimeout,
    /// The upstream closed the connection after the request went out.
    UpstreamDropped,
    Shutdown,
    TaskFailed,
    /// The delivery was dropped after its claim, before its forward began (its sender
    /// hung up while the store answered).
    Abandoned,
    /// The store failed after the claim, before the forward (`order:` reading the entity's
    /// newest version), and `on_store_error: reject` refused the delivery.
    StoreError,
}

impl ReleaseReason {
    pub const ALL: [ReleaseReason; 8] = [
        ReleaseReason::UpstreamStatus,
        ReleaseReason::UpstreamUnreachable,
        ReleaseReason::UpstreamTimeout,
        ReleaseReason::UpstreamDropped,
        ReleaseReason::Shutdown,
        ReleaseReason::TaskFailed,
        ReleaseReason::Abandoned,
        ReleaseReason::StoreError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::UpstreamStatus => "upstream_status",
            ReleaseReason::UpstreamUnreachable => "upstream_unreachable",
            ReleaseReason::UpstreamTimeout => "upstream_timeout",
            ReleaseReason::UpstreamDropped => "upstream_dropped",
            ReleaseReason::Shutdown => "shutdown",
            ReleaseReason::TaskFailed => "task_failed",
            ReleaseReason::Abandoned => "abandoned",
            ReleaseReason::StoreError => "store_error",
        }
    }
}

/// What renewing a claim's lease came to, for `dedupe_lease_renewals_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRenewal {
    Renewed,
    /// The store did not answer; tried again before the lease ends.
    Failed,
    /// The claim was settled or taken over by someone else: its lease had ended.
    Lost,
}

impl LeaseRenewal {
    pub const ALL: [LeaseRenewal; 3] = [
        LeaseRenewal::Renewed,
        LeaseRenewal::Failed,
        LeaseRenewal::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseRenewal::Renewed => "renewed",
            LeaseRenewal::Failed => "failed",
            LeaseRenewal::Lost => "lost",
        }
    }
}

/// The counts the gauges show as of a scrape: this process's claims in flight, its
/// deliveries waiting on one, and the store's done records when it knows them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KeyCounts {
    pub in_flight: usize,
    pub waiting: usize,
    pub done: Option<u64>,
    /// The embedded store's syncs to stable storage, for `dedupe_store_syncs_total` and
    /// its siblings.
    pub syncs: Option<DiskSyncs>,
}

/// The registry and its metrics; cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    requests: Family<RouteOutcome, Counter>,
    upstream_duration: Family<RouteLabel, per_minute::LatencyHistogram>,
    claims_released: Family<RouteReason, Counter>,
    store_errors: Counter,
    store_keys: Family<StateLabel, Gauge>,
    store_syncs: Counter,
    store_sync_waiters: Counter,
    store_sync_seconds: Counter<f64, AtomicU64>,
    store_sync_failures: Counter,
    /// Held while the sync counters catch up with the store's, so that two scrapes do not
    /// both add the same difference.
    catching_up: parking_lot::Mutex<()>,
    waiting: Gauge,
    keys_held: Family<RouteLabel, Gauge>,
    sweep_removed: Counter,
    sweep_succeeded_at: Gauge,
    payload_mismatch: Family<RouteLabel, Counter>,
    order_checks: Family<RouteResult, Counter>,
    signatures_refused: Family<RouteReason, Counter>,
    config_reloads: Family<ResultLabel, Counter>,
    last_reload_successful: Gauge,
    lease_renewals: Family<ResultLabel, Counter>,
    /// `dedupe_queue_*`.
    pub(crate) queue: QueueMetrics,
    /// `dedupe_delivery_log_*`.
    pub(crate) log: LogMetrics,
    /// Each minute's figures for the charts, until the store takes them.
    pub(crate) minutes: MinuteBook,
    minutes_unwritten: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::default(),
            requests: Family::default(),
            upstream_duration: Family::default(),
            claims_released: Family::default(),
            store_errors: Counter::default(),
            store_keys: Family::default(),
            store_syncs: Counter::default(),
            store_sync_waiters: Counter::default(),
            store_sync_seconds: Counter::default(),
            store_sync_failures: Counter::default(),
            catching_up: parking_lot::Mutex::new(()),
            waiting: Gauge::default(),
            keys_held: Family::default(),
            sweep_removed: Counter::default(),
            sweep_succeeded_at: Gauge::default(),
            payload_mismatch: Family::default(),
            order_checks: Family::default(),
            signatures_refused: Family::default(),
            config_reloads: Family::default(),
            last_reload_successful: Gauge::default(),
            lease_renewals: Family::default(),
            queue: QueueMetrics::new(),
            log: LogMetrics::default(),
            minutes: MinuteBook::default(),
            minutes_unwritten: Gauge::default(),
        };
        metrics.register_deliveries();
        metrics.queue.register(&mut metrics.registry);
        metrics.log.register(&mut metrics.registry);
        metrics.register_the_rest();
        // Series that exist from the start, at zero (reloads: none tried is a success).
        for result in LeaseRenewal::ALL {
            let _ = metrics.lease_renewals.get_or_create(&ResultLabel {
                result: result.as_str(),
            });
        }
        for result in ["success", "failure"] {
            let _ = metrics
                .config_reloads
                .get_or_create(&ResultLabel { result });
        }
        metrics.last_reload_successful.set(1);
        metrics
    }

    /// Registers the metrics of deliveries: requests, the app's answers, releases,
    /// waits, holds, leases, payloads, order checks and signatures.
    fn register_deliveries(&mut self) {
        self.registry.register(
            "dedupe_requests",
            "Requests by route and outcome (the Dedupe-Status value; `unmatched` for requests no route took)",
            self.requests.clone(),
        );
        self.registry.register(
            "dedupe_upstream_duration_seconds",
            "Time from forwarding a claimed delivery to the upstream's answer head, or its failure",
            self.upstream_duration.clone(),
        );
        self.registry.register(
            "dedupe_claims_released",
            "Claims released so that a retry runs the work, by route and reason",
            self.claims_released.clone(),
        );
        self.registry.register(
            "dedupe_waiting_deliveries",
            "Deliveries waiting for the outcome of their key's delivery in flight (on_in_flight: wait)",
            self.waiting.clone(),
        );
        self.registry.register(
            "dedupe_keys_held",
            "Held keys (on_ambiguous: hold) in the store by route, counted every few seconds; each waits for an operator",
            self.keys_held.clone(),
        );
        self.registry.register(
            "dedupe_lease_renewals",
            "Renewals of the leases of claims whose delivery is still being handled: renewed, failed (the store did not answer; tried again), lost (the claim was taken over: its event may run twice)",
            self.lease_renewals.clone(),
        );
        self.registry.register(
            "dedupe_payload_mismatch",
            "Duplicates whose body differs from the delivery that was processed, by route",
            self.payload_mismatch.clone(),
        );
        self.registry.register(
            "dedupe_order_checks",
            "Deliveries on routes with order: by route and what the stale-event guard found",
            self.order_checks.clone(),
        );
        self.registry.register(
            "dedupe_signatures_refused",
            "Deliveries refused for their signature, by route and reason",
            self.signatures_refused.clone(),
        );
    }

    /// Registers the metrics of the store, the sweep, the trace export and reloads.
    fn register_the_rest(&mut self) {
        self.registry.register(
            "dedupe_chart_minutes_unwritten",
            "Ended minutes of the console's charts that the store has not taken yet (kept for a day, then dropped)",
            self.minutes_unwritten.clone(),
        );
        self.registry.register(
            "dedupe_store_errors",
            "Claim-store operations that failed",
            self.store_errors.clone(),
        );
        self.registry.register(
            "dedupe_store_keys",
            "Keys in the store by state (done: records on disk, expired ones until swept)",
            self.store_keys.clone(),
        );
        self.registry.register(
            "dedupe_store_syncs",
            "Syncs of the embedded store's files to stable storage (fdatasync or fsync) that acknowledgments waited for",
            self.store_syncs.clone(),
        );
        self.registry.register(
            "dedupe_store_sync_waiters",
            "Writes that waited for a sync before their answer (acknowledgments, operators' changes); over dedupe_store_syncs_total, how many one sync served",
            self.store_sync_waiters.clone(),
        );
        self.registry.register(
            "dedupe_store_sync_seconds",
            "Time spent in those syncs; over dedupe_store_syncs_total, the mean time one took",
            self.store_sync_seconds.clone(),
        );
        self.registry.register(
            "dedupe_store_sync_failures",
            "Syncs that failed: their writes were not acknowledged, and the store reopened",
            self.store_sync_failures.clone(),
        );
        self.registry.register(
            "dedupe_sweep_removed",
            "Expired records removed by the background sweep",
            self.sweep_removed.clone(),
        );
        self.registry.register(
            "dedupe_sweep_last_success_timestamp_seconds",
            "Unix time at which the background sweep last ran to the end without an error (0 before the first)",
            self.sweep_succeeded_at.clone(),
        );
        self.registry.register(
            "dedupe_trace_spans_dropped",
            "Spans not exported because the export queue was full (the collector slow or away); deliveries are never held up for them",
            SPANS_DROPPED.clone(),
        );
        self.registry.register(
            "dedupe_trace_exports_failed",
            "Exports of a batch of spans that failed: the collector refused them or did not answer in time",
            SPAN_EXPORTS_FAILED.clone(),
        );
        self.registry.register(
            "dedupe_config_reloads",
            "Configuration reloads by result (an invalid file keeps the running routes)",
            self.config_reloads.clone(),
        );
        self.registry.register(
            "dedupe_config_last_reload_successful",
            "1 if the last configuration reload succeeded (or none was tried since the start), 0 if it failed and the running routes are not the file's",
            self.last_reload_successful.clone(),
        );
    }

    /// Creates every series of the routes about to serve, at zero, so that `rate()` and
    /// alerts see a series before its first event: each outcome, release reason and
    /// (for a route that checks signatures) refusal reason, and (for a route with `order:`)
    /// each order check's result.
    pub fn expect_routes<'a>(&self, routes: impl IntoIterator<Item = (&'a str, bool, bool)>) {
        for (route, verifies, orders) in routes {
            for outcome in DedupeStatus::ALL {
                let _ = self.requests.get_or_create(&RouteOutcome {
                    route: route.to_owned(),
                    outcome: outcome.as_str(),
                });
            }
            for reason in ReleaseReason::ALL {
                let _ = self.claims_released.get_or_create(&RouteReason {
                    route: route.to_owned(),
                    reason: reason.as_str(),
                });
            }
            let label = RouteLabel {
                route: route.to_owned(),
            };
            let _ = self.payload_mismatch.get_or_create(&label);
            let _ = self.keys_held.get_or_create(&label);
            let _ = self.upstream_duration.get_or_create(&label);
            if orders {
                for check in OrderCheck::ALL {
                    let _ = self.order_checks.get_or_create(&RouteResult {
                        route: route.to_owned(),
                        result: check.as_str(),
                    });
                }
            }
            if verifies {
                for reason in VerifyError::CODES {
                    let _ = self.signatures_refused.get_or_create(&RouteReason {
                        route: route.to_owned(),
                        reason,
                    });
                }
            }
        }
    }

    /// The held keys of `route`, as the store last counted them.
    pub fn keys_held(&self, route: &str, count: u64) {
        let label = RouteLabel {
            route: route.to_owned(),
        };
        self.keys_held
            .get_or_create(&label)
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// `route`'s requests by outcome since the start, as `dedupe_requests_total` counts them.
    pub fn requests_of(&self, route: &str) -> Vec<(&'static str, u64)> {
        DedupeStatus::ALL
            .iter()
            .map(|outcome| {
                let labels = RouteOutcome {
                    route: route.to_owned(),
                    outcome: outcome.as_str(),
                };
                (outcome.as_str(), self.requests.get_or_create(&labels).get())
            })
            .collect()
    }

    /// Each of `routes`' counters now, for the minute's figures: `(name, queued)` pairs.
    pub fn counters_of<'a>(
        &self,
        routes: impl IntoIterator<Item = (&'a str, bool)>,
    ) -> std::collections::HashMap<String, RouteCounters> {
        let mut counters = std::collections::HashMap::new();
        for (route, queued) in routes {
            let label = RouteLabel {
                route: route.to_owned(),
            };
            let latency = self.upstream_duration.get_or_create(&label).counts();
            let of_route = RouteCounters {
                outcomes: self.requests_of(route),
                latency,
                queue: queued.then(|| self.queue.depth_of(route)),
            };
            counters.insert(route.to_owned(), of_route);
        }
        counters
    }

    /// How many ended minutes wait for the store, for `dedupe_chart_minutes_unwritten`.
    pub fn minutes_unwritten(&self, count: usize) {
        self.minutes_unwritten
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// `route`'s held keys, as the store last counted them.
    pub fn held_of(&self, route: &str) -> i64 {
        let label = RouteLabel {
            route: route.to_owned(),
        };
        self.keys_held.get_or_create(&label).get()
    }

    /// The store's failures since the start.
    pub fn store_errors(&self) -> u64 {
        self.store_errors.get()
    }

    pub fn delivery(&self, route: &str, outcome: DedupeStatus) {
        self.count_request(route, outcome.as_str());
    }

    pub fn unmatched(&self) {
        self.count_request(UNMATCHED, "unmatched");
    }

    /// A request refused before routing (a malformed `Host` or target).
    pub fn bad_request(&self) {
        self.count_request(UNMATCHED, DedupeStatus::Rejected.as_str());
    }

    fn count_request(&self, route: &str, outcome: &'static str) {
        let labels = RouteOutcome {
            route: route.to_owned(),
            outcome,
        };
        self.requests.get_or_create(&labels).inc();
    }

    pub fn upstream_answered(&self, route: &str, seconds: f64) {
        let labels = RouteLabel {
            route: route.to_owned(),
        };
        self.upstream_duration
            .get_or_create(&labels)
            .observe(seconds);
    }

    pub fn released(&self, route: &str, reason: ReleaseReason) {
        let labels = RouteReason {
            route: route.to_owned(),
            reason: reason.as_str(),
        };
        self.claims_released.get_or_create(&labels).inc();
    }

    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    pub fn lease_renewal(&self, result: LeaseRenewal) {
        self.lease_renewals
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    pub fn swept(&self, removed: usize) {
        self.sweep_removed.inc_by(removed as u64);
    }

    /// A sweep ran to its end without an error, at `unix_seconds`.
    pub fn sweep_succeeded(&self, unix_seconds: u64) {
        self.sweep_succeeded_at
            .set(i64::try_from(unix_seconds).unwrap_or(i64::MAX));
    }

    pub fn payload_mismatch(&self, route: &str) {
        let labels = RouteLabel {
            route: route.to_owned(),
        };
        self.payload_mismatch.get_or_create(&labels).inc();
    }

    pub fn order_checked(&self, route: &str, check: OrderCheck) {
        let labels = RouteResult {
            route: route.to_owned(),
            result: check.as_str(),
        };
        self.order_checks.get_or_create(&labels).inc();
    }

    pub fn signature_refused(&self, route: &str, reason: &'static str) {
        let labels = RouteReason {
            route: route.to_owned(),
            reason,
        };
        self.signatures_refused.get_or_create(&labels).inc();
    }

    pub fn reloaded(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.last_reload_successful.set(i64::from(success));
        self.config_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// The exposition text, with the store's key counts as of now.
    pub fn encode(&self, keys: KeyCounts) -> String {
        let gauge = |state| self.store_keys.get_or_create(&StateLabel { state }).clone();
        gauge("in_flight").set(i64::try_from(keys.in_flight).unwrap_or(i64::MAX));
        self.waiting
            .set(i64::try_from(keys.waiting).unwrap_or(i64::MAX));
        if let Some(done) = keys.done {
            gauge("done").set(i64::try_from(done).unwrap_or(i64::MAX));
        }
        if let Some(syncs) = keys.syncs {
            // The store counts; the counters catch up with it, one scrape at a time.
            let _one_at_a_time = self.catching_up.lock();
            let catch_up = |counter: &Counter, now: u64| {
                counter.inc_by(now.saturating_sub(counter.get()));
            };
            catch_up(&self.store_syncs, syncs.syncs);
            catch_up(&self.store_sync_waiters, syncs.waiters);
            catch_up(&self.store_sync_failures, syncs.failures);
            let seconds = syncs.seconds - self.store_sync_seconds.get();
            if seconds > 0.0 {
                self.store_sync_seconds.inc_by(seconds);
            }
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Its place in [`ReleaseReason::ALL`]: a new reason does not compile until it has one.
    fn position(reason: ReleaseReason) -> usize {
        match reason {
            ReleaseReason::UpstreamStatus => 0,
            ReleaseReason::UpstreamUnreachable => 1,
            ReleaseReason::UpstreamTimeout => 2,
            ReleaseReason::UpstreamDropped => 3,
            ReleaseReason::Shutdown => 4,
            ReleaseReason::TaskFailed => 5,
            ReleaseReason::Abandoned => 6,
            ReleaseReason::StoreError => 7,
        }
    }

    #[test]
    fn every_release_reason_is_listed() {
        for (index, reason) in ReleaseReason::ALL.into_iter().enumerate() {
            assert_eq!(position(reason), index, "{reason:?}");
        }
    }

    #[test]
    fn every_series_of_a_configured_route_exists_at_zero() {
        let metrics = Metrics::new();
        metrics.expect_routes([("stripe", true, false), ("plain", false, true)]);
        let text = metrics.encode(KeyCounts::default());
        for line in [
            r#"dedupe_requests_total{route="stripe",outcome="forwarded"} 0"#,
            r#"dedupe_requests_total{route="plain",outcome="released"} 0"#,
            r#"dedupe_claims_released_total{route="stripe",reason="upstream_timeout"} 0"#,
            r#"dedupe_claims_released_total{route="plain",reason="shutdown"} 0"#,
            r#"dedupe_payload_mismatch_total{route="plain"} 0"#,
            r#"dedupe_signatures_refused_total{route="stripe",reason="signature_mismatch"} 0"#,
            r#"dedupe_signatures_refused_total{route="stripe",reason="stale_signature"} 0"#,
            r#"dedupe_upstream_duration_seconds_count{route="plain"} 0"#,
            r#"dedupe_config_reloads_total{result="failure"} 0"#,
            r#"dedupe_order_checks_total{route="plain",result="stale_skipped"} 0"#,
            "dedupe_store_errors_total 0",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
        assert!(
            !text.contains(r#"dedupe_signatures_refused_total{route="plain""#),
            "a route without a check cannot refuse a signature"
        );
        assert!(
            !text.contains(r#"dedupe_order_checks_total{route="stripe""#),
            "a route without order: checks none"
        );
    }

    #[test]
    fn names_labels_and_values_are_exposed() {
        let metrics = Metrics::new();
        metrics.delivery("stripe", DedupeStatus::Forwarded);
        metrics.delivery("stripe", DedupeStatus::Forwarded);
        metrics.delivery("stripe", DedupeStatus::Duplicate);
        metrics.unmatched();
        metrics.upstream_answered("stripe", 0.003);
        metrics.released("stripe", ReleaseReason::UpstreamTimeout);
        metrics.store_error();
        metrics.swept(7);
        metrics.payload_mismatch("stripe");
        metrics.reloaded(false);
        metrics.sweep_succeeded(1_767_225_600);
        let text = metrics.encode(KeyCounts {
            in_flight: 2,
            waiting: 3,
            done: Some(40),
            syncs: Some(DiskSyncs {
                syncs: 5,
                waiters: 12,
                seconds: 0.25,
                failures: 1,
            }),
        });
        for line in [
            "dedupe_waiting_deliveries 3",
            r#"dedupe_requests_total{route="stripe",outcome="forwarded"} 2"#,
            r#"dedupe_requests_total{route="stripe",outcome="duplicate"} 1"#,
            r#"dedupe_requests_total{route="(unmatched)",outcome="unmatched"} 1"#,
            r#"dedupe_upstream_duration_seconds_count{route="stripe"} 1"#,
            r#"dedupe_claims_released_total{route="stripe",reason="upstream_timeout"} 1"#,
            "dedupe_store_errors_total 1",
            r#"dedupe_store_keys{state="in_flight"} 2"#,
            r#"dedupe_store_keys{state="done"} 40"#,
            "dedupe_sweep_removed_total 7",
            r#"dedupe_payload_mismatch_total{route="stripe"} 1"#,
            r#"dedupe_config_reloads_total{result="failure"} 1"#,
            "dedupe_config_last_reload_successful 0",
            "dedupe_sweep_last_success_timestamp_seconds 1767225600",
            "dedupe_store_syncs_total 5",
            "dedupe_store_sync_waiters_total 12",
            "dedupe_store_sync_seconds_total 0.25",
            "dedupe_store_sync_failures_total 1",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
    }
}
