//! The delivery log on sled: the tree `delivery_log`, one value per batch the recorder
//! writes (a **chunk**), under a number from sled's `generate_id` (big-endian, so the
//! tree's order is the order written). One insert per batch, not per entry: a sled write
//! costs about as much as a tenth of a delivery here.
//!
//! A chunk is its header (the encoding's version, how many entries, the newest entry's
//! time) and then the entries, each its length and its encoding. An entry's [`LogId`] is
//! its chunk's number and its place in the chunk. Trimming removes whole chunks, oldest
//! first: those whose newest entry is older than the retention, then those whose every
//! entry is beyond the newest `keep`; and at once, whenever a write takes the tree past
//! [`MOST_BYTES`].

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::database::{Database, OpenDatabase};
use crate::store::log::{DeliveryLog, LogId, LoggedDelivery};
use crate::store::{Millis, StoreError};

const CHUNK_VERSION: u8 = 1;
const HEADER: usize = 1 + 4 + 8;

/// The most bytes of chunks the tree keeps: the oldest go beyond it, whatever the
/// retention and count. A tree node larger than a quarter of sled's segment is written
/// apart as a blob, which sled's cache counts as a pointer's size, so the log's chunks
/// (bodies included) stay in memory: this bounds that memory.
const MOST_BYTES: u64 = 64 << 20;

/// The sled store's log.
pub(super) struct SledLog {
    database: Database,
    /// What the tree holds, counted from the chunks the first time it is needed.
    totals: Mutex<Option<Totals>>,
}

/// The entries the tree holds and the bytes of its chunks.
#[derive(Clone, Copy, Default)]
struct Totals {
    entries: u64,
    bytes: u64,
}

impl Totals {
    fn add(&mut self, chunk: &[u8]) {
        self.entries += Header::read(chunk).map_or(0, |header| u64::from(header.entries));
        self.bytes += chunk.len() as u64;
    }

    fn remove(&mut self, chunk: &[u8]) {
        let entries = Header::read(chunk).map_or(0, |header| u64::from(header.entries));
        self.entries = self.entries.saturating_sub(entries);
        self.bytes = self.bytes.saturating_sub(chunk.len() as u64);
    }
}

impl SledLog {
    pub(super) fn new(database: Database) -> SledLog {
        SledLog {
            database,
            totals: Mutex::new(None),
        }
    }

    fn open(&self) -> Result<Arc<OpenDatabase>, StoreError> {
        self.database.open()
    }

    /// Passes `result` through, reopening the database after a backend failure.
    fn checked<T>(
        &self,
        database: &Arc<OpenDatabase>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.database.reopen_if_failed(database, result)
    }

    /// The tree's totals, counted on first use; `change` applied to them and kept.
    fn totals<T>(
        &self,
        tree: &sled::Tree,
        change: impl FnOnce(&mut Totals) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut kept = self.totals.lock();
        let mut totals = match *kept {
            Some(totals) => totals,
            None => {
                let mut totals = Totals::default();
                for chunk in tree.iter().values() {
                    totals.add(&chunk?);
                }
                totals
            }
        };
        let changed = change(&mut totals);
        // After a failure they are counted again.
        *kept = changed.is_ok().then_some(totals);
        changed
    }
}

/// A chunk's header.
struct Header {
    entries: u32,
    newest_at: Millis,
}

impl Header {
    fn read(chunk: &[u8]) -> Option<Header> {
        if chunk.len() < HEADER || chunk[0] != CHUNK_VERSION {
            return None;
        }
        Some(Header {
            entries: u32::from_le_bytes(chunk[1..5].try_into().ok()?),
            newest_at: u64::from_le_bytes(chunk[5..13].try_into().ok()?),
        })
    }
}

fn encode_chunk(entries: &[LoggedDelivery]) -> Vec<u8> {
    let newest_at = entries.iter().map(|entry| entry.at).max().unwrap_or(0);
    // About 200 bytes an entry without a body: one allocation for most chunks.
    let bodies: usize = entries
        .iter()
        .filter_map(|entry| entry.body.as_ref())
        .map(|body| body.len())
        .sum();
    let mut chunk = Vec::with_capacity(HEADER + entries.len() * 256 + bodies);
    chunk.push(CHUNK_VERSION);
    chunk.extend((entries.len() as u32).to_le_bytes());
    chunk.extend(newest_at.to_le_bytes());
    for entry in entries {
        // The length goes before the entry, once the entry is written after it.
        let at = chunk.len();
        chunk.extend([0; 4]);
        chunk = entry.encode_into(chunk);
        let length = (chunk.len() - at - 4) as u32;
        chunk[at..at + 4].copy_from_slice(&length.to_le_bytes());
    }
    chunk
}

/// A chunk's entries, each with its place; one that does not read is `None`.
fn decode_chunk(chunk: &[u8]) -> Vec<Option<LoggedDelivery>> {
    let Some(header) = Header::read(chunk) else {
        return Vec::new();
    };
    let mut rest = &chunk[HEADER..];
    let mut entries = Vec::with_capacity(header.entries as usize);
    while rest.len() >= 4 {
        let length = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(encoded) = rest.get(4..4 + length) else {
            break;
        };
        entries.push(LoggedDelivery::decode(encoded));
        rest = &rest[4 + length..];
    }
    entries
}

fn chunk_number(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

#[async_trait]
impl DeliveryLog for SledLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let database = self.open()?;
        let written = self.totals(&database.log, |totals| {
            let number = database.db.generate_id()?;
            let chunk = encode_chunk(entries);
            totals.add(&chunk);
            database.log.insert(number.to_be_bytes(), chunk)?;
            // The oldest chunks go as soon as the log holds too many bytes: a trim every
            // few seconds would let a burst of large bodies past the bound meanwhile.
            while totals.bytes > MOST_BYTES {
                let Some((_, oldest)) = database.log.pop_min()? else {
                    break;
                };
                totals.remove(&oldest);
            }
            Ok((0..entries.len() as u64)
                .map(|place| LogId(number, place))
                .collect())
        });
        self.checked(&database, written)
    }

    async fn read(
        &self,
        before: Option<LogId>,
        limit: usize,
    ) -> Result<Vec<(LogId, LoggedDelivery)>, StoreError> {
        let database = self.open()?;
        let end = before.map_or(u64::MAX, |id| id.0);
        let read = (|| {
            let mut found = Vec::new();
            for chunk in database.log.range(..=end.to_be_bytes()).rev() {
                let (key, chunk) = chunk?;
                let Some(number) = chunk_number(&key) else {
                    continue;
                };
                let entries = decode_chunk(&chunk);
                for (place, entry) in entries.into_iter().enumerate().rev() {
                    let id = LogId(number, place as u64);
                    if before.is_some_and(|before| id >= before) {
                        continue;
                    }
                    if let Some(entry) = entry {
                        found.push((id, entry));
                        if found.len() == limit {
                            return Ok(found);
                        }
                    }
                }
            }
            Ok(found)
        })();
        self.checked(&database, read)
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let database = self.open()?;
        let chunk = database
            .log
            .get(id.0.to_be_bytes())
            .map_err(StoreError::from);
        let chunk = self.checked(&database, chunk)?;
        Ok(chunk.and_then(|chunk| {
            usize::try_from(id.1)
                .ok()
                .and_then(|place| decode_chunk(&chunk).into_iter().nth(place).flatten())
        }))
    }

    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError> {
        let database = self.open()?;
        let trimmed = self.totals(&database.log, |totals| {
            let mut removed = 0;
            for chunk in database.log.iter() {
                let (key, chunk) = chunk?;
                let header = Header::read(&chunk);
                let (entries, newest_at) = header.map_or((0, 0), |header| {
                    (u64::from(header.entries), header.newest_at)
                });
                // A chunk goes when it has aged, or when every entry of it is beyond the
                // newest `keep`.
                if newest_at >= older_than && totals.entries.saturating_sub(entries) < keep {
                    break;
                }
                database.log.remove(key)?;
                totals.remove(&chunk);
                removed += entries;
            }
            Ok(removed)
        });
        self.checked(&database, trimmed)
    }
}
