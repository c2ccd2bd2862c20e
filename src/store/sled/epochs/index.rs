//! A window's index in memory: where each of its record keys is filed.
//!
//! Exact, unlike the Bloom filter it replaced: a key not in the index is not in the tree,
//! so a new event reads nothing, and a key in it names the chunk that holds its record.
//! Each entry keeps the first 8 bytes of the record key (the hash the table files it by;
//! the key is already a digest) and a place: the chunk's number, or 0 where the tree
//! files records by key. Two keys sharing those 8 bytes get an entry each, and the
//! chunk's full record keys tell them apart. 12 bytes an entry, in 16 shards, so that
//! claims on two cores seldom wait for one another.

use hashbrown::HashTable;
use parking_lot::Mutex;

use super::record::RecordKey;

const SHARDS: usize = 16;

/// One record key's place.
#[derive(Clone, Copy)]
struct Entry {
    /// The record key's first 8 bytes, as two halves: 4-byte alignment keeps an entry
    /// at 12 bytes.
    prefix: [u32; 2],
    place: u32,
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

    /// The places that may hold `key`: none for almost every key not filed, one for
    /// almost every key filed.
    pub(super) fn places(&self, key: &RecordKey) -> Vec<u32> {
        let prefix = prefix(key);
        let shard = self.shards[shard(key)].lock();
        shard
            .iter_hash(hash(key))
            .filter(|entry| entry.prefix == prefix)
            .map(|entry| entry.place)
            .collect()
    }

    /// Notes that `key` may be at `place` (once, however often it is noted).
    pub(super) fn insert(&self, key: &RecordKey, place: u32) {
        let entry = Entry {
            prefix: prefix(key),
            place,
        };
        let mut shard = self.shards[shard(key)].lock();
        let known = (shard.iter_hash(entry.hash()))
            .any(|known| known.prefix == entry.prefix && known.place == place);
        if !known {
            shard.insert_unique(entry.hash(), entry, Entry::hash);
        }
    }

    /// Notes that `key` is no longer at `place`.
    pub(super) fn remove(&self, key: &RecordKey, place: u32) {
        let prefix = prefix(key);
        let mut shard = self.shards[shard(key)].lock();
        let found = shard.find_entry(hash(key), |entry| {
            entry.prefix == prefix && entry.place == place
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
    fn keys_sharing_their_first_bytes_keep_a_place_each() {
        let index = Index::new();
        // The same first 9 bytes (the shard's byte too), then different.
        let (one, two) = (
            [1; 16],
            [&[1u8; 9][..], &[2; 7]].concat().try_into().unwrap(),
        );
        assert!(index.places(&one).is_empty());
        index.insert(&one, 7);
        index.insert(&one, 7);
        index.insert(&two, 9);
        // Both are offered for either key; the chunk's full keys tell them apart.
        let mut places = index.places(&one);
        places.sort_unstable();
        assert_eq!(places, [7, 9]);
        index.remove(&one, 7);
        assert_eq!(index.places(&two), [9]);
        index.remove(&two, 9);
        assert!(index.places(&one).is_empty());
        assert!(index.places(&[3; 16]).is_empty());
    }

    #[test]
    fn a_million_keys_take_about_thirteen_bytes_each_at_most_twice_that() {
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
        assert!((12..=30).contains(&per_key), "{per_key} bytes a key");
    }
}
