//! The embedded store's delivery log: append-only files in the directory `delivery_log`
//! of the data directory, beside sled's files but not in sled ([`segments`]). A B-tree
//! paid for an append-only stream at every batch (reading pages back into the cache that
//! the done records need, splitting nodes, syncing large nodes as blobs); a file append
//! pays one write. sled's lock on the data directory keeps other processes out of it.
//!
//! The recorder writes each batch as one [`chunk`](crate::store::log::chunk). An entry's [`LogId`] is its chunk's
//! number and its place in the chunk. Trimming removes whole chunks, oldest first: those
//! whose newest entry is older than the retention, then those whose every entry is beyond
//! the newest `keep`; and the oldest files at once, whenever a write takes the files past
//! [`MOST_BYTES`].
//!
//! Earlier versions kept the chunks in the sled tree `delivery_log`; the first open moves
//! them to the files, under the same numbers, syncs the files and drops the tree.

mod segments;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use self::segments::{Frames, SegmentView, Segments};
use crate::store::log::chunk::{ChunkVersion, decode_chunk, encode_chunk, entry_at, newest_first};
use crate::store::log::{DeliveryLog, LogId, LogRead, LoggedDelivery};
use crate::store::{Millis, StoreError};

/// The log's directory, inside the data directory.
pub(super) const DIRECTORY: &str = "delivery_log";

/// The most bytes of chunks the files keep (and the file being written, which may pass it
/// by a batch): the oldest files go beyond it, whatever the retention and count, so that
/// a burst of large bodies cannot fill the disk.
const MOST_BYTES: u64 = 64 << 20;

/// The tree earlier versions kept the chunks in.
const OLD_TREE: &str = "delivery_log";

/// The embedded store's log, in files.
pub(super) struct FileLog {
    segments: Mutex<Segments>,
    /// The file the last read read, kept for the next: a listing reads the same file
    /// in several calls.
    last_read: Mutex<Option<(SegmentView, Arc<Vec<u8>>)>>,
}

impl FileLog {
    /// Opens the log's files in `data`'s [`DIRECTORY`], first moving into them the chunks
    /// an earlier version kept in `db`. Blocks on disk I/O.
    pub(super) fn open(data: &Path, db: &sled::Db) -> Result<FileLog, StoreError> {
        let dir = data.join(DIRECTORY);
        let in_dir = |error| StoreError::of("delivery log", format!("{}: {error}", dir.display()));
        let mut segments = Segments::open(&dir).map_err(in_dir)?;
        if (db.tree_names().iter()).any(|name| name == OLD_TREE.as_bytes()) {
            let tree = db.open_tree(OLD_TREE)?;
            for chunk in tree.iter() {
                let (key, chunk) = chunk?;
                // A chunk already moved by an open that stopped before the drop is
                // passed over.
                let number = chunk_number(&key).filter(|&n| n >= segments.next_number());
                if let Some(number) = number {
                    segments.append_as(number, &chunk).map_err(in_dir)?;
                }
            }
            // The files hold the chunks before the tree goes.
            segments.sync().map_err(in_dir)?;
            db.drop_tree(OLD_TREE)?;
        }
        Ok(FileLog {
            segments: Mutex::new(segments),
            last_read: Mutex::new(None),
        })
    }

    /// The bytes of `view`'s file, from the last read when it read the same.
    fn bytes(&self, view: &SegmentView) -> Result<Arc<Vec<u8>>, StoreError> {
        if let Some((read, bytes)) = &*self.last_read.lock()
            && read.same(view)
        {
            return Ok(Arc::clone(bytes));
        }
        let bytes = Arc::new(view.read().map_err(failed)?);
        *self.last_read.lock() = Some((view.clone(), Arc::clone(&bytes)));
        Ok(bytes)
    }
}

fn chunk_number(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

fn failed(error: std::io::Error) -> StoreError {
    StoreError::of("delivery log", error)
}

#[async_trait]
impl DeliveryLog for FileLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let chunk = encode_chunk(ChunkVersion::Files, entries);
        let mut segments = self.segments.lock();
        let number = segments.append(&chunk).map_err(failed)?;
        // The oldest files go as soon as the log holds too many bytes: a trim every few
        // seconds would let a burst of large bodies past the bound meanwhile. The entries
        // are stored whether or not that works.
        if let Err(error) = segments.keep_bytes(MOST_BYTES) {
            tracing::warn!(%error, "removing the delivery log's oldest file failed");
        }
        Ok((0..entries.len() as u64)
            .map(|place| LogId(number, place))
            .collect())
    }

    async fn read(&self, before: Option<LogId>, limit: usize) -> Result<LogRead, StoreError> {
        let end = before.map_or(u64::MAX, |id| id.0);
        let views = self.segments.lock().views(end);
        let mut found = Vec::new();
        for view in &views.segments {
            let bytes = self.bytes(view)?;
            let frames: Vec<_> = Frames::new(&bytes, view.first)
                .filter(|&(number, _)| number >= views.trimmed_before && number <= end)
                .collect();
            for (number, chunk) in frames.into_iter().rev() {
                if newest_first(
                    LogId(number, 0),
                    decode_chunk(chunk),
                    before,
                    limit,
                    &mut found,
                ) {
                    let more_before = found.last().map(|&(id, _)| id);
                    return Ok(LogRead {
                        entries: found,
                        more_before,
                    });
                }
            }
        }
        // Every kept chunk was looked at.
        Ok(LogRead {
            entries: found,
            more_before: None,
        })
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let views = self.segments.lock().views(id.0);
        let Some(view) = (views.segments.first()).filter(|_| id.0 >= views.trimmed_before) else {
            return Ok(None);
        };
        let bytes = self.bytes(view)?;
        let chunk = Frames::new(&bytes, view.first).find(|&(number, _)| number == id.0);
        Ok(chunk.and_then(|(_, chunk)| entry_at(chunk, id.1)))
    }

    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError> {
        self.segments.lock().trim(older_than, keep).map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::*;

    fn entry(key: &str, at: Millis) -> LoggedDelivery {
        LoggedDelivery::sample(key, at, 3)
    }

    /// A data directory: sled's files and the log's directory.
    struct Data {
        dir: tempfile::TempDir,
        db: sled::Db,
    }

    impl Data {
        fn new() -> Data {
            let dir = tempfile::tempdir().unwrap();
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            Data { dir, db }
        }

        fn open(&self) -> FileLog {
            FileLog::open(self.dir.path(), &self.db).unwrap()
        }

        /// The log's segment files, oldest first.
        fn segments(&self) -> Vec<PathBuf> {
            let mut files: Vec<_> = (fs::read_dir(self.dir.path().join(DIRECTORY)).unwrap())
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
                .collect();
            files.sort();
            files
        }

        fn bytes(&self) -> u64 {
            (self.segments().iter())
                .map(|file| fs::metadata(file).unwrap().len())
                .sum()
        }
    }

    async fn keys(log: &FileLog) -> Vec<String> {
        (log.read(None, 1000).await.unwrap().entries.into_iter())
            .map(|(_, entry)| entry.key.unwrap())
            .collect()
    }

    #[tokio::test]
    async fn entries_read_back_after_a_reopen_and_ids_keep_growing() {
        let data = Data::new();
        let log = data.open();
        let first = log.append(&[entry("a", 1), entry("b", 2)]).await.unwrap();
        let second = log.append(&[entry("c", 3)]).await.unwrap();
        drop(log);

        let log = data.open();
        assert_eq!(keys(&log).await, ["c", "b", "a"]);
        assert_eq!(log.get(first[1]).await.unwrap().unwrap().key.unwrap(), "b");
        // Ids an operator makes up name nothing, whatever their size.
        for made_up in [LogId(0, 0), LogId(u64::MAX, u64::MAX), LogId(first[0].0, 2)] {
            assert_eq!(log.get(made_up).await.unwrap(), None, "{made_up}");
        }
        assert_eq!(
            log.read(Some(LogId(0, 0)), 10).await.unwrap(),
            LogRead::default()
        );
        let third = log.append(&[entry("d", 4)]).await.unwrap();
        assert!(third[0] > second[0], "{third:?} after {second:?}");
    }

    #[tokio::test]
    async fn a_torn_last_frame_is_cut_off_its_id_not_given_again() {
        let data = Data::new();
        let log = data.open();
        log.append(&[entry("a", 1)]).await.unwrap();
        let torn = log.append(&[entry("b", 2)]).await.unwrap()[0];
        drop(log);
        // A power cut in the middle of the last write: its frame is half there.
        let file = data.segments().pop().unwrap();
        let len = fs::metadata(&file).unwrap().len();
        let cut = fs::OpenOptions::new().write(true).open(&file).unwrap();
        cut.set_len(len - 10).unwrap();

        let log = data.open();
        assert_eq!(keys(&log).await, ["a"]);
        let next = log.append(&[entry("c", 3)]).await.unwrap()[0];
        assert!(next > torn, "{next:?} after the lost {torn:?}");
        drop(log);
        // Zeros where a write never reached the disk read as the end too.
        let mut bytes = fs::read(&file).unwrap();
        bytes.extend([0; 64]);
        fs::write(&file, bytes).unwrap();
        let log = data.open();
        log.append(&[entry("d", 4)]).await.unwrap();
        assert_eq!(keys(&log).await, ["d", "c", "a"]);
    }

    #[tokio::test]
    async fn a_frame_whose_bytes_changed_ends_its_file() {
        let data = Data::new();
        let log = data.open();
        for key in ["a", "b", "c"] {
            log.append(&[entry(key, 1)]).await.unwrap();
        }
        let file = data.segments().pop().unwrap();
        let mut bytes = fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        fs::write(&file, bytes).unwrap();
        // Seen by a read at once; cut off at the next open, so that what follows reads.
        drop(log);
        let log = data.open();
        assert_eq!(keys(&log).await, ["a"]);
        log.append(&[entry("d", 1)]).await.unwrap();
        drop(log);
        assert_eq!(keys(&data.open()).await, ["d", "a"]);
    }

    #[tokio::test]
    async fn what_a_trim_removed_stays_removed_after_a_reopen() {
        let data = Data::new();
        let log = data.open();
        let mut ids = Vec::new();
        for (at, key) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            ids.extend(log.append(&[entry(key, at as u64)]).await.unwrap());
        }
        // By age, then by count.
        assert_eq!(log.trim(1, 1000).await.unwrap(), 1);
        assert_eq!(log.trim(0, 3).await.unwrap(), 1);
        assert_eq!(keys(&log).await, ["e", "d", "c"]);
        assert_eq!(log.get(ids[1]).await.unwrap(), None);
        assert!(log.get(ids[2]).await.unwrap().is_some());
        drop(log);
        let log = data.open();
        assert_eq!(keys(&log).await, ["e", "d", "c"]);

        // Everything trimmed, the files gone: numbers still grow after a reopen.
        assert_eq!(log.trim(u64::MAX, 0).await.unwrap(), 3);
        assert!(data.segments().is_empty());
        drop(log);
        let log = data.open();
        assert!(keys(&log).await.is_empty());
        let next = log.append(&[entry("f", 5)]).await.unwrap()[0];
        assert!(next > ids[4], "{next:?} after {:?}", ids[4]);
    }

    #[tokio::test]
    async fn a_file_takes_an_hour_of_entries_so_that_expired_ones_leave_the_disk() {
        let data = Data::new();
        let log = data.open();
        let hour = 60 * 60 * 1000;
        log.append(&[entry("a", 1)]).await.unwrap();
        log.append(&[entry("b", hour / 2)]).await.unwrap();
        log.append(&[entry("c", hour + 1)]).await.unwrap();
        assert_eq!(data.segments().len(), 2);
        assert_eq!(log.trim(hour, 1000).await.unwrap(), 2);
        assert_eq!(data.segments().len(), 1, "the expired file is gone");
        assert_eq!(keys(&log).await, ["c"]);
    }

    #[tokio::test]
    async fn the_files_keep_their_byte_bound_oldest_first() {
        let data = Data::new();
        let log = data.open();
        // Chunks of about 256 KiB: four to a file.
        let big = |key: &str| LoggedDelivery::sample(key, 1, 256 << 10);
        let chunks = (MOST_BYTES / (256 << 10)) as usize + 40;
        for n in 0..chunks {
            log.append(&[big(&n.to_string())]).await.unwrap();
        }
        let bytes = data.bytes();
        assert!(bytes <= MOST_BYTES, "{bytes} bytes on disk");
        assert!(bytes > MOST_BYTES - (2 << 20), "only {bytes} bytes kept");
        let kept = keys(&log).await;
        assert_eq!(kept.first().unwrap(), &(chunks - 1).to_string());
        let oldest: usize = kept.last().unwrap().parse().unwrap();
        assert_eq!(oldest, chunks - kept.len(), "the newest kept, in a row");
    }

    /// Chunks as an earlier version kept them in sled.
    fn old_chunks(data: &Data, keys: &[&str]) -> Vec<LogId> {
        let tree = data.db.open_tree(OLD_TREE).unwrap();
        let mut ids = Vec::new();
        for key in keys {
            let number = data.db.generate_id().unwrap();
            tree.insert(
                number.to_be_bytes(),
                encode_chunk(ChunkVersion::Files, &[entry(key, 1)]),
            )
            .unwrap();
            ids.push(LogId(number, 0));
        }
        ids
    }

    #[tokio::test]
    async fn chunks_kept_in_sled_by_an_earlier_version_move_to_the_files() {
        let data = Data::new();
        let old = old_chunks(&data, &["a", "b"]);
        let log = data.open();
        assert_eq!(keys(&log).await, ["b", "a"]);
        assert_eq!(log.get(old[0]).await.unwrap().unwrap().key.unwrap(), "a");
        assert!(!data.db.tree_names().contains(&OLD_TREE.as_bytes().into()));
        let next = log.append(&[entry("c", 2)]).await.unwrap()[0];
        assert!(next > old[1]);
        drop(log);
        assert_eq!(keys(&data.open()).await, ["c", "b", "a"]);
    }

    #[tokio::test]
    async fn a_move_cut_short_goes_on_without_moving_a_chunk_twice() {
        let data = Data::new();
        let old = old_chunks(&data, &["a", "b"]);
        // The first chunk reached the files before the process stopped; the tree stayed.
        let mut moved = Segments::open(&data.dir.path().join(DIRECTORY)).unwrap();
        let chunk = data
            .db
            .open_tree(OLD_TREE)
            .unwrap()
            .first()
            .unwrap()
            .unwrap()
            .1;
        moved.append_as(old[0].0, &chunk).unwrap();
        drop(moved);

        let log = data.open();
        assert_eq!(keys(&log).await, ["b", "a"]);
        assert!(!data.db.tree_names().contains(&OLD_TREE.as_bytes().into()));
    }
}
