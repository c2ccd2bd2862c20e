//! One expiry window's tree: where its records go in it, and the index that finds them.
//!
//! A tree this version creates files its records in **chunks**, in the order they were
//! written: record number `n` of the window goes into the chunk numbered
//! `n / RECORDS_PER_CHUNK`, a sled value under that number (4 bytes, big-endian). So a
//! write lands on the chunk written just before, which sled's cache holds, instead of
//! pulling a page that a hash chose back from disk; and the index says which chunk holds
//! a key. A chunk's entries carry their whole record key ([`Bucket`] with no prefix).
//!
//! A tree an earlier version created files its records **by key**, in buckets named by
//! the record key's first bytes; it is read, written and swept as before until its
//! window ends, and its index (chunk 0 for every key) only spares reading a bucket that
//! cannot hold the key.
//!
//! A record larger than [`INLINE_LIMIT`] (one keeping a replayed answer) is stored apart,
//! with an empty entry in its chunk or bucket, so that writing its neighbours does not
//! rewrite it: under its chunk's number and its record key (next to its chunk), or under
//! its record key in a tree by key.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::bucket::{Bucket, Entry};
use super::index::Index;
use super::record::{RECORD_KEY_LEN, RecordKey, decode, decode_named};
use super::window::{Layout, Window};
use crate::store::DoneRecord;

/// How many records share a chunk: small enough that rewriting one copies little, large
/// enough that sled keeps few pages for them.
const RECORDS_PER_CHUNK: u64 = 8;

/// The largest encoded record kept inside its chunk or bucket (a record without a
/// replayed answer takes about 44 bytes and its store key).
const INLINE_LIMIT: usize = 256;

/// The sled key of a value holding records' entries: a chunk's number, or a bucket's
/// leading record-key bytes.
#[derive(Clone, Copy)]
pub(super) struct ValueKey {
    bytes: [u8; RECORD_KEY_LEN],
    len: usize,
}

impl ValueKey {
    pub(super) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// One window's tree, its index and how many records it holds.
pub(super) struct Epoch {
    pub(super) window: Window,
    pub(super) layout: Layout,
    pub(super) tree: sled::Tree,
    index: Index,
    records: AtomicI64,
    /// The number of the next record written, in a tree of chunks.
    next_record: AtomicU64,
    /// Set once the records the tree held at start-up are in the index and the count.
    indexed: AtomicBool,
    /// Held while they are read in: a second reader waits for the first.
    indexing: Mutex<()>,
}

impl Epoch {
    /// A new tree (always of chunks).
    pub(super) fn new(window: Window, tree: sled::Tree) -> Epoch {
        Epoch {
            window,
            layout: Layout::Chunks,
            tree,
            index: Index::new(),
            records: AtomicI64::new(0),
            next_record: AtomicU64::new(0),
            indexed: AtomicBool::new(true),
            indexing: Mutex::new(()),
        }
    }

    /// A tree that already holds records: its index and count come from
    /// [`Epoch::ensure_indexed`]. Records written from now on start a chunk of their own.
    pub(super) fn existing(
        window: Window,
        layout: Layout,
        tree: sled::Tree,
    ) -> sled::Result<Epoch> {
        // A record stored apart starts with its chunk's number too.
        let last_chunk = match tree.last()? {
            Some((sled_key, _)) if layout == Layout::Chunks => sled_key.get(..4).map(chunk_number),
            _ => None,
        };
        let next_chunk = last_chunk.map_or(0, |chunk| u64::from(chunk) + 1);
        Ok(Epoch {
            layout,
            next_record: AtomicU64::new(next_chunk * RECORDS_PER_CHUNK),
            indexed: AtomicBool::new(false),
            ..Epoch::new(window, tree)
        })
    }

    pub(super) fn tree_name(&self) -> String {
        self.window.tree_name(self.layout)
    }

    /// How many records it holds, expired ones not yet swept included.
    pub(super) fn records(&self) -> i64 {
        self.records.load(Ordering::Relaxed)
    }

    /// The sled key of the value holding `key`'s entry: the chunk numbered `chunk`, or
    /// the bucket `key`'s first bytes name (in a tree by key, where `chunk` is 0).
    pub(super) fn value_key(&self, key: &RecordKey, chunk: u32) -> ValueKey {
        let mut bytes = [0; RECORD_KEY_LEN];
        let len = match self.layout {
            Layout::Chunks => {
                bytes[..4].copy_from_slice(&chunk.to_be_bytes());
                4
            }
            Layout::ByKey { bucket_bytes } => {
                bytes[..bucket_bytes].copy_from_slice(&key[..bucket_bytes]);
                bucket_bytes
            }
        };
        ValueKey { bytes, len }
    }

    /// The chunk the value at `sled_key` is (0 in a tree by key).
    pub(super) fn chunk_of(&self, sled_key: &[u8]) -> u32 {
        match self.layout {
            Layout::Chunks => chunk_number(sled_key),
            Layout::ByKey { .. } => 0,
        }
    }

    /// Whether a sled key of the tree names a value holding entries (rather than a
    /// record stored apart).
    pub(super) fn holds_entries(&self, sled_key: &[u8]) -> bool {
        match self.layout {
            Layout::Chunks => sled_key.len() == 4,
            Layout::ByKey { bucket_bytes } => sled_key.len() == bucket_bytes,
        }
    }

    /// The sled key of `key`'s record stored apart, for the value at `value_key`.
    fn apart_key(&self, value_key: &[u8], key: &RecordKey) -> Vec<u8> {
        match self.layout {
            Layout::Chunks => [value_key, key].concat(),
            Layout::ByKey { .. } => key.to_vec(),
        }
    }

    /// The entries of a value of the tree.
    pub(super) fn entries_in<'a>(&self, value: &'a [u8]) -> Bucket<'a> {
        let prefix = match self.layout {
            Layout::Chunks => 0,
            Layout::ByKey { bucket_bytes } => bucket_bytes,
        };
        Bucket::new(value, prefix)
    }

    /// The whole record key of an entry, from its value's sled key and the rest.
    pub(super) fn record_key(&self, value_key: &[u8], rest: &[u8]) -> RecordKey {
        let mut key: RecordKey = [0; RECORD_KEY_LEN];
        let prefix = RECORD_KEY_LEN - rest.len();
        key[..prefix].copy_from_slice(&value_key[..prefix]);
        key[prefix..].copy_from_slice(rest);
        key
    }

    /// The chunks that may hold `key`, newest first (after a crash between a rewrite and
    /// the removal of the copy before it, the newer copy is the one to read). A tree by
    /// key not read in yet may hold any key, in its bucket.
    pub(super) fn chunks_of(&self, key: &RecordKey) -> sled::Result<Vec<u32>> {
        if self.layout == Layout::Chunks {
            self.ensure_indexed()?;
        } else if !self.is_indexed() {
            return Ok(vec![0]);
        }
        let mut chunks = self.index.chunks(key);
        chunks.sort_unstable_by(|a, b| b.cmp(a));
        Ok(chunks)
    }

    /// The record of `key`, expired or not.
    pub(super) fn read(&self, key: &RecordKey) -> sled::Result<Option<DoneRecord>> {
        let chunks = self.chunks_of(key)?;
        if chunks.is_empty() {
            return Ok(None);
        }
        if let Some(found) = self.read_in(key, &chunks)? {
            return Ok(Some(found));
        }
        // Noted and not found: a rewrite notes the newer chunk, writes the record there,
        // then removes the older copy, so one that came between the reads left its record
        // in a chunk read too early. A second look finds it.
        self.read_in(key, &self.chunks_of(key)?)
    }

    fn read_in(&self, key: &RecordKey, chunks: &[u32]) -> sled::Result<Option<DoneRecord>> {
        for &chunk in chunks {
            let value_key = self.value_key(key, chunk);
            let Some(value) = self.tree.get(value_key.as_slice())? else {
                continue;
            };
            match self.entries_in(&value).find(key) {
                None => continue,
                Some(Entry::StoredApart) => {
                    let apart = self.tree.get(self.apart_key(value_key.as_slice(), key))?;
                    return Ok(apart.and_then(|bytes| decode(key, &bytes, self.window)));
                }
                Some(Entry::Inline(record)) => return Ok(decode(key, record, self.window)),
            }
        }
        Ok(None)
    }

    /// Writes the encoded record of `key`, then removes any copy of it elsewhere in the
    /// tree.
    pub(super) fn write(&self, key: &RecordKey, record: &[u8]) -> sled::Result<()> {
        let before = self.chunks_of(key)?;
        let chunk = match self.layout {
            Layout::Chunks => {
                let number = self.next_record.fetch_add(1, Ordering::Relaxed) / RECORDS_PER_CHUNK;
                // 34 billion records in one window: refused rather than piled into one
                // value that every write would rewrite.
                u32::try_from(number).map_err(|_| {
                    sled::Error::Unsupported("a window holds too many done records".into())
                })?
            }
            Layout::ByKey { .. } => 0,
        };
        // First: a key in the index and not in the tree is harmless.
        self.index.insert(key, chunk);
        let value_key = self.value_key(key, chunk);
        let apart = record.len() > INLINE_LIMIT;
        if apart {
            // First, so that whoever finds the entry finds the record.
            self.tree
                .insert(self.apart_key(value_key.as_slice(), key), record)?;
        }
        let entry = if apart {
            Entry::StoredApart
        } else {
            Entry::Inline(record)
        };
        let previous = self.tree.fetch_and_update(value_key.as_slice(), |value| {
            Some(self.entries_in(value.unwrap_or_default()).with(key, entry))
        })?;
        let previous = (previous.as_deref()).and_then(|value| self.entries_in(value).find(key));
        if previous == Some(Entry::StoredApart) && !apart {
            self.tree
                .remove(self.apart_key(value_key.as_slice(), key))?;
        }
        // One record more, less each copy it replaces (more than one after a crash).
        let mut copies = i64::from(previous.is_some());
        for elsewhere in before.into_iter().filter(|before| *before != chunk) {
            copies += i64::from(self.delete_in(key, elsewhere)?.is_some());
        }
        self.records.fetch_add(1 - copies, Ordering::Relaxed);
        Ok(())
    }

    /// Deletes the record of `key`, returning what it held.
    pub(super) fn delete(&self, key: &RecordKey) -> sled::Result<Option<sled::IVec>> {
        let mut deleted = None;
        for chunk in self.chunks_of(key)? {
            if let Some(here) = self.delete_in(key, chunk)? {
                self.records.fetch_sub(1, Ordering::Relaxed);
                deleted = deleted.or(Some(here));
            }
        }
        Ok(deleted)
    }

    /// Deletes `key`'s entry from the value of `chunk`, if it holds one. Its index entry
    /// goes unless another key of that value shares it (its first 8 bytes).
    fn delete_in(&self, key: &RecordKey, chunk: u32) -> sled::Result<Option<sled::IVec>> {
        let value_key = self.value_key(key, chunk);
        let Some(value) = self.tree.get(value_key.as_slice())? else {
            return Ok(None);
        };
        if self.entries_in(&value).find(key).is_none() {
            return Ok(None);
        }
        let before = self.tree.fetch_and_update(value_key.as_slice(), |value| {
            let rest = self.entries_in(value.unwrap_or_default()).without(key);
            (!rest.is_empty()).then_some(rest)
        })?;
        let Some(before) = before else {
            return Ok(None);
        };
        let shares_index_entry = (self.entries_in(&before).entries()).any(|(rest, _)| {
            let other = self.record_key(value_key.as_slice(), rest);
            other != *key && other[..8] == key[..8]
        });
        if !shares_index_entry {
            self.index.remove(key, chunk);
        }
        match self.entries_in(&before).find(key) {
            None => Ok(None),
            Some(Entry::StoredApart) => self.tree.remove(self.apart_key(value_key.as_slice(), key)),
            Some(Entry::Inline(record)) => Ok(Some(record.into())),
        }
    }

    /// Whether the records the tree held at start-up are read in.
    pub(super) fn is_indexed(&self) -> bool {
        self.indexed.load(Ordering::Acquire)
    }

    /// Reads every record of the tree into the index and the count, once. A second
    /// caller waits for the first; after a failure, the next caller tries again.
    pub(super) fn ensure_indexed(&self) -> sled::Result<()> {
        if self.is_indexed() {
            return Ok(());
        }
        let _one_at_a_time = self.indexing.lock();
        if self.is_indexed() {
            return Ok(());
        }
        let mut count = 0i64;
        for item in self.tree.iter() {
            let (sled_key, value) = item?;
            if !self.holds_entries(&sled_key) {
                continue;
            }
            let chunk = self.chunk_of(&sled_key);
            for (rest, _) in self.entries_in(&value).entries() {
                self.index.insert(&self.record_key(&sled_key, rest), chunk);
                count += 1;
            }
        }
        // In a tree by key, records written while this ran may be counted twice: the
        // count feeds a metric, and it is exact again once the window is gone. (A tree of
        // chunks is read in before it is written.)
        self.records.fetch_add(count, Ordering::Relaxed);
        self.indexed.store(true, Ordering::Release);
        Ok(())
    }

    /// Removes about `limit` records from the start of the tree, a whole value at a time
    /// (so up to a value's records more). Returns how many it removed and whether the
    /// tree is now empty.
    pub(super) fn empty(&self, limit: usize) -> sled::Result<(usize, bool)> {
        let mut removed = 0;
        for sled_key in self.tree.iter().keys() {
            if removed >= limit {
                return Ok((removed, false));
            }
            let sled_key = sled_key?;
            let value = self.tree.remove(&sled_key)?;
            // A record stored apart is counted with its entry.
            if let Some(value) = value.filter(|_| self.holds_entries(&sled_key)) {
                let count = self.entries_in(&value).entries().count();
                self.records.fetch_sub(count as i64, Ordering::Relaxed);
                removed += count;
            }
        }
        Ok((removed, true))
    }

    /// The records of the value at `sled_key`, in record-key order, each decoded with its
    /// name (`None` if unreadable).
    #[allow(clippy::type_complexity)]
    pub(super) fn records_of(
        &self,
        sled_key: &[u8],
        value: &[u8],
    ) -> sled::Result<Vec<(RecordKey, Option<(DoneRecord, Option<String>)>)>> {
        let mut records = Vec::new();
        for (rest, entry) in self.entries_in(value).entries() {
            let key = self.record_key(sled_key, rest);
            let decoded = match entry {
                Entry::Inline(bytes) => decode_named(&key, bytes, self.window),
                Entry::StoredApart => (self.tree.get(self.apart_key(sled_key, &key))?)
                    .and_then(|bytes| decode_named(&key, &bytes, self.window)),
            };
            records.push((key, decoded));
        }
        records.sort_by_key(|record| record.0);
        Ok(records)
    }

    /// Files every record of `other`, a tree by key of the same window, in this one: after
    /// going back to an earlier version and forward again, a window can have both. The
    /// earlier version wrote `other` last, so its records replace any here.
    pub(super) fn take_in(&self, other: &Epoch) -> sled::Result<()> {
        for item in other.tree.iter() {
            let (sled_key, value) = item?;
            if !other.holds_entries(&sled_key) {
                continue;
            }
            for (rest, entry) in other.entries_in(&value).entries() {
                let key = other.record_key(&sled_key, rest);
                let record = match entry {
                    Entry::Inline(record) => Some(sled::IVec::from(record)),
                    Entry::StoredApart => other.tree.get(other.apart_key(&sled_key, &key))?,
                };
                // Encoded for the same window, so its bytes read the same here.
                if let Some(record) = record {
                    self.write(&key, &record)?;
                }
            }
        }
        Ok(())
    }
}

/// A chunk's number, from the first 4 bytes of a sled key.
fn chunk_number(sled_key: &[u8]) -> u32 {
    u32::from_be_bytes(sled_key[..4].try_into().expect("4 bytes"))
}
