//! The delivery queue in the embedded store, in the claims' database.
//!
//! - `jobs`: a job under its store key, with when it is due and the token of its take.
//! - `jobs_due`: the jobs that are not dead by route and due time (route, a zero byte, the
//!   time big-endian, the key), so that a take reads only what is due.
//! - `jobs_received`: the same by the time each was received, for the oldest's age.
//! - `jobs_dead`: dead letters by route and the time they died, for their listing.
//! - `jobs_paused`: the routes paused.
//! - `jobs_lanes`: the jobs of each lane (`queue.order_by`) in the order stored (route,
//!   a zero byte, the lane's length and the lane, a number from sled's ids, the key).
//!   Only a lane's first job is due; the others wait at [`BEHIND`]. Whether a job is
//!   first is decided under a lock its lane shares with few others ([`LANE_LOCKS`]):
//!   one change at a time. No other process opens the database.
//!
//! No sled transaction: the first one a process runs turns on a lock around every sled
//! operation of the process, which cost the hot path an order of magnitude
//! (`docs/performance.md`). A job changes by compare-and-swap instead; its new index
//! entries are written before the swap and its old ones removed after. So an index entry
//! may be ahead of its job for a moment (a take, a count or a listing checks each entry
//! against the job, and passes over one that does not match: removing it would orphan a
//! job about to be written), but a job never lacks one. Only a crash leaves entries
//! stale or missing (or a duplicate enqueue racing a change of its job within one
//! millisecond); the opening of the store mends both (it reads every job anyway, for the
//! counts), and makes each lane's first job due if a crash left it behind.
//!
//! An enqueue, a take and a bury wait for the sync that puts them on stable storage
//! (shared with every caller that arrived meanwhile, `durable.rs`) whatever `durability`
//! says; an operator's change is synced by the admin API before it answers; a retry or
//! a completion is written by sled's own periodic sync: lost in a crash, the job is due
//! again, and delivered again (the documented window). The counts live in memory: no
//! other process uses this database.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use sled::{IVec, Tree};

use super::database::{Database, OpenDatabase, QueueTrees};
use crate::store::queue::{
    BEHIND, DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken, dead_cursor,
    parse_dead_cursor,
};
use crate::store::{Clock, Millis, StoreError, millis};

/// A job as the `jobs` tree keeps it.
#[derive(Clone, Serialize, Deserialize)]
struct Entry {
    due_at: Millis,
    token: u64,
    takes: u32,
    /// Its place in its lane (`job.lane`), if it has one.
    lane_seq: u64,
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

    /// Its index entries: in `due`, `received` and its lane's while it is not dead, in
    /// `dead` once it is.
    fn indexes<'t>(&self, trees: &'t QueueTrees) -> Vec<(&'t Tree, Vec<u8>)> {
        let job = &self.job;
        if let Some((died, _)) = job.dead {
            return vec![(&trees.dead, index_key(&job.route, died, &job.key))];
        }
        let mut indexes = vec![
            (&trees.due, index_key(&job.route, self.due_at, &job.key)),
            (
                &trees.received,
                index_key(&job.route, job.received_at, &job.key),
            ),
        ];
        if let Some(lane) = &job.lane {
            let mut index = lane_prefix(&job.route, lane);
            index.extend_from_slice(&self.lane_seq.to_be_bytes());
            index.extend_from_slice(job.key.as_bytes());
            indexes.push((&trees.lanes, index));
        }
        indexes
    }

    /// Whether the lane entry `index` files this job as it is now.
    fn files(&self, index: &[u8]) -> bool {
        self.job.dead.is_none()
            && self.job.lane.as_ref().is_some_and(|lane| {
                let prefix = lane_prefix(&self.job.route, lane);
                index.len() == prefix.len() + 8 + self.job.key.len()
                    && index.starts_with(&prefix)
                    && index[prefix.len()..prefix.len() + 8] == self.lane_seq.to_be_bytes()
            })
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

/// How many locks the lanes share.
const LANE_LOCKS: usize = 64;

/// How many due entries that match no job (see the module's doc) a take passes over.
const PASSED_OVER: usize = 256;

/// The embedded store's queue.
pub(super) struct SledQueue {
    database: Database,
    clock: Arc<dyn Clock>,
    counts: DashMap<String, Counts>,
    lane_locks: Vec<Mutex<()>>,
    /// The database last mended: one opened since is mended before its first use. The
    /// address is read without the lock on every operation; the `Weak` keeps it from
    /// being reused by another database.
    mended: Mutex<Weak<OpenDatabase>>,
    mended_at: AtomicUsize,
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

/// Where a lane's entries start: the route, a zero byte, the lane's length (two bytes) and
/// the lane; each entry then has its place (eight bytes) and the job's key. A lane is at
/// most a key's length (512 bytes); the cut is only there to keep the length exact.
fn lane_prefix(route: &str, lane: &str) -> Vec<u8> {
    let lane = &lane.as_bytes()[..lane.len().min(u16::MAX as usize)];
    let mut prefix = Vec::with_capacity(route.len() + 3 + lane.len());
    prefix.extend_from_slice(route.as_bytes());
    prefix.push(0);
    prefix.extend_from_slice(&(lane.len() as u16).to_be_bytes());
    prefix.extend_from_slice(lane);
    prefix
}

/// The lane prefix an entry of `jobs_lanes` starts with, and its job's key.
fn lane_of(index: &[u8]) -> Option<(&[u8], &[u8])> {
    let route = index.iter().position(|byte| *byte == 0)?;
    let length = index.get(route + 1..route + 3)?;
    let end = route + 3 + usize::from(u16::from_be_bytes([length[0], length[1]]));
    Some((index.get(..end)?, index.get(end + 8..)?))
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
/// index entries met on the way are passed over.
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
    }
    Ok(None)
}

/// Removes the index entries that file no job as it is (a crash between a change and the
/// removal of its old entries). Runs at open, before any change.
fn drop_stale_indexes(trees: &QueueTrees) -> Result<(), StoreError> {
    for tree in [&trees.due, &trees.received, &trees.dead, &trees.lanes] {
        for indexed in tree.iter() {
            let (index, _) = indexed?;
            let key = if std::ptr::eq(tree, &trees.lanes) {
                lane_of(&index).map(|(_, key)| key)
            } else {
                let route = index.iter().position(|byte| *byte == 0);
                route.and_then(|route| index.get(route + 9..))
            };
            let entry = match key {
                Some(key) => trees.jobs.get(key)?,
                None => None,
            };
            let filed = entry
                .and_then(|bytes| Entry::read(&bytes).ok())
                .is_some_and(|entry| holds(&entry.indexes(trees), tree, &index));
            if !filed {
                tree.remove(index)?;
            }
        }
    }
    Ok(())
}

/// Removes the index entries a change wrote for a job it did not change after all,
/// except those the job as it is now (`current`, if any) files too.
fn take_back(
    trees: &QueueTrees,
    ours: &[(&Tree, Vec<u8>)],
    current: Option<IVec>,
) -> Result<(), StoreError> {
    let theirs = current
        .and_then(|bytes| Entry::read(&bytes).ok())
        .map_or_else(Vec::new, |entry| entry.indexes(trees));
    remove_unshared(ours, &theirs)
}

/// Whether `indexes` holds the entry `index` of `tree`.
fn holds(indexes: &[(&Tree, Vec<u8>)], tree: &Tree, index: &[u8]) -> bool {
    indexes
        .iter()
        .any(|(other, kept)| std::ptr::eq(*other, tree) && kept.as_slice() == index)
}

/// Removes the entries of `gone` that `kept` does not hold too.
fn remove_unshared(gone: &[(&Tree, Vec<u8>)], kept: &[(&Tree, Vec<u8>)]) -> Result<(), StoreError> {
    for (tree, index) in gone {
        if !holds(kept, tree, index) {
            tree.remove(index.as_slice())?;
        }
    }
    Ok(())
}

/// What a change found and left: the job before, and after (none once removed).
type Swapped = (Entry, Option<Entry>);

impl SledQueue {
    /// The queue of the store's database, mended (see [`SledQueue::mend`]). Blocks on
    /// disk I/O.
    pub(super) fn new(clock: Arc<dyn Clock>, database: Database) -> Result<SledQueue, StoreError> {
        let queue = SledQueue {
            database,
            clock,
            counts: DashMap::new(),
            lane_locks: (0..LANE_LOCKS).map(|_| Mutex::new(())).collect(),
            mended: Mutex::new(Weak::new()),
            mended_at: AtomicUsize::new(0),
        };
        queue.open()?;
        Ok(queue)
    }

    /// The open database, mended first if it is newly opened (at start, or reopened
    /// from disk after a failure: either way, what a crash left).
    fn open(&self) -> Result<Arc<OpenDatabase>, StoreError> {
        let database = self.database.open()?;
        let address = Arc::as_ptr(&database) as usize;
        if self.mended_at.load(Ordering::Acquire) == address {
            return Ok(database);
        }
        let mut mended = self.mended.lock();
        if !std::ptr::eq(mended.as_ptr(), Arc::as_ptr(&database)) {
            let result = self.mend(&database.queue);
            self.database.reopen_if_failed(&database, result)?;
            *mended = Arc::downgrade(&database);
            self.mended_at.store(address, Ordering::Release);
        }
        Ok(database)
    }

    /// Mends what a crash left: the jobs taken when it came made due now (their attempts
    /// were cut off), the index entries it left unwritten written and those it left stale
    /// removed, each lane's first job made due, and the counts read again. Blocks on disk
    /// I/O, for every job.
    fn mend(&self, trees: &QueueTrees) -> Result<(), StoreError> {
        self.counts.clear();
        let now = self.clock.now();
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
            self.count(&entry.job, true);
        }
        drop_stale_indexes(trees)?;
        self.mend_lanes(trees)
    }

    /// Makes each lane's first job due if it waits behind one that went (a crash between
    /// the two changes).
    fn mend_lanes(&self, trees: &QueueTrees) -> Result<(), StoreError> {
        let mut last: Option<Vec<u8>> = None;
        for indexed in trees.lanes.iter() {
            let (index, _) = indexed?;
            let Some((prefix, _)) = lane_of(&index) else {
                continue;
            };
            if last.as_deref() != Some(prefix) {
                self.promote_first(trees, prefix)?;
                last = Some(prefix.to_vec());
            }
        }
        Ok(())
    }

    /// Serializes the changes of a lane (of one of [`LANE_LOCKS`] shards of lanes), so
    /// that whether a job is its lane's first is decided by one change at a time: none
    /// for a job without a lane. No other process opens the database.
    fn lane_lock(&self, route: &str, lane: Option<&str>) -> Option<MutexGuard<'_, ()>> {
        let mut hasher = DefaultHasher::new();
        (route, lane?).hash(&mut hasher);
        Some(self.lane_locks[hasher.finish() as usize % LANE_LOCKS].lock())
    }

    /// The first job of a lane that is not dead, stale entries passed over. Runs under
    /// the lane's lock.
    fn lane_head(&self, trees: &QueueTrees, prefix: &[u8]) -> Result<Option<Entry>, StoreError> {
        for indexed in trees.lanes.scan_prefix(prefix) {
            let (index, _) = indexed?;
            let entry = match lane_of(&index) {
                Some((_, key)) => trees.jobs.get(key)?,
                None => None,
            };
            if let Some(entry) = entry.and_then(|bytes| Entry::read(&bytes).ok())
                && entry.files(&index)
            {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// Where a job joining `lane` (at its end) goes: due now, or behind if the lane holds
    /// a job that is not dead; and its number in the lane. Runs under the lane's lock.
    fn place_in_lane(
        &self,
        trees: &QueueTrees,
        route: &str,
        lane: Option<&str>,
        now: Millis,
    ) -> Result<(Millis, u64), StoreError> {
        let Some(lane) = lane else {
            return Ok((now, 0));
        };
        let due_at = match self.lane_head(trees, &lane_prefix(route, lane))? {
            Some(_) => BEHIND,
            None => now,
        };
        Ok((due_at, trees.ids.generate_id()?))
    }

    /// Makes the first job of `job`'s lane due now if it waits behind one that went.
    /// Runs under the lane's lock.
    fn promote(&self, trees: &QueueTrees, job: &Job) -> Result<(), StoreError> {
        match &job.lane {
            Some(lane) => self.promote_first(trees, &lane_prefix(&job.route, lane)),
            None => Ok(()),
        }
    }

    /// Makes the first job of the lane at `prefix` due now if it is behind.
    fn promote_first(&self, trees: &QueueTrees, prefix: &[u8]) -> Result<(), StoreError> {
        let Some(first) = self.lane_head(trees, prefix)? else {
            return Ok(());
        };
        if first.due_at != BEHIND {
            return Ok(());
        }
        let now = self.clock.now();
        self.swap(trees, first.job.key.as_bytes(), |entry| {
            if entry.due_at != BEHIND || entry.token != 0 || entry.job.dead.is_some() {
                return Err(());
            }
            Ok(Some(Entry {
                due_at: now,
                ..entry.clone()
            }))
        })?;
        Ok(())
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
        let database = self.open()?;
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
        if let Err(changed) =
            trees
                .jobs
                .compare_and_swap(key, Some(bytes), encoded.map(IVec::from))?
        {
            take_back(trees, &new_indexes, changed.current)?;
            return Ok(None);
        }
        remove_unshared(&before.indexes(trees), &new_indexes)?;
        Ok(Some((before, after)))
    }

    /// Counts a swap's job out as it was and in as it is.
    fn recount(&self, swapped: &Swapped) {
        self.count(&swapped.0.job, false);
        if let Some(after) = &swapped.1 {
            self.count(&after.job, true);
        }
    }

    /// Takes the job a due index entry files, due again at `due_at`, unless the entry does
    /// not match the job (a change under way, or a stale entry).
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
                lane_seq: entry.lane_seq,
                job: entry.job.clone(),
            }))
        })?;
        match swapped {
            Some((_, Some(after))) => Ok(Some(Taken {
                attempt: after.takes,
                job: after.job,
                token,
            })),
            _ => Ok(None),
        }
    }

    /// Stores `job` in place of a taken one, if the take still owns it: due at `due_at`,
    /// or in dead letters.
    fn change_taken(
        &self,
        trees: &QueueTrees,
        taken: &Taken,
        job: &Job,
        due_at: Option<Millis>,
    ) -> Result<(), StoreError> {
        let swapped = self.swap(trees, taken.job.key.as_bytes(), |stored| {
            if stored.token != taken.token || stored.job.dead.is_some() {
                return Err(());
            }
            Ok(Some(Entry {
                due_at: due_at.unwrap_or(0),
                token: 0,
                takes: stored.takes,
                lane_seq: stored.lane_seq,
                job: job.clone(),
            }))
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
        let database = self.open()?;
        let trees = &database.queue;
        let stored = (|| {
            let _lane = self.lane_lock(&job.route, job.lane.as_deref());
            // A job of the key stays as it is, its index entries untouched: written and
            // taken back, ours could be one a retry of that job just wrote.
            if trees.jobs.contains_key(job.key.as_bytes())? {
                return Ok(Enqueued::AlreadyQueued);
            }
            let now = self.clock.now();
            let (due_at, lane_seq) =
                self.place_in_lane(trees, &job.route, job.lane.as_deref(), now)?;
            let entry = Entry {
                due_at,
                token: 0,
                takes: 0,
                lane_seq,
                job: job.clone(),
            };
            // The index entries first: a job must never lack them.
            let ours = entry.indexes(trees);
            for (tree, index) in &ours {
                tree.insert(index.as_slice(), &[])?;
            }
            let inserted = trees.jobs.compare_and_swap(
                job.key.as_bytes(),
                None::<&[u8]>,
                Some(entry.encode()?),
            )?;
            match inserted {
                Ok(()) => Ok(Enqueued::Stored),
                Err(existing) => {
                    take_back(trees, &ours, existing.current)?;
                    Ok(Enqueued::AlreadyQueued)
                }
            }
        })();
        let stored = self.database.reopen_if_failed(&database, stored)?;
        if stored == Enqueued::Stored {
            self.count(job, true);
        }
        // Whether stored now or before: the acknowledgment waits for it to be on disk.
        let flushed = database.syncs.sync().await;
        self.database.reopen_if_failed(&database, flushed)?;
        Ok(stored)
    }

    async fn take(
        &self,
        route: &str,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<Taken>, StoreError> {
        let database = self.open()?;
        let taken = self.on_database(|trees| {
            let now = self.clock.now();
            let prefix = route_prefix(route);
            let end = index_key(route, now.saturating_add(1), "");
            let until = now.saturating_add(millis(visibility));
            let mut taken = Vec::new();
            // Entries that do not match their job are passed over without counting, up
            // to a bound: a take never stops short behind a few of them.
            let due = trees.due.range(prefix.as_slice()..end.as_slice());
            for entry in due.take(limit.saturating_add(PASSED_OVER)) {
                let (index, _) = entry?;
                taken.extend(self.take_one(trees, route, &index, until)?);
                if taken.len() == limit {
                    break;
                }
            }
            Ok(taken)
        })?;
        if !taken.is_empty() {
            let flushed = database.syncs.sync().await;
            self.database.reopen_if_failed(&database, flushed)?;
        }
        Ok(taken)
    }

    async fn complete(&self, taken: &Taken) -> Result<(), StoreError> {
        let job = &taken.job;
        let removed = self.on_database(|trees| {
            let _lane = self.lane_lock(&job.route, job.lane.as_deref());
            let removed = self.swap(trees, job.key.as_bytes(), |stored| {
                if stored.token != taken.token || stored.job.dead.is_some() {
                    return Err(());
                }
                Ok(None)
            })?;
            if removed.is_some() {
                self.promote(trees, job)?;
            }
            Ok(removed)
        })?;
        let Some(swapped) = removed else {
            return Err(StoreError::NotOwner);
        };
        self.recount(&swapped);
        Ok(())
    }

    async fn retry(&self, taken: &Taken, job: &Job, due_at: Millis) -> Result<(), StoreError> {
        self.on_database(|trees| self.change_taken(trees, taken, job, Some(due_at)))
    }

    async fn bury(&self, taken: &Taken, job: &Job) -> Result<(), StoreError> {
        if job.dead.is_none() {
            return Err(StoreError::BadRequest(
                "a job is buried with its time of death".into(),
            ));
        }
        let database = self.open()?;
        let buried = (|| {
            let _lane = self.lane_lock(&job.route, job.lane.as_deref());
            self.change_taken(&database.queue, taken, job, None)?;
            self.promote(&database.queue, job)
        })();
        self.database.reopen_if_failed(&database, buried)?;
        // A dead letter is reported (logged, counted, listed) as one: on disk first.
        let flushed = database.syncs.sync().await;
        self.database.reopen_if_failed(&database, flushed)
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
                // One that does not match the job (revived, discarded, dying again) is passed
                // over.
                let current = job.filter(|job| {
                    job.dead
                        .is_some_and(|(at, _)| index == index_key(route, at, &job.key))
                });
                page.jobs.extend(current);
            }
            Ok(page)
        })
    }

    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let Some(dead) = self.job(route, key).await? else {
            return Ok(false);
        };
        let revived = self.on_database(|trees| {
            // A job of a lane goes to the end of it.
            let _lane = self.lane_lock(route, dead.lane.as_deref());
            let now = self.clock.now();
            let (due_at, lane_seq) = self.place_in_lane(trees, route, dead.lane.as_deref(), now)?;
            self.swap(trees, key.as_bytes(), |stored| {
                if stored.job.route != route
                    || stored.job.dead.is_none()
                    || stored.job.lane != dead.lane
                {
                    return Err(());
                }
                let mut job = stored.job.clone();
                job.revive(now);
                Ok(Some(Entry {
                    due_at,
                    token: 0,
                    takes: stored.takes,
                    lane_seq,
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
        })
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
