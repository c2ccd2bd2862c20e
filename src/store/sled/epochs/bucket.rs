//! The codec of a sled value holding several records' entries: a chunk (records filed in
//! the order written, each entry with its whole record key) or a bucket of a tree by key
//! (records whose keys share a prefix, each entry with the rest of its key).

use super::record::{RECORD_KEY_LEN, RecordKey};

/// A record's entry in its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry<'a> {
    /// The encoded record itself.
    Inline(&'a [u8]),
    /// The record is too large to share a value: it is stored apart (see `epoch.rs`).
    StoredApart,
}

impl<'a> Entry<'a> {
    /// An encoded record is never empty, so an empty entry marks a record stored apart.
    fn encoded(self) -> &'a [u8] {
        match self {
            Entry::Inline(record) => record,
            Entry::StoredApart => &[],
        }
    }

    fn decoded(bytes: &'a [u8]) -> Entry<'a> {
        if bytes.is_empty() {
            Entry::StoredApart
        } else {
            Entry::Inline(bytes)
        }
    }
}

/// A bucket's bytes: for each record, the rest of its key after the prefix, then its
/// entry with its length first.
pub(super) struct Bucket<'a> {
    bytes: &'a [u8],
    /// The length of the prefix, which is the bucket's sled key.
    prefix: usize,
}

impl<'a> Bucket<'a> {
    pub(super) fn new(bytes: &'a [u8], prefix: usize) -> Bucket<'a> {
        Bucket { bytes, prefix }
    }

    /// The entries, in order, each with the rest of its key. An unreadable tail is
    /// treated as absent (and logged), as an unreadable record is.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&'a [u8], Entry<'a>)> + use<'a> {
        let (mut rest, suffix) = (self.bytes, RECORD_KEY_LEN - self.prefix);
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let parsed = rest.split_at_checked(suffix).and_then(|(key, tail)| {
                let (entry, tail) = postcard::take_from_bytes::<&[u8]>(tail).ok()?;
                Some((key, entry, tail))
            });
            let Some((key, entry, tail)) = parsed else {
                tracing::warn!("unreadable done records, treating them as absent");
                rest = &[];
                return None;
            };
            rest = tail;
            Some((key, Entry::decoded(entry)))
        })
    }

    /// The entry of `key`.
    pub(super) fn find(&self, key: &RecordKey) -> Option<Entry<'a>> {
        let suffix = &key[self.prefix..];
        self.entries()
            .find(|(rest, _)| *rest == suffix)
            .map(|(_, entry)| entry)
    }

    /// The bucket with `key`'s entry set to `entry`.
    pub(super) fn with(&self, key: &RecordKey, entry: Entry<'_>) -> Vec<u8> {
        self.rebuilt(key, Some(entry))
    }

    /// The bucket without `key`'s entry.
    pub(super) fn without(&self, key: &RecordKey) -> Vec<u8> {
        self.rebuilt(key, None)
    }

    fn rebuilt(&self, key: &RecordKey, entry: Option<Entry<'_>>) -> Vec<u8> {
        let suffix = &key[self.prefix..];
        let added = entry.map(|entry| (suffix, entry.encoded()));
        let mut out = Vec::with_capacity(self.bytes.len() + added.map_or(0, |(_, e)| e.len() + 20));
        let kept = self
            .entries()
            .filter(|(rest, _)| *rest != suffix)
            .map(|(rest, entry)| (rest, entry.encoded()));
        for (rest, encoded) in kept.chain(added) {
            out.extend_from_slice(rest);
            out = postcard::to_extend(&encoded, out).expect("a byte string always serializes");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_keeps_each_record_apart() {
        let keys: Vec<RecordKey> = (0..5u8).map(|i| [i; 16]).collect();
        let records: Vec<Vec<u8>> = (0..5u8)
            .map(|i| vec![i; usize::from(i) * 100 + 1])
            .collect();
        let mut bytes = Vec::new();
        for (key, record) in keys.iter().zip(&records) {
            bytes = Bucket::new(&bytes, 2).with(key, Entry::Inline(record));
        }
        let find = |bytes: &[u8], key| {
            Bucket::new(bytes, 2)
                .find(key)
                .map(|entry| entry.encoded().to_vec())
        };
        for (key, record) in keys.iter().zip(&records) {
            assert_eq!(find(&bytes, key).as_ref(), Some(record));
        }
        // Only the rest of each key after the prefix is kept: 14 bytes, then the record's
        // length (one byte below 128, two up to 16 KiB) and the record.
        assert_eq!(
            bytes.len(),
            5 * 14 + (1 + 1 + 2 + 2 + 2) + (1 + 101 + 201 + 301 + 401)
        );
        // Replacing a record keeps one entry for its key.
        bytes = Bucket::new(&bytes, 2).with(&keys[2], Entry::Inline(b"new"));
        assert_eq!(find(&bytes, &keys[2]), Some(b"new".to_vec()));
        assert_eq!(Bucket::new(&bytes, 2).entries().count(), 5);
        // A record stored apart is marked as such.
        bytes = Bucket::new(&bytes, 2).with(&keys[3], Entry::StoredApart);
        assert_eq!(
            Bucket::new(&bytes, 2).find(&keys[3]),
            Some(Entry::StoredApart)
        );
        // Removing one leaves the others.
        bytes = Bucket::new(&bytes, 2).without(&keys[0]);
        assert_eq!(find(&bytes, &keys[0]), None);
        assert_eq!(find(&bytes, &keys[4]), Some(vec![4; 401]));
        assert_eq!(find(&bytes, &[9; 16]), None);
        // A torn tail (the record written last) reads as absent; the records before it
        // still read.
        let torn = &bytes[..bytes.len() - 1];
        assert_eq!(find(torn, &keys[4]), Some(vec![4; 401]));
        assert_eq!(Bucket::new(torn, 2).find(&keys[3]), None);
    }
}
