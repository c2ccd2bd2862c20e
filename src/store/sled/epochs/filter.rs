//! A Bloom filter that grows with the window it rules keys out of.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use fastbloom::AtomicBloomFilter;
use parking_lot::RwLock;

use super::record::RecordKey;

/// The false-positive rate of each filter segment.
const FALSE_POSITIVES: f64 = 0.01;

/// The smallest filter segment, in keys.
const MIN_FILTER: usize = 1024;

/// A Bloom filter that grows: when its last segment is full, a twice larger one is added.
pub(super) struct Filter {
    segments: RwLock<Vec<Segment>>,
    /// False while the keys a tree held before a restart are not in the filter yet:
    /// until then it cannot rule a key out.
    complete: AtomicBool,
}

struct Segment {
    bits: AtomicBloomFilter,
    capacity: usize,
    items: AtomicUsize,
}

impl Segment {
    fn new(capacity: usize) -> Segment {
        Segment {
            bits: AtomicBloomFilter::with_false_pos(FALSE_POSITIVES).expected_items(capacity),
            capacity,
            items: AtomicUsize::new(0),
        }
    }
}

/// The filter's hash of a key: the key is already a digest, so its first 8 bytes serve.
fn filter_hash(key: &RecordKey) -> u64 {
    u64::from_le_bytes(key[..8].try_into().expect("8 bytes"))
}

impl Filter {
    /// The filter of a new tree.
    pub(super) fn new() -> Filter {
        Filter {
            segments: RwLock::new(Vec::new()),
            complete: AtomicBool::new(true),
        }
    }

    /// The filter of a tree that already holds keys, until [`Filter::complete_with`].
    pub(super) fn pending() -> Filter {
        Filter {
            complete: AtomicBool::new(false),
            ..Filter::new()
        }
    }

    pub(super) fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Adds `key`; `expected` sizes the first segment.
    pub(super) fn insert(&self, key: &RecordKey, expected: impl FnOnce() -> usize) {
        let hash = filter_hash(key);
        {
            let segments = self.segments.read();
            if let Some(last) = segments.last()
                && last.items.fetch_add(1, Ordering::Relaxed) < last.capacity
            {
                last.bits.insert_hash(hash);
                return;
            }
        }
        let mut segments = self.segments.write();
        let full = segments
            .last()
            .is_none_or(|last| last.items.load(Ordering::Relaxed) > last.capacity);
        if full {
            let capacity = segments
                .last()
                .map_or_else(|| expected().max(MIN_FILTER), |last| last.capacity * 2);
            segments.push(Segment::new(capacity));
        }
        let last = segments.last().expect("a segment was just added");
        last.items.fetch_add(1, Ordering::Relaxed);
        last.bits.insert_hash(hash);
    }

    /// Adds the keys the tree held before the restart, with room for as many again, and
    /// lets the filter rule keys out. Keys added meanwhile stay in their own segments.
    pub(super) fn complete_with(&self, keys: &[RecordKey]) {
        let segment = Segment::new((keys.len() * 2).max(MIN_FILTER));
        for key in keys {
            segment.bits.insert_hash(filter_hash(key));
        }
        segment.items.store(keys.len(), Ordering::Relaxed);
        // First, so that inserts keep filling the last segment.
        self.segments.write().insert(0, segment);
        self.complete.store(true, Ordering::Release);
    }

    pub(super) fn may_contain(&self, key: &RecordKey) -> bool {
        if !self.is_complete() {
            return true;
        }
        let hash = filter_hash(key);
        self.segments
            .read()
            .iter()
            .any(|segment| segment.bits.contains_hash(hash))
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::record_key;
    use super::*;

    fn key_of(store_key: &str) -> RecordKey {
        record_key(b"salt", store_key)
    }

    #[test]
    fn a_filter_grows_and_never_forgets_a_key() {
        let filter = Filter::new();
        let keys: Vec<RecordKey> = (0..10_000u32).map(|i| key_of(&format!("k{i}"))).collect();
        for key in &keys[..5000] {
            filter.insert(key, || 0);
        }
        assert!(filter.segments.read().len() > 1, "it grew");
        assert!(keys[..5000].iter().all(|key| filter.may_contain(key)));
        let read_back = Filter::pending();
        assert!(
            read_back.may_contain(&keys[0]),
            "a pending filter rules nothing out"
        );
        read_back.complete_with(&keys[5000..]);
        for key in &keys[..3000] {
            read_back.insert(key, || 0);
        }
        let mut held = keys[..3000].iter().chain(&keys[5000..]);
        assert!(held.all(|key| read_back.may_contain(key)));
        let filter = read_back;
        let strangers = (0..10_000u32)
            .filter(|i| filter.may_contain(&key_of(&format!("stranger{i}"))))
            .count();
        assert!(strangers < 500, "{strangers} false positives in 10000");
    }
}
