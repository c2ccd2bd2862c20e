//! Done records, filed by when they expire.
//!
//! Each *epoch* is a sled tree holding the records whose expiry falls in one window of
//! time. Once a window has passed, everything in its tree has expired: the sweep empties
//! the tree and drops it. So no expiry index is needed (it doubled the disk per key), and
//! the sweep's cost follows what expired, not the store's size.
//!
//! A record is known by a 16-byte SHA-256 prefix of its store key, and the records whose
//! keys share their first two bytes (three in a window expected to hold more than two
//! million) share one sled value, a [`Bucket`]. sled keeps a few
//! hundred bytes of bookkeeping in memory for every page of about a dozen sled keys,
//! cached or not: a sled key per record cost 40 MiB per million records, a bucket per
//! several records a fraction of it. Writing a record rewrites its bucket, which stays
//! small: 65 536 buckets per window hold a million records at 15 each, and a record
//! larger than [`INLINE_LIMIT`] (one keeping a replayed answer) is stored apart under its
//! full key, with an empty entry in its bucket, so that it is not rewritten with the
//! others.
//!
//! Each epoch keeps a Bloom filter of its keys in memory, so a claim reads only the trees
//! that may hold its key: about one read for a duplicate, almost none for a new event.
//! After a restart the filters are rebuilt by reading every key once ([`Indexing`]), in
//! the background and newest window first: until a window's filter is built it cannot
//! rule a key out, so a claim reads that window's tree, as it would without filters. The
//! store is ready at once whatever its size.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};

use fastbloom::AtomicBloomFilter;
use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use super::super::{DoneRecord, Fingerprint, Millis, RecordedResponse, Swept};

/// A done record's key in its tree: the first 16 bytes of the SHA-256 of the store's
/// salt followed by the store key.
pub(super) type RecordKey = [u8; RECORD_KEY_LEN];

const RECORD_KEY_LEN: usize = 16;

/// Where a data directory keeps its salt, in sled's default tree.
const SALT_KEY: &[u8] = b"record-key-salt";

/// A record key under `salt`. The salt is random per data directory and never leaves it,
/// so a sender cannot choose keys that land in one bucket (each write to a bucket rewrites
/// it, so a bucket grown on purpose would make every write to it slower) or that share a
/// record key; the hash's output is never shown, so a salt prefix keys it as well as an
/// HMAC would.
pub(super) fn record_key(salt: &[u8], store_key: &str) -> RecordKey {
    let digest = Sha256::new()
        .chain_update(salt)
        .chain_update(store_key.as_bytes())
        .finalize();
    let mut key = [0; RECORD_KEY_LEN];
    key.copy_from_slice(&digest[..RECORD_KEY_LEN]);
    key
}

/// The data directory's salt: the one it holds, a new one for a directory without
/// records, or none for a directory whose records were filed before salts existed (their
/// keys were hashed without one; a new data directory gets a salt).
fn salt(db: &sled::Db) -> sled::Result<Vec<u8>> {
    if let Some(salt) = db.get(SALT_KEY)? {
        return Ok(salt.to_vec());
    }
    let holds_records = db.tree_names().iter().any(|name| {
        name.starts_with(TREE_PREFIX.as_bytes())
            || name.starts_with(KEYED_TREE_PREFIX.as_bytes())
            || name == b"done"
    });
    if holds_records {
        tracing::warn!(
            "this data directory files its done records under unsalted key hashes, as before salts; a sender able to choose many event keys could slow its writes. A new data directory gets a salt."
        );
        return Ok(Vec::new());
    }
    let salt: [u8; 16] = rand::random();
    db.insert(SALT_KEY, &salt)?;
    db.flush()?;
    Ok(salt.to_vec())
}

/// Epoch trees are named `epoch.<width>.<end>.<bucket bytes>`, in milliseconds.
const TREE_PREFIX: &str = "epoch.";

/// The earlier layout's epoch trees, a sled key per record, moved into buckets at open.
const KEYED_TREE_PREFIX: &str = "done.";

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

/// The narrowest window.
const MIN_WIDTH: Millis = 1024;

/// The false-positive rate of each filter segment.
const FALSE_POSITIVES: f64 = 0.01;

/// The smallest filter segment, in keys.
const MIN_FILTER: usize = 1024;

/// The time window `[end - width, end)` of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Window {
    end: Millis,
    width: Millis,
}

impl Window {
    /// The window of a record expiring at `expires_at` that was kept for `retention`.
    /// Its width is a power of two near an eighth of the retention: about eight to
    /// sixteen trees hold a route's records, and an expired record stays on disk at most
    /// an eighth of its retention longer.
    fn holding(expires_at: Millis, retention: Millis) -> Window {
        let target = (retention / 8).max(MIN_WIDTH);
        let width = 1 << target.ilog2();
        Window {
            end: (expires_at / width).saturating_add(1).saturating_mul(width),
            width,
        }
    }

    fn tree_name(self, bucket_bytes: usize) -> String {
        format!("{TREE_PREFIX}{}.{}.{bucket_bytes}", self.width, self.end)
    }

    /// The window and bucket width of an epoch tree's name.
    fn from_tree_name(name: &[u8]) -> Option<(Window, usize)> {
        let name = std::str::from_utf8(name).ok()?.strip_prefix(TREE_PREFIX)?;
        let (window, bucket_bytes) = name.rsplit_once('.')?;
        let bucket_bytes = bucket_bytes
            .parse()
            .ok()
            .filter(|bytes| (1..=16).contains(bytes))?;
        Some((Window::parse(window)?, bucket_bytes))
    }

    /// The window of an earlier layout's epoch tree.
    fn from_keyed_tree_name(name: &[u8]) -> Option<Window> {
        Window::parse(
            std::str::from_utf8(name)
                .ok()?
                .strip_prefix(KEYED_TREE_PREFIX)?,
        )
    }

    /// `<width>.<end>`
    fn parse(text: &str) -> Option<Window> {
        let (width, end) = text.split_once('.')?;
        Some(Window {
            end: end.parse().ok()?,
            width: width.parse().ok()?,
        })
    }
}

/// A Bloom filter that grows: when its last segment is full, a twice larger one is added.
struct Filter {
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
    fn new() -> Filter {
        Filter {
            segments: RwLock::new(Vec::new()),
            complete: AtomicBool::new(true),
        }
    }

    /// The filter of a tree that already holds keys, until [`Filter::complete_with`].
    fn pending() -> Filter {
        Filter {
            complete: AtomicBool::new(false),
            ..Filter::new()
        }
    }

    fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Adds `key`; `expected` sizes the first segment.
    fn insert(&self, key: &RecordKey, expected: impl FnOnce() -> usize) {
        let hash = filter_hash(key);
        {
            let segments = read(&self.segments);
            if let Some(last) = segments.last()
                && last.items.fetch_add(1, Ordering::Relaxed) < last.capacity
            {
                last.bits.insert_hash(hash);
                return;
            }
        }
        let mut segments = self
            .segments
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
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
    fn complete_with(&self, keys: &[RecordKey]) {
        let segment = Segment::new((keys.len() * 2).max(MIN_FILTER));
        for key in keys {
            segment.bits.insert_hash(filter_hash(key));
        }
        segment.items.store(keys.len(), Ordering::Relaxed);
        let mut segments = self
            .segments
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // First, so that inserts keep filling the last segment.
        segments.insert(0, segment);
        drop(segments);
        self.complete.store(true, Ordering::Release);
    }

    fn may_contain(&self, key: &RecordKey) -> bool {
        if !self.is_complete() {
            return true;
        }
        let hash = filter_hash(key);
        read(&self.segments)
            .iter()
            .any(|segment| segment.bits.contains_hash(hash))
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
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
            Some(APART) => (self.tree.get(key)?).and_then(|bytes| decode(key, &bytes, self.window)),
            Some(bytes) => decode(key, bytes, self.window),
        })
    }

    /// Writes the encoded record of `key`. Returns whether the key had none.
    fn write(&self, key: &RecordKey, record: &[u8]) -> sled::Result<bool> {
        let apart = record.len() > INLINE_LIMIT;
        if apart {
            // First, so that whoever finds the entry finds the record.
            self.tree.insert(key, record)?;
        }
        let inline = if apart { APART } else { record };
        let before = self.tree.fetch_and_update(self.bucket(key), |bucket| {
            Some(
                self.view(bucket.unwrap_or_default())
                    .with(key, Some(inline)),
            )
        })?;
        let previous = before
            .as_deref()
            .and_then(|bucket| self.view(bucket).find(key));
        if previous == Some(APART) && !apart {
            self.tree.remove(key)?;
        }
        Ok(previous.is_none())
    }

    /// Deletes the record of `key`, returning what it held.
    fn delete(&self, key: &RecordKey) -> sled::Result<Option<sled::IVec>> {
        let before = self.tree.fetch_and_update(self.bucket(key), |bucket| {
            let rest = self.view(bucket.unwrap_or_default()).with(key, None);
            (!rest.is_empty()).then_some(rest)
        })?;
        match before
            .as_deref()
            .and_then(|bucket| self.view(bucket).find(key))
        {
            None => Ok(None),
            Some(APART) => self.tree.remove(key),
            Some(record) => Ok(Some(record.into())),
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
    /// Finds the epoch trees of `db`, first moving records of the earlier single-tree
    /// layout into them. Their filters and counts are read in by the [`Indexing`]
    /// returned, to be started.
    pub(super) fn open(db: &sled::Db, now: Millis) -> sled::Result<(Epochs, Indexing)> {
        let salt = salt(db)?;
        let mut by_window = BTreeMap::new();
        for name in db.tree_names() {
            if let Some((window, bucket_bytes)) = Window::from_tree_name(&name) {
                let epoch = Epoch::existing(window, bucket_bytes, db.open_tree(&name)?);
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
        epochs.migrate_single_tree_layout(now)?;
        epochs.migrate_keyed_epochs(now)?;
        Ok((epochs, indexing))
    }

    /// Moves the live records of the earlier epoch trees, a sled key per record, into
    /// buckets, then drops those trees.
    fn migrate_keyed_epochs(&self, now: Millis) -> sled::Result<()> {
        for name in self.db.tree_names() {
            let Some(window) = Window::from_keyed_tree_name(&name) else {
                continue;
            };
            let old = self.db.open_tree(&name)?;
            let mut moved = 0;
            if window.end > now {
                for entry in old.iter() {
                    let (key, bytes) = entry?;
                    let Ok(key) = RecordKey::try_from(key.as_ref()) else {
                        continue;
                    };
                    if let Some(record) = decode(&key, &bytes, window) {
                        let retention = record.expires_at.saturating_sub(record.completed_at);
                        self.put(&key, &record, retention)?;
                        moved += 1;
                    }
                }
            }
            self.db.flush()?;
            self.db.drop_tree(&name)?;
            tracing::info!(
                records = moved,
                tree = %String::from_utf8_lossy(&name),
                "moved a window's done records into buckets"
            );
        }
        Ok(())
    }

    /// Moves the live records of the layout before epochs (a `done` tree keyed by store
    /// key, an `expiry` index) into epoch trees, then drops the old trees.
    fn migrate_single_tree_layout(&self, now: Millis) -> sled::Result<()> {
        let names = self.db.tree_names();
        if !names.iter().any(|name| name == b"done") {
            return Ok(());
        }
        let old = self.db.open_tree("done")?;
        let mut moved = 0;
        for entry in old.iter() {
            let (store_key, bytes) = entry?;
            // That layout stored the record itself; an unreadable one is left behind.
            let live = postcard::from_bytes::<DoneRecord>(&bytes)
                .ok()
                .filter(|record| record.expires_at > now);
            if let Some(record) = live {
                let key = self.record_key(&String::from_utf8_lossy(&store_key));
                let retention = record.expires_at.saturating_sub(record.completed_at);
                self.put(&key, &record, retention)?;
                moved += 1;
            }
        }
        self.db.flush()?;
        self.db.drop_tree("done")?;
        if names.iter().any(|name| name == b"expiry") {
            self.db.drop_tree("expiry")?;
        }
        tracing::info!(
            records = moved,
            "moved the live done records into epoch trees"
        );
        Ok(())
    }

    /// Where the done record of `store_key` is filed.
    pub(super) fn record_key(&self, store_key: &str) -> RecordKey {
        record_key(&self.salt, store_key)
    }

    /// The live done record of `key`, if there is one.
    pub(super) fn get(&self, key: &RecordKey, now: Millis) -> sled::Result<Option<DoneRecord>> {
        // Held throughout, so that the sweep cannot drop a tree being read.
        let by_window = read(&self.by_window);
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

    /// Writes a done record kept for `retention` into its window's tree.
    pub(super) fn put(
        &self,
        key: &RecordKey,
        record: &DoneRecord,
        retention: Millis,
    ) -> sled::Result<()> {
        let window = Window::holding(record.expires_at, retention);
        let bytes = encode(record, window);
        loop {
            {
                let by_window = read(&self.by_window);
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
        let mut by_window = self
            .by_window
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let bucket_bytes = bucket_bytes(expected_records(&by_window, window));
        if let Entry::Vacant(vacant) = by_window.entry(window) {
            let tree = self.db.open_tree(window.tree_name(bucket_bytes))?;
            let epoch = Epoch::new(window, bucket_bytes, tree);
            vacant.insert(Arc::new(epoch));
        }
        Ok(())
    }

    /// Removes `key`'s records from every tree. Returns whether a live one was removed.
    pub(super) fn remove(&self, key: &RecordKey, now: Millis) -> sled::Result<bool> {
        let by_window = read(&self.by_window);
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
        let ended: Vec<Arc<Epoch>> = read(&self.by_window)
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
        let mut by_window = self
            .by_window
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        by_window.remove(&epoch.window);
        // Under the lock: no reader is in the tree, and no writer can recreate it before
        // it is gone.
        self.db.drop_tree(epoch.tree_name())?;
        Ok(())
    }

    /// How many done records the store holds, expired ones not yet swept included.
    pub(super) fn records(&self) -> u64 {
        let records: i64 = read(&self.by_window)
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

/// The entry of a record stored apart under its full key: an encoded record is never
/// empty.
const APART: &[u8] = &[];

/// The records of the keys that share a prefix, as one sled value: for each record, the
/// rest of its key after the prefix, then its encoded [`Stored`] form with its length
/// first ([`APART`] for a large one).
struct Bucket<'a> {
    bytes: &'a [u8],
    /// The length of the prefix, which is the bucket's sled key.
    prefix: usize,
}

impl<'a> Bucket<'a> {
    fn new(bytes: &'a [u8], prefix: usize) -> Bucket<'a> {
        Bucket { bytes, prefix }
    }

    /// The records, in order, each as the rest of its key and its encoded form. An
    /// unreadable tail is treated as absent (and logged), as an unreadable record is.
    fn entries(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + use<'a> {
        let (mut rest, suffix) = (self.bytes, RECORD_KEY_LEN - self.prefix);
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let parsed = rest.split_at_checked(suffix).and_then(|(key, tail)| {
                let (record, tail) = postcard::take_from_bytes::<&[u8]>(tail).ok()?;
                Some((key, record, tail))
            });
            let Some((key, record, tail)) = parsed else {
                tracing::warn!("unreadable done records, treating them as absent");
                rest = &[];
                return None;
            };
            rest = tail;
            Some((key, record))
        })
    }

    /// The encoded record of `key`.
    fn find(&self, key: &RecordKey) -> Option<&'a [u8]> {
        let suffix = &key[self.prefix..];
        self.entries()
            .find(|(rest, _)| *rest == suffix)
            .map(|(_, record)| record)
    }

    /// The bucket with `key`'s record replaced by `record`, or removed if `None`.
    fn with(&self, key: &RecordKey, record: Option<&[u8]>) -> Vec<u8> {
        let suffix = &key[self.prefix..];
        let mut out = Vec::with_capacity(self.bytes.len() + record.map_or(0, |r| r.len() + 20));
        let kept = self.entries().filter(|(rest, _)| *rest != suffix);
        for (rest, record) in kept.chain(record.map(|record| (suffix, record))) {
            out.extend_from_slice(rest);
            out = postcard::to_extend(&record, out).expect("a byte string always serializes");
        }
        out
    }
}

/// A done record as stored, its times as small differences, which take fewer bytes
/// (44 in all for a record kept a week, instead of 53 for the record as it is).
#[derive(Serialize, Deserialize)]
struct Stored {
    /// `window.end - expires_at`, less than the window's width.
    expires_before_end: Millis,
    /// `expires_at - completed_at` (the retention), as [`compact_duration`] writes it.
    kept_for: u64,
    /// `completed_at - claimed_at`
    took: Millis,
    upstream_status: u16,
    fingerprint: Fingerprint,
    response: Option<RecordedResponse>,
}

/// A duration in milliseconds, in whole seconds when it is (as retentions usually are):
/// `seconds << 1`, else `milliseconds << 1 | 1`.
fn compact_duration(ms: Millis) -> u64 {
    if ms.is_multiple_of(1000) {
        (ms / 1000) << 1
    } else {
        ms.saturating_mul(2) | 1
    }
}

fn full_duration(compact: u64) -> Millis {
    if compact & 1 == 0 {
        (compact >> 1).saturating_mul(1000)
    } else {
        compact >> 1
    }
}

fn encode(record: &DoneRecord, window: Window) -> Vec<u8> {
    let stored = Stored {
        expires_before_end: window.end.saturating_sub(record.expires_at),
        kept_for: compact_duration(record.expires_at.saturating_sub(record.completed_at)),
        took: record.completed_at.saturating_sub(record.claimed_at),
        upstream_status: record.upstream_status,
        fingerprint: record.fingerprint,
        response: record.response.clone(),
    };
    // Sized for a record without a replayed answer: one allocation instead of four.
    postcard::to_extend(&stored, Vec::with_capacity(64)).expect("a record always serializes")
}

/// Decodes a done record of `window`; an undecodable one is treated as absent (and
/// logged) rather than blocking its key forever, since refusing the key would lose the
/// event.
fn decode(key: &[u8], bytes: &[u8], window: Window) -> Option<DoneRecord> {
    match postcard::from_bytes::<Stored>(bytes) {
        Ok(stored) => {
            let expires_at = window.end.saturating_sub(stored.expires_before_end);
            let completed_at = expires_at.saturating_sub(full_duration(stored.kept_for));
            Some(DoneRecord {
                claimed_at: completed_at.saturating_sub(stored.took),
                completed_at,
                expires_at,
                upstream_status: stored.upstream_status,
                fingerprint: stored.fingerprint,
                response: stored.response,
            })
        }
        Err(error) => {
            tracing::warn!(key = %hex::encode(key), %error, "unreadable done record, treating it as absent");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_800_000_000_000;
    const MINUTE: Millis = 60_000;

    /// A record key without a salt, as a directory from before salts files it.
    fn key_of(store_key: &str) -> RecordKey {
        record_key(b"", store_key)
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
    fn a_new_directory_gets_a_salt_of_its_own_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = salt(&open_db(&dir)).unwrap();
        assert_eq!(first.len(), 16);
        assert_eq!(salt(&open_db(&dir)).unwrap(), first, "kept across opens");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(salt(&open_db(&other)).unwrap(), first);
        assert_ne!(record_key(&first, "k"), key_of("k"));
        let (epochs, _) = Epochs::open(&open_db(&dir), NOW).unwrap();
        assert_eq!(epochs.record_key("k"), record_key(&first, "k"));
    }

    #[test]
    fn a_directory_with_records_from_before_salts_still_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let record = done(200);
        {
            let db = open_db(&dir);
            let window = Window::holding(record.expires_at, MINUTE);
            let epoch = Epoch::new(window, 2, db.open_tree(window.tree_name(2)).unwrap());
            epoch
                .write(&key_of("old"), &encode(&record, window))
                .unwrap();
            db.flush().unwrap();
        }
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db, NOW).unwrap();
        indexing.run();
        assert_eq!(
            epochs.get(&epochs.record_key("old"), NOW).unwrap(),
            Some(record)
        );
        assert_eq!(
            db.get(SALT_KEY).unwrap(),
            None,
            "no salt is adopted under old records"
        );
    }

    #[test]
    fn windows_are_about_an_eighth_of_the_retention_and_hold_their_records() {
        let day = 86_400_000;
        let window = Window::holding(1_800_000_000_000, 7 * day);
        assert!(window.width <= 7 * day / 8 && window.width > 7 * day / 16);
        assert!(window.end > 1_800_000_000_000);
        assert!(window.end - window.width <= 1_800_000_000_000);
        assert_eq!(Window::holding(5_000, 1_000).width, MIN_WIDTH);
        assert_eq!(
            Window::from_tree_name(window.tree_name(3).as_bytes()),
            Some((window, 3))
        );
        assert_eq!(Window::from_tree_name(b"done"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048.0"), None);
        assert_eq!(Window::from_tree_name(b"__sled__default"), None);
        assert_eq!(
            Window::from_keyed_tree_name(b"done.1024.2048"),
            Some(Window {
                end: 2048,
                width: 1024
            })
        );
    }

    #[test]
    fn records_read_back_as_written() {
        let record = DoneRecord {
            claimed_at: 1_800_000_000_000,
            completed_at: 1_800_000_000_250,
            expires_at: 1_800_604_800_250,
            upstream_status: 202,
            fingerprint: [9; 32],
            response: Some(RecordedResponse {
                status: 202,
                content_type: Some("application/json".into()),
                body: bytes::Bytes::from_static(b"{}"),
            }),
        };
        let week = 7 * 86_400_000;
        let window = Window::holding(record.expires_at, week);
        let bytes = encode(&record, window);
        assert_eq!(decode(b"k", &bytes, window), Some(record.clone()));
        let plain = DoneRecord {
            response: None,
            ..record.clone()
        };
        assert_eq!(encode(&plain, window).len(), 44);
        assert_eq!(
            decode(b"k", b"\xff", window),
            None,
            "unreadable reads as absent"
        );
        // A retention that is not whole seconds, in a narrow window.
        let odd = DoneRecord {
            expires_at: record.completed_at + 1_500,
            ..record
        };
        let window = Window::holding(odd.expires_at, 1_500);
        assert_eq!(decode(b"k", &encode(&odd, window), window), Some(odd));
    }

    #[test]
    fn a_bucket_keeps_each_record_apart() {
        let keys: Vec<RecordKey> = (0..5u8).map(|i| [i; 16]).collect();
        let mut bytes = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            bytes = Bucket::new(&bytes, 2).with(key, Some(&vec![i as u8; i * 100 + 1]));
        }
        let find = |bytes: &[u8], key| Bucket::new(bytes, 2).find(key).map(<[u8]>::to_vec);
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(find(&bytes, key), Some(vec![i as u8; i * 100 + 1]));
        }
        // Only the rest of each key after the prefix is kept: 14 bytes, then the record's
        // length (one byte below 128, two up to 16 KiB) and the record.
        assert_eq!(
            bytes.len(),
            5 * 14 + (1 + 1 + 2 + 2 + 2) + (1 + 101 + 201 + 301 + 401)
        );
        // Replacing a record keeps one entry for its key.
        bytes = Bucket::new(&bytes, 2).with(&keys[2], Some(b"new"));
        assert_eq!(find(&bytes, &keys[2]), Some(b"new".to_vec()));
        assert_eq!(Bucket::new(&bytes, 2).entries().count(), 5);
        // Removing one leaves the others.
        bytes = Bucket::new(&bytes, 2).with(&keys[0], None);
        assert_eq!(find(&bytes, &keys[0]), None);
        assert_eq!(find(&bytes, &keys[4]), Some(vec![4; 401]));
        assert_eq!(find(&bytes, &[9; 16]), None);
        // A torn tail (the rewritten record, now last) reads as absent; the records
        // before it still read.
        let torn = &bytes[..bytes.len() - 2];
        assert_eq!(find(torn, &keys[4]), Some(vec![4; 401]));
        assert_eq!(find(torn, &keys[2]), None);
        assert_eq!(bucket_bytes(1_000_000), 2);
        assert_eq!(bucket_bytes(10_000_000), 3);
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
        let (epochs, indexing) = Epochs::open(&db, now).unwrap();
        indexing.run();
        for (i, key) in keys.iter().enumerate() {
            epochs.put(key, &record(200 + i as u16), minute).unwrap();
        }
        epochs.put(&keys[1], &record(299), minute).unwrap();
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
        let (epochs, indexing) = Epochs::open(&db, NOW).unwrap();
        indexing.run();
        let replayed = |body: &'static [u8]| DoneRecord {
            response: Some(RecordedResponse {
                status: 200,
                content_type: Some("application/json".into()),
                body: bytes::Bytes::from_static(body),
            }),
            ..done(200)
        };
        let large = replayed(&[b'x'; 4096]);
        // Two keys sharing a bucket: one large, one small.
        let (big, small) = ([5; 16], [5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        epochs.put(&big, &large, MINUTE).unwrap();
        epochs.put(&small, &done(201), MINUTE).unwrap();
        assert_eq!(epochs.get(&big, NOW).unwrap(), Some(large.clone()));
        assert_eq!(epochs.records(), 2, "a record stored apart counts once");
        let by_window = read(&epochs.by_window);
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
            .write(&big, &encode(&replayed(b"{}"), epoch.window))
            .unwrap();
        assert_eq!(epoch.tree.get(big).unwrap(), None);
        epoch.write(&big, &encode(&large, epoch.window)).unwrap();
        drop(by_window);
        // Read back after a restart, then removed with its record.
        drop(epochs);
        let (epochs, indexing) = Epochs::open(&db, NOW).unwrap();
        indexing.run();
        assert_eq!(epochs.records(), 2);
        assert_eq!(epochs.get(&big, NOW).unwrap(), Some(large));
        assert!(epochs.remove(&big, NOW).unwrap());
        assert_eq!(epochs.get(&big, NOW).unwrap(), None);
        assert_eq!(
            epochs.get(&small, NOW).unwrap().unwrap().upstream_status,
            201
        );
        let by_window = read(&epochs.by_window);
        assert_eq!(
            by_window.values().next().unwrap().tree.len(),
            1,
            "only the bucket"
        );
        drop(by_window);
        // The sweep counts a record stored apart once.
        epochs.put(&big, &done(202), MINUTE).unwrap();
        epochs
            .put(&[6; 16], &replayed(&[b'y'; 1000]), MINUTE)
            .unwrap();
        let swept = epochs.sweep(NOW + 2 * MINUTE, 10_000).unwrap();
        assert_eq!((swept.examined, swept.removed), (3, 3));
        assert_eq!(epochs.records(), 0);
    }

    #[test]
    fn the_keyed_layout_moves_into_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let (now, minute, record) = (NOW, MINUTE, done(201));
        let window = Window::holding(record.expires_at, minute);
        let ended = Window::holding(now - minute, minute);
        let keys: Vec<RecordKey> = (0..100u32).map(|i| key_of(&format!("k{i}"))).collect();
        {
            let db = open_db(&dir);
            let keyed = db
                .open_tree(format!(
                    "{KEYED_TREE_PREFIX}{}.{}",
                    window.width, window.end
                ))
                .unwrap();
            let stale = db
                .open_tree(format!("{KEYED_TREE_PREFIX}{}.{}", ended.width, ended.end))
                .unwrap();
            for key in &keys {
                keyed.insert(key, encode(&record, window)).unwrap();
                stale.insert(key, encode(&record, ended)).unwrap();
            }
            db.flush().unwrap();
        }
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db, now).unwrap();
        indexing.run();
        assert!(
            keys.iter()
                .all(|key| epochs.get(key, now).unwrap() == Some(record.clone()))
        );
        assert_eq!(epochs.records(), 100, "the ended window was not moved");
        assert!(
            db.tree_names()
                .iter()
                .all(|name| Window::from_keyed_tree_name(name).is_none())
        );
    }

    #[test]
    fn a_filter_grows_and_never_forgets_a_key() {
        let filter = Filter::new();
        let keys: Vec<RecordKey> = (0..10_000u32).map(|i| key_of(&format!("k{i}"))).collect();
        for key in &keys[..5000] {
            filter.insert(key, || 0);
        }
        assert!(read(&filter.segments).len() > 1, "it grew");
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

    #[test]
    fn after_a_restart_keys_are_found_before_and_after_their_filters_are_built() {
        let dir = tempfile::tempdir().unwrap();
        let (now, minute, record) = (NOW, MINUTE, done(200));
        let keys: Vec<RecordKey> = (0..2000u32).map(|i| key_of(&format!("k{i}"))).collect();
        {
            let db = open_db(&dir);
            let (epochs, indexing) = Epochs::open(&db, now).unwrap();
            indexing.run();
            for key in &keys {
                epochs.put(key, &record, minute).unwrap();
            }
            db.flush().unwrap();
        }
        let db = open_db(&dir);
        let (epochs, indexing) = Epochs::open(&db, now).unwrap();
        assert!(!indexing.pending.is_empty());

        // Not indexed yet: every key is found by reading its tree.
        assert!(
            keys.iter()
                .all(|key| epochs.get(key, now).unwrap().is_some())
        );
        assert_eq!(epochs.get(&key_of("stranger"), now).unwrap(), None);
        let later = now + 2 * minute;
        let fresh = key_of("written while indexing");
        epochs.put(&fresh, &record, minute).unwrap();

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
        let by_window = read(&epochs.by_window);
        assert!(by_window.values().all(|epoch| epoch.filter.is_complete()));
        drop(by_window);
        assert_eq!(epochs.sweep(later, 10_000).unwrap().removed, 2001);
        assert_eq!(epochs.get(&keys[0], now).unwrap(), None);

        // A window the sweep reaches before the indexing thread is read in first, so
        // that its count is right when it goes.
        for key in &keys {
            epochs.put(key, &record, minute).unwrap();
        }
        drop(epochs);
        let (epochs, _never_started) = Epochs::open(&db, now).unwrap();
        assert_eq!(epochs.sweep(later, 10_000).unwrap().removed, 2000);
        assert_eq!(epochs.records(), 0);
    }
}
