//! Stable storage for the embedded store: what makes an acknowledged write survive a power
//! loss, not only a crash of the process.
//!
//! sled's `Db::flush` writes its buffers with `sync_file_range`, which pushes the pages
//! towards the device but flushes neither the file's metadata nor the device's volatile
//! cache, and promises nothing after a power loss. So every flush that an acknowledgment
//! waits for is followed here by an `fdatasync` of the log file (`fsync` when its size
//! changed). Values too large for the log go to blob files of their own, which the
//! patched sled (`vendor/sled`) syncs, with their directory, before its log names them.
//! At open, every file sled holds, its directories and the data directory's parent are
//! synced once (also what an earlier, unpatched build wrote).
//!
//! One thread runs these syncs, because they block, and never `flush_async`, which
//! deadlocks in sled 0.34.7 under concurrent callers. Every caller that arrives while a
//! sync runs waits for the next, which serves them all (group commit). A sync that fails
//! fails every later one on that database: after a failed `fsync` the kernel may have
//! marked the pages it could not write clean, so a later success would prove nothing
//! about them. The store reopens the directory instead, after [`forget_cached`] has
//! dropped those pages from the page cache, so that it reads what the disk holds.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::store::{DiskSyncs, StoreError};

/// sled's log file in its directory.
const LOG_FILE: &str = "db";
/// sled's directory of values too large for the log.
const BLOB_DIR: &str = "blobs";
/// The longest a write waits for its sync: a disk slower than this is failing, and the
/// request that waits holds a place the proxy's limits count.
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The directories from `path` up to (without) the first that exists: what opening a
/// store at `path` will create. Read before sled opens it.
pub(super) fn missing_directories(path: &Path) -> Vec<PathBuf> {
    path.ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .map(Path::to_path_buf)
        .collect()
}

/// Drops the pages of the files in `dir` from the page cache (`POSIX_FADV_DONTNEED`), so
/// that opening it again reads the disk: after a failed sync, the kernel may keep the
/// pages it could not write, clean, and readable as if they were on disk. Best effort.
pub(super) fn forget_cached(dir: &Path) {
    let mut files: Vec<PathBuf> = vec![dir.join(LOG_FILE)];
    if let Ok(blobs) = std::fs::read_dir(dir.join(BLOB_DIR)) {
        files.extend(blobs.flatten().map(|entry| entry.path()));
    }
    for path in files {
        if let Ok(file) = File::open(&path) {
            let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
        }
    }
}

/// The files of one sled directory, as far as they are known to be on stable storage.
struct StableFiles {
    dir: PathBuf,
    log: File,
    /// The log file's size at its last sync. `fdatasync` keeps a new size on Linux too,
    /// but POSIX leaves that to the system: where the size changed, `fsync` asks for it.
    log_synced_len: u64,
}

impl StableFiles {
    /// Syncs, after sled has opened `dir`, every file it holds, the blob directory, `dir`
    /// itself, its parent, and the parent of each directory in `created` (those opening it
    /// made): until then, a power loss could take the names of what sled wrote.
    fn open(dir: &Path, created: &[PathBuf]) -> io::Result<StableFiles> {
        let mut files = StableFiles {
            dir: dir.to_path_buf(),
            log: File::open(dir.join(LOG_FILE))?,
            log_synced_len: 0,
        };
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                File::open(entry.path())?.sync_all()?;
            }
        }
        files.sync_blobs()?;
        sync_directory(dir)?;
        for made in created.iter().map(PathBuf::as_path).chain([dir]) {
            sync_directory(parent(made))?;
        }
        files.log_synced_len = files.log.metadata()?.len();
        Ok(files)
    }

    /// Syncs every blob file and their directory, as they are (at open).
    fn sync_blobs(&self) -> io::Result<()> {
        let blob_dir = self.dir.join(BLOB_DIR);
        let Some(entries) = unless_gone(std::fs::read_dir(&blob_dir))? else {
            return Ok(());
        };
        for entry in entries {
            File::open(entry?.path())?.sync_all()?;
        }
        sync_directory(&blob_dir)
    }

    /// Makes sled's log stable (call after `Db::flush`); the patched sled syncs its blob
    /// files as it writes them.
    fn sync(&mut self) -> io::Result<()> {
        let len = self.log.metadata()?.len();
        if len == self.log_synced_len {
            self.log.sync_data()
        } else {
            self.log.sync_all()?;
            self.log_synced_len = len;
            Ok(())
        }
    }
}

/// A path's directory: `.` for a relative path of one part.
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// `Ok(None)` for a file that is not there (any more).
fn unless_gone<T>(result: io::Result<T>) -> io::Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// `fsync` of a directory: makes the names in it stable.
fn sync_directory(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What the syncs have done since the store opened, kept across reopenings.
#[derive(Default)]
pub(super) struct SyncCounters {
    syncs: AtomicU64,
    waiters: AtomicU64,
    nanos: AtomicU64,
    failures: AtomicU64,
}

impl SyncCounters {
    pub(super) fn read(&self) -> DiskSyncs {
        DiskSyncs {
            syncs: self.syncs.load(Ordering::Relaxed),
            waiters: self.waiters.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
            failures: self.failures.load(Ordering::Relaxed),
        }
    }

    /// Counts a sync (or a failed one) that took `took`.
    fn count(&self, took: Duration, failed: bool) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        if failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

type Waiter = oneshot::Sender<Result<(), String>>;

/// Makes writes stable before they are acknowledged, one sync for every caller waiting.
pub(super) struct SyncGroup {
    waiters: mpsc::Sender<Waiter>,
}

impl SyncGroup {
    /// Syncs what opening `dir` wrote (`created`: the directories it made), then starts
    /// the thread that serves [`SyncGroup::sync`]. Blocks on disk I/O.
    pub(super) fn start(
        db: sled::Db,
        dir: &Path,
        created: &[PathBuf],
        counters: Arc<SyncCounters>,
    ) -> Result<SyncGroup, StoreError> {
        let began = Instant::now();
        let opened = db
            .flush()
            .map_err(io::Error::other)
            .and_then(|_| StableFiles::open(dir, created));
        counters.count(began.elapsed(), opened.is_err());
        let mut files = opened.map_err(|error| {
            StoreError::Backend(format!("syncing the data directory failed: {error}"))
        })?;
        let (waiters, queue) = mpsc::channel::<Waiter>();
        std::thread::Builder::new()
            .name("sled-sync".into())
            .spawn(move || {
                let failed = serve(&db, &mut files, &queue, &counters);
                close(db, failed);
            })
            .map_err(|error| {
                StoreError::Backend(format!("cannot start the sync thread: {error}"))
            })?;
        Ok(SyncGroup { waiters })
    }

    /// Returns once everything written before the call is on stable storage.
    pub(super) async fn sync(&self) -> Result<(), StoreError> {
        let stopped = || StoreError::Backend("the sync thread has stopped".into());
        let (done, synced) = oneshot::channel();
        self.waiters.send(done).map_err(|_| stopped())?;
        match tokio::time::timeout(SYNC_WAIT, synced).await {
            Ok(answer) => answer.map_err(|_| stopped())?.map_err(StoreError::Backend),
            Err(_) => Err(StoreError::Backend(format!(
                "the disk did not finish a sync within {SYNC_WAIT:?}"
            ))),
        }
    }
}

/// Answers waiters, a batch per sync, until the store drops the channel; returns whether
/// a sync failed (after which every waiter is told so, and nothing is synced again).
fn serve(
    db: &sled::Db,
    files: &mut StableFiles,
    queue: &mpsc::Receiver<Waiter>,
    counters: &SyncCounters,
) -> bool {
    let mut failure: Option<String> = None;
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        batch.extend(queue.try_iter());
        if failure.is_none() {
            let began = Instant::now();
            let synced = db
                .flush()
                .map_err(|error| error.to_string())
                .and_then(|_| files.sync().map_err(|error| error.to_string()));
            counters.count(began.elapsed(), synced.is_err());
            if let Err(error) = synced {
                failure = Some(format!("syncing the data directory failed: {error}"));
            }
        }
        counters
            .waiters
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let answer = failure.clone().map_or(Ok(()), Err);
        for waiter in batch {
            let _ = waiter.send(answer.clone());
        }
    }
    failure.is_some()
}

/// Lets go of the database, usually its last handle. After a failed sync, sled's own
/// sync as it closes fails too, and sled panics on it: caught here, on this thread of
/// ours, and said plainly instead.
fn close(db: sled::Db, failed: bool) {
    if !failed {
        return drop(db);
    }
    let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(db)));
    if closed.is_err() {
        tracing::warn!(
            "sled could not sync its log while closing the database whose sync failed (the panic above is sled's); the store reopens from the disk"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_to_create_stop_at_the_first_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a").join("b").join("c");
        assert_eq!(
            missing_directories(&deep),
            vec![
                deep.clone(),
                dir.path().join("a").join("b"),
                dir.path().join("a")
            ]
        );
        assert!(missing_directories(dir.path()).is_empty());
        assert_eq!(parent(Path::new("data")), Path::new("."));
        assert_eq!(parent(Path::new("a/data")), Path::new("a"));
    }
}
