//! A queued route's places for attempts in flight (`max_concurrency`), and the jobs taken
//! ahead of them.
//!
//! A take returns once it is on stable storage (it counts in `Dedupe-Attempt`, which must
//! not repeat after a crash), and on the embedded store that sync is most of a fast
//! attempt's time. A loop that took only for the places free would leave every place idle
//! through each take's sync. So while the route's attempts end quickly, its loop takes up
//! to `max_concurrency` jobs more than it has free places, and each waits for a place
//! ([`Waiting`]). Once an attempt, or a job's wait for its place, takes longer than
//! [`QUICK`], the loop takes only for free places for [`SLOW_FOR`]: a job taken ahead
//! waits about as long as the attempt before it, which its visibility (counted from the
//! take) does not cover for long.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The longest attempt after which the loop still takes jobs ahead of free places.
const QUICK: Duration = Duration::from_millis(500);

/// How long after an attempt slower than [`QUICK`] the loop takes only for free places.
const SLOW_FOR: Duration = Duration::from_secs(30);

/// The longest after its take was asked for that a job which had to wait for a place
/// still starts: its attempt then keeps most of the visibility's margin to record its
/// outcome.
pub(super) const LONGEST_WAIT: Duration = Duration::from_secs(2);

/// A route's places, kept across reloads so that attempts under way still count after
/// the settings change.
pub(super) struct Places {
    semaphore: Arc<Semaphore>,
    size: AtomicUsize,
    /// Jobs taken and not yet holding a place.
    waiting: AtomicUsize,
    /// Places a shrink still has to take back, each as an attempt under way ends.
    owed: AtomicUsize,
    /// Until when (milliseconds after `since`) jobs are taken only for free places.
    slow_until: AtomicU64,
    since: Instant,
    /// Wakes the loop when a place is freed or a waiting job stops waiting.
    changed: Notify,
}

impl Places {
    pub(super) fn new(size: usize) -> Places {
        Places {
            semaphore: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
            waiting: AtomicUsize::new(0),
            owed: AtomicUsize::new(0),
            slow_until: AtomicU64::new(0),
            since: Instant::now(),
            changed: Notify::new(),
        }
    }

    /// Waits until the loop may take jobs, and answers how many: the places free that no
    /// waiting job will take, and, while attempts are quick and `ahead` is allowed,
    /// `max_concurrency` more.
    pub(super) async fn room(&self, ahead: bool) -> usize {
        loop {
            let changed = self.changed.notified();
            let room = self.room_now(ahead && !self.slow());
            if room > 0 {
                return room;
            }
            changed.await;
        }
    }

    fn room_now(&self, ahead: bool) -> usize {
        let ahead = if ahead {
            self.size.load(Ordering::Relaxed)
        } else {
            0
        };
        // Waiting first: a job that takes a place between the two reads is then counted
        // twice (too little room, and its drop wakes the loop), never missed.
        let waiting = self.waiting.load(Ordering::Acquire);
        (self.semaphore.available_permits() + ahead).saturating_sub(waiting)
    }

    /// Counts a job taken (its take asked for at `asked`) as waiting for a place, until it
    /// has one or gives up.
    pub(super) fn wait(self: &Arc<Self>, asked: Instant) -> Waiting {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting {
            places: Arc::clone(self),
            asked,
            since: Instant::now(),
        }
    }

    /// Notes how long an attempt took, or a job waited for its place: longer than
    /// [`QUICK`] stops taking ahead for a while.
    fn note_duration(&self, took: Duration) {
        if took > QUICK {
            self.slow_for_a_while();
        }
    }

    /// Takes only for free places for [`SLOW_FOR`].
    fn slow_for_a_while(&self) {
        let until = self.now_ms().saturating_add(millis(SLOW_FOR));
        self.slow_until.fetch_max(until, Ordering::Relaxed);
    }

    fn slow(&self) -> bool {
        self.now_ms() < self.slow_until.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        millis(self.since.elapsed())
    }

    /// Places held by attempts under way (more than the size while a shrink is owed).
    pub(super) fn in_use(&self) -> usize {
        (self.size.load(Ordering::Relaxed) + self.owed.load(Ordering::Relaxed))
            .saturating_sub(self.semaphore.available_permits())
    }

    /// Grows at once (first by forgiving what a shrink still owes); shrinks by the places
    /// free now, and the rest as the attempts under way end. Called by one reload at a
    /// time.
    pub(super) fn resize(&self, size: usize) {
        let old = self.size.swap(size, Ordering::Relaxed);
        if size > old {
            let forgiven = take_up_to(&self.owed, size - old);
            self.semaphore.add_permits(size - old - forgiven);
            self.changed.notify_one();
        } else if old > size {
            let mut shrink = old - size;
            while shrink > 0
                && let Ok(free) = self.semaphore.try_acquire()
            {
                free.forget();
                shrink -= 1;
            }
            self.owed.fetch_add(shrink, Ordering::Relaxed);
        }
    }
}

/// Takes up to `most` from `count`; answers how many it took.
fn take_up_to(count: &AtomicUsize, most: usize) -> usize {
    let mut taken = 0;
    let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
        taken = left.min(most);
        Some(left - taken)
    });
    taken
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A taken job waiting for a place; dropped, it waits no more.
pub(super) struct Waiting {
    places: Arc<Places>,
    /// When its take was asked for (its visibility counts from there).
    asked: Instant,
    /// When it began to wait (its take returned).
    since: Instant,
}

impl Waiting {
    /// A place for the job: one free now (however long its take took), or one freed
    /// within [`LONGEST_WAIT`] of its take; `None` once that passed. A wait over
    /// [`QUICK`], or one that ran out, stops taking ahead for a while: attempts that slow
    /// leave no time to wait behind them.
    pub(super) async fn place_in_time(self) -> Option<InFlight> {
        if let Ok(permit) = Arc::clone(&self.places.semaphore).try_acquire_owned() {
            return Some(self.placed(permit).0);
        }
        let places = Arc::clone(&self.places);
        let deadline = tokio::time::Instant::from_std(self.asked + LONGEST_WAIT);
        match tokio::time::timeout_at(deadline, self.place()).await {
            Ok((place, waited)) => {
                places.note_duration(waited);
                Some(place)
            }
            Err(_) => {
                places.slow_for_a_while();
                None
            }
        }
    }

    /// Waits for a place (the semaphore serves its waiters first come, first served).
    /// Answers the place and how long the job waited for it.
    async fn place(self) -> (InFlight, Duration) {
        let permit = Arc::clone(&self.places.semaphore)
            .acquire_owned()
            .await
            .expect("never closed");
        self.placed(permit)
    }

    fn placed(self, permit: OwnedSemaphorePermit) -> (InFlight, Duration) {
        let in_flight = InFlight {
            places: Arc::clone(&self.places),
            started: Instant::now(),
            permit: Some(permit),
        };
        (in_flight, self.since.elapsed())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.places.waiting.fetch_sub(1, Ordering::Release);
        self.places.changed.notify_one();
    }
}

/// A place held by an attempt; dropped, it is free again.
pub(super) struct InFlight {
    places: Arc<Places>,
    started: Instant,
    permit: Option<OwnedSemaphorePermit>,
}

impl InFlight {
    /// Notes that the attempt ended (how long it took decides whether to take ahead).
    pub(super) fn ended(&self) {
        self.places.note_duration(self.started.elapsed());
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Freed first, so that the loop woken finds it free; or kept, if a shrink is owed.
        if let Some(permit) = self.permit.take() {
            if take_up_to(&self.places.owed, 1) == 1 {
                permit.forget();
            } else {
                drop(permit);
            }
        }
        self.places.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds `count` places of `places`, as attempts under way would.
    async fn hold(places: &Arc<Places>, count: usize) -> Vec<InFlight> {
        let mut held = Vec::new();
        for _ in 0..count {
            held.push(places.wait(Instant::now()).place().await.0);
        }
        held
    }

    #[tokio::test]
    async fn room_counts_free_places_jobs_waiting_and_those_taken_ahead() {
        let places = Arc::new(Places::new(2));
        assert_eq!((places.room_now(false), places.room_now(true)), (2, 4));
        let held = hold(&places, 1).await;
        let waiting = places.wait(Instant::now());
        assert_eq!((places.room_now(false), places.room_now(true)), (0, 2));
        assert_eq!(places.in_use(), 1);
        drop(waiting);
        drop(held);
        assert_eq!(places.room_now(true), 4);
        places.note_duration(QUICK * 2);
        assert!(places.slow());
    }

    #[tokio::test]
    async fn a_shrink_takes_places_back_as_attempts_end_and_a_grow_forgives_it() {
        let places = Arc::new(Places::new(4));
        let mut held = hold(&places, 3).await;
        // One free place goes at once; two are owed by the attempts under way.
        places.resize(1);
        assert_eq!((places.in_use(), places.room_now(false)), (3, 0));
        held.pop();
        assert_eq!((places.in_use(), places.room_now(false)), (2, 0));
        // Growing before the rest came back forgives it: four places, two held.
        places.resize(4);
        assert_eq!((places.in_use(), places.room_now(false)), (2, 2));
        drop(held);
        assert_eq!((places.in_use(), places.room_now(false)), (0, 4));
        places.resize(2);
        assert_eq!((places.in_use(), places.room_now(false)), (0, 2));
    }
}
