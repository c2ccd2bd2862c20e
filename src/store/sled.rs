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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
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

/// The embedded store.
pub struct SledStore {
    db: sled::Db,
    claims: sled::Tree,
    deadlines: sled::Tree,
    /// This process's random id, the high half of every owner token it issues.
    boot: u64,
    next_token: AtomicU64,
    clock: Arc<dyn Clock>,
    /// Present with `durability: fsync`.
    flusher: Option<GroupFlusher>,
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
        Ok(SledStore {
            db,
            claims,
            deadlines,
            boot: rand::random(),
            next_token: AtomicU64::new(0),
            clock,
            flusher,
        })
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
}

/// Removes up to `limit` records whose deadline is at or before `now`, reading only the
/// expired part of the index. Blocking.
fn sweep_expired(
    claims: &sled::Tree,
    deadlines: &sled::Tree,
    now: Millis,
    limit: usize,
) -> Result<Swept, StoreError> {
    let upper = now.saturating_add(1).to_be_bytes();
    let mut swept = Swept::default();
    for entry in deadlines.range(..upper.as_slice()).keys().take(limit) {
        let index = entry.map_err(backend)?;
        swept.examined += 1;
        let (deadline, key) = index.split_at(8);
        let deadline = Millis::from_be_bytes(deadline.try_into().expect("8 bytes"));
        if let Some(bytes) = claims.get(key).map_err(backend)? {
            // An entry whose record has moved on (a new claim, a finish) is only dropped.
            let expired = decode(key, &bytes).is_none_or(|record| record.deadline() == deadline);
            if expired
                && claims
                    .compare_and_swap(key, Some(&bytes), None::<&[u8]>)
                    .map_err(backend)?
                    .is_ok()
            {
                swept.removed += 1;
            }
        }
        deadlines.remove(&index).map_err(backend)?;
    }
    Ok(swept)
}

#[async_trait]
impl ClaimStore for SledStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let key_bytes = key.as_bytes();
        loop {
            let now = self.clock.now();
            let current = self.read(key_bytes)?;
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
            if self.swap(key_bytes, current_ref, Some(&record))? {
                return Ok(ClaimOutcome::Claimed(Claim {
                    key: key.to_owned(),
                    token,
                    took_over: matches!(found, Some(Record::InFlight { .. })),
                }));
            }
            // Another claim changed the record between our read and our swap: look again.
        }
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        loop {
            let (bytes, record) = self.owned(claim)?;
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
            if self.swap(
                claim.key.as_bytes(),
                Some((&bytes, Some(&record))),
                Some(&done),
            )? {
                break;
            }
        }
        match &self.flusher {
            Some(flusher) => flusher.flush().await,
            None => Ok(()),
        }
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        loop {
            let (bytes, record) = self.owned(claim)?;
            if self.swap(claim.key.as_bytes(), Some((&bytes, Some(&record))), None)? {
                return Ok(());
            }
        }
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        let now = self.clock.now();
        let state = match self.read(key.as_bytes())? {
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

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let key_bytes = key.as_bytes();
        loop {
            let now = self.clock.now();
            let Some((bytes, record)) = self.read(key_bytes)? else {
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
            if self.swap(key_bytes, Some((&bytes, record.as_ref())), None)? {
                return Ok(outcome);
            }
        }
    }

    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        let (claims, deadlines) = (self.claims.clone(), self.deadlines.clone());
        let now = self.clock.now();
        tokio::task::spawn_blocking(move || sweep_expired(&claims, &deadlines, now, limit))
            .await
            .map_err(|error| StoreError::Backend(error.to_string()))?
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|error| StoreError::Backend(error.to_string()))?
            .map(drop)
            .map_err(backend)
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
