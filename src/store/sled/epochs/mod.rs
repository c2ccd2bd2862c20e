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
//! When the store opens, the indexes of the trees of chunks are rebuilt by reading every
//! record once, newest window first, before the store answers (about half a second a
//! million records); trees by key are read in the background ([`Indexing`]), and until
//! then a read looks in the key's bucket.
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
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use self::epoch::Epoch;
#[cfg(test)]
use self::record::RECORD_KEY_LEN;
use self::record::{decode, encode, record_key, salt};
use self::window::{Layout, Window};
use crate::store::{DoneRecord, Millis, StoreError, Swept};

pub(super) use self::record::RecordKey;

/// The trees by key that held records before the store was opened, whose indexes and
/// counts still have to be read in.
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
            // Meanwhile, and if it fails, reads look in the key's bucket.
            read_in_or_warn(epoch);
        }
        tracing::debug!(
            windows = self.pending.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "done records indexed"
        );
    }
}

/// Reads `epoch`'s records in; on failure, says so and returns false.
fn read_in_or_warn(epoch: &Epoch) -> bool {
    let read = epoch.ensure_indexed();
    if let Err(error) = &read {
        tracing::warn!(%error, tree = epoch.tree_name(), "cannot read a window's keys");
    }
    read.is_ok()
}

/// Every epoch of the database, by window.
pub(super) struct Epochs {
    db: sled::Db,
    /// Keys the record-key hash ([`record_key`]).
    salt: Vec<u8>,
    by_window: RwLock<BTreeMap<Window, Arc<Epoch>>>,
    /// Count up as a record's move to another expiry begins and as it ends (odd while
    /// one is under way), one counter for each share of the keys: a read of a key of
    /// that share that finds nothing meanwhile looks again.
    moves: [AtomicU64; MOVE_SHARES],
}

/// How many shares of the keys count their moves apart, so that a move makes only the
/// reads of a few keys look again.
const MOVE_SHARES: usize = 64;

/// The counter of the moves of `key`'s share (a byte the index's hash does not use).
fn moves_of<'a>(moves: &'a [AtomicU64; MOVE_SHARES], key: &RecordKey) -> &'a AtomicU64 {
    &moves[usize::from(key[9]) % MOVE_SHARES]
}

/// A move under way: counts the move's end when dropped, even by a panic, so that reads
/// never wait for a move that is over.
struct Moving<'a>(&'a AtomicU64);

impl<'a> Moving<'a> {
    fn start(counter: &'a AtomicU64) -> Moving<'a> {
        counter.fetch_add(1, Ordering::SeqCst);
        Moving(counter)
    }
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Epochs {
    /// Finds the epoch trees of `db` and reads the trees of chunks in. The trees by key
    /// are read in by the [`Indexing`] returned, to be started.
    pub(super) fn open(db: &sled::Db) -> Result<(Epochs, Indexing), StoreError> {
        let failed = |error: sled::Error| StoreError::Backend(error.to_string());
        let salt = salt(db)?;
        let mut by_window: BTreeMap<Window, Arc<Epoch>> = BTreeMap::new();
        let mut doubles = Vec::new();
        for name in db.tree_names() {
            if let Some((window, layout)) = Window::from_tree_name(&name) {
                let tree = db.open_tree(&name).map_err(failed)?;
                let epoch = Arc::new(Epoch::existing(window, layout, tree).map_err(failed)?);
                // A tree by key beside a tree of chunks for one window: the first goes
                // into the second below.
                match by_window.insert(window, Arc::clone(&epoch)) {
                    Some(other) if other.layout == Layout::Chunks => {
                        by_window.insert(window, other);
                        doubles.push(epoch);
                    }
                    Some(other) => doubles.push(other),
                    None => {}
                }
            }
        }
        for epoch in by_window.values().rev() {
            if epoch.layout == Layout::Chunks {
                epoch.ensure_indexed().map_err(failed)?;
            }
        }
        for double in doubles {
            by_window[&double.window].take_in(&double).map_err(failed)?;
            // On disk before the tree goes: a crash meanwhile leaves both, to merge again.
            db.flush().map_err(failed)?;
            db.drop_tree(double.tree_name()).map_err(failed)?;
        }
        let indexing = Indexing {
            pending: (by_window.values().rev())
                .filter(|epoch| !epoch.is_indexed())
                .cloned()
                .collect(),
        };
        let epochs = Epochs {
            db: db.clone(),
            salt,
            by_window: RwLock::new(by_window),
            moves: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        Ok((epochs, indexing))
    }

    /// Where the done record of `store_key` is filed.
    pub(super) fn record_key(&self, store_key: &str) -> RecordKey {
        record_key(&self.salt, store_key)
    }

    /// The live done record of `key`, if there is one.
    pub(super) fn get(&self, key: &RecordKey, now: Millis) -> sled::Result<Option<DoneRecord>> {
        let counter = moves_of(&self.moves, key);
        loop {
            let moves = counter.load(Ordering::SeqCst);
            let found = self.get_once(key, now)?;
            // A record moved to another window meanwhile may have been looked for in
            // each before it was there and after it had gone.
            if found.is_some()
                || (moves.is_multiple_of(2) && counter.load(Ordering::SeqCst) == moves)
            {
                return Ok(found);
            }
            std::thread::yield_now();
        }
    }

    fn get_once(&self, key: &RecordKey, now: Millis) -> sled::Result<Option<DoneRecord>> {
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
                    return epoch.write(key, &bytes);
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
        let _moving = Moving::start(moves_of(&self.moves, key));
        self.move_to(key, record, name)
    }

    fn move_to(&self, key: &RecordKey, record: &DoneRecord, name: &str) -> sled::Result<()> {
        let retention = record.expires_at.saturating_sub(record.completed_at).max(1);
        self.put(key, record, retention, name)?;
        let window = Window::holding(record.expires_at, retention);
        let by_window = self.by_window.read();
        for epoch in by_window.values().filter(|epoch| epoch.window != window) {
            epoch.delete(key)?;
        }
        Ok(())
    }

    /// Removes `key`'s records from every tree. Returns whether a live one was removed.
    pub(super) fn remove(&self, key: &RecordKey, now: Millis) -> sled::Result<bool> {
        let by_window = self.by_window.read();
        let mut removed_live = false;
        for epoch in by_window.values() {
            if let Some(bytes) = epoch.delete(key)? {
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
            if !read_in_or_warn(&epoch) {
                continue;
            }
            let (removed, emptied) = epoch.empty(limit.saturating_sub(swept.examined))?;
            swept.examined += removed;
            swept.removed += removed;
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
            .map(|epoch| epoch.records())
            .sum();
        u64::try_from(records).unwrap_or(0)
    }
}

/// Where a walk stopped: after this record, in this chunk (or bucket), of this window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    window: Window,
    /// The chunk's number (0 in a tree by key).
    chunk: u32,
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
            self.chunk,
            hex::encode(self.key)
        )
    }

    pub(super) fn decode(text: &str) -> Option<Position> {
        let mut parts = text.splitn(4, '.');
        let end = parts.next()?.parse().ok()?;
        let width = parts.next()?.parse().ok()?;
        let chunk = parts.next()?.parse().ok()?;
        let key = hex::decode(parts.next()?).ok()?.try_into().ok()?;
        Some(Position {
            window: Window { end, width },
            chunk,
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
            let start = after.map(|after| epoch.value_key(&after.key, after.chunk));
            let start: &[u8] = start.as_ref().map_or(&[], |start| start.as_slice());
            for item in epoch.tree.range(start..) {
                let (sled_key, value) = item?;
                if !epoch.holds_entries(&sled_key) {
                    continue;
                }
                let chunk = epoch.chunk_of(&sled_key);
                for (key, record) in epoch.records_of(&sled_key, &value)? {
                    if after.is_some_and(|after| *sled_key == *start && key <= after.key) {
                        continue;
                    }
                    examined += 1;
                    let here = Position {
                        window: epoch.window,
                        chunk,
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
        // Three keys sharing their first 9 bytes (so one entry of the index, in one shard,
        // for the three in one chunk), one not.
        let mut keys: Vec<RecordKey> = (0..3u8)
            .map(|i| [7, 7, 7, 7, 7, 7, 7, 7, 7, i, 0, 0, 0, 0, 0, 0])
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
            let value = epoch.tree.get(chunk).unwrap().unwrap();
            epoch.entries_in(&value).entries().count()
        };
        assert_eq!((entries([0, 0, 0, 0]), entries([0, 0, 0, 2])), (8, 4));
        // A key filed again goes into the chunk being written, and out of its first.
        epoch
            .write(&keys[0], &encode(&done(201), epoch.window, "n"))
            .unwrap();
        assert_eq!((entries([0, 0, 0, 0]), entries([0, 0, 0, 2])), (7, 5));
        // A key never written has no chunk to read: a new event reads nothing.
        assert!((0..1000).all(|i| {
            epoch
                .chunks_of(&key_of(&format!("new {i}")))
                .unwrap()
                .is_empty()
        }));
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
    fn after_a_restart_the_trees_of_chunks_are_read_in_before_the_store_answers() {
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
        assert!(indexing.pending.is_empty(), "nothing left to the thread");
        assert_eq!(epochs.records(), 2000);
        assert!(
            keys.iter()
                .all(|key| epochs.get(key, now).unwrap().is_some())
        );
        assert_eq!(epochs.get(&key_of("stranger"), now).unwrap(), None);
        // A record written now starts a chunk after the last one written before.
        let fresh = key_of("written after the restart");
        epochs.put(&fresh, &record, minute, "n").unwrap();
        let by_window = epochs.by_window.read();
        let epoch = by_window.values().next().unwrap();
        assert_eq!(epoch.chunks_of(&fresh).unwrap(), [2000 / 8]);
        drop(by_window);
        assert!(epochs.get(&fresh, now).unwrap().is_some());
        assert_eq!(epochs.records(), 2001);
        let later = now + 2 * minute;
        assert_eq!(epochs.sweep(later, 10_000).unwrap().removed, 2001);
        assert_eq!(epochs.get(&keys[0], now).unwrap(), None);
        assert_eq!(epochs.records(), 0);
    }

    #[test]
    fn after_a_crash_between_a_rewrite_and_its_removal_the_newer_copy_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let key = key_of("moved");
        let (short, long) = (
            done(200),
            DoneRecord {
                expires_at: NOW + 61_000,
                ..done(201)
            },
        );
        {
            let db = open_db(&dir);
            let (epochs, _) = Epochs::open(&db).unwrap();
            epochs.put(&key, &short, MINUTE, "n").unwrap();
            // The newer copy (a later expiry, in the same window) filed in a later
            // chunk, the crash coming before the older one was removed.
            let by_window = epochs.by_window.read();
            let epoch = by_window.values().next().unwrap();
            assert_eq!(Window::holding(long.expires_at, MINUTE), epoch.window);
            let newer = encode(&long, epoch.window, "n");
            epoch
                .tree
                .fetch_and_update([0, 0, 0, 9], |value| {
                    Some(
                        epoch
                            .entries_in(value.unwrap_or_default())
                            .with(&key, bucket::Entry::Inline(&newer)),
                    )
                })
                .unwrap();
            db.flush().unwrap();
        }
        let db = open_db(&dir);
        let (epochs, _) = Epochs::open(&db).unwrap();
        // After the older copy's expiry, the newer one still answers.
        let found = epochs.get(&key, short.expires_at + 1).unwrap();
        assert_eq!(found.map(|done| done.upstream_status), Some(201));
        // Both copies were read in and counted; removing the key takes both out.
        assert_eq!(epochs.records(), 2);
        assert!(epochs.remove(&key, NOW).unwrap());
        assert_eq!(epochs.records(), 0);
        assert_eq!(epochs.get(&key, NOW).unwrap(), None);
    }

    #[test]
    fn a_read_while_a_record_moves_between_windows_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir);
        let (epochs, _) = Epochs::open(&db).unwrap();
        let key = key_of("moving");
        let expiries = [NOW + MINUTE, NOW + 60 * MINUTE];
        let at = |expires_at| DoneRecord {
            expires_at,
            ..done(200)
        };
        epochs.put(&key, &at(expiries[0]), MINUTE, "n").unwrap();
        let misses = std::sync::atomic::AtomicUsize::new(0);
        let moving = std::sync::atomic::AtomicBool::new(true);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for round in 1..=5000 {
                    epochs.refile(&key, &at(expiries[round % 2]), "n").unwrap();
                }
                moving.store(false, Ordering::Release);
            });
            while moving.load(Ordering::Acquire) {
                if epochs.get(&key, NOW).unwrap().is_none() {
                    misses.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        assert_eq!(misses.into_inner(), 0);
        assert_eq!(epochs.records(), 1);
    }

    #[test]
    fn a_tree_by_key_beside_a_tree_of_chunks_for_one_window_goes_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<RecordKey> = (0..40u32).map(|i| key_of(&format!("k{i}"))).collect();
        {
            let db = open_db(&dir);
            let (epochs, _) = Epochs::open(&db).unwrap();
            for key in &keys[..20] {
                epochs.put(key, &done(200), MINUTE, "n").unwrap();
            }
            // What an earlier version writes for the same window, not seeing the first
            // tree: a key of both, and others.
            tree_by_key(&db, &keys[10..], &done(299));
            db.flush().unwrap();
        }
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db).unwrap();
        let names = db.tree_names();
        let trees: Vec<_> = names
            .iter()
            .filter_map(|name| Window::from_tree_name(name))
            .collect();
        assert_eq!(trees.len(), 1, "the tree by key is gone");
        assert_eq!(trees[0].1, Layout::Chunks);
        assert!(indexing.pending.is_empty());
        let status = |key| {
            epochs
                .get(key, NOW)
                .unwrap()
                .map(|done| done.upstream_status)
        };
        assert!(keys[..10].iter().all(|key| status(key) == Some(200)));
        assert!(keys[10..].iter().all(|key| status(key) == Some(299)));
        assert_eq!(epochs.records(), 40);
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
            epochs.by_window.read()[&window]
                .chunks_of(&keys[250])
                .unwrap()
                .is_empty()
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
            chunk: 3,
            key: [7; RECORD_KEY_LEN],
        };
        // A cursor an earlier version gave (window end, width, record key).
        let before_chunks = format!("1800000065536.65536.{}", "07".repeat(16));
        assert_eq!(Position::decode(&before_chunks), None);
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
