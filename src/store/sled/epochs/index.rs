//! A window's index in memory: where each of its record keys is filed.
//!
//! Exact, unlike the Bloom filter it replaced: a key not in the index is not in the tree,
//! so a new event reads nothing, and a key in it names the chunk that holds its record.
//! Each entry keeps the first 8 bytes of the record key (the hash the table files it by;
//! the key is already a digest) and a chunk number (0 where the tree files records by
//! key). Two keys sharing those 8 bytes in different chunks get an entry each; in one
//! chunk they share one, which stays while either is there; the chunk's whole record
//! keys tell them apart. 12 bytes an entry (13 with the table's control byte, 15 to 30
//! with its spare room), in 16 shards, so that claims on two cores seldom wait for one
//! another.

use hashbrown::HashTable;
use parking_lot::Mutex;

use super::record::RecordKey;

const SHARDS: usize = 16;

/// Where record keys with these first 8 bytes are.
#[derive(Clone, Copy)]
struct Entry {
    /// The record key's first 8 bytes, as two halves: 4-byte alignment keeps an entry
    /// at 12 bytes.
    prefix: [u32; 2],
    chunk: u32,
}

impl Entry {
    fn hash(&self) -> u64 {
        u64::from(self.prefix[0]) << 32 | u64::from(self.prefix[1])
    }
}

/// The table's hash of a key: its first 8 bytes.
fn hash(key: &RecordKey) -> u64 {
    u64::from_be_bytes(key[..8].try_into().expect("8 bytes"))
}

fn prefix(key: &RecordKey) -> [u32; 2] {
    let hash = hash(key);
    [(hash >> 32) as u32, hash as u32]
}

/// A byte the table's hash does not use picks the shard.
fn shard(key: &RecordKey) -> usize {
    usize::from(key[8]) % SHARDS
}

pub(super) struct Index {
    shards: [Mutex<HashTable<Entry>>; SHARDS],
}

impl Index {
    pub(super) fn new() -> Index {
        Index {
            shards: std::array::from_fn(|_| Mutex::new(HashTable::new())),
        }
    }

    /// The chunks that may hold `key`: none for almost every key not filed, one for
    /// almost every key filed.
    pub(super) fn chunks(&self, key: &RecordKey) -> Vec<u32> {
        let prefix = prefix(key);
        let shard = self.shards[shard(key)].lock();
        shard
            .iter_hash(hash(key))
            .filter(|entry| entry.prefix == prefix)
            .map(|entry| entry.chunk)
            .collect()
    }

    /// Notes that `key` may be in `chunk` (once, however often it is noted).
    pub(super) fn insert(&self, key: &RecordKey, chunk: u32) {
        let entry = Entry {
            prefix: prefix(key),
            chunk,
        };
        let mut shard = self.shards[shard(key)].lock();
        let known = (shard.iter_hash(entry.hash()))
            .any(|known| known.prefix == entry.prefix && known.chunk == chunk);
        if !known {
            shard.insert_unique(entry.hash(), entry, Entry::hash);
        }
    }

    /// Notes that no key with `key`'s first 8 bytes is in `chunk` any more.
    pub(super) fn remove(&self, key: &RecordKey, chunk: u32) {
        let prefix = prefix(key);
        let mut shard = self.shards[shard(key)].lock();
        let found = shard.find_entry(hash(key), |entry| {
            entry.prefix == prefix && entry.chunk == chunk
        });
        if let Ok(found) = found {
            found.remove();
        }
    }

    /// The bytes its tables take.
    #[cfg(test)]
    pub(super) fn allocated(&self) -> usize {
        (self.shards.iter())
            .map(|shard| shard.lock().allocation_size())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_takes_twelve_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 12);
    }

    #[test]
    fn keys_sharing_their_first_bytes_keep_a_chunk_each() {
        let index = Index::new();
        // The same first 9 bytes (the shard's byte too), then different.
        let (one, two) = (
            [1; 16],
            [&[1u8; 9][..], &[2; 7]].concat().try_into().unwrap(),
        );
        assert!(index.chunks(&one).is_empty());
        index.insert(&one, 7);
        index.insert(&one, 7);
        index.insert(&two, 9);
        // Both are offered for either key; the chunk's full keys tell them apart.
        let mut chunks = index.chunks(&one);
        chunks.sort_unstable();
        assert_eq!(chunks, [7, 9]);
        index.remove(&one, 7);
        assert_eq!(index.chunks(&two), [9]);
        index.remove(&two, 9);
        assert!(index.chunks(&one).is_empty());
        assert!(index.chunks(&[3; 16]).is_empty());
    }

    #[test]
    fn a_key_takes_fifteen_to_thirty_bytes() {
        let index = Index::new();
        // splitmix64: keys spread as digests do.
        let mut state = 0u64;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for i in 0..1_000_000u32 {
            let key: RecordKey = [next().to_be_bytes(), next().to_be_bytes()]
                .concat()
                .try_into()
                .unwrap();
            index.insert(&key, i / 8);
        }
        let per_key = index.allocated() / 1_000_000;
        assert!((15..=30).contains(&per_key), "{per_key} bytes a key");
    }
}
