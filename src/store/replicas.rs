//! What each replica says of itself in a shared store (its identity, version, start and
//! its requests so far), so that any replica's overview shows them all. A replica reports
//! every [`REPORT_EVERY`]; one not heard from for [`SILENT_AFTER`] is shown as silent, and
//! a report older than [`FORGOTTEN_AFTER`] is dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::Millis;

/// How often a replica reports.
pub const REPORT_EVERY: Duration = Duration::from_secs(15);

/// A replica not heard from for this long has stopped reporting (three reports missed).
pub const SILENT_AFTER: Duration = Duration::from_secs(45);

/// A report this old is dropped from the store.
pub const FORGOTTEN_AFTER: Duration = Duration::from_secs(24 * 3600);

/// One replica's latest report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// The host's name and the process's id: unique among replicas, and the same for a
    /// container restarted in its pod.
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

    pub fn decode(text: &str) -> Result<ReplicaReport, StoreError> {
        serde_json::from_str(text)
            .map_err(|error| StoreError::Backend(format!("a replica's report: {error}")))
    }
}
