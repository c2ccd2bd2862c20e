//! What each replica says of itself in a shared store (its identity, version, start and
//! its requests so far), so that any replica's overview shows them all. A replica reports
//! every [`REPORT_EVERY`]; one not heard from for [`SILENT_AFTER`] is shown as silent, and
//! a report older than [`FORGOTTEN_AFTER`] is dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::{LATEST, Millis};

/// How often a replica reports.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// A replica not heard from for this long has stopped reporting (three reports missed).
pub const SILENT_AFTER: Duration = Duration::from_secs(15);

/// A report this old is dropped from the store: a replica stopped an hour ago is gone.
pub const FORGOTTEN_AFTER: Duration = Duration::from_secs(3600);

/// The largest report read: a few dozen outcomes' counts take a few hundred bytes.
pub const REPORT_MAX: usize = 16 * 1024;

/// One replica's latest report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// The host's name, the process's id and a number drawn at its start: unique among
    /// replicas, though several share a host name (host networking) and a pid (1).
    pub id: String,
    pub version: String,
    pub started_at: Millis,
    pub seen_at: Millis,
    /// Requests since it started, by outcome.
    pub requests: BTreeMap<String, u64>,
}

impl ReplicaReport {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a report is JSON")
    }

    /// A report as stored; refused if it is larger than [`REPORT_MAX`] or carries a time
    /// no clock gives (whoever else writes to the store cannot break the overview).
    pub fn decode(bytes: &[u8]) -> Result<ReplicaReport, StoreError> {
        let refused = |why: String| StoreError::Backend(format!("a replica's report: {why}"));
        if bytes.len() > REPORT_MAX {
            return Err(refused(format!("{} bytes", bytes.len())));
        }
        let report: ReplicaReport =
            serde_json::from_slice(bytes).map_err(|e| refused(e.to_string()))?;
        if report.seen_at > LATEST || report.started_at > LATEST {
            return Err(refused("a time past the year 9999".into()));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_no_replica_could_write_is_refused() {
        let written = ReplicaReport {
            id: "host:1:00ff".into(),
            version: "0.1.0".into(),
            started_at: 1_000,
            seen_at: 2_000,
            requests: [("forwarded".to_owned(), 3)].into(),
        };
        assert_eq!(
            ReplicaReport::decode(written.encode().as_bytes()).unwrap(),
            written
        );
        // A time RFC 3339 cannot write (the overview would fail on it), garbage, and a
        // report larger than any replica writes.
        let far = ReplicaReport {
            seen_at: LATEST + 1,
            ..written.clone()
        };
        let huge = ReplicaReport {
            id: "x".repeat(REPORT_MAX),
            ..written
        };
        for refused in [
            far.encode().into_bytes(),
            b"\xff{".to_vec(),
            huge.encode().into_bytes(),
        ] {
            assert!(ReplicaReport::decode(&refused).is_err());
        }
    }
}
