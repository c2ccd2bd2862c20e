//! The delivery log as the proxy keeps it: the [`Recorder`] takes each request's entry
//! off the request path (a bounded buffer; full, it drops and counts), a writer task
//! stores them in batches in the store's [`DeliveryLog`], tells live tails, and a trimmer
//! keeps the log within its retention and count. `query.rs` reads it back through
//! filters and cursors for the admin API.
//!
//! The log never slows or fails a delivery: recording is a `try_send`, and every store
//! failure costs entries, counted in `dedupe_delivery_log_dropped_total`, never answers.

pub(crate) mod query;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::DeliveryLogConfig;
use crate::metrics::{LogDrop, Metrics};
use crate::store::log::{DeliveryLog, LogId, LoggedDelivery};
use crate::store::{Clock, SystemClock, millis};

/// Entries waiting for the writer at most: about a second of a busy proxy's deliveries.
const BUFFER: usize = 16_384;

/// The most memory the waiting entries may hold ([`LoggedDelivery::weight`]): 16 384
/// entries with 64 KiB bodies would hold a GiB.
const BUFFER_BYTES: usize = 32 << 20;

/// Entries stored in one batch at most, and the most body bytes one batch carries.
const BATCH: usize = 512;
const BATCH_BODY_BYTES: usize = 1 << 20;

/// How often the writer takes what waits. It sleeps in between rather than waiting on
/// the buffer, so that recording an entry never wakes another thread: a wake-up per
/// delivery cost more than the rest of recording.
const WRITE_EVERY: Duration = Duration::from_millis(20);

/// Entries a live tail may fall behind by before it is told it missed some.
const TAIL_BUFFER: usize = 1024;

/// How often the log is trimmed to its retention and count.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// An entry as stored, with its id, for live tails.
pub type Stored = Arc<(LogId, LoggedDelivery)>;

/// Takes entries from the request path and has them stored.
pub struct Recorder {
    /// None when the log is off or the store keeps none.
    sender: Option<mpsc::Sender<LoggedDelivery>>,
    /// What the entries waiting for the writer weigh.
    waiting: Arc<AtomicUsize>,
    tail: broadcast::Sender<Stored>,
    log: Option<Arc<dyn DeliveryLog>>,
    unmatched: bool,
    metrics: Arc<Metrics>,
    /// Tells the writer to store what waits and end ([`Recorder::close`]).
    closing: CancellationToken,
    writer: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Stops the trimmer when the recorder goes.
    _trimming: Option<DropGuard>,
}

impl Recorder {
    /// Starts the writer and the trimmer of `log` on the current runtime.
    pub fn start(
        config: &DeliveryLogConfig,
        log: Option<Arc<dyn DeliveryLog>>,
        metrics: Arc<Metrics>,
    ) -> Recorder {
        let (tail, _) = broadcast::channel(TAIL_BUFFER);
        let log = log.filter(|_| config.enabled);
        let closing = CancellationToken::new();
        let waiting = Arc::new(AtomicUsize::new(0));
        let mut writer = None;
        let (sender, trimming) = match &log {
            Some(log) => {
                let (sender, receiver) = mpsc::channel(BUFFER);
                writer = Some(tokio::spawn(write(
                    Waiting {
                        receiver,
                        weight: Arc::clone(&waiting),
                    },
                    Arc::clone(log),
                    tail.clone(),
                    Arc::clone(&metrics),
                    replica_name(),
                    closing.clone(),
                )));
                let stop = CancellationToken::new();
                let trimmer = trim(
                    Arc::clone(log),
                    config.retention.0,
                    config.max_entries,
                    Arc::clone(&metrics),
                );
                let stopped = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stopped.cancelled() => {}
                        () = trimmer => {}
                    }
                });
                (Some(sender), Some(stop.drop_guard()))
            }
            None => (None, None),
        };
        Recorder {
            sender,
            waiting,
            tail,
            log,
            unmatched: config.unmatched,
            metrics,
            closing,
            writer: parking_lot::Mutex::new(writer),
            _trimming: trimming,
        }
    }

    /// Whether entries are recorded at all.
    pub fn enabled(&self) -> bool {
        self.sender.is_some()
    }

    /// Whether requests no route took are recorded.
    pub fn records_unmatched(&self) -> bool {
        self.unmatched && self.enabled()
    }

    /// Hands `entry` to the writer, or drops it (counted) if the writer is behind by
    /// [`BUFFER`] entries or [`BUFFER_BYTES`].
    pub fn record(&self, entry: LoggedDelivery) {
        let Some(sender) = &self.sender else {
            return;
        };
        let weight = entry.weight();
        let before = self.waiting.fetch_add(weight, Ordering::Relaxed);
        if before + weight > BUFFER_BYTES || sender.try_send(entry).is_err() {
            self.waiting.fetch_sub(weight, Ordering::Relaxed);
            self.metrics.log.dropped(LogDrop::Full, 1);
        }
    }

    /// Stores what waits and stops storing, within `within` (at shutdown, before the
    /// store is flushed): what is recorded from then on is dropped.
    pub async fn close(&self, within: Duration) {
        self.closing.cancel();
        let writer = self.writer.lock().take();
        if let Some(writer) = writer
            && tokio::time::timeout(within, writer).await.is_err()
        {
            tracing::warn!("the delivery log did not store its last entries in time");
        }
    }

    /// The log, to read back.
    pub fn log(&self) -> Option<&Arc<dyn DeliveryLog>> {
        self.log.as_ref()
    }

    /// Every entry stored from now on, as it is stored.
    pub fn subscribe(&self) -> broadcast::Receiver<Stored> {
        self.tail.subscribe()
    }
}

/// This replica's name for its entries: the host's (a pod's name on Kubernetes).
/// `HOSTNAME` is set in containers and pods; a service manager may leave it out.
pub(crate) fn replica_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

/// Stores what the recorder takes, a batch at a time and named after `replica`, until the
/// recorder is gone or `closing`, and every entry taken is stored.
async fn write(
    mut waiting: Waiting,
    log: Arc<dyn DeliveryLog>,
    tail: broadcast::Sender<Stored>,
    metrics: Arc<Metrics>,
    replica: Option<String>,
    closing: CancellationToken,
) {
    let mut taken = Vec::with_capacity(BATCH);
    let mut last_warning: Option<std::time::Instant> = None;
    let mut ticks = tokio::time::interval(WRITE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let closed = match take(&mut waiting, &mut taken) {
            Taken::Empty if closing.is_cancelled() => return,
            Taken::Empty => {
                tokio::select! {
                    _ = ticks.tick() => {}
                    () = closing.cancelled() => {}
                }
                continue;
            }
            Taken::Some => false,
            Taken::Closed => true,
        };
        for entry in &mut taken {
            entry.replica.clone_from(&replica);
        }
        let mut rest = taken.as_slice();
        while !rest.is_empty() {
            let batch = &rest[..batch_length(rest)];
            rest = &rest[batch.len()..];
            match log.append(batch).await {
                Ok(ids) => {
                    metrics.log.stored(batch.len());
                    // Summaries: a tail shows no body, and its buffer holds none.
                    if tail.receiver_count() > 0 {
                        for (id, entry) in ids.into_iter().zip(batch) {
                            let _ = tail.send(Arc::new((id, entry.summary())));
                        }
                    }
                }
                Err(error) => {
                    metrics.log.dropped(LogDrop::StoreError, batch.len());
                    // At most one line a minute: a store that is down would fill the log.
                    if last_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                        tracing::warn!(%error, entries = batch.len(), "the delivery log could not store entries; they are dropped");
                        last_warning = Some(std::time::Instant::now());
                    }
                }
            }
        }
        // Only now: until stored, the entries taken are still in memory.
        let weight = taken.iter().map(LoggedDelivery::weight).sum();
        waiting.weight.fetch_sub(weight, Ordering::Relaxed);
        taken.clear();
        if closed {
            return;
        }
    }
}

/// What [`take`] found waiting.
enum Taken {
    /// Entries, a batch at most (more may wait).
    Some,
    Empty,
    /// The recorder is gone: what it handed over is taken, and no more comes.
    Closed,
}

/// The entries handed to the writer, and what those not yet taken weigh.
struct Waiting {
    receiver: mpsc::Receiver<LoggedDelivery>,
    weight: Arc<AtomicUsize>,
}

/// Takes up to [`BATCH`] entries that wait, without waiting for any.
fn take(waiting: &mut Waiting, taken: &mut Vec<LoggedDelivery>) -> Taken {
    while taken.len() < BATCH {
        match waiting.receiver.try_recv() {
            Ok(entry) => taken.push(entry),
            Err(mpsc::error::TryRecvError::Empty) if taken.is_empty() => return Taken::Empty,
            Err(mpsc::error::TryRecvError::Empty) => return Taken::Some,
            Err(mpsc::error::TryRecvError::Disconnected) => return Taken::Closed,
        }
    }
    Taken::Some
}

/// How many of `entries` go in the next batch: at least one, and no more than
/// [`BATCH_BODY_BYTES`] of bodies.
fn batch_length(entries: &[LoggedDelivery]) -> usize {
    let mut bytes = 0;
    for (index, entry) in entries.iter().enumerate() {
        bytes += entry.body.as_ref().map_or(0, |body| body.len());
        if bytes > BATCH_BODY_BYTES && index > 0 {
            return index;
        }
    }
    entries.len()
}

/// Trims the log to `retention` and `max_entries` every [`TRIM_EVERY`].
async fn trim(
    log: Arc<dyn DeliveryLog>,
    retention: Duration,
    max_entries: u64,
    metrics: Arc<Metrics>,
) {
    let mut ticks = tokio::time::interval(TRIM_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let older_than = SystemClock.now().saturating_sub(millis(retention));
        match log.trim(older_than, max_entries).await {
            Ok(removed) => metrics.log.trimmed(removed),
            Err(error) => tracing::warn!(%error, "trimming the delivery log failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: usize) -> LoggedDelivery {
        LoggedDelivery {
            key: None,
            ..LoggedDelivery::sample("", 0, body)
        }
    }

    /// A log whose store never answers, or always fails.
    struct Stalled(bool);

    #[async_trait::async_trait]
    impl DeliveryLog for Stalled {
        async fn append(
            &self,
            _: &[LoggedDelivery],
        ) -> Result<Vec<LogId>, crate::store::StoreError> {
            if self.0 {
                std::future::pending::<()>().await;
            }
            Err(crate::store::StoreError::Backend("down".into()))
        }
        async fn read(
            &self,
            _: Option<LogId>,
            _: usize,
        ) -> Result<crate::store::log::LogRead, crate::store::StoreError> {
            Ok(Default::default())
        }
        async fn get(&self, _: LogId) -> Result<Option<LoggedDelivery>, crate::store::StoreError> {
            Ok(None)
        }
        async fn trim(&self, _: u64, _: u64) -> Result<u64, crate::store::StoreError> {
            Ok(0)
        }
    }

    fn dropped(metrics: &Metrics, reason: &str) -> u64 {
        let text = metrics.encode(crate::metrics::KeyCounts::default());
        let series = format!("dedupe_delivery_log_dropped_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn a_log_that_cannot_keep_up_drops_and_counts_and_never_waits() {
        let metrics = Arc::new(Metrics::new());
        let config = DeliveryLogConfig::default();
        let stuck = Recorder::start(&config, Some(Arc::new(Stalled(true))), Arc::clone(&metrics));
        // The writer takes its first batch, then never comes back for more.
        stuck.record(entry(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        let offered = BUFFER + 5000;
        for _ in 0..offered {
            stuck.record(entry(0));
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "recording never waits"
        );
        assert_eq!(dropped(&metrics, "full"), (offered - BUFFER) as u64);

        let failing = Recorder::start(
            &config,
            Some(Arc::new(Stalled(false))),
            Arc::clone(&metrics),
        );
        for _ in 0..10 {
            failing.record(entry(0));
        }
        let waited = std::time::Instant::now();
        while dropped(&metrics, "store_error") < 10 {
            assert!(
                waited.elapsed() < Duration::from_secs(5),
                "store errors counted"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn waiting_entries_hold_32_mib_at_most_whatever_their_bodies() {
        let metrics = Arc::new(Metrics::new());
        let config = DeliveryLogConfig::default();
        let stuck = Recorder::start(&config, Some(Arc::new(Stalled(true))), Arc::clone(&metrics));
        stuck.record(entry(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The first entry stays counted while the writer is stuck storing it.
        let large = entry(64 << 10);
        let fit = (BUFFER_BYTES - entry(0).weight()) / large.weight();
        for _ in 0..fit + 100 {
            stuck.record(large.clone());
        }
        assert_eq!(
            dropped(&metrics, "full"),
            100,
            "{fit} entries of 64 KiB fit"
        );
        assert!(stuck.waiting.load(Ordering::Relaxed) <= BUFFER_BYTES);
        // Small entries still get in up to the count, not pushed out by the bytes.
        let small = Recorder::start(
            &config,
            Some(Arc::new(Stalled(true))),
            Arc::new(Metrics::new()),
        );
        small.record(entry(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..BUFFER {
            small.record(entry(16));
        }
        assert_eq!(
            small.waiting.load(Ordering::Relaxed),
            entry(0).weight() + BUFFER * entry(16).weight()
        );
    }

    #[test]
    fn a_batch_carries_a_megabyte_of_bodies_at_most_and_one_entry_at_least() {
        let big = vec![entry(600 << 10), entry(600 << 10), entry(10)];
        assert_eq!(batch_length(&big), 1);
        assert_eq!(batch_length(&big[1..]), 2);
        let huge = vec![entry(2 << 20)];
        assert_eq!(batch_length(&huge), 1);
    }
}
