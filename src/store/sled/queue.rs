//! The delivery queue in the embedded store, in the claims' database.
//!
//! - `jobs`: a job under its store key, with when it is due and the token of its take.
//! - `jobs_due`: the jobs that are not dead by route and due time (route, a zero byte, the
//!   time big-endian, the key), so that a take reads only what is due.
//! - `jobs_received`: the same by the time each was received, for the oldest's age.
//! - `jobs_dead`: dead letters by route and the time they died, for their listing.
//! - `jobs_paused`: the routes paused.
//!
//! No sled transaction: the first one a process runs turns on a lock around every sled
//! operation of the process, which cost the hot path an order of magnitude
//! (`docs/performance.md`). A job changes by compare-and-swap instead; its new index
//! entries are written before the swap and its old ones removed after, so an index entry
//! may be stale (a take, a count or a listing checks it against the job, and drops it)
//! but a job never lacks one, except after a crash between the swap and the index write,
//! which the opening of the store mends (it reads every job anyway, for the counts).
//!
//! An enqueue and a take wait for the flush that writes them to disk (shared with every
//! caller that arrived meanwhile) whatever `durability` says; a retry, a bury or a
//! completion is written by sled's own periodic flush: lost in a crash, the job is due
//! again, and delivered again (the documented window). The counts live in memory: no
//! other process uses this database.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use sled::{IVec, Tree};

use super::database::{Database, QueueTrees};
use crate::store::queue::{
    DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken, dead_cursor, parse_dead_cursor,
};
use crate::store::{Clock, Millis, StoreError, millis};

/// A job as the `jobs` tree keeps it.
#[derive(Clone, Serialize, Deserialize)]
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

    /// Its index entries: in `due` and `received` while it is not dead, in `dead` once it
    /// is.
    fn indexes<'t>(&self, trees: &'t QueueTrees) -> Vec<(&'t Tree, Vec<u8>)> {
        let job = &self.job;
        match job.dead {
            Some((died, _)) => vec![(&trees.dead, index_key(&job.route, died, &job.key))],
            None => vec![
                (&trees.due, index_key(&job.route, self.due_at, &job.key)),
                (
                    &trees.received,
                    index_key(&job.route, job.received_at, &job.key),
                ),
            ],
        }
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

/// When the oldest job of `route` that is neither delivered nor dead was received; stale
/// index entries met on the way are dropped.
fn oldest_received(trees: &QueueTrees, route: &str) -> Result<Option<Millis>, StoreError> {
    for indexed in trees.received.scan_prefix(route_prefix(route)) {
        let (index, _) = indexed?;
        let Some(at) = index
            .get(route.len() + 1..route.len() + 9)
            .and_then(|at| at.try_into().ok())
            .map(u64::from_be_bytes)
        else {
            continue;
        };
        let live = match trees.jobs.get(indexed_key(route, &index))? {
            Some(bytes) => Entry::read(&bytes)
                .is_ok_and(|entry| entry.job.dead.is_none() && entry.job.received_at == at),
            None => false,
        };
        if live {
            return Ok(Some(at));
        }
        trees.received.remove(index)?;
    }
    Ok(None)
}

/// What a change found and left: the job before, and after (none once removed).
type Swapped = (Entry, Option<Entry>);

impl SledQueue {
    /// The queue of an open database: its counts read from its jobs, the index entries a
    /// crash left unwritten written, and the jobs taken when the last process stopped due
    /// now (their attempts were cut off). Blocks on disk I/O.
    pub(super) fn new(
        trees: &QueueTrees,
        clock: Arc<dyn Clock>,
        database: Database,
    ) -> Result<SledQueue, StoreError> {
        let counts = DashMap::<String, Counts>::new();
        let now = clock.now();
        for stored in trees.jobs.iter() {
            let (key, bytes) = stored?;
            let mut entry = match Entry::read(&bytes) {
                Ok(entry) => entry,
                Err(error) => {
                    tracing::error!(%error, "an unreadable queued job is left alone");
                    continue;
                }
            };
            if entry.token != 0 && entry.job.dead.is_none() {
                entry.token = 0;
                entry.due_at = now;
                trees.jobs.insert(key, entry.encode()?)?;
            }
            for (tree, index) in entry.indexes(trees) {
                tree.insert(index, &[])?;
            }
            counts
                .entry(entry.job.route.clone())
                .or_default()
                .change(&entry.job, true);
        }
        Ok(SledQueue {
            database,
            clock,
            counts,
        })
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

    /// Changes the job of `key` as `change` says (`None`: removed), if it is there and
    /// `change` wants to (returns `Err(())` to leave it): its new index entries first,
    /// then the job by compare-and-swap, then its old entries removed. Returns what was
    /// swapped, or none when the job was absent, unreadable, left alone, or changed by
    /// someone else meanwhile.
    fn swap(
        &self,
        trees: &QueueTrees,
        key: &[u8],
        change: impl FnOnce(&Entry) -> Result<Option<Entry>, ()>,
    ) -> Result<Option<Swapped>, StoreError> {
        let Some(bytes) = trees.jobs.get(key)? else {
            return Ok(None);
        };
        let Ok(before) = Entry::read(&bytes) else {
            return Ok(None);
        };
        let Ok(after) = change(&before) else {
            return Ok(None);
        };
        let new_indexes = after
            .as_ref()
            .map_or_else(Vec::new, |entry| entry.indexes(trees));
        for (tree, index) in &new_indexes {
            tree.insert(index.as_slice(), &[])?;
        }
        let encoded = after.as_ref().map(Entry::encode).transpose()?;
        if trees
            .jobs
            .compare_and_swap(key, Some(bytes), encoded.map(IVec::from))?
            .is_err()
        {
            for (tree, index) in &new_indexes {
                tree.remove(index.as_slice())?;
            }
            return Ok(None);
        }
        for (tree, index) in before.indexes(trees) {
            let kept = new_indexes
                .iter()
                .any(|(other, kept)| std::ptr::eq(*other, tree) && *kept == index);
            if !kept {
                tree.remove(index)?;
            }
        }
        Ok(Some((before, after)))
    }

    /// Counts a swap's job out as it was and in as it is.
    fn recount(&self, swapped: &Swapped) {
        self.count(&swapped.0.job, false);
        if let Some(after) = &swapped.1 {
            self.count(&after.job, true);
        }
    }

    /// Takes the job a due index entry files, due again at `due_at`, unless the entry is
    /// stale (the job moved, died or went), which is then removed.
    fn take_one(
        &self,
        trees: &QueueTrees,
        route: &str,
        index: &[u8],
        due_at: Millis,
    ) -> Result<Option<Taken>, StoreError> {
        let token: u64 = rand::random::<u64>() | 1;
        let swapped = self.swap(trees, indexed_key(route, index), |entry| {
            if entry.job.dead.is_some() || index != index_key(route, entry.due_at, &entry.job.key) {
                return Err(());
            }
            Ok(Some(Entry {
                due_at,
                token,
                takes: entry.takes + 1,
                job: entry.job.clone(),
            }))
        })?;
        match swapped {
            Some((_, Some(after))) => Ok(Some(Taken {
                attempt: after.takes,
                job: after.job,
                token,
            })),
            _ => {
                trees.due.remove(index)?;
                Ok(None)
            }
        }
    }

    /// Stores `job` in place of a taken one, if the take still owns it: due at `due_at`,
    /// or in dead letters.
    fn change_taken(
        &self,
        taken: &Taken,
        job: &Job,
        due_at: Option<Millis>,
    ) -> Result<(), StoreError> {
        let swapped = self.on_database(|trees| {
            self.swap(trees, taken.job.key.as_bytes(), |stored| {
                if stored.token != taken.token || stored.job.dead.is_some() {
                    return Err(());
                }
                Ok(Some(Entry {
                    due_at: due_at.unwrap_or(0),
                    token: 0,
                    takes: stored.takes,
                    job: job.clone(),
                }))
            })
        })?;
        let Some(swapped) = swapped else {
            return Err(StoreError::NotOwner);
        };
        self.recount(&swapped);
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
        let stored = (|| {
            // The index entries first: a job must never lack them (a stale one is dropped
            // where it is read).
            trees
                .due
                .insert(index_key(&job.route, now, &job.key), &[])?;
            trees
                .received
                .insert(index_key(&job.route, job.received_at, &job.key), &[])?;
            let inserted = trees.jobs.compare_and_swap(
                job.key.as_bytes(),
                None::<&[u8]>,
                Some(entry.as_slice()),
            )?;
            let Err(existing) = inserted else {
                return Ok(Enqueued::Stored);
            };
            // Ours are taken back, unless they are the stored job's own.
            let theirs = existing
                .current
                .and_then(|bytes| Entry::read(&bytes).ok())
                .map_or_else(Vec::new, |entry| entry.indexes(trees));
            let ours = [
                (&trees.due, index_key(&job.route, now, &job.key)),
                (
                    &trees.received,
                    index_key(&job.route, job.received_at, &job.key),
                ),
            ];
            for (tree, index) in ours {
                let shared = theirs
                    .iter()
                    .any(|(other, kept)| std::ptr::eq(*other, tree) && *kept == index);
                if !shared {
                    tree.remove(index)?;
                }
            }
            Ok(Enqueued::AlreadyQueued)
        })();
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
            self.swap(trees, taken.job.key.as_bytes(), |stored| {
                if stored.job.dead.is_some() {
                    return Err(());
                }
                Ok(None)
            })
        })?;
        if let Some(swapped) = removed {
            self.recount(&swapped);
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
                let job = match trees.jobs.get(indexed_key(route, &index))? {
                    Some(bytes) => Entry::read(&bytes).ok().map(|entry| entry.job),
                    None => None,
                };
                // A stale entry (the job revived, discarded, or died again) is dropped.
                let current = job.filter(|job| {
                    job.dead
                        .is_some_and(|(at, _)| index == index_key(route, at, &job.key))
                });
                match current {
                    Some(job) => page.jobs.push(job),
                    None => {
                        trees.dead.remove(index)?;
                    }
                }
            }
            Ok(page)
        })
    }

    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let revived = self.on_database(|trees| {
            self.swap(trees, key.as_bytes(), |stored| {
                if stored.job.route != route || stored.job.dead.is_none() {
                    return Err(());
                }
                let mut job = stored.job.clone();
                job.revive(now);
                Ok(Some(Entry {
                    due_at: now,
                    token: 0,
                    takes: stored.takes,
                    job,
                }))
            })
        })?;
        Ok(revived.map(|swapped| self.recount(&swapped)).is_some())
    }

    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let discarded = self.on_database(|trees| {
            self.swap(trees, key.as_bytes(), |stored| {
                if stored.job.route != route || stored.job.dead.is_none() {
                    return Err(());
                }
                Ok(None)
            })
        })?;
        Ok(discarded.map(|swapped| self.recount(&swapped)).is_some())
    }

    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError> {
        self.on_database(|trees| {
            routes
                .iter()
                .map(|route| {
                    let counts = self.counts.get(route).map(|c| *c).unwrap_or_default();
                    let oldest = oldest_received(trees, route)?;
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
