//! Stable storage for the embedded store: what makes an acknowledged write survive a power
//! loss, not only a crash of the process.
//!
//! sled's `Db::flush` writes its buffers with `sync_file_range`, which pushes the pages
//! towards the device but flushes neither the file's metadata nor the device's volatile
//! cache, and promises nothing after a power loss. So every flush that an acknowledgment
//! waits for is followed here by an `fdatasync` of the log file (`fsync` when its size
//! changed), an `fsync` of each blob file sled wrote or grew since the last sync (values
//! too large for the log go to files of their own, which sled never syncs), and of the
//! blob directory when it gained a file. At open, every file and directory sled may have
//! created is synced once, up to the first directory that already existed.
//!
//! One thread runs these flushes, because they block, and never `flush_async`, which
//! deadlocks in sled 0.34.7 under concurrent callers. Every caller that arrives while a
//! sync runs waits for the next, which serves them all (group commit). A sync that fails
//! fails every later one too: after a failed `fsync` the kernel may have dropped the
//! pages it could not write, so a later success would prove nothing about them. The store
//! reopens the database instead.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::store::{DiskSyncs, StoreError};

/// sled's log file in its directory.
const LOG_FILE: &str = "db";
/// sled's directory of values too large for the log.
const BLOB_DIR: &str = "blobs";

/// The directories from `path` up to (without) the first that exists: what opening a
/// store at `path` will create, and what must be synced once it has.
pub(super) fn missing_directories(path: &Path) -> Vec<PathBuf> {
    path.ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .map(Path::to_path_buf)
        .collect()
}

/// The files of one sled directory, as far as they are known to be on stable storage.
struct StableFiles {
    dir: PathBuf,
    log: File,
    /// The log file's size at its last sync: a different size needs its metadata too.
    log_synced_len: u64,
    /// Each blob file's size at its last sync. Blobs only grow while sled writes them, so
    /// a size that differs names one to sync again.
    blobs_synced: BTreeMap<OsString, u64>,
}

impl StableFiles {
    /// Syncs, after sled has opened `dir`, every file it holds, the blob directory and
    /// `dir` itself, and the parent of each directory in `created` (those that opening it
    /// made): until then, a power loss could take the names of what sled wrote.
    fn open(dir: &Path, created: &[PathBuf]) -> io::Result<StableFiles> {
        let mut files = StableFiles {
            dir: dir.to_path_buf(),
            log: File::open(dir.join(LOG_FILE))?,
            log_synced_len: 0,
            blobs_synced: BTreeMap::new(),
        };
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                File::open(entry.path())?.sync_all()?;
            }
        }
        files.sync_blobs(true)?;
        sync_directory(dir)?;
        for made in created {
            if let Some(parent) = made.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_directory(parent)?;
            }
        }
        files.log_synced_len = files.log.metadata()?.len();
        Ok(files)
    }

    /// Makes what sled has written so far stable (call after `Db::flush`).
    fn sync(&mut self) -> io::Result<()> {
        self.sync_blobs(false)?;
        let len = self.log.metadata()?.len();
        if len == self.log_synced_len {
            self.log.sync_data()
        } else {
            self.log.sync_all()?;
            self.log_synced_len = len;
            Ok(())
        }
    }

    /// Syncs each blob file that is new or has grown since its last sync, then the blob
    /// directory if it gained one (or `always`). Blobs removed meanwhile are forgotten.
    fn sync_blobs(&mut self, always: bool) -> io::Result<()> {
        let blob_dir = self.dir.join(BLOB_DIR);
        let entries = match std::fs::read_dir(&blob_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        let mut listed = BTreeMap::new();
        let mut named_anew = false;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(len) = gone_is_none(entry.metadata())?.map(|meta| meta.len()) else {
                continue;
            };
            let synced = self.blobs_synced.get(&name).copied();
            if synced != Some(len) {
                // Removed by sled since it was listed: nothing of it to keep.
                if let Some(file) = gone_is_none(File::open(entry.path()))? {
                    file.sync_all()?;
                }
                named_anew |= synced.is_none();
            }
            listed.insert(name, len);
        }
        if named_anew || always {
            sync_directory(&blob_dir)?;
        }
        self.blobs_synced = listed;
        Ok(())
    }
}

/// `Ok(None)` for a file that is not there (any more).
fn gone_is_none<T>(result: io::Result<T>) -> io::Result<Option<T>> {
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
}

type Waiter = oneshot::Sender<Result<(), String>>;

/// Makes writes stable before they are acknowledged, one sync for every caller waiting.
pub(super) struct GroupFlusher {
    waiters: mpsc::Sender<Waiter>,
}

impl GroupFlusher {
    /// Syncs what opening `dir` wrote (`created`: the directories it made), then starts
    /// the thread that serves [`GroupFlusher::flush`]. Blocks on disk I/O.
    pub(super) fn start(
        db: sled::Db,
        dir: &Path,
        created: &[PathBuf],
        counters: Arc<SyncCounters>,
    ) -> Result<GroupFlusher, StoreError> {
        let failed = |error: io::Error| {
            StoreError::Backend(format!("cannot sync the data directory to disk: {error}"))
        };
        db.flush()?;
        let mut files = StableFiles::open(dir, created).map_err(failed)?;
        let (waiters, queue) = mpsc::channel::<Waiter>();
        std::thread::Builder::new()
            .name("sled-sync".into())
            .spawn(move || {
                let mut failure: Option<String> = None;
                // Ends when the store is dropped and the channel closes.
                while let Ok(first) = queue.recv() {
                    let mut batch = vec![first];
                    batch.extend(queue.try_iter());
                    if failure.is_none() {
                        let began = Instant::now();
                        let synced = db
                            .flush()
                            .map_err(|error| error.to_string())
                            .and_then(|_| files.sync().map_err(|error| error.to_string()));
                        counters.syncs.fetch_add(1, Ordering::Relaxed);
                        let nanos = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        counters.nanos.fetch_add(nanos, Ordering::Relaxed);
                        if let Err(error) = synced {
                            counters.failures.fetch_add(1, Ordering::Relaxed);
                            failure = Some(format!("syncing the data directory failed: {error}"));
                        }
                    }
                    counters
                        .waiters
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let result = failure.clone().map_or(Ok(()), Err);
                    for waiter in batch {
                        let _ = waiter.send(result.clone());
                    }
                }
            })
            .map_err(failed)?;
        Ok(GroupFlusher { waiters })
    }

    /// Returns once everything written before the call is on stable storage.
    pub(super) async fn flush(&self) -> Result<(), StoreError> {
        let stopped = || StoreError::Backend("the sync thread has stopped".into());
        let (done, synced) = oneshot::channel();
        self.waiters.send(done).map_err(|_| stopped())?;
        synced
            .await
            .map_err(|_| stopped())?
            .map_err(StoreError::Backend)
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
    }

    #[test]
    fn a_blob_is_synced_again_when_it_grows_and_forgotten_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOG_FILE), b"log").unwrap();
        let blobs = dir.path().join(BLOB_DIR);
        std::fs::create_dir(&blobs).unwrap();
        std::fs::write(blobs.join("7"), b"ab").unwrap();
        let mut files = StableFiles::open(dir.path(), &[]).unwrap();
        assert_eq!(files.blobs_synced.get(&OsString::from("7")), Some(&2));
        std::fs::write(blobs.join("7"), b"abcd").unwrap();
        std::fs::write(blobs.join("9"), b"x").unwrap();
        files.sync().unwrap();
        assert_eq!(files.blobs_synced.get(&OsString::from("7")), Some(&4));
        assert_eq!(files.blobs_synced.get(&OsString::from("9")), Some(&1));
        std::fs::remove_file(blobs.join("7")).unwrap();
        std::fs::write(dir.path().join(LOG_FILE), b"longer log").unwrap();
        files.sync().unwrap();
        assert!(!files.blobs_synced.contains_key(&OsString::from("7")));
        assert_eq!(files.log_synced_len, 10);
    }
}
