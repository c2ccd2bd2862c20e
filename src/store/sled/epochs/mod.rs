//! Done records, filed by when they expire.
//!
//! Each *epoch* is a sled tree holding the records whose expiry falls in one window of
//! time. Once a window has passed, everything in its tree has expired: the sweep empties
//! the tree and drops it. So no expiry index is needed (it took as much disk as the records), and
//! the sweep's cost follows what expired, not the store's size.
//!
//! A record is known by a 16-byte SHA-256 prefix of its store key. Within its window's
//! tree it is filed in the order written, a few records to a sled value (a chunk), so
//! that writing a record rewrites the value written just before, which sled's cache
//! holds ([`epoch`] says why and how; trees of earlier versions file by key). Each epoch
//! keeps an index of its keys in memory ([`index`]), exact: a claim of a new event reads
//! nothing, a duplicate reads the one chunk that holds its record.
//!
//! After a restart the indexes are rebuilt by reading every record once ([`Indexing`]), in
//! the background and newest window first. A claim that needs a window not read in yet
//! reads it in itself, or waits for the thread that is doing so (about a second a million
//! records).
//!
//! The parts: [`window`] (which tree a record goes to, and how that tree files them),
//! [`epoch`] (one window's tree), [`index`] (its index), [`bucket`] (the entries that
//! share a sled value), [`record`] (a record's salted key and its encoding).
//!
//! Done records carry their store key, so that a walk ([`Epochs::walk`]) lists them a
//! bounded stretch at a time: windows oldest first, a window's chunks (or buckets) in
//! sled's order and a chunk's records in record-key order, so that a [`Position`] names
//! where it stopped. A record that stays put throughout is visited once; one written,
//! moved or removed meanwhile may be missed or seen twice. Records written before keys
//! were kept cannot be named and are passed over (they leave with their retention).

mod bucket;
mod epoch;
mod index;
mod record;
mod window;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::RwLock;

use self::epoch::Epoch;
#[cfg(test)]
use self::record::RECORD_KEY_LEN;
use self::record::{decode, encode, record_key, salt};
use self::window::{Layout, Window};
use crate::store::{DoneRecord, Millis, StoreError, Swept};

pub(super) use self::record::RecordKey;

/// The epochs that held records before the store was opened, whose indexes and counts
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
            if let Err(error) = epoch.ensure_indexed() {
                // Claims that need the window try again, and fail (503) while it fails.
                tracing::warn!(%error, tree = epoch.tree_name(), "cannot read a window's keys");
            }
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
    /// Finds the epoch trees of `db`. Their indexes and counts are read in by the
    /// [`Indexing`] returned, to be started.
    pub(super) fn open(db: &sled::Db) -> Result<(Epochs, Indexing), StoreError> {
        let failed = |error: sled::Error| StoreError::Backend(error.to_string());
        let salt = salt(db)?;
        let mut by_window = BTreeMap::new();
        for name in db.tree_names() {
            if let Some((window, layout)) = Window::from_tree_name(&name) {
                let tree = db.open_tree(&name).map_err(failed)?;
                let epoch = Epoch::existing(window, layout, tree).map_err(failed)?;
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
        if let MapEntry::Vacant(vacant) = by_window.entry(window) {
            let tree = self.db.open_tree(window.tree_name(Layout::Chunks))?;
            vacant.insert(Arc::new(Epoch::new(window, tree)));
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
            if epoch.may_hold(key)? && epoch.delete(key)?.is_some() {
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
            if let Some(bytes) = epoch.delete(key)? {
                epoch.records.fetch_sub(1, Ordering::Relaxed);
                removed_live |=
                    decode(key, &bytes, epoch.window).is_some_and(|record| record.expires_at > now);
            }
        }
        Ok(removed_live)
    }

    /// Removes up to about `limit` records of windows that ended by `now`, oldest first, a
    /// chunk (or bucket) at a time, and drops each tree once it is empty. Reads nothing
    /// else.
    pub(super) fn sweep(&self, now: Millis, limit: usize) -> sled::Result<Swept> {
        let ended: Vec<Arc<Epoch>> = self
            .by_window
            .read()
            .values()
            .take_while(|epoch| epoch.window.end <= now)
            .cloned()
            .collect();
        let mut swept = Swept::default();
        for epoch in ended {
            // Read in first, so that its count is right when it goes. A window whose
            // records cannot be read in is left alone: its count is unknown.
            if let Err(error) = epoch.ensure_indexed() {
                tracing::warn!(%error, tree = epoch.tree_name(), "cannot read a window's keys");
                continue;
            }
            let mut emptied = true;
            for sled_key in epoch.tree.iter().keys() {
                if swept.examined >= limit {
                    emptied = false;
                    break;
                }
                let sled_key = sled_key?;
                let removed = epoch.tree.remove(&sled_key)?;
                // A record stored apart is counted with its entry.
                if let Some(holder) = removed.filter(|_| epoch.is_holder(&sled_key)) {
                    let count = epoch.view(&holder).entries().count();
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

/// Where a walk stopped: after this record, in this chunk (or bucket), of this window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    window: Window,
    /// The chunk's number (0 in a tree by key).
    place: u32,
    key: RecordKey,
}

impl Position {
    /// As text, for a listing's cursor: `<window end>.<window width>.<chunk>.<record key
    /// in hex>`.
    pub(super) fn encode(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.window.end,
            self.window.width,
            self.place,
            hex::encode(self.key)
        )
    }

    pub(super) fn decode(text: &str) -> Option<Position> {
        let mut parts = text.splitn(4, '.');
        let end = parts.next()?.parse().ok()?;
        let width = parts.next()?.parse().ok()?;
        let place = parts.next()?.parse().ok()?;
        let key = hex::decode(parts.next()?).ok()?.try_into().ok()?;
        Some(Position {
            window: Window { end, width },
            place,
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
            let after = from.filter(|from| from.window == epoch.window);
            let start = after.map(|after| epoch.holder(&after.key, after.place));
            let start: &[u8] = start.as_ref().map_or(&[], |start| start.as_slice());
            for item in epoch.tree.range(start..) {
                let (sled_key, holder) = item?;
                if !epoch.is_holder(&sled_key) {
                    continue;
                }
                let place = epoch.place_of(&sled_key);
                for (key, record) in epoch.records_of(&sled_key, &holder)? {
                    if after.is_some_and(|after| *sled_key == *start && key <= after.key) {
                        continue;
                    }
                    examined += 1;
                    let here = Position {
                        window: epoch.window,
                        place,
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
    fn records_are_found_counted_rewritten_and_removed_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (now, minute, record) = (NOW, MINUTE, done);
        // Three keys sharing their first bytes, one not.
        let mut keys: Vec<RecordKey> = (0..3u8)
            .map(|i| [7, 7, 7, 7, 7, 7, 7, 7, i, 0, 0, 0, 0, 0, 0, 0])
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
    fn records_are_filed_in_the_order_written_and_a_rewrite_leaves_its_old_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir);
        let (epochs, _) = Epochs::open(&db).unwrap();
        let keys: Vec<RecordKey> = (0..20u32).map(|i| key_of(&format!("k{i}"))).collect();
        for key in &keys {
            epochs.put(key, &done(200), MINUTE, "n").unwrap();
        }
        let by_window = epochs.by_window.read();
        let epoch = by_window.values().next().unwrap();
        assert_eq!(epoch.layout, Layout::Chunks);
        let chunks: Vec<Vec<u8>> = epoch
            .tree
            .iter()
            .keys()
            .map(|key| key.unwrap().to_vec())
            .collect();
        assert_eq!(chunks, [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2]]);
        let entries = |chunk: [u8; 4]| {
            epoch
                .view(&epoch.tree.get(chunk).unwrap().unwrap())
                .entries()
                .count()
        };
        assert_eq!((entries([0, 0, 0, 0]), entries([0, 0, 0, 2])), (8, 4));
        // A key filed again goes into the chunk being written, and out of its first.
        epoch
            .write(&keys[0], &encode(&done(201), epoch.window, "n"))
            .unwrap();
        assert_eq!((entries([0, 0, 0, 0]), entries([0, 0, 0, 2])), (7, 5));
        assert!(!epoch.may_hold(&key_of("stranger")).unwrap());
        drop(by_window);
        assert_eq!(
            epochs.get(&keys[0], NOW).unwrap().unwrap().upstream_status,
            201
        );
        assert_eq!(epochs.records(), 20);
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
        // Two keys sharing a chunk: one large, one small.
        let (big, small) = ([5; 16], [5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let chunk = [0u8; 4];
        let apart = [&chunk[..], &big].concat();
        epochs.put(&big, &large, MINUTE, "n").unwrap();
        epochs.put(&small, &done(201), MINUTE, "n").unwrap();
        assert_eq!(epochs.get(&big, NOW).unwrap(), Some(large.clone()));
        assert_eq!(epochs.records(), 2, "a record stored apart counts once");
        let by_window = epochs.by_window.read();
        let epoch = by_window.values().next().unwrap();
        let held = epoch.tree.get(chunk).unwrap().unwrap();
        assert!(held.len() < 100, "the chunk holds {} bytes", held.len());
        assert!(epoch.tree.get(&apart).unwrap().is_some());
        // Rewritten small, the record apart goes.
        epoch
            .write(&big, &encode(&replayed(b"{}"), epoch.window, "n"))
            .unwrap();
        assert_eq!(epoch.tree.get(&apart).unwrap(), None);
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
            "only the chunk"
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
    fn after_a_restart_a_claim_reads_its_window_in_before_it_answers() {
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
        let indexed = || (epochs.by_window.read().values()).all(|epoch| epoch.is_indexed());
        assert!(!indexed());

        // Not read in by the thread yet: the first claim reads the window in.
        assert!(
            keys.iter()
                .all(|key| epochs.get(key, now).unwrap().is_some())
        );
        assert!(indexed());
        assert_eq!(epochs.get(&key_of("stranger"), now).unwrap(), None);
        let later = now + 2 * minute;
        let fresh = key_of("written after the restart");
        epochs.put(&fresh, &record, minute, "n").unwrap();
        indexing.run();
        assert!(epochs.get(&fresh, now).unwrap().is_some());
        assert_eq!(epochs.records(), 2001);
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

    /// A tree an earlier version filed by key, as it wrote it: buckets named by the
    /// record keys' first two bytes.
    fn tree_by_key(db: &sled::Db, keys: &[RecordKey], record: &DoneRecord) -> Window {
        let window = Window::holding(record.expires_at, MINUTE);
        let layout = Layout::ByKey { bucket_bytes: 2 };
        let tree = db.open_tree(window.tree_name(layout)).unwrap();
        for key in keys {
            let entry = encode(record, window, "n");
            tree.fetch_and_update(&key[..2], |bucket| {
                Some(
                    bucket::Bucket::new(bucket.unwrap_or_default(), 2)
                        .with(key, bucket::Entry::Inline(&entry)),
                )
            })
            .unwrap();
        }
        window
    }

    #[test]
    fn a_tree_filed_by_key_is_read_written_and_swept_until_its_window_ends() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<RecordKey> = (0..300u32).map(|i| key_of(&format!("k{i}"))).collect();
        let window = {
            let db = open_db(&dir);
            let _salted = Epochs::open(&db).unwrap();
            let window = tree_by_key(&db, &keys[..200], &done(200));
            db.flush().unwrap();
            window
        };
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db).unwrap();
        // Found before its keys are read in (by reading each key's bucket) and after.
        assert!(
            keys[..200]
                .iter()
                .all(|key| epochs.get(key, NOW).unwrap().is_some())
        );
        assert_eq!(epochs.get(&keys[250], NOW).unwrap(), None);
        indexing.run();
        assert!(
            keys[..200]
                .iter()
                .all(|key| epochs.get(key, NOW).unwrap().is_some())
        );
        assert!(
            !epochs.by_window.read()[&window]
                .may_hold(&keys[250])
                .unwrap()
        );
        // Records of its window go on into it, by key.
        for key in &keys[200..] {
            epochs.put(key, &done(201), MINUTE, "n").unwrap();
        }
        assert_eq!(
            db.tree_names()
                .iter()
                .filter(|name| Window::from_tree_name(name).is_some())
                .count(),
            1
        );
        assert_eq!(
            epochs
                .get(&keys[250], NOW)
                .unwrap()
                .unwrap()
                .upstream_status,
            201
        );
        assert!(epochs.remove(&keys[0], NOW).unwrap());
        assert_eq!(epochs.get(&keys[0], NOW).unwrap(), None);
        assert_eq!(epochs.records(), 299);
        let mut listed = 0;
        let walked = epochs.walk(NOW, None, 1000, |name, _| {
            assert_eq!(name, "n");
            listed += 1;
            ControlFlow::Continue(())
        });
        assert_eq!((walked.unwrap(), listed), (None, 299));
        let swept = epochs.sweep(NOW + 2 * MINUTE, 10_000).unwrap();
        assert_eq!(swept.removed, 299);
        assert!(
            db.tree_names()
                .iter()
                .all(|name| Window::from_tree_name(name).is_none())
        );
    }

    #[test]
    fn a_walk_goes_on_where_it_stopped_in_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir);
        let (epochs, _) = Epochs::open(&db).unwrap();
        let names: Vec<String> = (0..21u32).map(|i| format!("n:{i}")).collect();
        for name in &names {
            epochs.put(&key_of(name), &done(200), MINUTE, name).unwrap();
        }
        let (mut seen, mut from) = (Vec::new(), None);
        loop {
            let mut page = 0;
            from = epochs
                .walk(NOW, from, 5, |name, _| {
                    seen.push(name.to_string());
                    page += 1;
                    ControlFlow::Continue(())
                })
                .unwrap();
            assert!(page <= 5);
            let Some(at) = from else { break };
            from = Position::decode(&at.encode());
            assert_eq!(from, Some(at));
        }
        seen.sort();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(seen, expected, "each record once");
    }

    #[test]
    fn a_position_reads_back_as_written() {
        let position = Position {
            window: Window {
                end: 1_800_000_065_536,
                width: 65_536,
            },
            place: 3,
            key: [7; RECORD_KEY_LEN],
        };
        assert_eq!(Position::decode(&position.encode()), Some(position));
        for bad in [
            "",
            "1.2",
            "1.2.3.zz",
            "1.2.3.0707",
            "x.2.3.07",
            "1.2.07",
            "1.2.x.07",
            "1.2.3.4.5",
        ] {
            assert_eq!(Position::decode(bad), None, "{bad}");
        }
    }
}
