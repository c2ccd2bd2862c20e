//! The delivery queue's contract (`delivery: queued`): where an accepted request waits,
//! durably, until a worker delivers it. Each backend keeps it beside its claims (sled in
//! the same database, Redis and PostgreSQL in the shared store), so that replicas sharing
//! claims share the queue too.
//!
//! A job is named by its event's store key, which makes accepting idempotent: a second
//! enqueue of a key already queued (or dead) stores nothing. A job is `ready` (due at a
//! time), taken (due again when its visibility ends, unless settled first), or `dead`:
//!
//! ```text
//!   enqueue ─▶ ready ──take──▶ taken ──complete──▶ (gone; the key stays done)
//!                ▲               │ │
//!                └──retry (at)───┘ └──bury──▶ dead ──discard──▶ (gone)
//!                ▲                              │
//!                └──────────── revive ──────────┘
//!   a taken job whose visibility ends is ready again (its worker died, say)
//! ```
//!
//! Complete, retry and bury are guarded by the token of the take, so that a worker whose
//! visibility ended cannot undo another's later attempt, nor end a job another holds (and
//! so let its lane's next job run beside it): the job is delivered again, at least once.
//!
//! Jobs of a lane (`queue.order_by`) go one at a time, in the order they were stored: a
//! job enqueued (or revived: it joins the end) while its lane holds another that is not
//! dead waits, due at [`BEHIND`] (counted as waiting, and in the oldest's age), and the
//! earliest waiting one is made due when the one before it is completed or buried. So
//! only the first job of a lane is ready or taken (save when a take's visibility ends
//! while its attempt still runs, as for any job), and a retrying one holds the rest of
//! its lane back until it is delivered or dead.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::Millis;

/// The due time of a job waiting behind an earlier one of its lane: never, until that one
/// is delivered or dead (2^53 - 1 ms, a time every store holds exactly, Redis's scores
/// included).
pub const BEHIND: Millis = (1 << 53) - 1;

/// How much of each answer an attempt keeps.
pub const ANSWER_KEPT: usize = 1024;

/// How many attempts a job's history keeps: the first and the latest.
pub const HISTORY_KEPT: usize = 50;

/// A request as accepted, ready to send again: what the upstream gets, apart from the
/// attempt's own headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedRequest {
    pub method: String,
    /// Path and query, in origin form, as forwarded.
    pub target: String,
    pub headers: Vec<(String, Bytes)>,
    pub body: Bytes,
}

/// One try at delivering a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub at: Millis,
    pub latency_ms: u64,
    /// The app's status, none when it gave no answer.
    pub status: Option<u16>,
    /// Why there was no answer, or the first [`ANSWER_KEPT`] bytes of the answer.
    pub detail: Bytes,
}

/// Why a job is in dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeadReason {
    /// The app answered a status that is not retried.
    Refused,
    /// `max_attempts` reached.
    Attempts,
    /// `max_age` reached.
    Age,
}

impl DeadReason {
    /// Every reason's name, as a dead-letter filter takes it.
    pub const NAMES: [&str; 3] = [
        DeadReason::Refused.as_str(),
        DeadReason::Attempts.as_str(),
        DeadReason::Age.as_str(),
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeadReason::Refused => "refused",
            DeadReason::Attempts => "max_attempts",
            DeadReason::Age => "max_age",
        }
    }
}

/// A queued delivery and its history. Its fields, in this order, are the stores' record
/// format (postcard): a change of them is a change of format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The event's store key: the job's name.
    pub key: String,
    pub route: String,
    /// The lane of a route with `queue.order_by`: its jobs are delivered one at a time,
    /// in the order they were stored.
    pub lane: Option<String>,
    pub received_at: Millis,
    pub request: QueuedRequest,
    /// How many attempts were made in all (the history may keep fewer).
    pub attempted: u32,
    /// Attempts made before the latest revival do not count against `max_attempts`;
    /// the age for `max_age` counts from the revival.
    pub revived: Option<(Millis, u32)>,
    pub history: Vec<Attempt>,
    /// Set once the job is in dead letters.
    pub dead: Option<(Millis, DeadReason)>,
}

impl Job {
    pub fn new(key: String, route: String, received_at: Millis, request: QueuedRequest) -> Job {
        Job {
            key,
            route,
            lane: None,
            received_at,
            request,
            attempted: 0,
            revived: None,
            history: Vec::new(),
            dead: None,
        }
    }

    /// Attempts that count against `max_attempts`.
    pub fn attempts_this_round(&self) -> u32 {
        self.attempted - self.revived.map_or(0, |(_, before)| before)
    }

    /// When the age for `max_age` started.
    pub fn round_started(&self) -> Millis {
        self.revived.map_or(self.received_at, |(at, _)| at)
    }

    /// Adds an attempt, keeping the first and the latest within [`HISTORY_KEPT`].
    pub fn record(&mut self, attempt: Attempt) {
        self.attempted += 1;
        if self.history.len() >= HISTORY_KEPT {
            self.history.remove(1);
        }
        self.history.push(attempt);
    }

    /// Makes a dead job ready again at `now`, for a new round of `max_attempts` and
    /// `max_age`.
    pub fn revive(&mut self, now: Millis) {
        self.dead = None;
        self.revived = Some((now, self.attempted));
    }

    /// The status of the latest attempt that had an answer.
    pub fn last_status(&self) -> Option<u16> {
        self.history.last().and_then(|attempt| attempt.status)
    }

    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        postcard::to_stdvec(self).map_err(|error| StoreError::Backend(error.to_string()))
    }

    pub fn decode(bytes: &[u8]) -> Result<Job, StoreError> {
        postcard::from_bytes(bytes)
            .map_err(|error| StoreError::Backend(format!("an unreadable queued job: {error}")))
    }
}

/// A job a worker took, with the token that proves it.
#[derive(Debug, Clone)]
pub struct Taken {
    pub job: Job,
    pub token: u64,
    /// How many times the job was taken, this take included: recorded by the take
    /// before the job is handed over, so that an attempt cut off by a crash still counts,
    /// and the app can tell a retry (`Dedupe-Attempt`).
    pub attempt: u32,
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    Stored,
    /// A job of that key is queued or dead already: nothing was stored.
    AlreadyQueued,
}

/// What a route's queue holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Not tried yet.
    pub waiting: u64,
    /// Tried, not delivered, not dead.
    pub retrying: u64,
    pub dead: u64,
    /// When the oldest job that is not dead was received.
    pub oldest: Option<Millis>,
}

/// One page of a route's dead letters, oldest first, and where the next one starts.
#[derive(Debug, Clone, Default)]
pub struct DeadPage {
    pub jobs: Vec<Job>,
    pub next: Option<String>,
}

/// The queue every store keeps for `delivery: queued`.
#[async_trait]
pub trait DeliveryQueue: Send + Sync + 'static {
    /// Stores `job`, ready now (or behind, see the module's doc), unless a job of its key
    /// is queued or dead. Returns once
    /// the job is durable: on disk for the embedded store, acknowledged by the server for
    /// the shared ones.
    async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError>;

    /// Takes up to `limit` of `route`'s jobs that are due, oldest due first, each for
    /// `visibility`: unless settled by then, it is due again. Returns once the takes are
    /// as durable as an enqueue.
    async fn take(
        &self,
        route: &str,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<Taken>, StoreError>;

    /// Removes a delivered job and makes the next job of its lane, if any, due.
    /// `NotOwner` if the take's visibility ended and the job was taken again or settled:
    /// it is left as it is.
    async fn complete(&self, taken: &Taken) -> Result<(), StoreError>;

    /// Stores `job` (its history grown) and makes it due at `due_at`. `NotOwner` if the
    /// take's visibility ended and the job was taken again or settled.
    async fn retry(&self, taken: &Taken, job: &Job, due_at: Millis) -> Result<(), StoreError>;

    /// Gives a taken job back unsent, due at `due_at`, as it was before the take: the take
    /// no longer counts toward `Dedupe-Attempt` (the number it gave was never sent).
    /// `NotOwner` as for retry.
    async fn release(&self, taken: &Taken, due_at: Millis) -> Result<(), StoreError>;

    /// Stores `job` in dead letters, as dying when its `dead` says (which must be set),
    /// and makes the next job of its lane due. `NotOwner` as for retry.
    async fn bury(&self, taken: &Taken, job: &Job) -> Result<(), StoreError>;

    /// The job of a store key on `route`, queued or dead.
    async fn job(&self, route: &str, key: &str) -> Result<Option<Job>, StoreError>;

    /// Up to `limit` of `route`'s dead letters, in the order they died, after the cursor
    /// `after` (a page's `next`).
    async fn dead(
        &self,
        route: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage, StoreError>;

    /// Makes a dead job ready now (or behind, at the end of its lane), with a fresh
    /// `max_attempts` and `max_age`. Returns whether it was dead.
    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError>;

    /// Removes a dead job. Returns whether it was dead.
    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError>;

    /// What each of `routes`' queues holds.
    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError>;

    /// Pauses or resumes the delivery of `route`'s jobs, for every replica.
    async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError>;

    /// The routes paused.
    async fn paused(&self) -> Result<Vec<String>, StoreError>;

    /// What the backend's own settings could lose of acknowledged jobs, if anything
    /// (Redis without an append-only file, say): logged when queued routes start.
    async fn durability_warning(&self) -> Option<String> {
        None
    }
}

/// A dead job made ready again at `now` (see [`Job::revive`]), and when it died; none for
/// a job that is absent or not dead. The shared stores read it, then write it back only if
/// it still died then.
pub fn revived(job: Option<Job>, now: Millis) -> Option<(Millis, Job)> {
    let mut job = job?;
    let (died, _) = job.dead?;
    job.revive(now);
    Some((died, job))
}

/// A cursor for dead letters: when the job died and its key, so that pages stay in order
/// while jobs die or go.
pub fn dead_cursor(job: &Job) -> String {
    dead_cursor_at(job.dead.map_or(0, |(at, _)| at), &job.key)
}

/// The [`dead_cursor`] of the job `key` that died at `died`.
pub fn dead_cursor_at(died: Millis, key: &str) -> String {
    format!("{died:016x}{key}")
}

/// Reads a [`dead_cursor`] back: the time and the key.
pub fn parse_dead_cursor(cursor: &str) -> Result<(Millis, &str), StoreError> {
    let refused = || StoreError::BadRequest(format!("`{cursor}` is not a cursor of this listing"));
    let (time, key) = (cursor.get(..16).ok_or_else(refused)?, &cursor[16..]);
    let time = u64::from_str_radix(time, 16).map_err(|_| refused())?;
    if key.is_empty() {
        return Err(refused());
    }
    Ok((time, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job::new(
            "r:1".into(),
            "r".into(),
            1,
            QueuedRequest {
                method: "POST".into(),
                target: "/".into(),
                headers: vec![],
                body: Bytes::new(),
            },
        )
    }

    fn attempt(at: Millis) -> Attempt {
        Attempt {
            at,
            latency_ms: 1,
            status: Some(500),
            detail: Bytes::new(),
        }
    }

    #[test]
    fn the_history_keeps_the_first_and_the_latest_attempts() {
        let mut job = job();
        for at in 0..(HISTORY_KEPT as u64 + 10) {
            job.record(attempt(at));
        }
        assert_eq!(job.history.len(), HISTORY_KEPT);
        assert_eq!(job.attempted, HISTORY_KEPT as u32 + 10);
        assert_eq!(job.history[0].at, 0);
        assert_eq!(job.history.last().unwrap().at, HISTORY_KEPT as u64 + 9);
        assert_eq!(job.history[1].at, 11);
    }

    #[test]
    fn a_revival_starts_a_new_round() {
        let mut job = job();
        job.record(attempt(5));
        job.record(attempt(6));
        assert_eq!((job.attempts_this_round(), job.round_started()), (2, 1));
        job.revived = Some((100, job.attempted));
        assert_eq!((job.attempts_this_round(), job.round_started()), (0, 100));
    }

    #[test]
    fn cursors_read_back_and_others_are_refused() {
        let mut job = job();
        job.dead = Some((77, DeadReason::Refused));
        let cursor = dead_cursor(&job);
        assert_eq!(parse_dead_cursor(&cursor).unwrap(), (77, "r:1"));
        for bad in ["", "zz", "000000000000004d", "xyz0000000000004dr:1"] {
            assert!(matches!(
                parse_dead_cursor(bad),
                Err(StoreError::BadRequest(_))
            ));
        }
    }
}
