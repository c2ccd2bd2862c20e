//! The figures behind the console's charts (`store::minutes`): at each minute's end, what
//! the request counters gained in it, the app's answers counted by latency, and each
//! queued route's depth; and the [`MinuteBook`] that keeps the ended minutes until the
//! store takes them (and the last hour's, to chart while it does not answer). Taken from
//! the counters the proxy keeps anyway, so the request path pays one more atomic add per
//! answer of the app, for the latency buckets that prometheus-client keeps to itself.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::store::minutes::{MinuteFigures, QueueDepth, RouteMinute};

/// The app's latency buckets' upper bounds, in seconds: 1 ms to about 33 s, a local
/// application's answer up to the longest timeouts. One more bucket counts the rest.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192, 16.384, 32.768,
];

/// How many ended minutes a replica keeps while the store does not take them: a day.
pub const UNWRITTEN_MAX: usize = 1440;

/// How many of its latest ended minutes a replica keeps to chart while the store does not
/// answer: an hour.
pub const RECENT_MAX: usize = 60;

/// `dedupe_upstream_duration_seconds` for one route, with its buckets' counts readable.
#[derive(Debug)]
pub struct LatencyHistogram {
    histogram: Histogram,
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            histogram: Histogram::new(LATENCY_BUCKETS),
            buckets: Default::default(),
        }
    }
}

impl LatencyHistogram {
    pub fn observe(&self, seconds: f64) {
        self.histogram.observe(seconds);
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn counts(&self) -> Vec<u64> {
        let count = |bucket: &AtomicU64| bucket.load(Ordering::Relaxed);
        self.buckets.iter().map(count).collect()
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.histogram.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The quantile `q` (0 to 1) of answers counted in [`LATENCY_BUCKETS`], in milliseconds:
/// placed linearly inside its bucket (as Prometheus' `histogram_quantile`), and at the
/// last bound when it falls above it. `None` without answers.
pub fn quantile_ms(counts: &[u64], q: f64) -> Option<f64> {
    // Counts come from the store: added without overflowing, as floats.
    let total: f64 = counts.iter().map(|count| *count as f64).sum();
    if total == 0.0 {
        return None;
    }
    let rank = q * total;
    let mut below = 0.0;
    for (bucket, count) in counts.iter().enumerate() {
        let count = *count as f64;
        if count > 0.0 && below + count >= rank {
            let Some(upper) = LATENCY_BUCKETS.get(bucket) else {
                break;
            };
            let lower = if bucket == 0 {
                0.0
            } else {
                LATENCY_BUCKETS[bucket - 1]
            };
            let within = (rank - below) / count;
            return Some((lower + (upper - lower) * within) * 1000.0);
        }
        below += count;
    }
    Some(LATENCY_BUCKETS[LATENCY_BUCKETS.len() - 1] * 1000.0)
}

/// One route's counters, as read at a minute's end: deliveries by outcome and the app's
/// answers by latency bucket, since the start.
#[derive(Debug, Clone, Default)]
pub struct RouteCounters {
    pub outcomes: Vec<(&'static str, u64)>,
    pub latency: Vec<u64>,
    /// A queued route's depth, as last counted.
    pub queue: Option<QueueDepth>,
}

/// The counters at the last minute's end, the ended minutes the store has not taken, and
/// the last hour's, written or not.
#[derive(Default)]
pub struct MinuteBook {
    state: parking_lot::Mutex<BookState>,
}

#[derive(Default)]
struct BookState {
    /// Each route's counters as last read; a route gone from the table keeps its reading,
    /// so that if it comes back (its counters were never reset) its next minute holds what
    /// it gained since, not all it ever counted.
    last: HashMap<String, RouteCounters>,
    unwritten: VecDeque<MinuteFigures>,
    recent: VecDeque<MinuteFigures>,
}

impl MinuteBook {
    /// Ends the minute starting at `minute`: its figures are what each route's `counters`
    /// gained since the last end, kept to be written (the oldest dropped past
    /// [`UNWRITTEN_MAX`]).
    pub fn end_minute(&self, replica: &str, minute: u64, counters: HashMap<String, RouteCounters>) {
        let mut state = self.state.lock();
        let figures = gained(replica, minute, &state.last, &counters);
        state.last.extend(counters);
        if figures.is_empty() {
            return;
        }
        if state.unwritten.len() == UNWRITTEN_MAX {
            state.unwritten.pop_front();
        }
        if state.recent.len() == RECENT_MAX {
            state.recent.pop_front();
        }
        state.recent.push_back(figures.clone());
        state.unwritten.push_back(figures);
    }

    /// The figures of the minute still running, from each route's `counters` now.
    pub fn running_minute(
        &self,
        replica: &str,
        minute: u64,
        counters: &HashMap<String, RouteCounters>,
    ) -> MinuteFigures {
        gained(replica, minute, &self.state.lock().last, counters)
    }

    /// The ended minutes not written yet, oldest first.
    pub fn unwritten(&self) -> Vec<MinuteFigures> {
        self.state.lock().unwritten.iter().cloned().collect()
    }

    /// This replica's ended minutes it still has: those not written, and the last hour's.
    pub fn own_minutes(&self) -> Vec<MinuteFigures> {
        let state = self.state.lock();
        let older = (state.unwritten.iter()).filter(|figures| {
            !state
                .recent
                .iter()
                .any(|recent| recent.minute == figures.minute)
        });
        older.chain(&state.recent).cloned().collect()
    }

    /// Forgets the ended minutes the store took.
    pub fn forget_written(&self, written: &[MinuteFigures]) {
        let mut state = self.state.lock();
        state
            .unwritten
            .retain(|figures| !written.iter().any(|w| w == figures));
    }

    /// How many ended minutes wait for the store.
    pub fn backlog(&self) -> usize {
        self.state.lock().unwritten.len()
    }
}

/// What each route's counters gained from `last` to `now`, as the figures of `minute`;
/// a direct route with nothing new is left out (a queued route always has its depth).
fn gained(
    replica: &str,
    minute: u64,
    last: &HashMap<String, RouteCounters>,
    now: &HashMap<String, RouteCounters>,
) -> MinuteFigures {
    let mut routes = BTreeMap::new();
    for (name, counters) in now {
        let before = last.get(name);
        let earlier = |outcome: &str| {
            before
                .and_then(|b| b.outcomes.iter().find(|(o, _)| *o == outcome))
                .map_or(0, |(_, count)| *count)
        };
        let outcomes: BTreeMap<String, u64> = counters
            .outcomes
            .iter()
            .map(|(outcome, count)| {
                (
                    (*outcome).to_owned(),
                    count.saturating_sub(earlier(outcome)),
                )
            })
            .filter(|(_, count)| *count > 0)
            .collect();
        let mut latency: Vec<u64> = counters
            .latency
            .iter()
            .enumerate()
            .map(|(bucket, count)| {
                let was = before.and_then(|b| b.latency.get(bucket)).copied();
                count.saturating_sub(was.unwrap_or(0))
            })
            .collect();
        if latency.iter().all(|count| *count == 0) {
            latency.clear();
        }
        let queue = counters.queue;
        if outcomes.is_empty() && latency.is_empty() && queue.is_none() {
            continue;
        }
        let figures = RouteMinute {
            outcomes,
            latency,
            queue,
        };
        routes.insert(name.clone(), figures);
    }
    MinuteFigures {
        replica: replica.to_owned(),
        minute,
        routes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_fall_inside_the_bucket_that_holds_them() {
        // 100 answers: 50 within 1 ms, 49 within 2-4 ms, one above 32.768 s.
        let mut counts = vec![0u64; LATENCY_BUCKETS.len() + 1];
        (counts[0], counts[2], counts[16]) = (50, 49, 1);
        assert_eq!(quantile_ms(&counts, 0.5), Some(1.0));
        let p99 = quantile_ms(&counts, 0.99).unwrap();
        assert!((2.0..=4.0).contains(&p99), "{p99}");
        assert_eq!(quantile_ms(&counts, 1.0), Some(32768.0));
        assert_eq!(quantile_ms(&[0; 17], 0.5), None);
    }

    #[test]
    fn an_answer_is_counted_in_the_first_bucket_that_holds_it() {
        let histogram = LatencyHistogram::default();
        for seconds in [0.0005, 0.001, 0.0011, 0.03, 40.0] {
            histogram.observe(seconds);
        }
        let counts = histogram.counts();
        assert_eq!((counts[0], counts[1], counts[5], counts[16]), (2, 1, 1, 1));
        assert_eq!(counts.iter().sum::<u64>(), 5);
    }

    #[test]
    fn a_minute_holds_what_the_counters_gained_in_it() {
        let book = MinuteBook::default();
        let at = |forwarded: u64, answers: u64| {
            let counters = RouteCounters {
                outcomes: vec![("forwarded", forwarded), ("duplicate", 0)],
                latency: vec![answers, 0],
                queue: None,
            };
            HashMap::from([("hooks".to_owned(), counters)])
        };
        book.end_minute("r", 0, at(5, 5));
        book.end_minute("r", 60_000, at(5, 5));
        book.end_minute("r", 120_000, at(7, 6));
        let ended = book.unwritten();
        // The quiet minute is left out.
        assert_eq!(ended.len(), 2);
        let route = &ended[1].routes["hooks"];
        assert_eq!(route.outcomes, BTreeMap::from([("forwarded".into(), 2)]));
        assert_eq!(route.latency, vec![1, 0]);
        assert_eq!(
            book.running_minute("r", 180_000, &at(8, 6)).routes["hooks"].outcomes["forwarded"],
            1
        );
        book.forget_written(&ended[..1]);
        assert_eq!(book.unwritten(), ended[1..].to_vec());
        // Written or not, the last hour's minutes stay to be charted.
        assert_eq!(book.own_minutes(), ended);
        // A route gone from the table and back gains from its last reading, not from zero.
        book.end_minute("r", 180_000, HashMap::new());
        book.end_minute("r", 240_000, at(9, 6));
        let back = book.unwritten().pop().unwrap();
        assert_eq!(
            (back.minute, back.routes["hooks"].outcomes["forwarded"]),
            (240_000, 2)
        );
    }
}
