//! Done records, filed by when they expire.
//!
//! Each *epoch* is a sled tree holding the records whose expiry falls in one window of
//! time. Once a window has passed, everything in its tree has expired: the sweep empties
//! the tree and drops it. So no expiry index is needed (it took as much disk as the records), and
//! the sweep's cost follows what expired, not the store's size.
//!
//! A record is known by a 16-byte SHA-256 prefix of its store key, and the records whose
//! keys share their first two bytes (three in a window expected to hold more than two
//! million) share one sled value, a [`Bucket`]. sled keeps a few hundred bytes of
//! bookkeeping in memory for every page of about a dozen sled keys, cached or not, so a
//! bucket per several records costs a fraction of the memory of a sled key each. Writing
//! a record rewrites its bucket, which stays small: 65 536 buckets per window hold a
//! million records at 15 each, and a record larger than [`INLINE_LIMIT`] (one keeping a
//! replayed answer) is stored apart under its full key ([`Entry::StoredApart`]), so that
//! it is not rewritten with the others.
//!
//! Each epoch keeps a Bloom filter of its keys in memory, so a claim reads only the trees
//! that may hold its key: about one read for a duplicate, almost none for a new event.
//! After a restart the filters are rebuilt by reading every key once ([`Indexing`]), in
//! the background and newest window first: until a window's filter is built it cannot
//! rule a key out, so a claim reads that window's tree, as it would without filters. The
//! store is ready at once whatever its size.
//!
//! The parts: [`window`] (which tree a record goes to), [`record`] (its salted key and its
//! encoding), [`bucket`] (the records that share a sled value), [`filter`] (the Bloom
//! filter of a window).
//!
//! Done records carry their store key, so that a walk ([`Epochs::walk`]) lists them a
//! bounded stretch at a time: windows oldest first, a window's buckets in sled's order and
//! a bucket's records in record-key order, so that a [`Position`] names where it stopped.
//! A record that stays put throughout is visited once; one written, moved or removed
//! meanwhile may be missed or seen twice. Records written before keys were kept cannot be
//! named and are passed over (they leave with their retention).

mod bucket;
mod filter;
mod record;
mod window;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use self::bucket::{Bucket, Entry};
use self::filter::Filter;
use self::record::{RECORD_KEY_LEN, decode, decode_named, encode, record_key, salt};
use self::window::Window;
use crate::store::{DoneRecord, Millis, StoreError, Swept};

pub(super) use self::record::RecordKey;

/// The largest encoded record kept inside its bucket (a record without a replayed answer
/// takes about 44 bytes).
const INLINE_LIMIT: usize = 256;

/// How many leading bytes of a record key name its bucket, in a window expected to hold
/// `records`: two (65 536 buckets) up to two million records, so that a bucket holds at
/// most about 32 of them; three beyond. A window's first count comes from the one
/// before it (traffic changes slowly), so the first window after a fresh start has two.
fn bucket_bytes(records: usize) -> usize {
    if records <= 1 << 21 { 2 } else { 3 }
}

/// One window's tree, its filter and how many records it holds.
struct Epoch {
    window: Window,
    /// How many leading bytes of a record key name its bucket.
    bucket_bytes: usize,
    tree: sled::Tree,
    filter: Filter,
    records: AtomicI64,
    /// Set once the keys the tree held at start-up are in the filter and the count.
    indexed: OnceLock<()>,
}

impl Epoch {
    fn new(window: Window, bucket_bytes: usize, tree: sled::Tree) -> Epoch {
        Epoch {
            window,
            bucket_bytes,
            tree,
            filter: Filter::new(),
            records: AtomicI64::new(0),
            indexed: OnceLock::from(()),
        }
    }

    /// A tree that already holds records: its filter and count come from
    /// [`Epoch::ensure_indexed`].
    fn existing(window: Window, bucket_bytes: usize, tree: sled::Tree) -> Epoch {
        Epoch {
            filter: Filter::pending(),
            indexed: OnceLock::new(),
            ..Epoch::new(window, bucket_bytes, tree)
        }
    }

    fn tree_name(&self) -> String {
        self.window.tree_name(self.bucket_bytes)
    }

    /// The sled key of the bucket holding `key`'s record.
    fn bucket<'k>(&self, key: &'k RecordKey) -> &'k [u8] {
        &key[..self.bucket_bytes]
    }

    fn view<'a>(&self, bucket: &'a [u8]) -> Bucket<'a> {
        Bucket::new(bucket, self.bucket_bytes)
    }

    /// Whether a sled key of the tree names a bucket (rather than a record stored apart).
    fn is_bucket(&self, sled_key: &[u8]) -> bool {
        sled_key.len() == self.bucket_bytes
    }

    /// The record of `key`, expired or not.
    fn read(&self, key: &RecordKey) -> sled::Result<Option<DoneRecord>> {
        let Some(bucket) = self.tree.get(self.bucket(key))? else {
            return Ok(None);
        };
        Ok(match self.view(&bucket).find(key) {
            None => None,
            Some(Entry::StoredApart) => {
                (self.tree.get(key)?).and_then(|bytes| decode(key, &bytes, self.window))
            }
            Some(Entry::Inline(bytes)) => decode(key, bytes, self.window),
        })
    }

    /// Writes the encoded record of `key`. Returns whether the key had none.
    fn write(&self, key: &RecordKey, record: &[u8]) -> sled::Result<bool> {
        let apart = record.len() > INLINE_LIMIT;
        if apart {
            // First, so that whoever finds the entry finds the record.
            self.tree.insert(key, record)?;
        }
        let entry = if apart {
            Entry::StoredApart
        } else {
            Entry::Inline(record)
        };
        let before = self.tree.fetch_and_update(self.bucket(key), |bucket| {
            Some(self.view(bucket.unwrap_or_default()).with(key, entry))
        })?;
        let previous = before
            .as_deref()
            .and_then(|bucket| self.view(bucket).find(key));
        if previous == Some(Entry::StoredApart) && !apart {
            self.tree.remove(key)?;
        }
        Ok(previous.is_none())
    }

    /// Deletes the record of `key`, returning what it held.
    fn delete(&self, key: &RecordKey) -> sled::Result<Option<sled::IVec>> {
        let before = self.tree.fetch_and_update(self.bucket(key), |bucket| {
            let rest = self.view(bucket.unwrap_or_default()).without(key);
            (!rest.is_empty()).then_some(rest)
        })?;
        match before
            .as_deref()
            .and_then(|bucket| self.view(bucket).find(key))
        {
            None => Ok(None),
            Some(Entry::StoredApart) => self.tree.remove(key),
            Some(Entry::Inline(record)) => Ok(Some(record.into())),
        }
    }

    /// Reads every key of the tree into the filter and the count, once: a second caller
    /// (the sweep, reaching a window the indexing thread is reading) waits for the first.
    fn ensure_indexed(&self) {
        self.indexed.get_or_init(|| {
            if let Err(error) = self.index() {
                // Its filter stays pending: claims keep reading its tree, which is
                // correct, and the sweep leaves it alone.
                tracing::warn!(%error, tree = self.tree_name(), "cannot read a window's keys");
            }
        });
    }

    fn index(&self) -> sled::Result<()> {
        let mut keys: Vec<RecordKey> = Vec::new();
        for item in self.tree.iter() {
            let (sled_key, bucket) = item?;
            if self.is_bucket(&sled_key) {
                keys.extend(self.view(&bucket).entries().map(|(rest, _)| {
                    let mut key = RecordKey::default();
                    key[..self.bucket_bytes].copy_from_slice(&sled_key);
                    key[self.bucket_bytes..].copy_from_slice(rest);
                    key
                }));
            }
        }
        // Records written while this ran may be counted twice: the count feeds a metric
        // and a new window's filter size, and it is exact again once the window is gone.
        self.records.fetch_add(
            i64::try_from(keys.len()).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
        self.filter.complete_with(&keys);
        Ok(())
    }
}

/// The epochs that held records before the store was opened, whose filters and counts
/// still have to be read in.
pub(super) struct Indexing {
    pending: Vec<Arc<Epoch>>,
}

impl Indexing {
    /// Reads them in, newest window first (those serve claims), on a thread of its own.
    pub(super) fn start(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("sled-index".into())
            .spawn(move || self.run())
            .map(drop)
    }

    fn run(self) {
        let started = std::time::Instant::now();
        for epoch in &self.pending {
            epoch.ensure_indexed();
        }
        tracing::debug!(
            windows = self.pending.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "done records indexed"
        );
    }
}

/// Every epoch of the database, by window.
pub(super) struct Epochs {
    db: sled::Db,
    /// Keys the record-key hash ([`record_key`]).
    salt: Vec<u8>,
    by_window: RwLock<BTreeMap<Window, Arc<Epoch>>>,
}

impl Epochs {
    /// Finds the epoch trees of `db`. Their filters and counts are read in by the
    /// [`Indexing`] returned, to be started.
    pub(super) fn open(db: &sled::Db) -> Result<(Epochs, Indexing), StoreError> {
        let salt = salt(db)?;
        let mut by_window = BTreeMap::new();
        for name in db.tree_names() {
            if let Some((window, bucket_bytes)) = Window::from_tree_name(&name) {
                let tree = db
                    .open_tree(&name)
                    .map_err(|error| StoreError::Backend(error.to_string()))?;
                let epoch = Epoch::existing(window, bucket_bytes, tree);
                by_window.insert(window, Arc::new(epoch));
            }
        }
        let indexing = Indexing {
            pending: by_window.values().rev().cloned().collect(),
        };
        let epochs = Epochs {
            db: db.clone(),
            salt,
            by_window: RwLock::new(by_window),
        };
        Ok((epochs, indexing))
    }

    /// Where the done record of `store_key` is filed.
    pub(super) fn record_key(&self, store_key: &str) -> RecordKey {
        record_key(&self.salt, store_key)
    }

    /// The live done record of `key`, if there is one.
    pub(super) fn get(&self, key: &RecordKey, now: Millis) -> sled::Result<Option<DoneRecord>> {
        // Held throughout, so that the sweep cannot drop a tree being read.
        let by_window = self.by_window.read();
        // Newest windows first; a window that has ended holds nothing live.
        for epoch in by_window.values().rev() {
            if epoch.window.end <= now {
                break;
            }
            if !epoch.filter.may_contain(key) {
                continue;
            }
            let live = epoch.read(key)?.filter(|record| record.expires_at > now);
            if live.is_some() {
                return Ok(live);
            }
        }
        Ok(None)
    }

    /// Writes the done record of `name` (its store key, whose record key is `key`), kept
    /// for `retention`, into its window's tree.
    pub(super) fn put(
        &self,
        key: &RecordKey,
        record: &DoneRecord,
        retention: Millis,
        name: &str,
    ) -> sled::Result<()> {
        let window = Window::holding(record.expires_at, retention);
        let bytes = encode(record, window, name);
        loop {
            {
                let by_window = self.by_window.read();
                if let Some(epoch) = by_window.get(&window) {
                    // Filter first: a key in the filter and not in the tree is harmless.
                    let expected = || expected_records(&by_window, window);
                    epoch.filter.insert(key, expected);
                    if epoch.write(key, &bytes)? {
                        epoch.records.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(());
                }
            }
            self.create(window)?;
        }
    }

    fn create(&self, window: Window) -> sled::Result<()> {
        let mut by_window = self.by_window.write();
        let bucket_bytes = bucket_bytes(expected_records(&by_window, window));
        if let MapEntry::Vacant(vacant) = by_window.entry(window) {
            let tree = self.db.open_tree(window.tree_name(bucket_bytes))?;
            let epoch = Epoch::new(window, bucket_bytes, tree);
            vacant.insert(Arc::new(epoch));
        }
        Ok(())
    }

    /// Files `record`, a live record of `key` with its expiry moved, in the window of its
    /// new expiry, then takes it out of every other: a claim meanwhile finds one copy or
    /// the other, never none.
    pub(super) fn refile(
        &self,
        key: &RecordKey,
        record: &DoneRecord,
        name: &str,
    ) -> sled::Result<()> {
        let retention = record.expires_at.saturating_sub(record.completed_at).max(1);
        self.put(key, record, retention, name)?;
        let window = Window::holding(record.expires_at, retention);
        let by_window = self.by_window.read();
        for epoch in by_window.values().filter(|epoch| epoch.window != window) {
            if epoch.filter.may_contain(key) && epoch.delete(key)?.is_some() {
                epoch.records.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Removes `key`'s records from every tree. Returns whether a live one was removed.
    pub(super) fn remove(&self, key: &RecordKey, now: Millis) -> sled::Result<bool> {
        let by_window = self.by_window.read();
        let mut removed_live = false;
        for epoch in by_window.values() {
            if !epoch.filter.may_contain(key) {
                continue;
            }
            if let Some(bytes) = epoch.delete(key)? {
                epoch.records.fetch_sub(1, Ordering::Relaxed);
                removed_live |=
                    decode(key, &bytes, epoch.window).is_some_and(|record| record.expires_at > now);
            }
        }
        Ok(removed_live)
    }

    /// Removes up to about `limit` records of windows that ended by `now`, oldest first, a
    /// bucket at a time, and drops each tree once it is empty. Reads nothing else.
    pub(super) fn sweep(&self, now: Millis, limit: usize) -> sled::Result<Swept> {
        let ended: Vec<Arc<Epoch>> = self
            .by_window
            .read()
            .values()
            .take_while(|epoch| epoch.window.end <= now)
            .cloned()
            .collect();
        // A window whose keys were never read in (it failed) is left alone: its count is
        // unknown.
        let ended: Vec<Arc<Epoch>> = ended
            .into_iter()
            .filter(|epoch| {
                epoch.ensure_indexed();
                epoch.filter.is_complete()
            })
            .collect();
        let mut swept = Swept::default();
        for epoch in ended {
            let mut emptied = true;
            for sled_key in epoch.tree.iter().keys() {
                if swept.examined >= limit {
                    emptied = false;
                    break;
                }
                let sled_key = sled_key?;
                let removed = epoch.tree.remove(&sled_key)?;
                // A record stored apart is counted with its bucket's entry.
                if let Some(bucket) = removed.filter(|_| epoch.is_bucket(&sled_key)) {
                    let count = epoch.view(&bucket).entries().count();
                    epoch.records.fetch_sub(count as i64, Ordering::Relaxed);
                    swept.examined += count;
                    swept.removed += count;
                }
            }
            if !emptied {
                break;
            }
            self.drop_epoch(&epoch)?;
        }
        Ok(swept)
    }

    fn drop_epoch(&self, epoch: &Epoch) -> sled::Result<()> {
        let mut by_window = self.by_window.write();
        by_window.remove(&epoch.window);
        // Under the lock: no reader is in the tree, and no writer can recreate it before
        // it is gone.
        self.db.drop_tree(epoch.tree_name())?;
        Ok(())
    }

    /// How many done records the store holds, expired ones not yet swept included.
    pub(super) fn records(&self) -> u64 {
        let records: i64 = self
            .by_window
            .read()
            .values()
            .map(|epoch| epoch.records.load(Ordering::Relaxed))
            .sum();
        u64::try_from(records).unwrap_or(0)
    }
}

/// The size of a new window's filter: as many keys as the previous window of its width
/// held, since traffic changes slowly.
fn expected_records(by_window: &BTreeMap<Window, Arc<Epoch>>, window: Window) -> usize {
    by_window
        .range(..window)
        .rev()
        .find(|(earlier, _)| earlier.width == window.width)
        .map_or(0, |(_, epoch)| {
            usize::try_from(epoch.records.load(Ordering::Relaxed)).unwrap_or(0)
        })
}

/// Where a walk stopped: after this record of this window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    window: Window,
    key: RecordKey,
}

impl Position {
    /// As text, for a listing's cursor: `<window end>.<window width>.<record key in hex>`.
    pub(super) fn encode(&self) -> String {
        format!(
            "{}.{}.{}",
            self.window.end,
            self.window.width,
            hex::encode(self.key)
        )
    }

    pub(super) fn decode(text: &str) -> Option<Position> {
        let mut parts = text.splitn(3, '.');
        let end = parts.next()?.parse().ok()?;
        let width = parts.next()?.parse().ok()?;
        let key = hex::decode(parts.next()?).ok()?.try_into().ok()?;
        Some(Position {
            window: Window { end, width },
            key,
        })
    }
}

impl Epochs {
    /// Visits the live named records after `from` (from the first without one), at most
    /// `examined_max` records looked at, until `visit` breaks. Returns where to go on
    /// from, or `None` once every record was looked at.
    pub(super) fn walk(
        &self,
        now: Millis,
        from: Option<Position>,
        examined_max: usize,
        mut visit: impl FnMut(&str, DoneRecord) -> ControlFlow<()>,
    ) -> sled::Result<Option<Position>> {
        // Held throughout (a stretch is bounded), so that the sweep cannot drop a tree
        // being read.
        let by_window = self.by_window.read();
        let mut examined = 0;
        let live = by_window.values().filter(|epoch| epoch.window.end > now);
        for epoch in live.filter(|epoch| from.is_none_or(|from| epoch.window >= from.window)) {
            let after = from
                .filter(|from| from.window == epoch.window)
                .map(|from| from.key);
            let start: &[u8] = after.as_ref().map_or(&[], |key| epoch.bucket(key));
            for item in epoch.tree.range(start..) {
                let (sled_key, bucket) = item?;
                if !epoch.is_bucket(&sled_key) {
                    continue;
                }
                for (key, record) in epoch.records_of(&sled_key, &bucket)? {
                    if after.is_some_and(|after| key <= after) {
                        continue;
                    }
                    examined += 1;
                    let here = Position {
                        window: epoch.window,
                        key,
                    };
                    if let Some((record, Some(name))) = record
                        && record.expires_at > now
                        && visit(&name, record).is_break()
                    {
                        return Ok(Some(here));
                    }
                    if examined >= examined_max {
                        return Ok(Some(here));
                    }
                }
            }
        }
        Ok(None)
    }
}

impl Epoch {
    /// The records of the bucket at `sled_key`, in record-key order, each decoded with its
    /// name (`None` if unreadable).
    #[allow(clippy::type_complexity)]
    fn records_of(
        &self,
        sled_key: &[u8],
        bucket: &[u8],
    ) -> sled::Result<Vec<(RecordKey, Option<(DoneRecord, Option<String>)>)>> {
        let mut records = Vec::new();
        for (rest, entry) in self.view(bucket).entries() {
            let mut key: RecordKey = [0; RECORD_KEY_LEN];
            key[..sled_key.len()].copy_from_slice(sled_key);
            key[sled_key.len()..].copy_from_slice(rest);
            let decoded = match entry {
                Entry::Inline(bytes) => decode_named(&key, bytes, self.window),
                Entry::StoredApart => {
                    (self.tree.get(key)?).and_then(|bytes| decode_named(&key, &bytes, self.window))
                }
            };
            records.push((key, decoded));
        }
        records.sort_by_key(|record| record.0);
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RecordedResponse;

    const NOW: Millis = 1_800_000_000_000;
    const MINUTE: Millis = 60_000;

    fn key_of(store_key: &str) -> RecordKey {
        record_key(b"salt", store_key)
    }

    /// Opens the database at `dir`, waiting while the background threads of one just
    /// dropped still hold its lock.
    fn open_db(dir: &tempfile::TempDir) -> sled::Db {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match sled::Config::new().path(dir.path()).open() {
                Ok(db) => return db,
                Err(error) if std::time::Instant::now() < deadline => {
                    assert!(
                        error.to_string().contains("could not acquire lock"),
                        "{error}"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(error) => panic!("{error}"),
            }
        }
    }

    /// A record done at [`NOW`], kept a minute.
    fn done(upstream_status: u16) -> DoneRecord {
        DoneRecord {
            claimed_at: NOW,
            completed_at: NOW,
            expires_at: NOW + MINUTE,
            upstream_status,
            fingerprint: [1; 32],
            response: None,
        }
    }

    #[test]
    fn records_sharing_a_bucket_are_found_counted_and_removed_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (now, minute, record) = (NOW, MINUTE, done);
        // Three keys in one bucket, one in another.
        let mut keys: Vec<RecordKey> = (0..3u8)
            .map(|i| [7, 7, i, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .collect();
        keys.push([8; 16]);
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db).unwrap();
        indexing.run();
        for (i, key) in keys.iter().enumerate() {
            epochs
                .put(key, &record(200 + i as u16), minute, "n")
                .unwrap();
        }
        epochs.put(&keys[1], &record(299), minute, "n").unwrap();
        assert_eq!(epochs.records(), 4, "a rewrite is not a new record");
        let status = |key| {
            epochs
                .get(key, now)
                .unwrap()
                .map(|done| done.upstream_status)
        };
        assert_eq!(
            keys.iter().map(status).collect::<Vec<_>>(),
            [Some(200), Some(299), Some(202), Some(203)]
        );
        assert!(epochs.remove(&keys[0], now).unwrap());
        assert!(!epochs.remove(&keys[0], now).unwrap(), "already gone");
        assert_eq!(status(&keys[0]), None);
        assert_eq!(status(&keys[2]), Some(202));
        assert_eq!(epochs.records(), 3);
        let swept = epochs.sweep(now + 2 * minute, 10_000).unwrap();
        assert_eq!((swept.examined, swept.removed), (3, 3));
        assert_eq!(epochs.records(), 0);
        assert!(
            db.tree_names()
                .iter()
                .all(|name| Window::from_tree_name(name).is_none())
        );
    }

    #[test]
    fn a_large_record_is_stored_apart_and_leaves_its_bucket_small() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db).unwrap();
        indexing.run();
        let replayed = |body: &'static [u8]| DoneRecord {
            response: Some(RecordedResponse {
                status: 200,
                headers: vec![(
                    "content-type".into(),
                    bytes::Bytes::from_static(b"application/json"),
                )],
                body: bytes::Bytes::from_static(body),
            }),
            ..done(200)
        };
        let large = replayed(&[b'x'; 4096]);
        // Two keys sharing a bucket: one large, one small.
        let (big, small) = ([5; 16], [5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        epochs.put(&big, &large, MINUTE, "n").unwrap();
        epochs.put(&small, &done(201), MINUTE, "n").unwrap();
        assert_eq!(epochs.get(&big, NOW).unwrap(), Some(large.clone()));
        assert_eq!(epochs.records(), 2, "a record stored apart counts once");
        let by_window = epochs.by_window.read();
        let epoch = by_window.values().next().unwrap();
        let bucket = epoch.tree.get([5, 5]).unwrap().unwrap();
        assert!(
            bucket.len() < 100,
            "the bucket holds {} bytes",
            bucket.len()
        );
        assert!(epoch.tree.get(big).unwrap().is_some());
        // Rewritten small, the record apart goes.
        epoch
            .write(&big, &encode(&replayed(b"{}"), epoch.window, "n"))
            .unwrap();
        assert_eq!(epoch.tree.get(big).unwrap(), None);
        epoch
            .write(&big, &encode(&large, epoch.window, "n"))
            .unwrap();
        drop(by_window);
        // Read back after a restart, then removed with its record.
        drop(epochs);
        let (epochs, indexing) = Epochs::open(&db).unwrap();
        indexing.run();
        assert_eq!(epochs.records(), 2);
        assert_eq!(epochs.get(&big, NOW).unwrap(), Some(large));
        assert!(epochs.remove(&big, NOW).unwrap());
        assert_eq!(epochs.get(&big, NOW).unwrap(), None);
        assert_eq!(
            epochs.get(&small, NOW).unwrap().unwrap().upstream_status,
            201
        );
        let by_window = epochs.by_window.read();
        assert_eq!(
            by_window.values().next().unwrap().tree.len(),
            1,
            "only the bucket"
        );
        drop(by_window);
        // The sweep counts a record stored apart once.
        epochs.put(&big, &done(202), MINUTE, "n").unwrap();
        epochs
            .put(&[6; 16], &replayed(&[b'y'; 1000]), MINUTE, "n")
            .unwrap();
        let swept = epochs.sweep(NOW + 2 * MINUTE, 10_000).unwrap();
        assert_eq!((swept.examined, swept.removed), (3, 3));
        assert_eq!(epochs.records(), 0);
    }

    #[test]
    fn after_a_restart_keys_are_found_before_and_after_their_filters_are_built() {
        let dir = tempfile::tempdir().unwrap();
        let (now, minute, record) = (NOW, MINUTE, done(200));
        let keys: Vec<RecordKey> = (0..2000u32).map(|i| key_of(&format!("k{i}"))).collect();
        {
            let db = open_db(&dir);
            let (epochs, indexing) = Epochs::open(&db).unwrap();
            indexing.run();
            for key in &keys {
                epochs.put(key, &record, minute, "n").unwrap();
            }
            db.flush().unwrap();
        }
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db).unwrap();
        assert!(!indexing.pending.is_empty());

        // Not indexed yet: every key is found by reading its tree.
        assert!(
            keys.iter()
                .all(|key| epochs.get(key, now).unwrap().is_some())
        );
        assert_eq!(epochs.get(&key_of("stranger"), now).unwrap(), None);
        let later = now + 2 * minute;
        let fresh = key_of("written while indexing");
        epochs.put(&fresh, &record, minute, "n").unwrap();

        indexing.run();
        assert!(
            keys.iter()
                .all(|key| epochs.get(key, now).unwrap().is_some())
        );
        assert!(epochs.get(&fresh, now).unwrap().is_some());
        // The fresh record may be counted twice (written, then read in).
        assert!(
            (2001..=2002).contains(&epochs.records()),
            "{}",
            epochs.records()
        );
        let by_window = epochs.by_window.read();
        assert!(by_window.values().all(|epoch| epoch.filter.is_complete()));
        drop(by_window);
        assert_eq!(epochs.sweep(later, 10_000).unwrap().removed, 2001);
        assert_eq!(epochs.get(&keys[0], now).unwrap(), None);

        // A window the sweep reaches before the indexing thread is read in first, so
        // that its count is right when it goes.
        for key in &keys {
            epochs.put(key, &record, minute, "n").unwrap();
        }
        drop(epochs);
        let (epochs, _never_started) = Epochs::open(&db).unwrap();
        assert_eq!(epochs.sweep(later, 10_000).unwrap().removed, 2000);
        assert_eq!(epochs.records(), 0);
    }

    #[test]
    fn a_position_reads_back_as_written() {
        let position = Position {
            window: Window {
                end: 1_800_000_065_536,
                width: 65_536,
            },
            key: [7; RECORD_KEY_LEN],
        };
        assert_eq!(Position::decode(&position.encode()), Some(position));
        for bad in ["", "1.2", "1.2.zz", "1.2.0707", "x.2.07", "1.2.3.4"] {
            assert_eq!(Position::decode(bad), None, "{bad}");
        }
    }
}
