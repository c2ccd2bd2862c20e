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
use crate::store::minutes::{KEPT_FOR, MINUTE, MinuteFigures, QueueDepth, minute_of};
use crate::store::{Clock, SystemClock, rfc3339};

/// The ranges drawn, and how many minutes each holds.
const RANGES: [(&str, u64); 2] = [("hour", 60), ("day", KEPT_FOR.as_secs() / 60)];

/// The ranges' names, as the query takes them.
pub(super) const RANGE_NAMES: [&str; 2] = [RANGES[0].0, RANGES[1].0];

/// How long the store gets to give the minutes.
const STORE_WAIT: Duration = Duration::from_secs(2);

/// The store's minutes being read.
static READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

pub(super) async fn charts(
    State(state): State<Arc<AdminState>>,
    Live(serving): Live,
    RawQuery(query): RawQuery,
) -> Response<ProxyBody> {
    let ((mut range, mut count), mut route) = (RANGES[0], None);
    for (name, value) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        let bad = |reason: String| AdminRefusal::BadRequest(reason).into_response();
        match &*name {
            "range" => match RANGES.iter().find(|(known, _)| *known == value) {
                Some(known) => (range, count) = *known,
                None => {
                    let known = RANGE_NAMES.join(", ");
                    return bad(format!("range `{value}` is not one of {known}"));
                }
            },
            "route" => route = Some(value.into_owned()),
            other => return bad(format!("unknown query parameter `{other}`")),
        }
    }
    let now = SystemClock.now();
    // A clock before 1970's second day charts from the epoch.
    let from = minute_of(now).saturating_sub((count - 1) * MINUTE);
    let proxy = &serving.proxy;
    // One read of the store's minutes at a time (a day of many replicas' is large): the
    // others wait their turn within the same bound.
    let read = async {
        let _turn = READS.acquire().await;
        proxy.store().minutes(from).await
    };
    let (stored, store_error) = match tokio::time::timeout(STORE_WAIT, read).await {
        Ok(Ok(stored)) => (stored, None),
        Ok(Err(error)) => (
            Vec::new(),
            Some(crate::redact::text(&error.to_string()).into_owned()),
        ),
        Err(_) => (Vec::new(), Some(format!("no answer in {STORE_WAIT:?}"))),
    };
    let metrics = &state.metrics;
    let mut own = metrics.minutes.own_minutes();
    let counters = route_counters(proxy, metrics);
    own.push((metrics.minutes).running_minute(&replica_id(), minute_of(now), &counters));
    let mut totals = MinuteTotals::new(from, count as usize);
    for figures in merged(&stored, &own) {
        totals.add(figures, route.as_deref());
    }
    let answer = Charts {
        range: range.to_owned(),
        route,
        from: rfc3339(from),
        queued: totals.queued,
        replicas: totals.replicas.iter().cloned().collect(),
        minutes: totals.charted(),
        store_error,
    };
    answer_json(StatusCode::OK, &answer)
}

/// The store's minutes, and this replica's own that the store did not give (not written
/// yet, or the store did not answer): a minute in both is counted once.
fn merged<'a>(
    stored: &'a [MinuteFigures],
    own: &'a [MinuteFigures],
) -> impl Iterator<Item = &'a MinuteFigures> {
    let seen: HashSet<(&str, u64)> = (stored.iter())
        .map(|figures| (figures.replica.as_str(), figures.minute))
        .collect();
    let fresh = own
        .iter()
        .filter(move |figures| !seen.contains(&(figures.replica.as_str(), figures.minute)));
    stored.iter().chain(fresh)
}

/// The minutes of the range being added up, oldest first.
struct MinuteTotals {
    from: u64,
    minutes: Vec<MinuteTotal>,
    replicas: std::collections::BTreeSet<String>,
    queued: bool,
}

/// One minute of the range, every replica's figures added up.
#[derive(Default)]
struct MinuteTotal {
    deliveries: DeliveryGroups,
    latency: Vec<u64>,
    /// Each queued route's depth: the largest a replica counted (each counts the same
    /// shared queue).
    queues: HashMap<String, QueueDepth>,
}

impl MinuteTotals {
    fn new(from: u64, count: usize) -> MinuteTotals {
        MinuteTotals {
            from,
            minutes: (0..count).map(|_| MinuteTotal::default()).collect(),
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
                if let Some(group) = slot.deliveries.count_mut(outcome) {
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
                let waiting =
                    (slot.queues.values()).fold(0, |all, d| d.waiting.saturating_add(all));
                let oldest = (slot.queues.values()).map(|depth| depth.oldest_age_seconds);
                ChartMinute {
                    at: rfc3339(from + index as u64 * MINUTE),
                    deliveries: slot.deliveries,
                    answers: (slot.latency.iter()).fold(0, |all, n| all.saturating_add(*n)),
                    p50_ms: quantile_ms(&slot.latency, 0.5),
                    p99_ms: quantile_ms(&slot.latency, 0.99),
                    queue_waiting: queued.then_some(waiting),
                    queue_oldest_seconds: queued.then(|| oldest.fold(0.0, f64::max)),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::minutes::RouteMinute;

    fn minute(replica: &str, at: u64, route: &str, forwarded: u64, waiting: u64) -> MinuteFigures {
        let figures = RouteMinute {
            outcomes: [
                ("forwarded".to_owned(), forwarded),
                ("in-flight".to_owned(), 1),
            ]
            .into(),
            latency: vec![forwarded],
            queue: Some(QueueDepth {
                waiting,
                oldest_age_seconds: waiting as f64,
            }),
        };
        MinuteFigures {
            replica: replica.into(),
            minute: at,
            routes: [(route.to_owned(), figures)].into(),
        }
    }

    #[test]
    fn replicas_add_up_and_a_minute_in_the_store_and_in_memory_counts_once() {
        let stored = [
            minute("a", MINUTE, "hooks", 2, 5),
            minute("b", MINUTE, "hooks", 3, 4),
            minute("b", MINUTE, "other", 10, 0),
            // Before the range, and past it: left out.
            minute("a", 0, "hooks", 100, 0),
            minute("a", 4 * MINUTE, "hooks", 100, 0),
        ];
        // "a"'s minute written and still in memory; "a"'s next, only in memory.
        let own = [
            minute("a", MINUTE, "hooks", 2, 5),
            minute("a", 2 * MINUTE, "hooks", 1, 1),
        ];
        let mut totals = MinuteTotals::new(MINUTE, 3);
        for figures in merged(&stored, &own) {
            totals.add(figures, Some("hooks"));
        }
        assert_eq!(totals.replicas.len(), 2);
        let charted = totals.charted();
        let forwarded: Vec<u64> = charted.iter().map(|m| m.deliveries.forwarded).collect();
        assert_eq!(forwarded, [5, 1, 0], "the route's only, each minute once");
        assert_eq!(
            charted[0].deliveries.duplicate, 2,
            "in-flight answers count as duplicates"
        );
        assert_eq!(charted[0].answers, 5);
        // Each replica counts the same shared queue: the deepest is charted, not the sum.
        assert_eq!(charted[0].queue_waiting, Some(5));
        assert_eq!(charted[0].queue_oldest_seconds, Some(5.0));
        assert_eq!(charted[2].queue_waiting, Some(0));
        assert_eq!(charted[2].p50_ms, None);
    }
}
