//! The store's time: milliseconds since the Unix epoch, read from a [`Clock`] that tests
//! can move by hand.

#[cfg(any(test, feature = "testing"))]
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// Where the store reads the time; tests substitute a manual clock.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

/// The system's wall clock.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to (tests only).
#[cfg(any(test, feature = "testing"))]
#[derive(Default)]
pub struct ManualClock(std::sync::atomic::AtomicU64);

#[cfg(any(test, feature = "testing"))]
impl ManualClock {
    pub fn new(start: Millis) -> Arc<ManualClock> {
        Arc::new(ManualClock(std::sync::atomic::AtomicU64::new(start)))
    }

    pub fn advance(&self, by: Duration) {
        self.0
            .fetch_add(millis(by), std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(any(test, feature = "testing"))]
impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A duration in whole milliseconds, saturating.
pub fn millis(duration: Duration) -> Millis {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The latest time RFC 3339 writes (the end of year 9999): a record read from a store
/// with a later one is refused, as no clock gives it.
pub(crate) const LATEST: Millis = 253_402_300_799_999;

/// A time as RFC 3339 text, in UTC, to the millisecond.
pub(crate) fn rfc3339(at: Millis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at)).to_string()
}

/// RFC 3339 text (as an operator writes it in a filter or a request) as a time; the error
/// says what was wrong, naming the value `name`.
pub(crate) fn parse_rfc3339(name: &str, text: &str) -> Result<Millis, String> {
    let at = humantime::parse_rfc3339_weak(text)
        .map_err(|_| format!("{name} `{text}` is not a time like 2026-12-01T10:00:00Z"))?;
    at.duration_since(UNIX_EPOCH)
        .map(millis)
        .map_err(|_| format!("{name} `{text}` is before 1970"))
}
