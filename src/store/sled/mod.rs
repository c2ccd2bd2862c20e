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
//! - **Done records** are filed by when they expire, one sled tree per window of time,
//!   with a Bloom filter per tree in memory ([`epochs`]). The sweep empties and drops the
//!   trees whose window has passed, reading nothing else.
//! - **Entity records** (`order:`) are in the `entities` tree under their store key, and
//!   filed by when they expire in `entity_expiry` (the time, big-endian, then the key), so
//!   that the sweep reads only what has expired. A record replaced by a newer version
//!   leaves its old index entry behind, which the sweep drops without touching the record.
//! - `durability: fsync` makes each done mark durable before `finish` returns, through
//!   `GroupFlusher`; `batched` leaves it to sled's background flush every `flush_every`.
//! - sled keeps the first I/O error (a full disk, say) and fails every later operation,
//!   even once the disk has room again. So any failure drops the open database, and a
//!   background thread reopens the directory until it succeeds; meanwhile operations fail
//!   fast and the proxy follows `on_store_error`. The leases stay in memory throughout.

mod epochs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use parking_lot::RwLock;
use tokio::sync::oneshot;

use self::epochs::{Epochs, RecordKey};
use super::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Clock, Completion, DoneRecord, EntityRecord,
    Fingerprint, Forgotten, HeldRecord, KeyState, Millis, Page, RESOLVED_STATUS, Resolution,
    StateFilter, StoreError, Swept, SystemClock, Version, count_by_namespace, millis, page,
};
use crate::config::{Durability, SledConfig};

/// A key that is neither absent nor done, as the map in memory holds it.
#[derive(Debug, Clone)]
enum OpenKey {
    InFlight(Lease),
    Held(HeldRecord),
}

impl OpenKey {
    fn live(&self, now: Millis) -> bool {
        match self {
            OpenKey::InFlight(lease) => lease.lease_until > now,
            OpenKey::Held(held) => held.expires_at > now,
        }
    }

    fn state(&self) -> KeyState {
        match self {
            OpenKey::InFlight(lease) => KeyState::InFlight {
                claimed_at: lease.claimed_at,
                lease_until: lease.lease_until,
                fingerprint: lease.fingerprint,
            },
            OpenKey::Held(held) => KeyState::Held(held.clone()),
        }
    }

    fn owned_by(&self, token: u128) -> Option<&Lease> {
        match self {
            OpenKey::InFlight(lease) if lease.token == token => Some(lease),
            _ => None,
        }
    }
}

/// An in-flight claim.
#[derive(Debug, Clone)]
struct Lease {
    token: u128,
    /// Where the done record goes: hashed once, at the claim.
    record_key: RecordKey,
    claimed_at: Millis,
    lease_until: Millis,
    fingerprint: Fingerprint,
}

impl From<sled::Error> for StoreError {
    fn from(error: sled::Error) -> StoreError {
        StoreError::of("sled", error)
    }
}

/// An open database: its done records, its held keys, its entity records and, with
/// `fsync`, the flusher.
struct OpenDatabase {
    db: sled::Db,
    epochs: Epochs,
    held: sled::Tree,
    entities: sled::Tree,
    entity_expiry: sled::Tree,
    flusher: Option<GroupFlusher>,
}

impl OpenDatabase {
    /// Opens (or creates) the database at `config.path`. Blocks on disk I/O.
    fn open(config: &SledConfig) -> Result<OpenDatabase, StoreError> {
        let path = config.path.display();
        let db = sled::Config::new()
            .path(&config.path)
            .cache_capacity(config.cache.0)
            .flush_every_ms(Some(millis(config.flush_every.0).max(1)))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|error| match error.to_string() {
                text if text.contains("could not acquire lock") => StoreError::Backend(format!(
                    "data directory {path} is in use by another process (is another dedupe-proxy running on it?): {text}"
                )),
                text => StoreError::Backend(format!("cannot open data directory {path}: {text}")),
            })?;
        let (epochs, indexing) = Epochs::open(&db).map_err(|error| match error {
            StoreError::Backend(text) => {
                StoreError::Backend(format!("data directory {path}: {text}"))
            }
            other => other,
        })?;
        indexing.start().map_err(|error| {
            StoreError::Backend(format!("cannot start indexing the done records: {error}"))
        })?;
        let held = db.open_tree("held")?;
        let entities = db.open_tree("entities")?;
        let entity_expiry = db.open_tree("entity_expiry")?;
        let flusher =
            (config.durability == Durability::Fsync).then(|| GroupFlusher::start(db.clone()));
        Ok(OpenDatabase {
            db,
            epochs,
            held,
            entities,
            entity_expiry,
            flusher,
        })
    }

    /// The live record of `entity`; an unreadable one reads as none.
    fn live_entity(&self, entity: &str, now: Millis) -> Result<Option<EntityRecord>, StoreError> {
        Ok(self
            .entities
            .get(entity.as_bytes())?
            .and_then(|bytes| postcard::from_bytes::<EntityRecord>(&bytes).ok())
            .filter(|record| record.expires_at > now))
    }

    /// Records `version` unless a live record is as new, swapping the record only if it is
    /// still the one read, so that of racing calls the largest version stays.
    fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let record = EntityRecord {
            newest: version.clone(),
            recorded_at: now,
            expires_at: now.saturating_add(retention),
        };
        let encoded =
            postcard::to_stdvec(&record).map_err(|error| StoreError::of("sled", error))?;
        loop {
            let current = self.entities.get(entity.as_bytes())?;
            let as_new = current
                .as_ref()
                .and_then(|bytes| postcard::from_bytes::<EntityRecord>(bytes).ok())
                .is_some_and(|live| {
                    live.expires_at > now && live.newest.sort_key >= version.sort_key
                });
            if as_new {
                return Ok(false);
            }
            // The index entry first: a record the sweep cannot find would never go.
            self.entity_expiry
                .insert(entity_expiry_key(record.expires_at, entity), &[])?;
            if self
                .entities
                .compare_and_swap(entity.as_bytes(), current, Some(encoded.as_slice()))?
                .is_ok()
            {
                return Ok(true);
            }
        }
    }

    /// Removes entity records that expired by `now`, reading up to `limit` index entries.
    fn sweep_entities(&self, now: Millis, limit: usize) -> Result<Swept, StoreError> {
        let mut swept = Swept::default();
        let end = now.saturating_add(1).to_be_bytes();
        for entry in self.entity_expiry.range(..end.as_slice()).take(limit) {
            let (index_key, _) = entry?;
            swept.examined += 1;
            let entity = &index_key[index_key.len().min(8)..];
            if let Some(bytes) = self.entities.get(entity)? {
                let expired = postcard::from_bytes::<EntityRecord>(&bytes)
                    .map_or(true, |record| record.expires_at <= now);
                // Unless a newer version replaced it meanwhile.
                if expired
                    && self
                        .entities
                        .compare_and_swap(entity, Some(bytes), None::<&[u8]>)?
                        .is_ok()
                {
                    swept.removed += 1;
                }
            }
            self.entity_expiry.remove(index_key)?;
        }
        Ok(swept)
    }

    /// The held keys on disk that have not expired; the expired ones are removed.
    fn held_keys(&self, now: Millis) -> Result<Vec<(String, HeldRecord)>, StoreError> {
        let mut live = Vec::new();
        for entry in &self.held {
            let (key, value) = entry?;
            let (Ok(text), Ok(record)) = (
                String::from_utf8(key.to_vec()),
                postcard::from_bytes::<HeldRecord>(&value),
            ) else {
                tracing::error!("an unreadable held key in the store is ignored");
                continue;
            };
            if record.expires_at > now {
                live.push((text, record));
            } else {
                self.held.remove(key)?;
            }
        }
        Ok(live)
    }

    /// Makes the writes so far durable, with `fsync`.
    async fn make_durable(&self) -> Result<(), StoreError> {
        match &self.flusher {
            Some(flusher) => flusher.flush().await,
            None => Ok(()),
        }
    }

    /// The done record stored under `key`, if it has one that has not expired.
    fn live_done(&self, key: &RecordKey, now: Millis) -> Result<Option<DoneRecord>, StoreError> {
        Ok(self.epochs.get(key, now)?)
    }
}

/// Where an entity record is filed by its expiry: the time, big-endian, so that the index
/// sorts by it, then the entity's store key.
fn entity_expiry_key(expires_at: Millis, entity: &str) -> Vec<u8> {
    let mut key = expires_at.to_be_bytes().to_vec();
    key.extend_from_slice(entity.as_bytes());
    key
}

/// The open database, or none while it is being reopened after a failure.
type Slot = RwLock<Option<Arc<OpenDatabase>>>;

/// The embedded store.
pub struct SledStore {
    config: SledConfig,
    database: Arc<Slot>,
    /// In-flight and held keys.
    open_keys: DashMap<String, OpenKey>,
    next_token: AtomicU64,
    clock: Arc<dyn Clock>,
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
        let database = OpenDatabase::open(config)?;
        let open_keys = DashMap::new();
        for (key, held) in database.held_keys(clock.now())? {
            open_keys.insert(key, OpenKey::Held(held));
        }
        Ok(SledStore {
            config: config.clone(),
            database: Arc::new(RwLock::new(Some(Arc::new(database)))),
            open_keys,
            next_token: AtomicU64::new(rand::random()),
            clock,
        })
    }

    /// The open database, or an error while it is being reopened.
    fn database(&self) -> Result<Arc<OpenDatabase>, StoreError> {
        let slot = self.database.read();
        slot.clone()
            .ok_or_else(|| StoreError::Backend("the store is reopening after a failure".into()))
    }

    /// Passes `result` through; a backend failure drops `failed` and starts reopening.
    fn reopen_if_failed<T>(
        &self,
        failed: &Arc<OpenDatabase>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Err(StoreError::Backend(error)) = &result {
            let mut slot = self.database.write();
            if slot
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, failed))
            {
                tracing::error!(%error, "the store failed; reopening it in the background");
                *slot = None;
                reopen_in_background(Arc::downgrade(&self.database), self.config.clone());
            }
        }
        result
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
            Entry::Vacant(vacant) => match database.live_done(&fresh.record_key, now)? {
                Some(done) => Ok(ClaimOutcome::Done(done)),
                None => {
                    vacant.insert(OpenKey::InFlight(fresh.clone()));
                    Ok(claimed())
                }
            },
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
                let now = self.clock.now();
                let done = DoneRecord {
                    claimed_at: lease.claimed_at,
                    completed_at: now,
                    expires_at: now.saturating_add(millis(completion.retention)),
                    upstream_status: completion.upstream_status,
                    fingerprint: lease.fingerprint,
                    response: completion.response.clone(),
                };
                // On failure the lease stays until it ends: duplicates meanwhile get 409.
                database
                    .epochs
                    .put(&lease.record_key, &done, millis(completion.retention))?;
                open.remove();
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
            database.epochs.put(&record_key, &done, millis(retention))?;
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

/// Reopens the data directory until it succeeds, backing off up to 5 s between tries,
/// then puts the new database in `slot`. Gives up when the store is dropped.
fn reopen_in_background(slot: Weak<Slot>, config: SledConfig) {
    let spawned = std::thread::Builder::new()
        .name("sled-reopen".into())
        .spawn(move || {
            let mut backoff = Duration::from_millis(50);
            loop {
                std::thread::sleep(backoff);
                let Some(slot) = slot.upgrade() else {
                    return;
                };
                match OpenDatabase::open(&config) {
                    Ok(database) => {
                        *slot.write() = Some(Arc::new(database));
                        tracing::info!("the store is open again");
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "reopening the store failed; trying again");
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the thread that reopens the store");
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
        let database = self.database()?;
        let claimed = self.claim_on(&database, key, fingerprint, lease);
        self.reopen_if_failed(&database, claimed)
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let database = self.database()?;
        let finished = match self.finish_on(&database, claim, &completion) {
            Ok(()) => database.make_durable().await,
            failed => failed,
        };
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
            Ok(()) => database.make_durable().await,
            failed => failed,
        };
        self.reopen_if_failed(&database, held)
    }

    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError> {
        let database = self.database()?;
        let resolved = match self.resolve_on(&database, key, resolution) {
            Ok(true) => database.make_durable().await.map(|()| true),
            other => other,
        };
        self.reopen_if_failed(&database, resolved)
    }

    /// Done keys are filed by a hash of their key, so only in-flight and held keys are
    /// listed here.
    async fn list(
        &self,
        namespace: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        if state == Some(StateFilter::Done) {
            return Err(StoreError::BadRequest(
                "the embedded store files done keys by a hash of the key, so it cannot list them; look a key up by name instead".into(),
            ));
        }
        let now = self.clock.now();
        let prefix = format!("{namespace}:");
        let mut found: Vec<(String, KeyState)> = self
            .open_keys
            .iter()
            .filter(|open| {
                open.key().starts_with(&prefix)
                    && after.is_none_or(|after| open.key().as_str() > after)
                    && open.value().live(now)
            })
            .map(|open| (open.key().clone(), open.value().state()))
            .filter(|(_, found)| state.is_none_or(|state| state.admits(found)))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(page(found, limit))
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
        let database = self.database()?;
        let done = database.live_done(&database.epochs.record_key(key), now);
        self.reopen_if_failed(&database, done.map(|done| done.map(KeyState::Done)))
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let now = self.clock.now();
        match self
            .open_keys
            .get(key)
            .filter(|open| open.live(now))
            .as_deref()
        {
            Some(OpenKey::InFlight(_)) => return Ok(Forgotten::InFlight),
            Some(OpenKey::Held(_)) => return Ok(Forgotten::Held),
            None => {}
        }
        let database = self.database()?;
        let removed = database
            .epochs
            .remove(&database.epochs.record_key(key), now)
            .map_err(StoreError::from);
        let forgotten = removed.map(|live| {
            if live {
                Forgotten::Removed
            } else {
                Forgotten::Absent
            }
        });
        self.reopen_if_failed(&database, forgotten)
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
            Ok(true) => database.make_durable().await.map(|()| true),
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
        let forgotten = match forgotten {
            Ok(true) => database.make_durable().await.map(|()| true),
            other => other,
        };
        self.reopen_if_failed(&database, forgotten)
    }

    fn done_keys(&self) -> Option<u64> {
        self.database()
            .ok()
            .map(|database| database.epochs.records())
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let database = self.database()?;
        let worker = Arc::clone(&database);
        let flushed = tokio::task::spawn_blocking(move || worker.db.flush())
            .await
            .map_err(|error| StoreError::Backend(error.to_string()))
            .and_then(|flushed| Ok(flushed.map(drop)?));
        self.reopen_if_failed(&database, flushed)
    }
}

/// Makes done marks durable before they are acknowledged, sharing one `Db::flush` among
/// every mark that arrived while the previous flush ran (group commit). It runs on a
/// thread of its own because `flush` blocks, and it never calls `flush_async`, which
/// deadlocks in sled 0.34.7 under concurrent callers.
struct GroupFlusher {
    waiters: mpsc::Sender<oneshot::Sender<Result<(), String>>>,
}

impl GroupFlusher {
    fn start(db: sled::Db) -> GroupFlusher {
        let (waiters, queue) = mpsc::channel::<oneshot::Sender<Result<(), String>>>();
        std::thread::Builder::new()
            .name("sled-flusher".into())
            .spawn(move || {
                // Ends when the store is dropped and the channel closes.
                while let Ok(first) = queue.recv() {
                    let mut batch = vec![first];
                    batch.extend(queue.try_iter());
                    let result = db.flush().map(drop).map_err(|error| error.to_string());
                    for waiter in batch {
                        let _ = waiter.send(result.clone());
                    }
                }
            })
            .expect("spawning the flusher thread");
        GroupFlusher { waiters }
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let (done, flushed) = oneshot::channel();
        self.waiters
            .send(done)
            .map_err(|_| StoreError::Backend("the flusher thread has stopped".into()))?;
        flushed
            .await
            .map_err(|_| StoreError::Backend("the flusher thread has stopped".into()))?
            .map_err(StoreError::Backend)
    }
}
