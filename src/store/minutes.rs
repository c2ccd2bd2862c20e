//! Each replica's figures of each minute (its deliveries by route and outcome, the app's
//! answers counted by latency, and each queued route's depth), kept in the store for a
//! day, so that the console's charts survive a restart and show every replica sharing a
//! store. A replica writes a minute once it ends; whoever reads adds the replicas up.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::{LATEST, Millis};

/// One minute, in milliseconds.
pub const MINUTE: Millis = 60_000;

/// How long a minute's figures are kept: the console draws the last day.
pub const KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

/// The largest minute read: a few hundred routes' figures. A replica with more routes
/// than fit writes the busiest that do ([`MinuteFigures::encode`]).
pub const MINUTE_MAX: usize = 256 * 1024;

/// The most records one read returns: a day of 64 replicas' minutes.
pub const READ_MAX: usize = 64 * 1440;

/// One replica's figures of one minute.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MinuteFigures {
    /// The replica's id (`store::replicas`).
    pub replica: String,
    /// The minute's start: milliseconds since the epoch, a multiple of [`MINUTE`].
    pub minute: Millis,
    /// By route name.
    pub routes: BTreeMap<String, RouteMinute>,
}

/// One route's figures of a minute on one replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteMinute {
    /// Deliveries by outcome (the `Dedupe-Status` values), those counted only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outcomes: BTreeMap<String, u64>,
    /// The app's answers by latency: entry `i` counts those within bucket `i` of
    /// `metrics::LATENCY_BUCKETS` (and above its last bound, the last entry); empty when
    /// the app answered nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency: Vec<u64>,
    /// A queued route's depth at the minute's end, as the replica last counted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueDepth>,
}

/// A queued route's jobs not yet delivered, and the age of the oldest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueDepth {
    pub waiting: u64,
    pub oldest_age_seconds: f64,
}

impl MinuteFigures {
    /// Whether nothing happened in the minute on any route.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The record as stored: JSON of at most [`MINUTE_MAX`] bytes, the routes with the
    /// fewest deliveries left out where all do not fit.
    pub fn encode(&self) -> String {
        let text = serde_json::to_string(self).expect("a minute is JSON");
        if text.len() <= MINUTE_MAX {
            return text;
        }
        let mut routes: Vec<(&String, &RouteMinute)> = self.routes.iter().collect();
        routes
            .sort_by_key(|(_, figures)| std::cmp::Reverse(figures.outcomes.values().sum::<u64>()));
        let mut kept = MinuteFigures {
            routes: BTreeMap::new(),
            ..self.clone()
        };
        let mut size = serde_json::to_string(&kept).map_or(0, |text| text.len());
        for (name, figures) in routes {
            let more = name.len() + serde_json::to_string(figures).map_or(0, |text| text.len()) + 4;
            if size + more > MINUTE_MAX {
                break;
            }
            size += more;
            kept.routes.insert(name.clone(), figures.clone());
        }
        serde_json::to_string(&kept).expect("a minute is JSON")
    }

    /// A record as stored; refused if it is larger than [`MINUTE_MAX`], is not on a
    /// minute, or carries one no clock gives, so that whoever else writes to the store
    /// cannot break the charts.
    pub fn decode(bytes: &[u8]) -> Result<MinuteFigures, StoreError> {
        let refused = |why: String| StoreError::Backend(format!("a minute's figures: {why}"));
        if bytes.len() > MINUTE_MAX {
            return Err(refused(format!("{} bytes", bytes.len())));
        }
        let figures: MinuteFigures =
            serde_json::from_slice(bytes).map_err(|e| refused(e.to_string()))?;
        if figures.minute > LATEST || !figures.minute.is_multiple_of(MINUTE) {
            return Err(refused(format!("no minute starts at {}", figures.minute)));
        }
        Ok(figures)
    }
}

/// The start of the minute `at` falls in.
pub fn minute_of(at: Millis) -> Millis {
    at - at % MINUTE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(forwarded: u64) -> RouteMinute {
        RouteMinute {
            outcomes: [("forwarded".to_owned(), forwarded)].into(),
            latency: vec![0, forwarded],
            queue: None,
        }
    }

    #[test]
    fn a_minute_reads_back_and_one_no_replica_could_write_is_refused() {
        let written = MinuteFigures {
            replica: "host:1:00ff".into(),
            minute: 120_000,
            routes: [("hooks".to_owned(), route(3))].into(),
        };
        assert_eq!(
            MinuteFigures::decode(written.encode().as_bytes()).unwrap(),
            written
        );
        let off_the_minute = MinuteFigures {
            minute: 120_001,
            ..written.clone()
        };
        let far = MinuteFigures {
            minute: minute_of(LATEST) + MINUTE,
            ..written.clone()
        };
        let huge = format!(
            r#"{{"replica":"{}","minute":0,"routes":{{}}}}"#,
            "x".repeat(MINUTE_MAX)
        );
        for refused in [
            off_the_minute.encode().into_bytes(),
            far.encode().into_bytes(),
            b"\xff{".to_vec(),
            huge.into_bytes(),
        ] {
            assert!(MinuteFigures::decode(&refused).is_err());
        }
    }

    #[test]
    fn a_minute_of_too_many_routes_keeps_the_busiest_that_fit() {
        let routes = (0..20_000u64)
            .map(|n| (format!("route-{n:05}"), route(n)))
            .collect();
        let figures = MinuteFigures {
            replica: "r".into(),
            minute: 0,
            routes,
        };
        let text = figures.encode();
        assert!(text.len() <= MINUTE_MAX, "{}", text.len());
        let kept = MinuteFigures::decode(text.as_bytes()).unwrap();
        assert!(kept.routes.len() > 100, "{}", kept.routes.len());
        assert!(kept.routes.contains_key("route-19999"));
        assert!(!kept.routes.contains_key("route-00000"));
    }
}
