//! The metrics of queued delivery (`dedupe_queue_*`): what each route's queue holds
//! (counted from the store every few seconds), its attempts and dead letters, and the time
//! from acceptance to the app's success.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteState {
    route: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteResult {
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason: &'static str,
}

/// How an attempt ended, for `dedupe_queue_attempts_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    Delivered,
    Retried,
    Dead,
}

impl AttemptResult {
    const ALL: [AttemptResult; 3] = [
        AttemptResult::Delivered,
        AttemptResult::Retried,
        AttemptResult::Dead,
    ];

    fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Delivered => "delivered",
            AttemptResult::Retried => "retried",
            AttemptResult::Dead => "dead",
        }
    }
}

/// What a route's queue holds, as last counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueGauges {
    pub waiting: u64,
    pub retrying: u64,
    pub dead: u64,
    pub in_flight: u64,
    pub paused: bool,
    pub oldest_age_seconds: f64,
}

type HistogramFamily = Family<RouteLabel, Histogram, fn() -> Histogram>;

pub struct QueueMetrics {
    jobs: Family<RouteState, Gauge>,
    paused: Family<RouteLabel, Gauge>,
    oldest_age: Family<RouteLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    attempts: Family<RouteResult, Counter>,
    dead_letters: Family<RouteReason, Counter>,
    delivered_within_target: Family<RouteLabel, Counter>,
    delivery_seconds: HistogramFamily,
    store_errors: Family<RouteLabel, Counter>,
    dead_expired: Family<RouteLabel, Counter>,
    target: Family<RouteLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl QueueMetrics {
    pub(super) fn new() -> QueueMetrics {
        QueueMetrics {
            jobs: Family::default(),
            paused: Family::default(),
            oldest_age: Family::default(),
            attempts: Family::default(),
            dead_letters: Family::default(),
            delivered_within_target: Family::default(),
            // 100 ms to about 4.6 days: a healthy app's next poll, up to the longest
            // `max_age`.
            delivery_seconds: Family::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.1, 2.0, 23))) as fn() -> Histogram,
            ),
            store_errors: Family::default(),
            dead_expired: Family::default(),
            target: Family::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "dedupe_queue_jobs",
            "Queued jobs by route and state (waiting: not tried yet; retrying; in_flight: being delivered by this replica; dead: in dead letters), counted every few seconds",
            self.jobs.clone(),
        );
        registry.register(
            "dedupe_queue_paused",
            "1 while a route's queued delivery is paused",
            self.paused.clone(),
        );
        registry.register(
            "dedupe_queue_oldest_age_seconds",
            "Age of the oldest job of a route that is neither delivered nor dead",
            self.oldest_age.clone(),
        );
        registry.register(
            "dedupe_queue_attempts",
            "Delivery attempts of queued jobs by route and result (delivered, retried, dead)",
            self.attempts.clone(),
        );
        registry.register(
            "dedupe_queue_dead_letters",
            "Jobs put in dead letters, by route and reason (refused: a status not retried; max_attempts; max_age)",
            self.dead_letters.clone(),
        );
        registry.register(
            "dedupe_queue_delivery_seconds",
            "Time from a job's acceptance to the app's success",
            self.delivery_seconds.clone(),
        );
        registry.register(
            "dedupe_queue_delivered_within_target",
            "Jobs the app took within the route's `queue.target` of their acceptance (divide by the delivery histogram's count)",
            self.delivered_within_target.clone(),
        );
        registry.register(
            "dedupe_queue_target_seconds",
            "A route's `queue.target`: the time from acceptance to the app's success it is held to (routes with one only)",
            self.target.clone(),
        );
        registry.register(
            "dedupe_queue_store_errors",
            "Queue operations of a route's workers that the store failed (the job is tried again when its visibility ends)",
            self.store_errors.clone(),
        );
        registry.register(
            "dedupe_queue_dead_expired",
            "Dead letters discarded once past the route's queue.dead_retention",
            self.dead_expired.clone(),
        );
    }

    /// Creates a queued route's series at zero, and its target's if it has one.
    pub fn expect_route(&self, route: &str, target: Option<std::time::Duration>) {
        let label = RouteLabel {
            route: route.to_owned(),
        };
        match target {
            Some(target) => {
                self.target.get_or_create(&label).set(target.as_secs_f64());
            }
            None => {
                self.target.remove(&label);
            }
        }
        for result in AttemptResult::ALL {
            let _ = self.attempts.get_or_create(&RouteResult {
                route: route.to_owned(),
                result: result.as_str(),
            });
        }
        for reason in ["refused", "max_attempts", "max_age"] {
            let _ = self.dead_letters.get_or_create(&RouteReason {
                route: route.to_owned(),
                reason,
            });
        }
        let _ = self.delivery_seconds.get_or_create(&label);
        let _ = self.delivered_within_target.get_or_create(&label);
        let _ = self.store_errors.get_or_create(&label);
        self.held(route, QueueGauges::default());
    }

    pub fn held(&self, route: &str, held: QueueGauges) {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        for (state, count) in [
            ("waiting", held.waiting),
            ("retrying", held.retrying),
            ("in_flight", held.in_flight),
            ("dead", held.dead),
        ] {
            self.jobs
                .get_or_create(&RouteState {
                    route: route.to_owned(),
                    state,
                })
                .set(gauge(count));
        }
        let label = RouteLabel {
            route: route.to_owned(),
        };
        self.paused
            .get_or_create(&label)
            .set(i64::from(held.paused));
        self.oldest_age
            .get_or_create(&label)
            .set(held.oldest_age_seconds);
    }

    /// `route`'s jobs not delivered yet (waiting and retrying) and the oldest one's age,
    /// as last counted.
    pub fn depth_of(&self, route: &str) -> crate::store::minutes::QueueDepth {
        let jobs = |state: &'static str| {
            let label = RouteState {
                route: route.to_owned(),
                state,
            };
            u64::try_from(self.jobs.get_or_create(&label).get()).unwrap_or(0)
        };
        let label = RouteLabel {
            route: route.to_owned(),
        };
        crate::store::minutes::QueueDepth {
            waiting: jobs("waiting") + jobs("retrying"),
            oldest_age_seconds: self.oldest_age.get_or_create(&label).get(),
        }
    }

    pub fn attempted(&self, route: &str, result: AttemptResult) {
        self.attempts
            .get_or_create(&RouteResult {
                route: route.to_owned(),
                result: result.as_str(),
            })
            .inc();
    }

    pub fn died(&self, route: &str, reason: &'static str) {
        self.dead_letters
            .get_or_create(&RouteReason {
                route: route.to_owned(),
                reason,
            })
            .inc();
    }

    /// A job delivered `seconds` after its acceptance, `within_target` if the route has
    /// one and it was met.
    pub fn delivered(&self, route: &str, seconds: f64, within_target: bool) {
        let label = RouteLabel {
            route: route.to_owned(),
        };
        self.delivery_seconds.get_or_create(&label).observe(seconds);
        if within_target {
            self.delivered_within_target.get_or_create(&label).inc();
        }
    }

    /// `count` of a route's dead letters discarded past their retention.
    pub fn dead_expired(&self, route: &str, count: u64) {
        self.dead_expired
            .get_or_create(&RouteLabel {
                route: route.to_owned(),
            })
            .inc_by(count);
    }

    pub fn store_error(&self, route: &str) {
        self.store_errors
            .get_or_create(&RouteLabel {
                route: route.to_owned(),
            })
            .inc();
    }
}
