//! The delivery queue in the embedded store, in the claims' database.
//!
//! - `jobs`: a job under its store key, with when it is due and the token of its take.
//! - `jobs_due`: the jobs that are not dead by route and due time (route, a zero byte, the
//!   time big-endian, the key), so that a take reads only what is due.
//! - `jobs_received`: the same by the time each was received, for the oldest's age.
//! - `jobs_dead`: dead letters by route and the time they died, for their listing.
//! - `jobs_paused`: the routes paused.
//!
//! Every change to a job and its index entries is one sled transaction. An enqueue waits
//! for the flush that writes it to disk (shared with every enqueue and done mark that
//! arrived meanwhile) whatever `durability` says; a retry, a bury or a completion is
//! written by sled's own periodic flush: lost in a crash, the job is due again when its
//! visibility ends, and delivered again (the documented window). The counts live in memory,
//! counted from the jobs when the store opens: no other process uses this database.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{
    ConflictableTransactionError, TransactionError, TransactionalTree, UnabortableTransactionError,
};

use super::database::{Database, QueueTrees};
use crate::store::queue::{
    DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken, dead_cursor, parse_dead_cursor,
};
use crate::store::{Clock, Millis, StoreError, millis};

/// A job as the `jobs` tree keeps it.
#[derive(Serialize, Deserialize)]
struct Entry {
    due_at: Millis,
    token: u64,
    takes: u32,
    job: Job,
}

impl Entry {
    fn encode(&self) -> Result<Vec<u8>, StoreError> {
        postcard::to_stdvec(self).map_err(|error| StoreError::of("sled", error))
    }

    fn read(bytes: &[u8]) -> Result<Entry, StoreError> {
        postcard::from_bytes(bytes)
            .map_err(|error| StoreError::of("sled", format!("an unreadable queued job: {error}")))
    }
}

/// A route's counts, kept in memory.
#[derive(Default, Clone, Copy)]
struct Counts {
    waiting: u64,
    retrying: u64,
    dead: u64,
}

impl Counts {
    /// Counts `job` in (`add`) or out.
    fn change(&mut self, job: &Job, add: bool) {
        let count = if job.dead.is_some() {
            &mut self.dead
        } else if job.attempts_this_round() == 0 {
            &mut self.waiting
        } else {
            &mut self.retrying
        };
        *count = if add {
            count.saturating_add(1)
        } else {
            count.saturating_sub(1)
        };
    }
}

/// The embedded store's queue.
pub(super) struct SledQueue {
    database: Database,
    clock: Arc<dyn Clock>,
    counts: DashMap<String, Counts>,
}

/// An index entry: the route, a zero byte, the time big-endian, the key.
fn index_key(route: &str, at: Millis, key: &str) -> Vec<u8> {
    let mut index = Vec::with_capacity(route.len() + 9 + key.len());
    index.extend_from_slice(route.as_bytes());
    index.push(0);
    index.extend_from_slice(&at.to_be_bytes());
    index.extend_from_slice(key.as_bytes());
    index
}

fn route_prefix(route: &str) -> Vec<u8> {
    let mut prefix = route.as_bytes().to_vec();
    prefix.push(0);
    prefix
}

/// The key an index entry of `route` files.
fn indexed_key<'i>(route: &str, index: &'i [u8]) -> &'i [u8] {
    &index[(route.len() + 9).min(index.len())..]
}

type Aborted = ConflictableTransactionError<StoreError>;

fn read_in(tree: &TransactionalTree, key: &[u8]) -> Result<Option<Entry>, Aborted> {
    match tree.get(key)? {
        Some(bytes) => Entry::read(&bytes)
            .map(Some)
            .map_err(ConflictableTransactionError::Abort),
        None => Ok(None),
    }
}

fn write_in(tree: &TransactionalTree, entry: &Entry) -> Result<(), Aborted> {
    let bytes = entry
        .encode()
        .map_err(ConflictableTransactionError::Abort)?;
    tree.insert(entry.job.key.as_bytes(), bytes)?;
    Ok(())
}

fn settled<T>(result: Result<T, TransactionError<StoreError>>) -> Result<T, StoreError> {
    result.map_err(|error| match error {
        TransactionError::Abort(error) => error,
        TransactionError::Storage(error) => error.into(),
    })
}

impl From<UnabortableTransactionError> for StoreError {
    fn from(error: UnabortableTransactionError) -> StoreError {
        StoreError::of("sled", error)
    }
}

impl SledQueue {
    /// The queue of an open database, its counts read from its jobs. Blocks on disk I/O.
    pub(super) fn new(
        trees: &QueueTrees,
        clock: Arc<dyn Clock>,
        database: Database,
    ) -> Result<SledQueue, StoreError> {
        let counts = DashMap::<String, Counts>::new();
        let mut cut_off = Vec::new();
        for entry in trees.jobs.iter() {
            let (_, bytes) = entry?;
            match Entry::read(&bytes) {
                Ok(entry) => {
                    counts
                        .entry(entry.job.route.clone())
                        .or_default()
                        .change(&entry.job, true);
                    if entry.token != 0 && entry.job.dead.is_none() {
                        cut_off.push(entry);
                    }
                }
                Err(error) => tracing::error!(%error, "an unreadable queued job is left alone"),
            }
        }
        let queue = SledQueue {
            database,
            clock,
            counts,
        };
        // No other process uses this database: a job taken when the last one stopped
        // had its attempt cut off, and is due now rather than when its visibility ends.
        let now = queue.clock.now();
        for entry in cut_off {
            let taken = Taken {
                token: entry.token,
                attempt: entry.takes,
                job: entry.job,
            };
            queue.change_taken(&taken, &taken.job, Some(now))?;
        }
        Ok(queue)
    }

    fn count(&self, job: &Job, add: bool) {
        self.counts
            .entry(job.route.clone())
            .or_default()
            .change(job, add);
    }

    /// Runs `work` on the open database, reopening it if it fails.
    fn on_database<T>(
        &self,
        work: impl FnOnce(&QueueTrees) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let database = self.database.open()?;
        let result = work(&database.queue);
        self.database.reopen_if_failed(&database, result)
    }

    /// Takes the job a due index entry files, unless the entry is stale (the job moved or
    /// went), which is then removed.
    fn take_one(
        &self,
        trees: &QueueTrees,
        route: &str,
        index: &[u8],
        due_at: Millis,
    ) -> Result<Option<Taken>, StoreError> {
        let key = indexed_key(route, index).to_vec();
        let token: u64 = rand::random::<u64>() | 1;
        settled((&trees.jobs, &trees.due).transaction(|(jobs, due)| {
            due.remove(index)?;
            // An unreadable job is left where it is, out of the due index: it must not
            // stop the jobs due after it.
            let mut entry = match read_in(jobs, &key) {
                Ok(Some(entry)) => entry,
                Ok(None) | Err(ConflictableTransactionError::Abort(_)) => return Ok(None),
                Err(other) => return Err(other),
            };
            if entry.job.dead.is_some() || index != index_key(route, entry.due_at, &entry.job.key) {
                return Ok(None);
            }
            entry.due_at = due_at;
            entry.token = token;
            entry.takes += 1;
            due.insert(index_key(route, due_at, &entry.job.key), &[])?;
            write_in(jobs, &entry)?;
            Ok(Some(Taken {
                attempt: entry.takes,
                job: entry.job,
                token,
            }))
        }))
    }

    /// Stores `job` in place of a taken one, if the take still owns it: due at `due_at`,
    /// or in dead letters.
    fn change_taken(
        &self,
        taken: &Taken,
        job: &Job,
        due_at: Option<Millis>,
    ) -> Result<(), StoreError> {
        let changed = self.on_database(|trees| {
            settled(
                (&trees.jobs, &trees.due, &trees.received, &trees.dead).transaction(
                    |(jobs, due, received, dead)| {
                        let Some(stored) = read_in(jobs, taken.job.key.as_bytes())? else {
                            return Ok(None);
                        };
                        if stored.token != taken.token || stored.job.dead.is_some() {
                            return Ok(None);
                        }
                        let route = &stored.job.route;
                        due.remove(index_key(route, stored.due_at, &stored.job.key))?;
                        match (due_at, job.dead) {
                            (Some(at), _) => {
                                due.insert(index_key(route, at, &job.key), &[])?;
                            }
                            (None, Some((died, _))) => {
                                received.remove(index_key(
                                    route,
                                    stored.job.received_at,
                                    &job.key,
                                ))?;
                                dead.insert(index_key(route, died, &job.key), &[])?;
                            }
                            (None, None) => {}
                        }
                        write_in(
                            jobs,
                            &Entry {
                                due_at: due_at.unwrap_or(0),
                                token: 0,
                                takes: stored.takes,
                                job: job.clone(),
                            },
                        )?;
                        Ok(Some(stored.job))
                    },
                ),
            )
        })?;
        let Some(before) = changed else {
            return Err(StoreError::NotOwner);
        };
        self.count(&before, false);
        self.count(job, true);
        Ok(())
    }
}

#[async_trait]
impl DeliveryQueue for SledQueue {
    async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError> {
        let database = self.database.open()?;
        let now = self.clock.now();
        let entry = Entry {
            due_at: now,
            token: 0,
            takes: 0,
            job: job.clone(),
        }
        .encode()?;
        let trees = &database.queue;
        let stored = settled((&trees.jobs, &trees.due, &trees.received).transaction(
            |(jobs, due, received)| {
                if jobs.get(job.key.as_bytes())?.is_some() {
                    return Ok(Enqueued::AlreadyQueued);
                }
                jobs.insert(job.key.as_bytes(), entry.as_slice())?;
                due.insert(index_key(&job.route, now, &job.key), &[])?;
                received.insert(index_key(&job.route, job.received_at, &job.key), &[])?;
                Ok(Enqueued::Stored)
            },
        ));
        let stored = self.database.reopen_if_failed(&database, stored)?;
        if stored == Enqueued::Stored {
            self.count(job, true);
        }
        // Whether stored now or before: the acknowledgment waits for it to be on disk.
        let flushed = database.flusher.flush().await;
        self.database.reopen_if_failed(&database, flushed)?;
        Ok(stored)
    }

    async fn take(
        &self,
        route: &str,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<Taken>, StoreError> {
        let database = self.database.open()?;
        let taken = self.on_database(|trees| {
            let now = self.clock.now();
            let prefix = route_prefix(route);
            let end = index_key(route, now.saturating_add(1), "");
            let mut due = Vec::new();
            for entry in trees
                .due
                .range(prefix.as_slice()..end.as_slice())
                .take(limit)
            {
                let (index, _) = entry?;
                due.push(index);
            }
            let until = now.saturating_add(millis(visibility));
            let mut taken = Vec::new();
            for index in due {
                taken.extend(self.take_one(trees, route, &index, until)?);
            }
            Ok(taken)
        })?;
        if !taken.is_empty() {
            let flushed = database.flusher.flush().await;
            self.database.reopen_if_failed(&database, flushed)?;
        }
        Ok(taken)
    }

    async fn complete(&self, taken: &Taken) -> Result<(), StoreError> {
        let removed = self.on_database(|trees| {
            settled((&trees.jobs, &trees.due, &trees.received).transaction(
                |(jobs, due, received)| {
                    let key = taken.job.key.as_bytes();
                    let Some(stored) = read_in(jobs, key)? else {
                        return Ok(None);
                    };
                    if stored.job.dead.is_some() {
                        return Ok(None);
                    }
                    let job = &stored.job;
                    jobs.remove(key)?;
                    due.remove(index_key(&job.route, stored.due_at, &job.key))?;
                    received.remove(index_key(&job.route, job.received_at, &job.key))?;
                    Ok(Some(stored.job))
                },
            ))
        })?;
        if let Some(job) = removed {
            self.count(&job, false);
        }
        Ok(())
    }

    async fn retry(&self, taken: &Taken, job: &Job, due_at: Millis) -> Result<(), StoreError> {
        self.change_taken(taken, job, Some(due_at))
    }

    async fn bury(&self, taken: &Taken, job: &Job) -> Result<(), StoreError> {
        if job.dead.is_none() {
            return Err(StoreError::BadRequest(
                "a job is buried with its time of death".into(),
            ));
        }
        self.change_taken(taken, job, None)
    }

    async fn job(&self, route: &str, key: &str) -> Result<Option<Job>, StoreError> {
        self.on_database(|trees| match trees.jobs.get(key.as_bytes())? {
            Some(bytes) => Ok(Some(Entry::read(&bytes)?.job).filter(|job| job.route == route)),
            None => Ok(None),
        })
    }

    async fn dead(
        &self,
        route: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        let prefix = route_prefix(route);
        let start = match after {
            Some(cursor) => {
                let (died, key) = parse_dead_cursor(cursor)?;
                let mut past = index_key(route, died, key);
                past.push(0);
                past
            }
            None => prefix.clone(),
        };
        self.on_database(|trees| {
            let mut page = DeadPage::default();
            for entry in trees.dead.range(start.as_slice()..) {
                let (index, _) = entry?;
                if !index.starts_with(&prefix) {
                    break;
                }
                if page.jobs.len() == limit {
                    page.next = page.jobs.last().map(dead_cursor);
                    break;
                }
                if let Some(bytes) = trees.jobs.get(indexed_key(route, &index))? {
                    page.jobs.push(Entry::read(&bytes)?.job);
                }
            }
            Ok(page)
        })
    }

    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let revived = self.on_database(|trees| {
            settled(
                (&trees.jobs, &trees.due, &trees.received, &trees.dead).transaction(
                    |(jobs, due, received, dead)| {
                        let Some(mut stored) = read_in(jobs, key.as_bytes())? else {
                            return Ok(None);
                        };
                        let Some((died, _)) = stored.job.dead else {
                            return Ok(None);
                        };
                        if stored.job.route != route {
                            return Ok(None);
                        }
                        let before = stored.job.clone();
                        let job = &mut stored.job;
                        dead.remove(index_key(&job.route, died, &job.key))?;
                        job.revive(now);
                        due.insert(index_key(&job.route, now, &job.key), &[])?;
                        received.insert(index_key(&job.route, job.received_at, &job.key), &[])?;
                        stored.due_at = now;
                        stored.token = 0;
                        write_in(jobs, &stored)?;
                        Ok(Some((before, stored.job)))
                    },
                ),
            )
        })?;
        Ok(match revived {
            Some((before, after)) => {
                self.count(&before, false);
                self.count(&after, true);
                true
            }
            None => false,
        })
    }

    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let discarded = self.on_database(|trees| {
            settled((&trees.jobs, &trees.dead).transaction(|(jobs, dead)| {
                let Some(stored) = read_in(jobs, key.as_bytes())? else {
                    return Ok(None);
                };
                if stored.job.route != route {
                    return Ok(None);
                }
                let Some((died, _)) = stored.job.dead else {
                    return Ok(None);
                };
                jobs.remove(key.as_bytes())?;
                dead.remove(index_key(&stored.job.route, died, key))?;
                Ok(Some(stored.job))
            }))
        })?;
        Ok(match discarded {
            Some(job) => {
                self.count(&job, false);
                true
            }
            None => false,
        })
    }

    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError> {
        self.on_database(|trees| {
            routes
                .iter()
                .map(|route| {
                    let counts = self.counts.get(route).map(|c| *c).unwrap_or_default();
                    let oldest = match trees.received.scan_prefix(route_prefix(route)).next() {
                        Some(entry) => {
                            let (index, _) = entry?;
                            let at = index.get(route.len() + 1..route.len() + 9);
                            at.and_then(|at| at.try_into().ok()).map(u64::from_be_bytes)
                        }
                        None => None,
                    };
                    Ok(QueueCounts {
                        waiting: counts.waiting,
                        retrying: counts.retrying,
                        dead: counts.dead,
                        oldest,
                    })
                })
                .collect()
        })
    }

    async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError> {
        self.on_database(|trees| {
            if paused {
                trees.paused.insert(route.as_bytes(), &[])?;
            } else {
                trees.paused.remove(route.as_bytes())?;
            }
            Ok(())
        })?;
        let database = self.database.open()?;
        let flushed = database.flusher.flush().await;
        self.database.reopen_if_failed(&database, flushed)
    }

    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        self.on_database(|trees| {
            trees
                .paused
                .iter()
                .keys()
                .map(|key| Ok(String::from_utf8_lossy(&key?).into_owned()))
                .collect()
        })
    }
}
