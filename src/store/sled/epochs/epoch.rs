//! One expiry window's tree: where its records go in it, and the index that finds them.
//!
//! A tree this version creates files its records in **chunks**, in the order they were
//! written: record number `n` of the window goes into the chunk numbered
//! `n / RECORDS_PER_CHUNK`, a sled value under that number (4 bytes, big-endian). So a
//! write lands on the chunk written just before, which sled's cache holds, instead of
//! pulling a page that a hash chose back from disk; and the index says which chunk holds
//! a key. A chunk is a [`Bucket`] whose entries carry their whole record key.
//!
//! A tree an earlier version created files its records **by key**, in buckets named by
//! the record key's first bytes; it is read, written and swept as before until its
//! window ends.
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
pub(super) const INLINE_LIMIT: usize = 256;

/// The sled key of a chunk, or of a bucket, which holds records' entries.
#[derive(Clone, Copy)]
pub(super) struct Holder {
    bytes: [u8; RECORD_KEY_LEN],
    len: usize,
}

impl Holder {
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
    pub(super) records: AtomicI64,
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

    /// The sled key of what holds `key`'s entry: the chunk numbered `place`, or the
    /// bucket its first bytes name.
    pub(super) fn holder(&self, key: &RecordKey, place: u32) -> Holder {
        let mut bytes = [0; RECORD_KEY_LEN];
        let len = match self.layout {
            Layout::Chunks => {
                bytes[..4].copy_from_slice(&place.to_be_bytes());
                4
            }
            Layout::ByKey { bucket_bytes } => {
                bytes[..bucket_bytes].copy_from_slice(&key[..bucket_bytes]);
                bucket_bytes
            }
        };
        Holder { bytes, len }
    }

    /// The place the index notes for a record in the holder at `sled_key`.
    pub(super) fn place_of(&self, sled_key: &[u8]) -> u32 {
        match self.layout {
            Layout::Chunks => chunk_number(sled_key),
            Layout::ByKey { .. } => 0,
        }
    }

    /// Whether a sled key of the tree names a chunk or bucket (rather than a record
    /// stored apart).
    pub(super) fn is_holder(&self, sled_key: &[u8]) -> bool {
        match self.layout {
            Layout::Chunks => sled_key.len() == 4,
            Layout::ByKey { bucket_bytes } => sled_key.len() == bucket_bytes,
        }
    }

    /// The sled key of `key`'s record stored apart, for the holder at `holder`.
    fn apart(&self, holder: &[u8], key: &RecordKey) -> Vec<u8> {
        match self.layout {
            Layout::Chunks => [holder, key].concat(),
            Layout::ByKey { .. } => key.to_vec(),
        }
    }

    pub(super) fn view<'a>(&self, holder: &'a [u8]) -> Bucket<'a> {
        let prefix = match self.layout {
            Layout::Chunks => 0,
            Layout::ByKey { bucket_bytes } => bucket_bytes,
        };
        Bucket::new(holder, prefix)
    }

    /// The whole record key of an entry, from its holder's sled key and the rest.
    pub(super) fn record_key(&self, holder: &[u8], rest: &[u8]) -> RecordKey {
        let mut key: RecordKey = [0; RECORD_KEY_LEN];
        let prefix = RECORD_KEY_LEN - rest.len();
        key[..prefix].copy_from_slice(&holder[..prefix]);
        key[prefix..].copy_from_slice(rest);
        key
    }

    /// The places that may hold `key`. A tree of chunks is read into its index first; a
    /// tree by key not read in yet may hold any key, in its bucket.
    fn places(&self, key: &RecordKey) -> sled::Result<Vec<u32>> {
        match self.layout {
            Layout::Chunks => {
                self.ensure_indexed()?;
                Ok(self.index.places(key))
            }
            Layout::ByKey { .. } if !self.indexed.load(Ordering::Acquire) => Ok(vec![0]),
            Layout::ByKey { .. } => Ok(self.index.places(key)),
        }
    }

    /// Whether the tree may hold `key`.
    pub(super) fn may_hold(&self, key: &RecordKey) -> sled::Result<bool> {
        Ok(!self.places(key)?.is_empty())
    }

    /// The record of `key`, expired or not.
    pub(super) fn read(&self, key: &RecordKey) -> sled::Result<Option<DoneRecord>> {
        for place in self.places(key)? {
            let holder = self.holder(key, place);
            let Some(bytes) = self.tree.get(holder.as_slice())? else {
                continue;
            };
            match self.view(&bytes).find(key) {
                None => continue,
                Some(Entry::StoredApart) => {
                    let apart = self.tree.get(self.apart(holder.as_slice(), key))?;
                    return Ok(apart.and_then(|bytes| decode(key, &bytes, self.window)));
                }
                Some(Entry::Inline(record)) => return Ok(decode(key, record, self.window)),
            }
        }
        Ok(None)
    }

    /// Writes the encoded record of `key`. Returns whether the key had none.
    pub(super) fn write(&self, key: &RecordKey, record: &[u8]) -> sled::Result<bool> {
        let before = self.places(key)?;
        let place = match self.layout {
            Layout::Chunks => {
                let number = self.next_record.fetch_add(1, Ordering::Relaxed);
                u32::try_from(number / RECORDS_PER_CHUNK).unwrap_or(u32::MAX)
            }
            Layout::ByKey { .. } => 0,
        };
        // First: a key in the index and not in the tree is harmless.
        self.index.insert(key, place);
        let holder = self.holder(key, place);
        let apart = record.len() > INLINE_LIMIT;
        if apart {
            // First, so that whoever finds the entry finds the record.
            self.tree
                .insert(self.apart(holder.as_slice(), key), record)?;
        }
        let entry = if apart {
            Entry::StoredApart
        } else {
            Entry::Inline(record)
        };
        let previous = self.tree.fetch_and_update(holder.as_slice(), |bytes| {
            Some(self.view(bytes.unwrap_or_default()).with(key, entry))
        })?;
        let previous = (previous.as_deref()).and_then(|bytes| self.view(bytes).find(key));
        if previous == Some(Entry::StoredApart) && !apart {
            self.tree.remove(self.apart(holder.as_slice(), key))?;
        }
        let mut had = previous.is_some();
        for elsewhere in before.into_iter().filter(|before| *before != place) {
            had |= self.delete_at(key, elsewhere)?.is_some();
        }
        Ok(!had)
    }

    /// Deletes the record of `key`, returning what it held.
    pub(super) fn delete(&self, key: &RecordKey) -> sled::Result<Option<sled::IVec>> {
        let mut deleted = None;
        for place in self.places(key)? {
            let here = self.delete_at(key, place)?;
            deleted = deleted.or(here);
        }
        Ok(deleted)
    }

    fn delete_at(&self, key: &RecordKey, place: u32) -> sled::Result<Option<sled::IVec>> {
        let holder = self.holder(key, place);
        let before = self.tree.fetch_and_update(holder.as_slice(), |bytes| {
            let rest = self.view(bytes.unwrap_or_default()).without(key);
            (!rest.is_empty()).then_some(rest)
        })?;
        self.index.remove(key, place);
        match (before.as_deref()).and_then(|bytes| self.view(bytes).find(key)) {
            None => Ok(None),
            Some(Entry::StoredApart) => self.tree.remove(self.apart(holder.as_slice(), key)),
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
            let (sled_key, bytes) = item?;
            if !self.is_holder(&sled_key) {
                continue;
            }
            let place = self.place_of(&sled_key);
            for (rest, _) in self.view(&bytes).entries() {
                self.index.insert(&self.record_key(&sled_key, rest), place);
                count += 1;
            }
        }
        // Records written while this ran may be counted twice: the count feeds a metric,
        // and it is exact again once the window is gone.
        self.records.fetch_add(count, Ordering::Relaxed);
        self.indexed.store(true, Ordering::Release);
        Ok(())
    }

    /// The records of the holder at `sled_key`, in record-key order, each decoded with its
    /// name (`None` if unreadable).
    #[allow(clippy::type_complexity)]
    pub(super) fn records_of(
        &self,
        sled_key: &[u8],
        bytes: &[u8],
    ) -> sled::Result<Vec<(RecordKey, Option<(DoneRecord, Option<String>)>)>> {
        let mut records = Vec::new();
        for (rest, entry) in self.view(bytes).entries() {
            let key = self.record_key(sled_key, rest);
            let decoded = match entry {
                Entry::Inline(bytes) => decode_named(&key, bytes, self.window),
                Entry::StoredApart => (self.tree.get(self.apart(sled_key, &key))?)
                    .and_then(|bytes| decode_named(&key, &bytes, self.window)),
            };
            records.push((key, decoded));
        }
        records.sort_by_key(|record| record.0);
        Ok(records)
    }
}

/// A chunk's number, from the first 4 bytes of a sled key.
fn chunk_number(sled_key: &[u8]) -> u32 {
    u32::from_be_bytes(sled_key[..4].try_into().expect("4 bytes"))
}
