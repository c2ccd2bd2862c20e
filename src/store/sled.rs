//! The embedded claim store on sled: one tree of claim records and one expiry index.
//!
//! - `claims`: store key → postcard-encoded [`Record`]. Every transition is a
//!   compare-and-swap against the bytes just read, so concurrent claims of one key give
//!   exactly one owner, and an owner whose record changed (taken over, forgotten) gets
//!   [`StoreError::NotOwner`] instead of overwriting.
//! - `deadlines`: big-endian deadline ‖ store key → nothing. A record is indexed at its
//!   lease end while in flight and at its expiry once done, so the sweeper reads only
//!   what has expired, never the whole store. An index entry is written before the record
//!   it points to; a stale entry (its record changed since) is just dropped by the sweep.
//! - Owner tokens start with this process's random boot id. A record in flight under
//!   another boot id was left by an earlier process on this data directory: nobody else
//!   can own it (sled locks the directory), so it reads as released from the moment the
//!   store opens, without a start-up scan.
//! - `durability: fsync` makes each done mark durable before `finish` returns, through
//!   [`GroupFlusher`]; `batched` leaves it to sled's background flush every `flush_every`.
//! - sled keeps the first I/O error (a full disk, say) and fails every later operation,
//!   even once the disk has room again. So any failure drops the open database, and a
//!   background thread reopens the directory until it succeeds; meanwhile operations fail
//!   fast and the proxy follows `on_store_error`. Once the cause is gone, the store comes
//!   back by itself, with the same boot id, so this process's open claims stay its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{
    Claim, ClaimOutcome, ClaimStore, Clock, Completion, DoneRecord, Fingerprint, Forgotten,
    KeyState, Millis, StoreError, Swept, SystemClock, millis,
};
use crate::config::{Durability, SledConfig};

/// What `claims` holds for a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Record {
    InFlight {
        owner: u128,
        claimed_at: Millis,
        lease_until: Millis,
        fingerprint: Fingerprint,
    },
    Done(DoneRecord),
}

impl Record {
    /// When the record may be swept: its lease end or its expiry.
    fn deadline(&self) -> Millis {
        match self {
            Record::InFlight { lease_until, .. } => *lease_until,
            Record::Done(done) => done.expires_at,
        }
    }
}

fn encode(record: &Record) -> Vec<u8> {
    postcard::to_stdvec(record).expect("a record always serializes")
}

/// Decodes a record; an undecodable one is treated as absent (and logged) rather than
/// blocking its key forever, since refusing the key would lose the event.
fn decode(key: &[u8], bytes: &[u8]) -> Option<Record> {
    match postcard::from_bytes(bytes) {
        Ok(record) => Some(record),
        Err(error) => {
            tracing::warn!(key = %String::from_utf8_lossy(key), %error, "unreadable claim record, treating it as absent");
            None
        }
    }
}

fn deadline_key(deadline: Millis, key: &[u8]) -> Vec<u8> {
    let mut index = Vec::with_capacity(8 + key.len());
    index.extend_from_slice(&deadline.to_be_bytes());
    index.extend_from_slice(key);
    index
}

fn backend(error: sled::Error) -> StoreError {
    StoreError::Backend(error.to_string())
}

/// An open database: the trees and, with `fsync`, the flusher.
struct Handle {
    db: sled::Db,
    claims: sled::Tree,
    deadlines: sled::Tree,
    flusher: Option<GroupFlusher>,
}

impl Handle {
    /// Opens (or creates) the database at `config.path`. Blocks on disk I/O.
    fn open(config: &SledConfig) -> Result<Handle, StoreError> {
        let path = config.path.display();
        let db = sled::Config::new()
            .path(&config.path)
            .cache_capacity(config.cache.0)
            .flush_every_ms(Some(millis(config.flush_every.0).max(1)))
            .open()
            .map_err(|error| match error.to_string() {
                text if text.contains("could not acquire lock") => StoreError::Backend(format!(
                    "data directory {path} is in use by another process (is another dedupe-proxy running on it?): {text}"
                )),
                text => StoreError::Backend(format!("cannot open data directory {path}: {text}")),
            })?;
        let claims = db.open_tree("claims").map_err(backend)?;
        let deadlines = db.open_tree("deadlines").map_err(backend)?;
        let flusher =
            (config.durability == Durability::Fsync).then(|| GroupFlusher::start(db.clone()));
        Ok(Handle {
            db,
            claims,
            deadlines,
            flusher,
        })
    }

    /// Reads a key's record with the bytes it was decoded from, for a compare-and-swap.
    fn read(&self, key: &[u8]) -> Result<Option<(sled::IVec, Option<Record>)>, StoreError> {
        let current = self.claims.get(key).map_err(backend)?;
        Ok(current.map(|bytes| {
            let record = decode(key, &bytes);
            (bytes, record)
        }))
    }

    /// Replaces the record read as `current` with `new`, keeping the index in step:
    /// `new`'s deadline is indexed before the swap and `current`'s dropped after it.
    /// Returns false when the record changed since it was read; the index entry written
    /// for `new` is then left for the sweep to drop.
    fn swap(
        &self,
        key: &[u8],
        current: Option<(&sled::IVec, Option<&Record>)>,
        new: Option<&Record>,
    ) -> Result<bool, StoreError> {
        let new_index = new.map(|record| deadline_key(record.deadline(), key));
        if let Some(index) = &new_index {
            self.deadlines.insert(index, &[]).map_err(backend)?;
        }
        let swapped = self
            .claims
            .compare_and_swap(key, current.map(|(bytes, _)| bytes), new.map(encode))
            .map_err(backend)?
            .is_ok();
        if swapped {
            let old_index = current
                .and_then(|(_, record)| record)
                .map(|record| deadline_key(record.deadline(), key));
            if let Some(old_index) = old_index.filter(|old| Some(old) != new_index.as_ref()) {
                self.deadlines.remove(old_index).map_err(backend)?;
            }
        }
        Ok(swapped)
    }

    /// Reads the record that `claim` owns, or fails with `NotOwner`.
    fn owned(&self, claim: &Claim) -> Result<(sled::IVec, Record), StoreError> {
        match self.read(claim.key.as_bytes())? {
            Some((bytes, Some(record @ Record::InFlight { owner, .. })))
                if owner == claim.token =>
            {
                Ok((bytes, record))
            }
            _ => Err(StoreError::NotOwner),
        }
    }

    /// Removes up to `limit` records whose deadline is at or before `now`, reading only
    /// the expired part of the index. Blocking.
    fn sweep_expired(&self, now: Millis, limit: usize) -> Result<Swept, StoreError> {
        let upper = now.saturating_add(1).to_be_bytes();
        let mut swept = Swept::default();
        for entry in self.deadlines.range(..upper.as_slice()).keys().take(limit) {
            let index = entry.map_err(backend)?;
            swept.examined += 1;
            let (deadline, key) = index.split_at(8);
            let deadline = Millis::from_be_bytes(deadline.try_into().expect("8 bytes"));
            if let Some(bytes) = self.claims.get(key).map_err(backend)? {
                // An entry whose record has moved on (a new claim, a finish) is only dropped.
                let expired =
                    decode(key, &bytes).is_none_or(|record| record.deadline() == deadline);
                if expired
                    && self
                        .claims
                        .compare_and_swap(key, Some(&bytes), None::<&[u8]>)
                        .map_err(backend)?
                        .is_ok()
                {
                    swept.removed += 1;
                }
            }
            self.deadlines.remove(&index).map_err(backend)?;
        }
        Ok(swept)
    }
}

/// The open database, or none while it is being reopened after a failure.
type Slot = RwLock<Option<Arc<Handle>>>;

/// The embedded store.
pub struct SledStore {
    config: SledConfig,
    handle: Arc<Slot>,
    /// This process's random id, the high half of every owner token it issues.
    boot: u64,
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
        let handle = Handle::open(config)?;
        Ok(SledStore {
            config: config.clone(),
            handle: Arc::new(RwLock::new(Some(Arc::new(handle)))),
            boot: rand::random(),
            next_token: AtomicU64::new(0),
            clock,
        })
    }

    /// The open database, or an error while it is being reopened.
    fn handle(&self) -> Result<Arc<Handle>, StoreError> {
        let slot = self
            .handle
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.clone()
            .ok_or_else(|| StoreError::Backend("the store is reopening after a failure".into()))
    }

    /// Passes `result` through; a backend failure drops `failed` and starts reopening.
    fn checked<T>(
        &self,
        failed: &Arc<Handle>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Err(StoreError::Backend(error)) = &result {
            let mut slot = self
                .handle
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if slot
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, failed))
            {
                tracing::error!(%error, "the store failed; reopening it in the background");
                *slot = None;
                reopen_in_background(Arc::downgrade(&self.handle), self.config.clone());
            }
        }
        result
    }

    fn new_token(&self) -> u128 {
        let sequence = self.next_token.fetch_add(1, Ordering::Relaxed);
        (u128::from(self.boot) << 64) | u128::from(sequence)
    }

    /// Whether an in-flight record still holds its key: owned by this process (an earlier
    /// process's claims are released) and within its lease.
    fn holds(&self, owner: u128, lease_until: Millis, now: Millis) -> bool {
        (owner >> 64) as u64 == self.boot && lease_until > now
    }

    fn claim_on(
        &self,
        handle: &Handle,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let key_bytes = key.as_bytes();
        loop {
            let now = self.clock.now();
            let current = handle.read(key_bytes)?;
            let found = current.as_ref().and_then(|(_, record)| record.as_ref());
            match found {
                Some(Record::Done(done)) if done.expires_at > now => {
                    return Ok(ClaimOutcome::Done(done.clone()));
                }
                Some(Record::InFlight {
                    owner, lease_until, ..
                }) if self.holds(*owner, *lease_until, now) => {
                    return Ok(ClaimOutcome::InFlight {
                        lease_until: *lease_until,
                    });
                }
                _ => {}
            }
            let token = self.new_token();
            let record = Record::InFlight {
                owner: token,
                claimed_at: now,
                lease_until: now.saturating_add(millis(lease)),
                fingerprint,
            };
            let current_ref = current
                .as_ref()
                .map(|(bytes, record)| (bytes, record.as_ref()));
            if handle.swap(key_bytes, current_ref, Some(&record))? {
                return Ok(ClaimOutcome::Claimed(Claim {
                    key: key.to_owned(),
                    token,
                    took_over: matches!(found, Some(Record::InFlight { .. })),
                }));
            }
            // Another claim changed the record between our read and our swap: look again.
        }
    }

    fn finish_on(
        &self,
        handle: &Handle,
        claim: &Claim,
        completion: &Completion,
    ) -> Result<(), StoreError> {
        loop {
            let (bytes, record) = handle.owned(claim)?;
            let Record::InFlight {
                claimed_at,
                fingerprint,
                ..
            } = record
            else {
                unreachable!("owned() returns in-flight records");
            };
            let now = self.clock.now();
            let done = Record::Done(DoneRecord {
                claimed_at,
                completed_at: now,
                expires_at: now.saturating_add(millis(completion.retention)),
                upstream_status: completion.upstream_status,
                fingerprint,
                response: completion.response.clone(),
            });
            if handle.swap(
                claim.key.as_bytes(),
                Some((&bytes, Some(&record))),
                Some(&done),
            )? {
                return Ok(());
            }
        }
    }

    fn release_on(&self, handle: &Handle, claim: &Claim) -> Result<(), StoreError> {
        loop {
            let (bytes, record) = handle.owned(claim)?;
            if handle.swap(claim.key.as_bytes(), Some((&bytes, Some(&record))), None)? {
                return Ok(());
            }
        }
    }

    fn inspect_on(&self, handle: &Handle, key: &str) -> Result<Option<KeyState>, StoreError> {
        let now = self.clock.now();
        let state = match handle.read(key.as_bytes())? {
            Some((_, Some(Record::Done(done)))) if done.expires_at > now => {
                Some(KeyState::Done(done))
            }
            Some((
                _,
                Some(Record::InFlight {
                    owner,
                    claimed_at,
                    lease_until,
                    fingerprint,
                }),
            )) if self.holds(owner, lease_until, now) => Some(KeyState::InFlight {
                claimed_at,
                lease_until,
                fingerprint,
            }),
            _ => None,
        };
        Ok(state)
    }

    fn forget_on(&self, handle: &Handle, key: &str) -> Result<Forgotten, StoreError> {
        let key_bytes = key.as_bytes();
        loop {
            let now = self.clock.now();
            let Some((bytes, record)) = handle.read(key_bytes)? else {
                return Ok(Forgotten::Absent);
            };
            let outcome = match &record {
                Some(Record::InFlight {
                    owner, lease_until, ..
                }) if self.holds(*owner, *lease_until, now) => {
                    return Ok(Forgotten::InFlight);
                }
                Some(Record::Done(done)) if done.expires_at > now => Forgotten::Removed,
                _ => Forgotten::Absent,
            };
            if handle.swap(key_bytes, Some((&bytes, record.as_ref())), None)? {
                return Ok(outcome);
            }
        }
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
                match Handle::open(&config) {
                    Ok(handle) => {
                        *slot
                            .write()
                            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                            Some(Arc::new(handle));
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
        let handle = self.handle()?;
        let claimed = self.claim_on(&handle, key, fingerprint, lease);
        self.checked(&handle, claimed)
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let handle = self.handle()?;
        let finished = self.finish_on(&handle, claim, &completion);
        let finished = match (&finished, &handle.flusher) {
            (Ok(()), Some(flusher)) => flusher.flush().await,
            _ => finished,
        };
        self.checked(&handle, finished)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let handle = self.handle()?;
        let released = self.release_on(&handle, claim);
        self.checked(&handle, released)
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        let handle = self.handle()?;
        let state = self.inspect_on(&handle, key);
        self.checked(&handle, state)
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let handle = self.handle()?;
        let forgotten = self.forget_on(&handle, key);
        self.checked(&handle, forgotten)
    }

    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        let handle = self.handle()?;
        let now = self.clock.now();
        let worker = Arc::clone(&handle);
        let swept = tokio::task::spawn_blocking(move || worker.sweep_expired(now, limit))
            .await
            .map_err(|error| StoreError::Backend(error.to_string()))
            .and_then(|swept| swept);
        self.checked(&handle, swept)
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let handle = self.handle()?;
        let worker = Arc::clone(&handle);
        let flushed = tokio::task::spawn_blocking(move || worker.db.flush())
            .await
            .map_err(|error| StoreError::Backend(error.to_string()))
            .and_then(|flushed| flushed.map(drop).map_err(backend));
        self.checked(&handle, flushed)
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
