//! The metrics of the delivery log (`dedupe_delivery_log_*`): entries stored, entries
//! dropped (the recorder's buffer full, or the store failing) and entries trimmed.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Why entries were not logged, for `dedupe_delivery_log_dropped_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogDrop {
    /// The buffer before the store was full: the store did not keep up.
    Full,
    /// The store refused or did not answer.
    StoreError,
}

impl LogDrop {
    const ALL: [LogDrop; 2] = [LogDrop::Full, LogDrop::StoreError];

    fn as_str(self) -> &'static str {
        match self {
            LogDrop::Full => "full",
            LogDrop::StoreError => "store_error",
        }
    }
}

/// `dedupe_delivery_log_*`.
#[derive(Default)]
pub(crate) struct LogMetrics {
    stored: Counter,
    dropped: Family<ReasonLabel, Counter>,
    trimmed: Counter,
}

impl LogMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        for reason in LogDrop::ALL {
            let _ = self.dropped.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        registry.register(
            "dedupe_delivery_log_stored",
            "Entries stored in the delivery log",
            self.stored.clone(),
        );
        registry.register(
            "dedupe_delivery_log_dropped",
            "Entries the delivery log dropped: its buffer full (the store did not keep up) or the store failing; deliveries never wait for the log",
            self.dropped.clone(),
        );
        registry.register(
            "dedupe_delivery_log_trimmed",
            "Entries removed from the delivery log for its retention or its max_entries",
            self.trimmed.clone(),
        );
    }

    pub(crate) fn stored(&self, entries: usize) {
        self.stored.inc_by(entries as u64);
    }

    pub(crate) fn dropped(&self, reason: LogDrop, entries: usize) {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc_by(entries as u64);
    }

    pub(crate) fn trimmed(&self, entries: u64) {
        self.trimmed.inc_by(entries);
    }
}
