//! The embedded claim store: in-flight leases in memory, done records and held keys in sled.
//!
//! - **Leases** (in-flight claims) live in a sharded map in memory. sled locks its data
//!   directory, so no other process can hold a claim on these keys, and a claim left by a
//!   crashed process must be released at start-up anyway: a lease needs no disk at all.
//!   This keeps failed and in-flight deliveries off the disk and halves the writes of a
//!   successful one. A claim checks the map and sled's done records while holding the key's
//!   shard lock, so two claims of one key give exactly one owner, and a finish writes the
//!   done record before it drops the lease under that same lock, so no claim can slip
//!   between them.
//! - **Held keys** (`on_ambiguous: hold`) are few and must survive a restart: each is a
//!   record in the `held` tree, under its store key, and in the same map as the leases, so
//!   that a claim sees it under the same shard lock at no extra cost.
//! - **Done records** are filed by when they expire, one sled tree per window of time, in
//!   the order written, with an exact index of each tree's keys in memory ([`epochs`]):
//!   a claim's look-up goes `database.live_done` → `Epochs::get` → `Epoch::read`. The
//!   sweep empties and drops the trees whose window has passed, reading nothing else.
//! - **Entity records** (`order:`) are in the `entities` tree under their store key, and
//!   filed by when they expire in `entity_expiry` (the time, big-endian, then the key), so
//!   that the sweep reads only what has expired. A record replaced by a newer version
//!   leaves its old index entry behind, which the sweep drops without touching the record.
//! - `durability: fsync` makes each done mark (and hold, and entity record) stable before
//!   the call returns, through [`durable`]'s group commit; `batched` leaves it to sled's
//!   background sync every `flush_every`. An operator's change is made stable before it
//!   is answered whatever `durability` says: it is rare, and its answer says it is saved.
//! - sled keeps the first I/O error (a full disk, say) and fails every later operation,
//!   even once the disk has room again. So any failure drops the open database, and a
//!   background thread reopens the directory until it succeeds; meanwhile operations fail
//!   fast and the proxy follows `on_store_error`. The leases stay in memory throughout.

mod database;
mod durable;
mod epochs;
mod listing;
mod log;
mod open_key;
mod queue;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use parking_lot::RwLock;

use self::database::{Database, OpenDatabase};
use self::durable::SyncCounters;
use self::epochs::RecordKey;
use self::log::FileLog;
use self::open_key::{Lease, OpenKey};
use self::queue::SledQueue;
use super::queue::{DeliveryQueue, Enqueued, Job};
use super::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Clock, Completion, DiskSyncs, DoneRecord,
    EntityRecord, Expiry, Fingerprint, Forgotten, HeldRecord, KeyState, Millis, Page,
    RESOLVED_STATUS, Resolution, StateFilter, StoreError, Swept, SystemClock, Version,
    count_by_namespace, millis, store_key,
};
use crate::store::minutes::{KEPT_FOR, MinuteFigures};
use crate::store::settings::SledConfig;

/// What an open key is, to an operator's change.
enum Open {
    InFlight,
    Held,
}

/// The embedded store.
pub struct SledStore {
    database: Database,
    /// In-flight and held keys.
    open_keys: DashMap<String, OpenKey>,
    next_token: AtomicU64,
    clock: Arc<dyn Clock>,
    queue: Arc<SledQueue>,
    log: Arc<FileLog>,
    /// One operator's change of a done key at a time: a move of its expiry writes the new
    /// copy before it removes the old, so two moves (or a move and a forget) interleaved
    /// could leave no copy, or bring a forgotten one back.
    operator_changes: parking_lot::Mutex<()>,
}

impl SledStore {
    /// Opens (or creates) the store at `config.path`. Blocks on disk I/O.
    pub fn open(config: &SledConfig) -> Result<SledStore, StoreError> {
        SledStore::open_with_clock(config, Arc::new(SystemClock))
    }

    pub fn open_with_clock(
        config: &SledConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<SledStore, StoreError> {
        let syncs = Arc::new(SyncCounters::default());
        let opened = OpenDatabase::open(config, Arc::clone(&syncs))?;
        let open_keys = DashMap::new();
        for (key, held) in opened.held_keys(clock.now())? {
            open_keys.insert(key, OpenKey::Held(held));
        }
        let opened = Arc::new(opened);
        let database = Database {
            slot: Arc::new(RwLock::new(Some(Arc::clone(&opened)))),
            config: config.clone(),
            syncs,
        };
        let queue = SledQueue::new(Arc::clone(&clock), database.clone())?;
        let log = FileLog::open(&config.path, &opened.db)?;
        Ok(SledStore {
            queue: Arc::new(queue),
            log: Arc::new(log),
            database,
            open_keys,
            next_token: AtomicU64::new(rand::random()),
            clock,
            operator_changes: parking_lot::Mutex::new(()),
        })
    }

    /// The open database, or an error while it is being reopened.
    fn database(&self) -> Result<Arc<OpenDatabase>, StoreError> {
        self.database.open()
    }

    /// Passes `result` through; a backend failure drops `failed` and starts reopening.
    fn reopen_if_failed<T>(
        &self,
        failed: &Arc<OpenDatabase>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.database.reopen_if_failed(failed, result)
    }

    fn new_token(&self) -> u128 {
        u128::from(self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    fn claim_on(
        &self,
        database: &OpenDatabase,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now();
        let fresh = Lease {
            token: self.new_token(),
            record_key: database.epochs.record_key(key),
            claimed_at: now,
            lease_until: now.saturating_add(millis(lease)),
            fingerprint,
        };
        let claimed = || ClaimOutcome::Claimed(Claim::new(key, fresh.token));
        // The shard lock is held until the lease is in place: nothing can claim or
        // finish this key in between.
        match self.open_keys.entry(key.to_owned()) {
            Entry::Occupied(open) if open.get().live(now) => Ok(match open.get() {
                OpenKey::InFlight(lease) => ClaimOutcome::InFlight {
                    lease_until: lease.lease_until,
                },
                OpenKey::Held(held) => ClaimOutcome::Held(held.clone()),
            }),
            Entry::Occupied(mut ended) => {
                // Its owner outlived its lease (or a hold its retention): a new owner
                // takes over.
                if let OpenKey::Held(_) = ended.insert(OpenKey::InFlight(fresh.clone())) {
                    database.held.remove(key.as_bytes())?;
                }
                Ok(claimed())
            }
            Entry::Vacant(vacant) => match self.live_done(database, key, &fresh.record_key, now)? {
                Some(done) => Ok(ClaimOutcome::Done(done)),
                None => {
                    vacant.insert(OpenKey::InFlight(fresh.clone()));
                    Ok(claimed())
                }
            },
        }
    }

    /// The live done record of `key`: kept by its queued job, or filed. The queue is
    /// asked first, since a job leaving it files its done record before it goes.
    fn live_done(
        &self,
        database: &OpenDatabase,
        key: &str,
        record_key: &RecordKey,
        now: Millis,
    ) -> Result<Option<DoneRecord>, StoreError> {
        match self.queue.done_of(database, key, now)? {
            Some(done) => Ok(Some(done)),
            None => database.live_done(record_key, now),
        }
    }

    /// Stores `job` with the done record `completion` gives the key of `claim`, whose
    /// lease it must still own. A job of that key queued already keeps its own, and the
    /// key's done record is filed as a finish files it.
    fn store_with_done(
        &self,
        database: &OpenDatabase,
        claim: &Claim,
        job: &Job,
        completion: &Completion,
    ) -> Result<Enqueued, StoreError> {
        let lease = match self.open_keys.get(&claim.key) {
            Some(open) => open.owned_by(claim.token).cloned(),
            None => None,
        };
        let lease = lease.ok_or(StoreError::NotOwner)?;
        let done = lease.done_record(self.clock.now(), completion);
        let enqueued = self.queue.store_with_done(database, job, &done)?;
        if enqueued == Enqueued::AlreadyQueued {
            database.file_done(&claim.key, &done)?;
        }
        Ok(enqueued)
    }

    /// Whether `key` is in flight or held at `now`: an operator's change of a done key
    /// leaves such a key alone.
    fn open_state(&self, key: &str, now: Millis) -> Option<Open> {
        match self
            .open_keys
            .get(key)
            .filter(|open| open.live(now))
            .as_deref()
        {
            Some(OpenKey::InFlight(_)) => Some(Open::InFlight),
            Some(OpenKey::Held(_)) => Some(Open::Held),
            None => None,
        }
    }

    fn finish_on(
        &self,
        database: &OpenDatabase,
        claim: &Claim,
        completion: &Completion,
    ) -> Result<(), StoreError> {
        match self.open_keys.entry(claim.key.clone()) {
            Entry::Occupied(open) => {
                let Some(lease) = open.get().owned_by(claim.token) else {
                    return Err(StoreError::NotOwner);
                };
                let done = lease.done_record(self.clock.now(), completion);
                // On failure the lease stays until it ends: duplicates meanwhile get 409.
                database.epochs.put(
                    &lease.record_key,
                    &done,
                    millis(completion.retention),
                    &claim.key,
                )?;
                // A record to be synced keeps its lease until it is: no duplicate is
                // acknowledged on a done mark a power loss could still take.
                if !database.sync_settlements {
                    open.remove();
                }
                Ok(())
            }
            _ => Err(StoreError::NotOwner),
        }
    }

    fn hold_on(
        &self,
        database: &OpenDatabase,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError> {
        match self.open_keys.entry(claim.key.clone()) {
            Entry::Occupied(mut open) => {
                let Some(lease) = open.get().owned_by(claim.token) else {
                    return Err(StoreError::NotOwner);
                };
                let now = self.clock.now();
                let held = HeldRecord {
                    claimed_at: lease.claimed_at,
                    held_at: now,
                    expires_at: now.saturating_add(millis(retention)),
                    fingerprint: lease.fingerprint,
                    reason,
                };
                let encoded =
                    postcard::to_stdvec(&held).map_err(|error| StoreError::of("sled", error))?;
                // On failure the lease stays until it ends, as with a finish.
                database.held.insert(claim.key.as_bytes(), encoded)?;
                open.insert(OpenKey::Held(held));
                Ok(())
            }
            Entry::Vacant(_) => Err(StoreError::NotOwner),
        }
    }

    fn resolve_on(
        &self,
        database: &OpenDatabase,
        key: &str,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let Entry::Occupied(open) = self.open_keys.entry(key.to_owned()) else {
            return Ok(false);
        };
        let OpenKey::Held(held) = open.get() else {
            return Ok(false);
        };
        if held.expires_at <= now {
            return Ok(false);
        }
        if let Resolution::Done { retention } = resolution {
            let done = DoneRecord {
                claimed_at: held.claimed_at,
                completed_at: now,
                expires_at: now.saturating_add(millis(retention)),
                upstream_status: RESOLVED_STATUS,
                fingerprint: held.fingerprint,
                response: None,
            };
            // The done record first: a claim between the two writes sees the hold.
            let record_key = database.epochs.record_key(key);
            database
                .epochs
                .put(&record_key, &done, millis(retention), key)?;
        }
        database.held.remove(key.as_bytes())?;
        open.remove();
        Ok(true)
    }

    /// Removes leases that have ended without their owner settling them, and holds whose
    /// retention has ended (from the disk too).
    fn drop_ended(&self, database: &OpenDatabase, now: Millis) -> Result<usize, StoreError> {
        let mut ended_holds = Vec::new();
        let before = self.open_keys.len();
        self.open_keys.retain(|key, open| {
            let live = open.live(now);
            if !live && matches!(open, OpenKey::Held(_)) {
                ended_holds.push(key.clone());
            }
            live
        });
        for key in ended_holds {
            // Unless held again meanwhile (a new claim took the key over).
            if let Some(value) = database.held.get(key.as_bytes())?
                && postcard::from_bytes::<HeldRecord>(&value)
                    .map_or(true, |held| held.expires_at <= now)
            {
                let _ =
                    database
                        .held
                        .compare_and_swap(key.as_bytes(), Some(value), None::<&[u8]>)?;
            }
        }
        Ok(before.saturating_sub(self.open_keys.len()))
    }
}

#[async_trait]
impl ClaimStore for SledStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        // Through the queue: a database opened since is mended here, not under a key's
        // shard lock, where a claim asks the queue.
        let database = self.queue.open()?;
        let claimed = self.claim_on(&database, key, fingerprint, lease);
        self.reopen_if_failed(&database, claimed)
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let database = self.database()?;
        let finished = match self.finish_on(&database, claim, &completion) {
            Ok(()) => database.sync_settlement().await,
            failed => failed,
        };
        if finished.is_ok() && database.sync_settlements {
            self.open_keys
                .remove_if(&claim.key, |_, open| open.owned_by(claim.token).is_some());
        }
        self.reopen_if_failed(&database, finished)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        match self
            .open_keys
            .remove_if(&claim.key, |_, open| open.owned_by(claim.token).is_some())
        {
            Some(_) => Ok(()),
            None => Err(StoreError::NotOwner),
        }
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), StoreError> {
        let lease_until = self.clock.now().saturating_add(millis(lease));
        match self.open_keys.get_mut(&claim.key).as_deref_mut() {
            Some(OpenKey::InFlight(open)) if open.token == claim.token => {
                open.lease_until = lease_until;
                Ok(())
            }
            _ => Err(StoreError::NotOwner),
        }
    }

    async fn hold(
        &self,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let database = self.database()?;
        let held = self.hold_on(&database, claim, reason, retention);
        let held = match held {
            Ok(()) => database.sync_settlement().await,
            failed => failed,
        };
        self.reopen_if_failed(&database, held)
    }

    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError> {
        let database = self.database()?;
        let resolved = self.resolve_on(&database, key, resolution);
        self.reopen_if_failed(&database, resolved)
    }

    /// In-flight and held keys (from memory) and done keys whose queued jobs keep their
    /// done records first, together in key order, then the filed done keys (from a walk of
    /// the records, [`epochs::Position`] order).
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let listed = store_key(namespace, prefix);
        let from = match after.map(listing::Cursor::decode) {
            None => listing::Cursor::Open(None),
            Some(Some(cursor)) => cursor,
            Some(None) => return Err(listing::not_a_cursor(after.unwrap_or_default())),
        };
        let mut page = Page::default();
        if let listing::Cursor::Open(after) = &from {
            let now = self.clock.now();
            let after = after.as_deref();
            let mut found: listing::Found = (self.open_keys.iter())
                .filter(|open| {
                    open.key().starts_with(&listed)
                        && after.is_none_or(|after| open.key().as_str() > after)
                        && open.value().live(now)
                })
                .map(|open| (open.key().clone(), open.value().state()))
                .collect();
            // Done keys whose jobs are queued are listed among them, in key order.
            let wanted = match state {
                None | Some(StateFilter::Done) => limit + 1,
                Some(_) => 0,
            };
            let (queued, cut) = self.queue.done_keys(&listed, after, now, wanted)?;
            found.extend(
                queued
                    .into_iter()
                    .map(|(key, done)| (key, KeyState::Done(done))),
            );
            page = listing::open_keys(found, state, limit, cut);
            if page.next.is_some() || state.is_some_and(|state| state != StateFilter::Done) {
                return Ok(page);
            }
        }
        let position = match from {
            listing::Cursor::Done(position) => position,
            listing::Cursor::Open(_) => None,
        };
        let wanted = limit - page.keys.len();
        let database = self.database()?;
        let now = self.clock.now();
        let walked = tokio::task::spawn_blocking({
            let database = Arc::clone(&database);
            move || listing::done_keys(&database.epochs, now, &listed, position, wanted)
        })
        .await
        .map_err(|error| StoreError::of("sled", error))?;
        let (done, next) = self.reopen_if_failed(&database, walked.map_err(StoreError::from))?;
        page.keys.extend(done);
        page.next = next;
        Ok(page)
    }

    async fn count_held(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let now = self.clock.now();
        let held: Vec<String> = self
            .open_keys
            .iter()
            .filter(|open| matches!(open.value(), OpenKey::Held(_)) && open.live(now))
            .map(|open| open.key().clone())
            .collect();
        Ok(count_by_namespace(held.iter().map(String::as_str)))
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        let now = self.clock.now();
        if let Some(open) = self.open_keys.get(key).filter(|open| open.live(now)) {
            return Ok(Some(open.state()));
        }
        let database = self.queue.open()?;
        let done = self.live_done(&database, key, &database.epochs.record_key(key), now);
        self.reopen_if_failed(&database, done.map(|done| done.map(KeyState::Done)))
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let now = self.clock.now();
        match self.open_state(key, now) {
            Some(Open::InFlight) => return Ok(Forgotten::InFlight),
            Some(Open::Held) => return Ok(Forgotten::Held),
            None => {}
        }
        let database = self.database()?;
        let removed = {
            let _one_at_a_time = self.operator_changes.lock();
            self.queue
                .change_done(key, now, |_| None)
                .and_then(|queued| {
                    let filed = database
                        .epochs
                        .remove(&database.epochs.record_key(key), now)?;
                    Ok(queued || filed)
                })
        };
        let forgotten = removed.map(|live| {
            if live {
                Forgotten::Removed
            } else {
                Forgotten::Absent
            }
        });
        self.reopen_if_failed(&database, forgotten)
    }

    async fn set_expiry(&self, key: &str, expires_at: Millis) -> Result<Expiry, StoreError> {
        let now = self.clock.now();
        match self.open_state(key, now) {
            Some(Open::InFlight) => return Ok(Expiry::InFlight),
            Some(Open::Held) => return Ok(Expiry::Held),
            None => {}
        }
        let database = self.database()?;
        let record_key = database.epochs.record_key(key);
        let refiled = {
            let _one_at_a_time = self.operator_changes.lock();
            let queued = self
                .queue
                .change_done(key, now, |done| Some(DoneRecord { expires_at, ..done }));
            queued.and_then(|queued| {
                if queued {
                    return Ok(Expiry::Set);
                }
                let Some(done) = database.live_done(&record_key, now)? else {
                    return Ok(Expiry::Absent);
                };
                let moved = DoneRecord { expires_at, ..done };
                database.epochs.refile(&record_key, &moved, key)?;
                Ok(Expiry::Set)
            })
        };
        self.reopen_if_failed(&database, refiled)
    }

    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        let now = self.clock.now();
        let database = self.database()?;
        let ended = self.drop_ended(&database, now);
        let ended = self.reopen_if_failed(&database, ended)?;
        let worker = Arc::clone(&database);
        let swept = tokio::task::spawn_blocking(move || {
            let records = worker.epochs.sweep(now, limit)?;
            // The entities get what the done records left of the limit.
            let entities = worker.sweep_entities(now, limit.saturating_sub(records.examined))?;
            Ok::<_, StoreError>(Swept {
                examined: records.examined + entities.examined,
                removed: records.removed + entities.removed + ended,
            })
        })
        .await
        .map_err(|error| StoreError::Backend(error.to_string()))
        .and_then(|swept| swept);
        self.reopen_if_failed(&database, swept)
    }

    async fn record_minute(&self, figures: &MinuteFigures) -> Result<(), StoreError> {
        let database = self.database()?;
        let kept_from = figures.minute.saturating_sub(millis(KEPT_FOR));
        let recorded = database.record_minute(figures, kept_from);
        self.reopen_if_failed(&database, recorded)
    }

    async fn minutes(&self, since: Millis) -> Result<Vec<MinuteFigures>, StoreError> {
        let database = self.database()?;
        let read = database.minutes(since);
        self.reopen_if_failed(&database, read)
    }

    async fn newest_version(&self, entity: &str) -> Result<Option<EntityRecord>, StoreError> {
        let database = self.database()?;
        let newest = database.live_entity(entity, self.clock.now());
        self.reopen_if_failed(&database, newest)
    }

    async fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let database = self.database()?;
        let now = self.clock.now();
        let recorded = match database.record_version(entity, version, millis(retention), now) {
            Ok(true) => database.sync_settlement().await.map(|()| true),
            other => other,
        };
        self.reopen_if_failed(&database, recorded)
    }

    async fn forget_entity(&self, entity: &str) -> Result<bool, StoreError> {
        let database = self.database()?;
        let now = self.clock.now();
        let forgotten = database
            .entities
            .remove(entity.as_bytes())
            .map_err(StoreError::from)
            .map(|removed| {
                removed
                    .and_then(|bytes| postcard::from_bytes::<EntityRecord>(&bytes).ok())
                    .is_some_and(|record| record.expires_at > now)
            });
        self.reopen_if_failed(&database, forgotten)
    }

    fn queue(&self) -> Option<Arc<dyn DeliveryQueue>> {
        Some(Arc::clone(&self.queue) as Arc<dyn DeliveryQueue>)
    }

    async fn enqueue_done(
        &self,
        claim: &Claim,
        job: &Job,
        completion: &Completion,
    ) -> Result<Option<Enqueued>, StoreError> {
        let database = self.queue.open()?;
        let stored = self.store_with_done(&database, claim, job, completion);
        let stored = self.reopen_if_failed(&database, stored)?;
        // On stable storage before the claim ends: no duplicate is answered on a done
        // record a power loss could take.
        let flushed = database.syncs.sync().await;
        self.reopen_if_failed(&database, flushed)?;
        self.open_keys
            .remove_if(&claim.key, |_, open| open.owned_by(claim.token).is_some());
        Ok(Some(stored))
    }

    fn delivery_log(&self) -> Option<Arc<dyn crate::store::log::DeliveryLog>> {
        Some(Arc::clone(&self.log) as Arc<dyn crate::store::log::DeliveryLog>)
    }

    fn done_keys(&self) -> Option<u64> {
        let queued = u64::try_from(self.queue.done_count()).unwrap_or(u64::MAX);
        self.database()
            .ok()
            .map(|database| database.epochs.records().saturating_add(queued))
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let database = self.database()?;
        let flushed = database.syncs.sync().await;
        self.reopen_if_failed(&database, flushed)
    }

    fn disk_syncs(&self) -> Option<DiskSyncs> {
        Some(self.database.syncs.read())
    }
}
