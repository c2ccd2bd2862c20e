//! `GET /v1/charts`: the last hour or day, minute by minute, of every route or one:
//! deliveries by outcome, the app's latency (p50, p99) and queued routes' depth. Added up
//! from every replica's minutes in the store (`store::minutes`) and this replica's minute
//! still running; where the store does not answer, from this replica's own minutes (those
//! waiting to be written, the last hour's and the running one), with the store's error.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use http::{Response, StatusCode};

use super::answers::{ChartMinute, Charts, DeliveryGroups, answer_json};
use super::extract::Live;
use super::state::AdminState;
use crate::background::{replica_id, route_counters};
use crate::body::ProxyBody;
use crate::metrics::{LATENCY_BUCKETS, quantile_ms};
use crate::response::AdminRefusal;
use crate::store::minutes::{MINUTE, MinuteFigures, QueueDepth, minute_of};
use crate::store::{Clock, SystemClock, rfc3339};

/// The ranges drawn, and how many minutes each holds.
pub(super) const RANGES: [&str; 2] = ["hour", "day"];

/// How long the store gets to give the minutes.
const STORE_WAIT: Duration = Duration::from_secs(2);

pub(super) async fn charts(
    State(state): State<Arc<AdminState>>,
    Live(serving): Live,
    RawQuery(query): RawQuery,
) -> Response<ProxyBody> {
    let (mut range, mut route) = ("hour", None);
    for (name, value) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        let bad = |reason: String| AdminRefusal::BadRequest(reason).into_response();
        match &*name {
            "range" => match RANGES.iter().find(|known| **known == value) {
                Some(known) => range = known,
                None => return bad(format!("range `{value}` is not one of hour, day")),
            },
            "route" => route = Some(value.into_owned()),
            other => return bad(format!("unknown query parameter `{other}`")),
        }
    }
    let count: u64 = if range == "day" { 1440 } else { 60 };
    let now = SystemClock.now();
    let from = minute_of(now) - (count - 1) * MINUTE;
    let proxy = &serving.proxy;
    let (stored, store_error) =
        match tokio::time::timeout(STORE_WAIT, proxy.store().minutes(from)).await {
            Ok(Ok(stored)) => (stored, None),
            Ok(Err(error)) => (
                Vec::new(),
                Some(crate::redact::text(&error.to_string()).into_owned()),
            ),
            Err(_) => (Vec::new(), Some(format!("no answer in {STORE_WAIT:?}"))),
        };
    let metrics = &state.metrics;
    let mut own = metrics.minutes.own();
    let counters = route_counters(proxy, metrics);
    own.push(
        metrics
            .minutes
            .so_far(&replica_id(), minute_of(now), &counters),
    );
    let mut slots = Slots::new(from, count as usize);
    let seen: HashSet<(&str, u64)> = (stored.iter())
        .map(|figures| (figures.replica.as_str(), figures.minute))
        .collect();
    let fresh = own
        .iter()
        .filter(|figures| !seen.contains(&(figures.replica.as_str(), figures.minute)));
    for figures in stored.iter().chain(fresh) {
        slots.add(figures, route.as_deref());
    }
    let answer = Charts {
        range: range.to_owned(),
        route,
        from: rfc3339(from),
        queued: slots.queued,
        replicas: slots.replicas.iter().cloned().collect(),
        minutes: slots.charted(),
        store_error,
    };
    answer_json(StatusCode::OK, &answer)
}

/// The minutes being added up, oldest first.
struct Slots {
    from: u64,
    minutes: Vec<Slot>,
    replicas: std::collections::BTreeSet<String>,
    queued: bool,
}

#[derive(Default)]
struct Slot {
    deliveries: DeliveryGroups,
    latency: Vec<u64>,
    /// Each queued route's depth: the largest a replica counted (each counts the same
    /// shared queue).
    queues: HashMap<String, QueueDepth>,
}

impl Slots {
    fn new(from: u64, count: usize) -> Slots {
        Slots {
            from,
            minutes: (0..count).map(|_| Slot::default()).collect(),
            replicas: Default::default(),
            queued: false,
        }
    }

    /// Adds one replica's minute, of `route` only if one is named.
    fn add(&mut self, figures: &MinuteFigures, route: Option<&str>) {
        let Some(index) = figures
            .minute
            .checked_sub(self.from)
            .map(|after| after / MINUTE)
        else {
            return;
        };
        let Some(slot) = self.minutes.get_mut(index as usize) else {
            return;
        };
        let chosen = (figures.routes.iter()).filter(|(name, _)| route.is_none_or(|r| r == *name));
        for (name, of_route) in chosen {
            self.replicas.insert(figures.replica.clone());
            for (outcome, count) in &of_route.outcomes {
                if let Some(group) = slot.deliveries.group_of(outcome) {
                    *group = group.saturating_add(*count);
                }
            }
            slot.latency.resize(LATENCY_BUCKETS.len() + 1, 0);
            for (bucket, count) in of_route.latency.iter().enumerate().take(slot.latency.len()) {
                slot.latency[bucket] = slot.latency[bucket].saturating_add(*count);
            }
            if let Some(depth) = of_route.queue {
                self.queued = true;
                let deepest = slot.queues.entry(name.clone()).or_default();
                deepest.waiting = deepest.waiting.max(depth.waiting);
                deepest.oldest_age_seconds =
                    deepest.oldest_age_seconds.max(depth.oldest_age_seconds);
            }
        }
    }

    fn charted(self) -> Vec<ChartMinute> {
        let from = self.from;
        let queued = self.queued;
        (self.minutes.into_iter().enumerate())
            .map(|(index, slot)| {
                let waiting = slot.queues.values().map(|depth| depth.waiting).sum();
                let oldest = (slot.queues.values()).map(|depth| depth.oldest_age_seconds);
                ChartMinute {
                    at: rfc3339(from + index as u64 * MINUTE),
                    deliveries: slot.deliveries,
                    answers: slot.latency.iter().sum(),
                    p50_ms: quantile_ms(&slot.latency, 0.5),
                    p99_ms: quantile_ms(&slot.latency, 0.99),
                    queue_waiting: queued.then_some(waiting),
                    queue_oldest_seconds: queued.then(|| oldest.fold(0.0, f64::max)),
                }
            })
            .collect()
    }
}
