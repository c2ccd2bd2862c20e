//! Deliveries waiting for the outcome of another delivery of their key
//! (`on_in_flight: wait`): who waits on which store key, how many may, and the
//! announcements that wake them, which the proxy makes when it finishes, releases or
//! holds a key after a forward, and which a shared store passes on from the other
//! replicas.
//!
//! A waiter is registered before it looks at the store again, and an announcement leaves
//! a permit with every waiter of the key (`Notify::notify_one`), so an outcome that lands
//! between the look and the wait still wakes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How soon a waiter looks at the store again without an announcement (a lease may end,
/// or an announcement be lost while a shared store is out of reach), doubling after
/// each look up to [`RECHECK_MAX`]: many waiters must not load a shared store. The
/// configuration docs repeat both values.
pub const RECHECK: Duration = Duration::from_millis(250);
pub const RECHECK_MAX: Duration = Duration::from_secs(2);

/// A waiter as its keys list it: its number, and how to wake it.
type Registered = (u64, Arc<Notify>);

/// The waiters of this process.
pub struct Waiting {
    by_key: Mutex<HashMap<String, Vec<Registered>>>,
    /// Registered waiters, so that an announcement with none costs one atomic read.
    registered: AtomicUsize,
    places: Arc<Semaphore>,
    /// Waiters per key scope: one scope takes at most `scope_places` (half the places),
    /// so that a sender flooding one route with duplicates leaves the others room.
    by_scope: Mutex<HashMap<String, usize>>,
    scope_places: usize,
    next_id: AtomicU64,
    closing: CancellationToken,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// An outcome was announced, or it is time to look again: look at the store.
    Look,
    /// The wait ran out.
    TimedOut,
    /// The proxy is shutting down.
    Closing,
}

impl Waiting {
    /// At most `places` deliveries wait at once, at most half of them on one scope.
    pub fn new(places: usize) -> Waiting {
        let places = places.max(1);
        Waiting {
            by_key: Mutex::new(HashMap::new()),
            registered: AtomicUsize::new(0),
            places: Arc::new(Semaphore::new(places)),
            by_scope: Mutex::new(HashMap::new()),
            scope_places: (places / 2).max(1),
            next_id: AtomicU64::new(0),
            closing: CancellationToken::new(),
        }
    }

    /// Registers a waiter of the key scope `scope` on `keys`, or `None` when every place,
    /// or every place the scope may take, is taken, or the proxy is shutting down.
    pub fn register(self: &Arc<Self>, scope: &str, keys: Vec<String>) -> Option<Waiter> {
        if self.closing.is_cancelled() {
            return None;
        }
        let mut by_scope = self.by_scope.lock();
        let taken = by_scope.get(scope).copied().unwrap_or(0);
        if taken >= self.scope_places {
            return None;
        }
        let place = Arc::clone(&self.places).try_acquire_owned().ok()?;
        by_scope.insert(scope.to_owned(), taken + 1);
        drop(by_scope);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let mut by_key = self.by_key.lock();
        for key in &keys {
            by_key
                .entry(key.clone())
                .or_default()
                .push((id, Arc::clone(&wake)));
        }
        self.registered.fetch_add(1, Ordering::SeqCst);
        Some(Waiter {
            waiting: Arc::clone(self),
            id,
            scope: scope.to_owned(),
            keys,
            wake,
            recheck: RECHECK,
            _place: place,
        })
    }

    /// Wakes the waiters of `key`: its delivery finished or was released here.
    pub fn announce(&self, key: &str) {
        // SeqCst with the registration's increment: a waiter registered before its look at
        // the store is seen here whenever the look could have missed this outcome.
        if self.registered.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(waiters) = self.by_key.lock().get(key) {
            for (_, wake) in waiters {
                wake.notify_one();
            }
        }
    }

    /// Ends every wait at once, and refuses new ones (shutdown).
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// How many deliveries wait now.
    pub fn count(&self) -> usize {
        self.registered.load(Ordering::Relaxed)
    }
}

/// One delivery's wait; dropping it (its sender hung up) removes it.
pub struct Waiter {
    waiting: Arc<Waiting>,
    id: u64,
    scope: String,
    keys: Vec<String>,
    wake: Arc<Notify>,
    /// The pause before the next look without an announcement.
    recheck: Duration,
    _place: OwnedSemaphorePermit,
}

impl Waiter {
    /// Waits for an announcement of one of its keys, the next recheck, `until` or
    /// shutdown, whichever comes first.
    pub async fn wait(&mut self, until: Instant) -> Woken {
        let recheck = (Instant::now() + self.recheck).min(until);
        self.recheck = (self.recheck * 2).min(RECHECK_MAX);
        tokio::select! {
            () = self.waiting.closing.cancelled() => Woken::Closing,
            () = self.wake.notified() => Woken::Look,
            () = tokio::time::sleep_until(recheck) => {
                if recheck >= until { Woken::TimedOut } else { Woken::Look }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut by_key = self.waiting.by_key.lock();
        for key in &self.keys {
            if let Some(waiters) = by_key.get_mut(key) {
                waiters.retain(|(id, _)| *id != self.id);
                if waiters.is_empty() {
                    by_key.remove(key);
                }
            }
        }
        drop(by_key);
        let mut by_scope = self.waiting.by_scope.lock();
        if let Some(taken) = by_scope.get_mut(&self.scope) {
            *taken -= 1;
            if *taken == 0 {
                by_scope.remove(&self.scope);
            }
        }
        self.waiting.registered.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_announcement_wakes_the_waiters_of_its_key_only() {
        let waiting = Arc::new(Waiting::new(8));
        let mut a = waiting.register("s", keys(&["a", "body"])).unwrap();
        let mut b = waiting.register("s", keys(&["b"])).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        // Announced before the wait began: the permit is kept.
        waiting.announce("body");
        assert_eq!(a.wait(until).await, Woken::Look);
        let started = Instant::now();
        assert_eq!(b.wait(until).await, Woken::Look, "only the recheck wakes b");
        assert_eq!(started.elapsed(), RECHECK);
        for pause in [2, 4, 8, 8] {
            let started = Instant::now();
            assert_eq!(b.wait(until).await, Woken::Look);
            assert_eq!(
                started.elapsed(),
                RECHECK * pause,
                "backing off to RECHECK_MAX"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_runs_out_at_its_deadline_and_ends_at_shutdown() {
        let waiting = Arc::new(Waiting::new(8));
        let mut waiter = waiting.register("s", keys(&["a"])).unwrap();
        let until = Instant::now() + Duration::from_millis(100);
        assert_eq!(waiter.wait(until).await, Woken::TimedOut);
        waiting.close();
        let later = Instant::now() + Duration::from_secs(10);
        assert_eq!(waiter.wait(later).await, Woken::Closing);
        assert!(
            waiting.register("s", keys(&["b"])).is_none(),
            "no new waits"
        );
    }

    #[test]
    fn one_scope_takes_at_most_half_the_places() {
        let waiting = Arc::new(Waiting::new(4));
        let flood: Vec<_> = (0..2)
            .map(|_| waiting.register("flooded", keys(&["a"])).unwrap())
            .collect();
        assert!(waiting.register("flooded", keys(&["a"])).is_none());
        let _other = waiting.register("other", keys(&["b"])).unwrap();
        drop(flood);
        assert!(waiting.by_scope.lock().get("flooded").is_none(), "emptied");
        assert!(waiting.register("flooded", keys(&["a"])).is_some());
    }

    #[test]
    fn waiters_are_bounded_and_dropping_one_frees_its_place_and_keys() {
        let waiting = Arc::new(Waiting::new(4));
        let first = waiting.register("s", keys(&["a"])).unwrap();
        let _second = waiting.register("t", keys(&["a"])).unwrap();
        let _third = waiting.register("u", keys(&["a"])).unwrap();
        let _fourth = waiting.register("v", keys(&["a"])).unwrap();
        assert!(
            waiting.register("w", keys(&["c"])).is_none(),
            "beyond the cap"
        );
        assert_eq!(waiting.count(), 4);
        drop(first);
        assert_eq!(waiting.count(), 3);
        assert_eq!(waiting.by_key.lock()["a"].len(), 3);
        let third = waiting.register("s", keys(&["c"])).unwrap();
        drop(third);
        assert!(
            !waiting.by_key.lock().contains_key("c"),
            "an empty key is removed"
        );
    }
}
