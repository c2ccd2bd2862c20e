//! The delivery log on sled: the tree `delivery_log`, one value per batch the recorder
//! writes (a **chunk**), under a number from sled's `generate_id` (big-endian, so the
//! tree's order is the order written). One insert per batch, not per entry: a sled write
//! costs about as much as a tenth of a delivery here.
//!
//! A chunk is its header (the encoding's version, how many entries, the newest entry's
//! time) and then the entries, each its length and its encoding. An entry's [`LogId`] is
//! its chunk's number and its place in the chunk. Trimming removes whole chunks, oldest
//! first: those whose newest entry is older than the retention, then those whose every
//! entry is beyond the newest `keep`; and at once, whenever a write takes the tree past
//! [`MOST_BYTES`].

//! The embedded store's delivery log: append-only files in the directory `delivery_log`
//! inside the data directory, beside sled's own files but not in sled ([`segments`]).
//! A B-tree paid for an append-only stream at every batch (reading pages back into the
//! cache that the done records need, splitting nodes, syncing large nodes as blobs);
//! a file append pays one write.
//!
//! The recorder writes each batch as one **chunk**: its header (the encoding's version,
//! how many entries, the newest entry's time) and then the entries, each its length and
//! its encoding. An entry's [`LogId`] is its chunk's number and its place in the chunk.
//! Trimming removes whole chunks, oldest first: those whose newest entry is older than
//! the retention, then those whose every entry is beyond the newest `keep`; and at once,
//! whenever a write takes the files past [`MOST_BYTES`].
//!
//! Earlier versions kept the chunks in the sled tree `delivery_log`; the first open moves
//! them to the files, under the same numbers, and drops the tree.

mod segments;

use std::path::Path;

use async_trait::async_trait;
use parking_lot::Mutex;

use self::segments::{Frames, Segments};
use crate::store::log::{DeliveryLog, LogId, LoggedDelivery};
use crate::store::{Millis, StoreError};

const CHUNK_VERSION: u8 = 1;
const HEADER: usize = 1 + 4 + 8;

/// The most bytes of chunks the files keep: the oldest go beyond it, whatever the
/// retention and count, so that a burst of large bodies cannot fill the disk.
const MOST_BYTES: u64 = 64 << 20;

/// The tree earlier versions kept the chunks in.
const OLD_TREE: &str = "delivery_log";

/// The sled store's log.
pub(super) struct SledLog {
    segments: Mutex<Segments>,
}

impl SledLog {
    /// Opens the log's files in `dir`, first moving into them the chunks an earlier
    /// version kept in `db`. Blocks on disk I/O.
    pub(super) fn open(dir: &Path, db: &sled::Db) -> Result<SledLog, StoreError> {
        let failed = |error| StoreError::of("delivery log", format!("{}: {error}", dir.display()));
        let mut segments = Segments::open(dir).map_err(failed)?;
        if db
            .tree_names()
            .iter()
            .any(|name| name == OLD_TREE.as_bytes())
        {
            let tree = db.open_tree(OLD_TREE)?;
            for chunk in tree.iter() {
                let (key, chunk) = chunk?;
                // A chunk already moved by an open that stopped before the drop is
                // passed over.
                if let Some(number) = chunk_number(&key).filter(|&n| n >= segments.next_number()) {
                    segments.append_as(number, &chunk).map_err(failed)?;
                }
            }
            db.drop_tree(OLD_TREE)?;
        }
        Ok(SledLog {
            segments: Mutex::new(segments),
        })
    }
}

/// A chunk's header.
struct Header {
    entries: u32,
    newest_at: Millis,
}

impl Header {
    fn read(chunk: &[u8]) -> Option<Header> {
        if chunk.len() < HEADER || chunk[0] != CHUNK_VERSION {
            return None;
        }
        Some(Header {
            entries: u32::from_le_bytes(chunk[1..5].try_into().ok()?),
            newest_at: u64::from_le_bytes(chunk[5..13].try_into().ok()?),
        })
    }
}

fn encode_chunk(entries: &[LoggedDelivery]) -> Vec<u8> {
    let newest_at = entries.iter().map(|entry| entry.at).max().unwrap_or(0);
    // About 200 bytes an entry without a body: one allocation for most chunks.
    let bodies: usize = entries
        .iter()
        .filter_map(|entry| entry.body.as_ref())
        .map(|body| body.len())
        .sum();
    let mut chunk = Vec::with_capacity(HEADER + entries.len() * 256 + bodies);
    chunk.push(CHUNK_VERSION);
    chunk.extend((entries.len() as u32).to_le_bytes());
    chunk.extend(newest_at.to_le_bytes());
    for entry in entries {
        // The length goes before the entry, once the entry is written after it.
        let at = chunk.len();
        chunk.extend([0; 4]);
        chunk = entry.encode_into(chunk);
        let length = (chunk.len() - at - 4) as u32;
        chunk[at..at + 4].copy_from_slice(&length.to_le_bytes());
    }
    chunk
}

/// A chunk's entries, each with its place; one that does not read is `None`.
fn decode_chunk(chunk: &[u8]) -> Vec<Option<LoggedDelivery>> {
    let Some(header) = Header::read(chunk) else {
        return Vec::new();
    };
    let mut rest = &chunk[HEADER..];
    let mut entries = Vec::with_capacity(header.entries as usize);
    while rest.len() >= 4 {
        let length = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(encoded) = rest.get(4..4 + length) else {
            break;
        };
        entries.push(LoggedDelivery::decode(encoded));
        rest = &rest[4 + length..];
    }
    entries
}

fn chunk_number(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

fn failed(error: std::io::Error) -> StoreError {
    StoreError::of("delivery log", error)
}

#[async_trait]
impl DeliveryLog for SledLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let chunk = encode_chunk(entries);
        let mut segments = self.segments.lock();
        let number = segments.append(&chunk).map_err(failed)?;
        // The oldest files go as soon as the log holds too many bytes: a trim every few
        // seconds would let a burst of large bodies past the bound meanwhile.
        segments.keep_bytes(MOST_BYTES).map_err(failed)?;
        Ok((0..entries.len() as u64)
            .map(|place| LogId(number, place))
            .collect())
    }

    async fn read(
        &self,
        before: Option<LogId>,
        limit: usize,
    ) -> Result<Vec<(LogId, LoggedDelivery)>, StoreError> {
        let end = before.map_or(u64::MAX, |id| id.0);
        let (views, trimmed_before) = self.segments.lock().views(end);
        let mut found = Vec::new();
        for view in views {
            let bytes = view.read().map_err(failed)?;
            let frames: Vec<_> = Frames::new(&bytes, view.first)
                .filter(|&(number, _)| number >= trimmed_before && number <= end)
                .collect();
            for (number, chunk) in frames.into_iter().rev() {
                for (place, entry) in decode_chunk(chunk).into_iter().enumerate().rev() {
                    let id = LogId(number, place as u64);
                    if before.is_some_and(|before| id >= before) {
                        continue;
                    }
                    if let Some(entry) = entry {
                        found.push((id, entry));
                        if found.len() == limit {
                            return Ok(found);
                        }
                    }
                }
            }
        }
        Ok(found)
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let (views, trimmed_before) = self.segments.lock().views(id.0);
        let Some(view) = views.into_iter().next().filter(|_| id.0 >= trimmed_before) else {
            return Ok(None);
        };
        let bytes = view.read().map_err(failed)?;
        let chunk = Frames::new(&bytes, view.first).find(|&(number, _)| number == id.0);
        Ok(chunk.and_then(|(_, chunk)| {
            usize::try_from(id.1)
                .ok()
                .and_then(|place| decode_chunk(chunk).into_iter().nth(place).flatten())
        }))
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

    /// A data directory with sled's files and the log's directory in it.
    struct Data {
        dir: tempfile::TempDir,
        db: sled::Db,
    }

    impl Data {
        fn new() -> Data {
            let dir = tempfile::tempdir().unwrap();
            let db = sled::Config::new()
                .path(dir.path().join("db"))
                .open()
                .unwrap();
            Data { dir, db }
        }

        fn logs(&self) -> PathBuf {
            self.dir.path().join("delivery_log")
        }

        fn open(&self) -> SledLog {
            SledLog::open(&self.logs(), &self.db).unwrap()
        }

        /// The log's segment files, oldest first.
        fn segments(&self) -> Vec<PathBuf> {
            let mut files: Vec<_> = (fs::read_dir(self.logs()).unwrap())
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
                .collect();
            files.sort();
            files
        }
    }

    async fn keys(log: &SledLog) -> Vec<String> {
        (log.read(None, 1000).await.unwrap().into_iter())
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
        let third = log.append(&[entry("d", 4)]).await.unwrap();
        assert!(third[0] > second[0], "{third:?} after {second:?}");
    }

    #[tokio::test]
    async fn a_torn_last_frame_is_cut_off_and_writing_goes_on_after_it() {
        let data = Data::new();
        let log = data.open();
        log.append(&[entry("a", 1)]).await.unwrap();
        log.append(&[entry("b", 2)]).await.unwrap();
        drop(log);
        // A power cut in the middle of the last write: its frame is half there.
        let file = data.segments().pop().unwrap();
        let len = fs::metadata(&file).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(len - 10)
            .unwrap();

        let log = data.open();
        assert_eq!(keys(&log).await, ["a"]);
        log.append(&[entry("c", 3)]).await.unwrap();
        drop(log);
        // Zeros where a write never reached the disk read as the end too.
        let mut bytes = fs::read(&file).unwrap();
        bytes.extend([0; 64]);
        fs::write(&file, bytes).unwrap();
        assert_eq!(keys(&data.open()).await, ["c", "a"]);
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
        // Seen at once by a read, and cut off at the next open.
        assert_eq!(keys(&log).await, ["a"]);
        drop(log);
        assert_eq!(keys(&data.open()).await, ["a"]);
    }

    #[tokio::test]
    async fn what_a_trim_removed_stays_removed_after_a_reopen() {
        let data = Data::new();
        let log = data.open();
        let mut last = LogId(0, 0);
        for (at, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            last = log.append(&[entry(key, at as u64)]).await.unwrap()[0];
        }
        assert_eq!(log.trim(2, 1000).await.unwrap(), 2);
        assert_eq!(keys(&log).await, ["d", "c"]);
        assert_eq!(log.get(LogId(last.0 - 3, 0)).await.unwrap(), None);
        drop(log);
        let log = data.open();
        assert_eq!(keys(&log).await, ["d", "c"]);

        // Everything trimmed, the files gone: numbers still grow after a reopen.
        assert_eq!(log.trim(u64::MAX, 0).await.unwrap(), 2);
        assert!(data.segments().is_empty());
        drop(log);
        let log = data.open();
        assert!(keys(&log).await.is_empty());
        let next = log.append(&[entry("e", 5)]).await.unwrap()[0];
        assert!(next > last, "{next:?} after {last:?}");
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
        let bytes: u64 = (data.segments().iter())
            .map(|file| fs::metadata(file).unwrap().len())
            .sum();
        assert!(bytes <= MOST_BYTES, "{bytes} bytes on disk");
        let kept = keys(&log).await;
        assert_eq!(kept.first().unwrap(), &(chunks - 1).to_string());
        assert!(kept.len() < chunks - 30, "{} kept", kept.len());
        let oldest: usize = kept.last().unwrap().parse().unwrap();
        assert_eq!(oldest, chunks - kept.len(), "the newest kept, in a row");
    }

    #[tokio::test]
    async fn chunks_kept_in_sled_by_an_earlier_version_move_to_the_files() {
        let data = Data::new();
        let tree = data.db.open_tree(OLD_TREE).unwrap();
        let mut old = Vec::new();
        for key in ["a", "b"] {
            let number = data.db.generate_id().unwrap();
            tree.insert(number.to_be_bytes(), encode_chunk(&[entry(key, 1)]))
                .unwrap();
            old.push(LogId(number, 0));
        }
        drop(tree);

        let log = data.open();
        assert_eq!(keys(&log).await, ["b", "a"]);
        assert_eq!(log.get(old[0]).await.unwrap().unwrap().key.unwrap(), "a");
        assert!(!data.db.tree_names().contains(&OLD_TREE.as_bytes().into()));
        let next = log.append(&[entry("c", 2)]).await.unwrap()[0];
        assert!(next > old[1]);
        drop(log);
        assert_eq!(keys(&data.open()).await, ["c", "b", "a"]);
    }
}
