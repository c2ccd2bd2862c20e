//! The delivery queue in the embedded store, in the claims' database.
//!
//! On disk, the tree `jobs_by_seq` holds each job's record under its seq: a number sled
//! gives the job as it is stored (they only grow, also across restarts). So an
//! acceptance writes at the tree's end, and takes and completions, which mostly follow
//! the order stored, work near its front, in pages that stay in sled's cache. The record
//! holds the job, when it is due, the token of its take, its place in its lane and its
//! key's done record (`record.rs`), so that an acceptance is one write and claims of the
//! key find it here; `jobs_paused` holds the routes paused. Every change of a job is one
//! write of its record; a job that leaves first files its done record with the others
//! (two writes).
//!
//! Each key's seq, and what a take, a listing and the counts need in order (jobs by due
//! time, the oldest received, dead letters by time of death, lanes), is indexed in
//! memory (`index.rs`; index trees cost two more sled writes per change,
//! `docs/performance.md`), rebuilt from the records whenever the database opens, which
//! reads every record anyway to mend what a crash left: a job taken when the process
//! stopped is due again, and a lane whose first job went has its next made due.
//!
//! A job changes under its key's lock (one of [`KEY_LOCKS`] the keys share), from the
//! read of its record to the change of the indexes after the write, so that the indexes
//! follow the records change by change. Whether a job is its lane's first is decided
//! under the lane's lock (one of [`LANE_LOCKS`]), taken before any key's. No other
//! process opens the database, and no sled transaction is used: the first one a process
//! runs turns on a lock around every sled operation of the process
//! (`docs/performance.md`).
//!
//! An enqueue, a take and a bury wait for the sync that puts them on stable storage
//! (shared with every caller that arrived meanwhile, `durable.rs`) whatever `durability`
//! says; an operator's change is synced by the admin API before it answers; a retry or
//! a completion is written by sled's own periodic sync: lost in a crash, the job is due
//! again, and delivered again (the documented window).

mod index;
mod record;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use self::index::{Filing, Indexes};
use self::record::{Record, read_at_open};
use super::database::{Database, OpenDatabase, QueueTrees};
use crate::store::queue::{
    BEHIND, DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken, dead_cursor,
    parse_dead_cursor,
};
use crate::store::{Clock, DoneRecord, Millis, StoreError, millis};
use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};

/// What a change did to a job's record.
enum Changed {
    Written(Box<Record>),
    Removed,
}

/// Keys done by their queued jobs, each with its done record, and where the look for
/// them was cut short, if it was ([`SledQueue::done_keys`]).
pub(super) type QueuedDoneKeys = (Vec<(String, DoneRecord)>, Option<String>);

/// How many keys' done records one listing's page looks at in the indexes, at most (a
/// few milliseconds under the lock every claim takes).
const DONE_KEYS_EXAMINED_MAX: usize = 50_000;

/// How many locks the keys share.
const KEY_LOCKS: usize = 256;
/// How many locks the lanes share.
const LANE_LOCKS: usize = 64;

/// The embedded store's queue.
pub(super) struct SledQueue {
    database: Database,
    clock: Arc<dyn Clock>,
    indexes: Mutex<Indexes>,
    key_locks: Vec<Mutex<()>>,
    lane_locks: Vec<Mutex<()>>,
    /// The database last mended: one opened since is mended before its first use. The
    /// address is read without the lock on every operation; the `Weak` keeps it from
    /// being reused by another database.
    mended: Mutex<Weak<OpenDatabase>>,
    mended_address: AtomicUsize,
    /// How many jobs keep a done record, as the indexes last said: read without their
    /// lock, so that a claim on a store whose queue keeps none takes no lock.
    done_jobs: AtomicUsize,
}

fn shard(locks: &[Mutex<()>], value: impl Hash) -> MutexGuard<'_, ()> {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    locks[hasher.finish() as usize % locks.len()].lock()
}

impl SledQueue {
    /// The queue of the store's database, mended (see [`SledQueue::mend`]). Blocks on
    /// disk I/O.
    pub(super) fn new(clock: Arc<dyn Clock>, database: Database) -> Result<SledQueue, StoreError> {
        let queue = SledQueue {
            database,
            clock,
            indexes: Mutex::new(Indexes::default()),
            key_locks: (0..KEY_LOCKS).map(|_| Mutex::new(())).collect(),
            lane_locks: (0..LANE_LOCKS).map(|_| Mutex::new(())).collect(),
            mended: Mutex::new(Weak::new()),
            mended_address: AtomicUsize::new(0),
            done_jobs: AtomicUsize::new(0),
        };
        queue.open()?;
        Ok(queue)
    }

    /// The open database, mended first if it is newly opened (at start, or reopened
    /// from disk after a failure: either way, what a crash left).
    pub(super) fn open(&self) -> Result<Arc<OpenDatabase>, StoreError> {
        let database = self.database.open()?;
        let address = Arc::as_ptr(&database) as usize;
        if self.mended_address.load(Ordering::Acquire) == address {
            return Ok(database);
        }
        let mut mended = self.mended.lock();
        if !std::ptr::eq(mended.as_ptr(), Arc::as_ptr(&database)) {
            let result = self.mend(&database.queue);
            self.database.reopen_if_failed(&database, result)?;
            *mended = Arc::downgrade(&database);
            self.mended_address.store(address, Ordering::Release);
        }
        Ok(database)
    }

    /// Reads every record into the indexes, and mends what a crash left: the jobs taken
    /// when it came made due now (their attempts were cut off), and each lane's first job
    /// made due. Of two records of a key, the first stored is the job: a second the same
    /// is removed (two would deliver the job twice), one that differs is left alone and
    /// reported (neither is known to be the right one). Blocks on disk I/O, for every
    /// job.
    fn mend(&self, trees: &QueueTrees) -> Result<(), StoreError> {
        let mut indexes = Indexes::default();
        let now = self.clock.now();
        for stored in trees.jobs.iter() {
            let (key, bytes) = stored?;
            let Some(seq) = <[u8; 8]>::try_from(&*key).ok().map(u64::from_be_bytes) else {
                tracing::error!("a queued job under a key that is no seq is left alone");
                continue;
            };
            let Some((record, was_taken)) = read_at_open(&bytes, now) else {
                continue;
            };
            if let Some(first) = indexes.seq(&record.job.key) {
                // Compared as this version writes them: either may be an earlier one's.
                let first = (trees.jobs.get(first.to_be_bytes())?)
                    .and_then(|bytes| read_at_open(&bytes, now))
                    .map(|(first, _)| first.encode())
                    .transpose()?;
                if first == Some(record.encode()?) {
                    tracing::warn!("a second copy of a queued job's record is removed");
                    trees.jobs.remove(key)?;
                } else {
                    tracing::error!(
                        "a queued job has two records that differ: the second is left alone, undelivered"
                    );
                }
                continue;
            }
            if was_taken {
                trees.jobs.insert(key, record.encode()?)?;
            }
            indexes.refile(&record.job.route, None, Some(&record.filing(seq)));
        }
        let lanes = indexes.lanes();
        self.done_jobs
            .store(indexes.done_count(), Ordering::Release);
        *self.indexes.lock() = indexes;
        for (route, lane) in lanes {
            let _lane = self.lane_lock(&route, Some(&lane));
            self.promote_first(trees, &route, &lane)?;
        }
        Ok(())
    }

    /// When a job joining `lane` (at its end) is due: now, or behind if the lane holds a
    /// job that is not dead. Runs under the lane's lock.
    fn due_in_lane(&self, route: &str, lane: Option<&str>, now: Millis) -> Millis {
        match lane.and_then(|lane| self.indexes.lock().lane_head(route, lane)) {
            Some(_) => BEHIND,
            None => now,
        }
    }

    /// The lock of a lane's changes, held while whether a job is its lane's first is
    /// decided; none for a job without a lane.
    fn lane_lock(&self, route: &str, lane: Option<&str>) -> Option<MutexGuard<'_, ()>> {
        Some(shard(&self.lane_locks, (route, lane?)))
    }

    /// Makes the first job of `job`'s lane due now if it waits behind one that went.
    /// Runs under the lane's lock.
    fn promote(&self, trees: &QueueTrees, job: &Job) -> Result<(), StoreError> {
        match &job.lane {
            Some(lane) => self.promote_first(trees, &job.route, lane),
            None => Ok(()),
        }
    }

    /// Makes the first job of `route`'s lane `lane` due now if it is behind. Runs under
    /// the lane's lock.
    fn promote_first(&self, trees: &QueueTrees, route: &str, lane: &str) -> Result<(), StoreError> {
        let Some(first) = self.indexes.lock().lane_head(route, lane) else {
            return Ok(());
        };
        let now = self.clock.now();
        self.swap(trees, &first, |record| {
            if record.due_at != BEHIND || record.token != 0 || record.job.dead.is_some() {
                return Err(());
            }
            Ok(Some(Record {
                due_at: now,
                ..record
            }))
        })?;
        Ok(())
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
    /// `change` wants to (returns `Err(())` to leave it), under the key's lock: one
    /// write, then the indexes. Returns what it did, or none when the job was absent,
    /// unreadable or left alone.
    fn swap(
        &self,
        trees: &QueueTrees,
        key: &str,
        change: impl FnOnce(Record) -> Result<Option<Record>, ()>,
    ) -> Result<Option<Changed>, StoreError> {
        let _key = shard(&self.key_locks, key);
        let Some((seq, before)) = self.stored(trees, key)? else {
            return Ok(None);
        };
        let (route, filed) = (before.job.route.clone(), before.filing(seq));
        let Ok(after) = change(before) else {
            return Ok(None);
        };
        match &after {
            Some(record) => trees.jobs.insert(seq.to_be_bytes(), record.encode()?)?,
            None => trees.jobs.remove(seq.to_be_bytes())?,
        };
        let refiled = after.as_ref().map(|record| record.filing(seq));
        self.refile(&route, Some(&filed), refiled.as_ref());
        Ok(Some(after.map_or(Changed::Removed, |record| {
            Changed::Written(Box::new(record))
        })))
    }

    /// The record of the job of `key` and its seq, if one is stored and reads.
    fn stored(&self, trees: &QueueTrees, key: &str) -> Result<Option<(u64, Record)>, StoreError> {
        let Some(seq) = self.indexes.lock().seq(key) else {
            return Ok(None);
        };
        Ok(match trees.jobs.get(seq.to_be_bytes())? {
            Some(bytes) => Record::read(&bytes).ok().map(|record| (seq, record)),
            None => None,
        })
    }

    /// Takes the due job of `key`, due again at `due_at`, unless it changed since it was
    /// found due (taken by another take, say).
    fn take_one(
        &self,
        trees: &QueueTrees,
        key: &str,
        now: Millis,
        due_at: Millis,
    ) -> Result<Option<Taken>, StoreError> {
        let token: u64 = rand::random::<u64>() | 1;
        let changed = self.swap(trees, key, |record| {
            if record.job.dead.is_some() || record.due_at > now {
                return Err(());
            }
            Ok(Some(Record {
                due_at,
                token,
                takes: record.takes + 1,
                ..record
            }))
        })?;
        match changed {
            Some(Changed::Written(after)) => Ok(Some(Taken {
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
        self.change_owned(trees, taken, |stored| Record {
            due_at: due_at.unwrap_or(0),
            token: 0,
            job: job.clone(),
            ..stored
        })
    }

    /// Writes `change` of a taken job's record, if the take still owns it (`NotOwner`
    /// otherwise).
    fn change_owned(
        &self,
        trees: &QueueTrees,
        taken: &Taken,
        change: impl FnOnce(Record) -> Record,
    ) -> Result<(), StoreError> {
        let changed = self.swap(trees, &taken.job.key, |stored| {
            if stored.token != taken.token || stored.job.dead.is_some() {
                return Err(());
            }
            Ok(Some(change(stored)))
        })?;
        changed.map(drop).ok_or(StoreError::NotOwner)
    }

    /// Stores `job` unless a job of its key is there, due now or behind the lane's jobs,
    /// under the next seq (also its place in its lane). A job is refused as queued only
    /// once its record is found on disk: indexes that name a record the disk does not
    /// hold fail the call, which reopens the database and rebuilds them.
    fn store_new(
        &self,
        trees: &QueueTrees,
        job: &Job,
        done: Option<&DoneRecord>,
    ) -> Result<Enqueued, StoreError> {
        let _lane = self.lane_lock(&job.route, job.lane.as_deref());
        let _key = shard(&self.key_locks, job.key.as_str());
        let indexed = self.indexes.lock().seq(&job.key);
        if let Some(seq) = indexed {
            if trees.jobs.contains_key(seq.to_be_bytes())? {
                return Ok(Enqueued::AlreadyQueued);
            }
            return Err(StoreError::Backend(
                "the queue's indexes name a job that is not on disk".into(),
            ));
        }
        let seq = trees.ids.generate_id()?;
        let record = Record {
            due_at: self.due_in_lane(&job.route, job.lane.as_deref(), self.clock.now()),
            token: 0,
            takes: 0,
            lane_place: if job.lane.is_some() { seq } else { 0 },
            job: job.clone(),
            done: done.cloned(),
        };
        trees.jobs.insert(seq.to_be_bytes(), record.encode()?)?;
        self.refile(&job.route, None, Some(&record.filing(seq)));
        Ok(Enqueued::Stored)
    }

    /// Stores `job` as an enqueue does, keeping `done`, its key's done record, in its
    /// record: the queue answers for the key until the job leaves. Not synced: the caller
    /// syncs before it answers.
    pub(super) fn store_with_done(
        &self,
        database: &OpenDatabase,
        job: &Job,
        done: &DoneRecord,
    ) -> Result<Enqueued, StoreError> {
        self.store_new(&database.queue, job, Some(done))
    }

    /// Files a job's change in the indexes, and counts the jobs that keep a done record.
    fn refile(&self, route: &str, before: Option<&Filing>, after: Option<&Filing>) {
        let mut indexes = self.indexes.lock();
        indexes.refile(route, before, after);
        self.done_jobs
            .store(indexes.done_count(), Ordering::Release);
    }

    /// The live done record a queued job keeps for `key`, read from its record only when
    /// the indexes say it keeps one. A claim of a key whose job keeps one comes after its
    /// lease ended, so after the count of the job's filing.
    pub(super) fn done_of(
        &self,
        database: &OpenDatabase,
        key: &str,
        now: Millis,
    ) -> Result<Option<DoneRecord>, StoreError> {
        if self.done_jobs.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let Some(seq) = self.indexes.lock().done(key, now) else {
            return Ok(None);
        };
        let record = match database.queue.jobs.get(seq.to_be_bytes())? {
            Some(bytes) => Record::read(&bytes).ok(),
            None => None,
        };
        Ok(record.and_then(|record| record.live_done(now).cloned()))
    }

    /// How many jobs keep a done record, expired or not.
    pub(super) fn done_count(&self) -> usize {
        self.done_jobs.load(Ordering::Acquire)
    }

    /// Changes the live done record a queued job keeps for `key` (`None`: the key is no
    /// longer done once the job leaves). Returns whether there was one.
    pub(super) fn change_done(
        &self,
        key: &str,
        now: Millis,
        change: impl FnOnce(DoneRecord) -> Option<DoneRecord>,
    ) -> Result<bool, StoreError> {
        let changed = self.on_database(|trees| {
            self.swap(trees, key, |stored| {
                let Some(done) = stored.live_done(now).cloned() else {
                    return Err(());
                };
                Ok(Some(Record {
                    done: change(done),
                    ..stored
                }))
            })
        })?;
        Ok(changed.is_some())
    }

    /// Up to `wanted` keys starting with `prefix`, after `after`, in key order, whose
    /// jobs keep a live done record, each with it; and the last key looked at, when the
    /// look was cut short (at [`DONE_KEYS_EXAMINED_MAX`]) before `wanted` were found.
    pub(super) fn done_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        now: Millis,
        wanted: usize,
    ) -> Result<QueuedDoneKeys, StoreError> {
        if wanted == 0 {
            return Ok((Vec::new(), None));
        }
        let (keys, cut) =
            (self.indexes.lock()).done_keys(prefix, after, now, wanted, DONE_KEYS_EXAMINED_MAX);
        self.on_database(|trees| {
            let mut found = Vec::with_capacity(keys.len());
            for key in keys {
                // One delivered or changed since it was found is passed over.
                if let Some((_, record)) = self.stored(trees, &key)?
                    && let Some(done) = record.live_done(now)
                {
                    found.push((key.to_string(), done.clone()));
                }
            }
            Ok((found, cut.map(|key| key.to_string())))
        })
    }

    /// Removes the job of `key` if `leaves` says so, its live done record filed with the
    /// others first: a claim meanwhile finds one or the other. Returns whether it went.
    fn remove_job(
        &self,
        database: &OpenDatabase,
        key: &str,
        leaves: impl FnOnce(&Record) -> bool,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut filing = Ok(());
        let removed = self.swap(&database.queue, key, |stored| {
            if !leaves(&stored) {
                return Err(());
            }
            if let Some(done) = stored.live_done(now) {
                filing = database.file_done(key, done);
            }
            filing.as_ref().map(|()| None).map_err(drop)
        });
        removed.and_then(|removed| filing.map(|()| removed.is_some()))
    }
}

#[async_trait]
impl DeliveryQueue for SledQueue {
    async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError> {
        let database = self.open()?;
        let stored = self.store_new(&database.queue, job, None);
        let stored = self.database.reopen_if_failed(&database, stored)?;
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
            let until = now.saturating_add(millis(visibility));
            let due = self.indexes.lock().due(route, now, limit);
            let mut taken = Vec::with_capacity(due.len());
            for key in due {
                taken.extend(self.take_one(trees, &key, now, until)?);
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
        // Opened (and mended, which takes the lanes' locks) before the lane's lock.
        let database = self.open()?;
        let completed = (|| {
            let _lane = self.lane_lock(&job.route, job.lane.as_deref());
            let owned = |stored: &Record| stored.token == taken.token && stored.job.dead.is_none();
            if !self.remove_job(&database, &job.key, owned)? {
                return Err(StoreError::NotOwner);
            }
            self.promote(&database.queue, job)
        })();
        self.database.reopen_if_failed(&database, completed)
    }

    async fn retry(&self, taken: &Taken, job: &Job, due_at: Millis) -> Result<(), StoreError> {
        self.on_database(|trees| self.change_taken(trees, taken, job, Some(due_at)))
    }

    async fn release(&self, taken: &Taken, due_at: Millis) -> Result<(), StoreError> {
        self.on_database(|trees| {
            self.change_owned(trees, taken, |stored| Record {
                due_at,
                token: 0,
                takes: stored.takes.saturating_sub(1),
                ..stored
            })
        })
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
        self.on_database(|trees| {
            let record = self.stored(trees, key)?.map(|(_, record)| record);
            Ok(record
                .map(|record| record.job)
                .filter(|job| job.route == route))
        })
    }

    async fn dead(
        &self,
        route: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        let mut after = after
            .map(parse_dead_cursor)
            .transpose()?
            .map(|(died, key)| (died, Arc::<str>::from(key)));
        self.on_database(|trees| {
            let mut page = DeadPage::default();
            loop {
                let asked = limit.saturating_add(1);
                let listed = after.as_ref().map(|(died, key)| (*died, &**key));
                let batch = self.indexes.lock().dead(route, listed, asked);
                let last_batch = batch.len() < asked;
                for (died, key) in batch {
                    if page.jobs.len() == limit {
                        page.next = page.jobs.last().map(dead_cursor);
                        return Ok(page);
                    }
                    let job = self.stored(trees, &key)?.map(|(_, record)| record.job);
                    // One revived, discarded or dead again since it was listed is passed
                    // over here.
                    page.jobs.extend(job.filter(|job| {
                        job.route == route && job.dead.is_some_and(|(at, _)| at == died)
                    }));
                    after = Some((died, key));
                }
                if last_batch {
                    return Ok(page);
                }
            }
        })
    }

    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let Some(dead) = self.job(route, key).await? else {
            return Ok(false);
        };
        let revived = self.on_database(|trees| {
            // A job of a lane goes to the end of it; its record keeps its seq.
            let _lane = self.lane_lock(route, dead.lane.as_deref());
            let now = self.clock.now();
            let due_at = self.due_in_lane(route, dead.lane.as_deref(), now);
            let lane_place = match dead.lane {
                Some(_) => trees.ids.generate_id()?,
                None => 0,
            };
            self.swap(trees, key, |stored| {
                if stored.job.route != route
                    || stored.job.dead.is_none()
                    || stored.job.lane != dead.lane
                {
                    return Err(());
                }
                let mut job = stored.job;
                job.revive(now);
                Ok(Some(Record {
                    due_at,
                    token: 0,
                    takes: stored.takes,
                    lane_place,
                    job,
                    done: stored.done,
                }))
            })
        })?;
        Ok(revived.is_some())
    }

    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let database = self.open()?;
        let discarded = self.remove_job(&database, key, |stored| {
            stored.job.route == route && stored.job.dead.is_some()
        });
        self.database.reopen_if_failed(&database, discarded)
    }

    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError> {
        self.open()?;
        let indexes = self.indexes.lock();
        Ok(routes
            .iter()
            .map(|route| {
                let (counts, oldest) = indexes.counts(route);
                QueueCounts {
                    waiting: counts.waiting,
                    retrying: counts.retrying,
                    dead: counts.dead,
                    oldest,
                }
            })
            .collect())
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
