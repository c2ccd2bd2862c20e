//! The delivery log's files: chunks ([`super::chunk`]) appended to **segment** files in
//! one directory, each file named by the number of its first chunk, the oldest files
//! removed whole.
//!
//! A chunk is written as a frame: its number, its length, a CRC-32 of those and of the
//! chunk, then the chunk. A chunk's number is the time it was written in microseconds, or
//! one more than the number before when the clock has not passed it: numbers grow from
//! chunk to chunk, across files and restarts, and a number a power cut took is not given
//! again (unless the clock went back meanwhile). Nothing is synced: the log is a record
//! for operators, not a promise to a sender, so a power cut may take its last chunks; a
//! frame that does not check (torn, or never written) ends its file, which is cut back to
//! the frames before it at open.
//!
//! Trimming removes whole files, and within the oldest file it moves a mark, kept in
//! the file `trimmed`: chunks numbered below it are gone to every read. A file takes
//! chunks for an hour at most, so that what a trim passed leaves the disk within the
//! hour.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::store::Millis;
use crate::store::log::chunk::summary;

/// A frame's header: the chunk's number, its length, and the CRC-32 of both and the chunk.
const FRAME_HEADER: usize = 8 + 4 + 4;
/// A segment takes no new chunk once it holds this many bytes.
const SEGMENT_BYTES: u64 = 1 << 20;
/// A segment takes no new chunk an hour after its first (in the entries' time).
const SEGMENT_MILLIS: Millis = 60 * 60 * 1000;
/// The file holding the trim mark: the first chunk number still kept, little-endian.
const TRIM_MARK_FILE: &str = "trimmed";
/// How a segment's file name ends, after its first chunk's number.
const EXTENSION: &str = "log";

/// One file of chunks.
struct Segment {
    /// The number of its first chunk, which names its file.
    first: u64,
    file: Arc<File>,
    /// The bytes of its whole frames: reads stop there, and the next frame goes there.
    len: u64,
    /// The entries of its chunks not trimmed.
    entries: u64,
    /// The newest entry's time in its first chunk, and in all its chunks.
    started_at: Option<Millis>,
    newest_at: Millis,
    /// A failed write could not be cut off: the next chunk starts a new file.
    sealed: bool,
}

impl Segment {
    fn new(first: u64, file: File) -> Segment {
        Segment {
            first,
            file: Arc::new(file),
            len: 0,
            entries: 0,
            started_at: None,
            newest_at: 0,
            sealed: false,
        }
    }

    /// Counts a chunk of it in: its entries if it is not trimmed, its time.
    fn count(&mut self, chunk: &[u8], trimmed: bool) -> u64 {
        let (entries, newest_at) = summary(chunk);
        self.started_at.get_or_insert(newest_at);
        self.newest_at = self.newest_at.max(newest_at);
        if trimmed {
            return 0;
        }
        self.entries += entries;
        entries
    }

    /// Whether the next chunk, with entries up to `at`, goes to a new file.
    fn full(&self, at: Millis) -> bool {
        self.sealed
            || self.len >= SEGMENT_BYTES
            || (self.started_at).is_some_and(|started| at.saturating_sub(started) >= SEGMENT_MILLIS)
    }
}

/// A segment as a read sees it: the bytes written when the read began.
#[derive(Clone)]
pub(super) struct SegmentView {
    pub(super) first: u64,
    file: Arc<File>,
    len: u64,
}

impl SegmentView {
    /// Its bytes; a file removed by a trim meanwhile still reads through its handle.
    pub(super) fn read(&self) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0; self.len as usize];
        self.file.read_exact_at(&mut bytes, 0)?;
        Ok(bytes)
    }

    /// Whether `other` is the same file with the same bytes.
    pub(super) fn same(&self, other: &SegmentView) -> bool {
        self.first == other.first && self.len == other.len
    }
}

/// What a read sees: the files that may hold the chunks it asks for, newest first, and
/// the first number not trimmed.
pub(super) struct Views {
    pub(super) segments: Vec<SegmentView>,
    pub(super) trimmed_before: u64,
}

/// The log's files, their totals and where the next chunk goes.
pub(super) struct Segments {
    dir: PathBuf,
    /// Oldest first; the last takes the next chunk.
    segments: VecDeque<Segment>,
    next_number: u64,
    /// Chunks numbered below it are trimmed.
    trimmed_before: u64,
    /// The entries not trimmed.
    entries: u64,
    /// The bytes of the files.
    bytes: u64,
}

impl Segments {
    /// Opens the files in `dir` (made if missing), cutting a torn frame off the end of a
    /// file and removing files with no chunk left.
    pub(super) fn open(dir: &Path) -> io::Result<Segments> {
        fs::create_dir_all(dir)?;
        let trimmed_before = read_mark(dir)?;
        let mut numbers = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            if let Some(first) = name.to_str().and_then(segment_number) {
                numbers.push(first);
            }
        }
        numbers.sort_unstable();
        let mut opened = Segments {
            dir: dir.to_owned(),
            segments: VecDeque::new(),
            next_number: trimmed_before,
            trimmed_before,
            entries: 0,
            bytes: 0,
        };
        let mut lowest = 0;
        for first in numbers {
            if let Some(last) = opened.open_segment(first, lowest)? {
                lowest = last.saturating_add(1);
                opened.next_number = opened.next_number.max(lowest);
            }
        }
        Ok(opened)
    }

    /// Opens the file of chunks numbered from `first`, none below `lowest` (numbered above
    /// every chunk of the files before it); returns its last chunk's number, if any.
    fn open_segment(&mut self, first: u64, lowest: u64) -> io::Result<Option<u64>> {
        let path = self.path(first);
        let mut file = OpenOptions::new().read(true).append(true).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut segment = Segment::new(first, file);
        let mut frames = Frames::new(&bytes, lowest.max(first));
        let mut last = None;
        for (number, chunk) in frames.by_ref() {
            self.entries += segment.count(chunk, number < self.trimmed_before);
            last = Some(number);
        }
        segment.len = frames.read;
        if segment.entries == 0 {
            // Every chunk of it trimmed, or none there.
            remove(&path)?;
            return Ok(last);
        }
        if segment.len < bytes.len() as u64 {
            segment.file.set_len(segment.len)?;
        }
        self.bytes += segment.len;
        self.segments.push_back(segment);
        Ok(last)
    }

    fn path(&self, first: u64) -> PathBuf {
        self.dir.join(format!("{first:020}.{EXTENSION}"))
    }

    /// The lowest number the next chunk may get.
    pub(super) fn next_number(&self) -> u64 {
        self.next_number
    }

    /// Appends `chunk` under the next number and returns it.
    pub(super) fn append(&mut self, chunk: &[u8]) -> io::Result<u64> {
        let number = self.next_number.max(now_micros());
        self.append_as(number, chunk)?;
        Ok(number)
    }

    /// Appends `chunk` under `number`, which must be at least [`Segments::next_number`].
    pub(super) fn append_as(&mut self, number: u64, chunk: &[u8]) -> io::Result<()> {
        debug_assert!(number >= self.next_number);
        let (_, at) = summary(chunk);
        if self.segments.back().is_none_or(|segment| segment.full(at)) {
            self.start_segment(number)?;
        }
        let segment = self.segments.back_mut().expect("a segment was just made");
        let frame = frame(number, chunk);
        if let Err(error) = (&*segment.file).write_all(&frame) {
            // Whatever part of the frame was written is cut off; if it cannot be, it lies
            // past the end that reads stop at, and the next chunk goes to a new file.
            segment.sealed = segment.file.set_len(segment.len).is_err();
            return Err(error);
        }
        segment.len += frame.len() as u64;
        self.entries += segment.count(chunk, false);
        self.bytes += frame.len() as u64;
        self.next_number = number.saturating_add(1);
        Ok(())
    }

    /// Starts the file of chunks numbered from `first`, in place of a sealed file that
    /// holds nothing (named by a number no chunk got).
    fn start_segment(&mut self, first: u64) -> io::Result<()> {
        if self.segments.back().is_some_and(|back| back.len == 0) {
            let empty = self.segments.pop_back().expect("the last is there");
            remove(&self.path(empty.first))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(self.path(first))?;
        file.set_len(0)?;
        self.segments.push_back(Segment::new(first, file));
        Ok(())
    }

    /// Removes the oldest files while the files hold more than `most` bytes, keeping the
    /// one being written.
    pub(super) fn keep_bytes(&mut self, most: u64) -> io::Result<()> {
        while self.bytes > most && self.segments.len() > 1 {
            self.remove_oldest()?;
        }
        Ok(())
    }

    /// Removes the chunks whose newest entry is older than `older_than`, then those whose
    /// every entry is beyond the newest `keep`, oldest first; returns how many entries
    /// went.
    pub(super) fn trim(&mut self, older_than: Millis, keep: u64) -> io::Result<u64> {
        // Whether chunks of `entries` entries, the newest at `newest_at`, go, when
        // `kept` entries are kept in all.
        let expired = |entries: u64, newest_at: Millis, kept: u64| {
            newest_at < older_than || kept.saturating_sub(entries) >= keep
        };
        let mut removed = 0;
        while let Some(oldest) = self.segments.front() {
            if oldest.entries > 0 && !expired(oldest.entries, oldest.newest_at, self.entries) {
                break;
            }
            removed += self.remove_oldest()?;
        }
        let Some(oldest) = self.segments.front_mut() else {
            return Ok(removed);
        };
        let bytes = view(oldest).read()?;
        let mut mark = self.trimmed_before;
        for (number, chunk) in Frames::new(&bytes, oldest.first) {
            if number < mark {
                continue;
            }
            let (entries, newest_at) = summary(chunk);
            if !expired(entries, newest_at, self.entries) {
                break;
            }
            mark = number.saturating_add(1);
            oldest.entries -= entries.min(oldest.entries);
            self.entries -= entries.min(self.entries);
            removed += entries;
        }
        if mark != self.trimmed_before {
            write_mark(&self.dir, mark)?;
            self.trimmed_before = mark;
        }
        Ok(removed)
    }

    /// Removes the oldest file; returns how many entries it held. The mark moves past it
    /// first, so that a file a failure left behind reads as trimmed.
    fn remove_oldest(&mut self) -> io::Result<u64> {
        let Some(oldest) = self.segments.front() else {
            return Ok(0);
        };
        let next = (self.segments.get(1)).map_or(self.next_number, |next| next.first);
        if next > self.trimmed_before {
            write_mark(&self.dir, next)?;
            self.trimmed_before = next;
        }
        remove(&self.path(oldest.first))?;
        let oldest = self.segments.pop_front().expect("the oldest is there");
        self.entries -= oldest.entries.min(self.entries);
        self.bytes -= oldest.len.min(self.bytes);
        Ok(oldest.entries)
    }

    /// What a read of the chunks numbered up to `last` sees.
    pub(super) fn views(&self, last: u64) -> Views {
        Views {
            segments: (self.segments.iter().rev())
                .filter(|segment| segment.first <= last)
                .map(view)
                .collect(),
            trimmed_before: self.trimmed_before,
        }
    }

    /// Makes every file and the directory stable.
    pub(super) fn sync(&self) -> io::Result<()> {
        for segment in &self.segments {
            segment.file.sync_data()?;
        }
        File::open(&self.dir)?.sync_all()
    }
}

fn view(segment: &Segment) -> SegmentView {
    SegmentView {
        first: segment.first,
        file: Arc::clone(&segment.file),
        len: segment.len,
    }
}

fn now_micros() -> u64 {
    (SystemTime::now().duration_since(UNIX_EPOCH)).map_or(0, |since| since.as_micros() as u64)
}

/// The number a segment's file name carries: twenty digits, then `.log`.
fn segment_number(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(EXTENSION)?.strip_suffix('.')?;
    (digits.len() == 20 && digits.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

fn frame(number: u64, chunk: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER + chunk.len());
    frame.extend(number.to_le_bytes());
    frame.extend((chunk.len() as u32).to_le_bytes());
    let crc = checksum(&frame, chunk);
    frame.extend(crc.to_le_bytes());
    frame.extend_from_slice(chunk);
    frame
}

fn checksum(head: &[u8], chunk: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(head);
    hasher.update(chunk);
    hasher.finalize()
}

/// The frames of a segment's bytes, in order, up to the first that does not check: too
/// short, a wrong checksum, or a number below `lowest` (the first number it may hold) or
/// not above the one before.
pub(super) struct Frames<'a> {
    rest: &'a [u8],
    lowest: u64,
    /// The bytes of the frames read so far.
    read: u64,
}

impl<'a> Frames<'a> {
    pub(super) fn new(bytes: &'a [u8], lowest: u64) -> Frames<'a> {
        Frames {
            rest: bytes,
            lowest,
            read: 0,
        }
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = (u64, &'a [u8]);

    fn next(&mut self) -> Option<(u64, &'a [u8])> {
        let head = self.rest.get(..FRAME_HEADER)?;
        let number = u64::from_le_bytes(head[..8].try_into().ok()?);
        let length = u32::from_le_bytes(head[8..12].try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(head[12..16].try_into().ok()?);
        let chunk = self.rest.get(FRAME_HEADER..FRAME_HEADER + length)?;
        if number < self.lowest || checksum(&head[..12], chunk) != crc {
            self.rest = &[];
            return None;
        }
        self.lowest = number.saturating_add(1);
        self.rest = &self.rest[FRAME_HEADER + length..];
        self.read += (FRAME_HEADER + length) as u64;
        Some((number, chunk))
    }
}

/// The trim mark; 0 (nothing trimmed) when there is none or it does not read, so that at
/// worst trimmed entries show again until the next trim.
fn read_mark(dir: &Path) -> io::Result<u64> {
    match fs::read(dir.join(TRIM_MARK_FILE)) {
        Ok(bytes) => Ok(bytes.try_into().map_or(0, u64::from_le_bytes)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(error),
    }
}

/// Replaces the mark whole (a new file renamed over it), so that it never reads half
/// written.
fn write_mark(dir: &Path, mark: u64) -> io::Result<()> {
    let fresh = dir.join(format!("{TRIM_MARK_FILE}.new"));
    fs::write(&fresh, mark.to_le_bytes())?;
    fs::rename(fresh, dir.join(TRIM_MARK_FILE))
}

/// Removes a file; one already gone is no error. (durable.rs has the same two lines: the
/// log imports nothing of the store's folder, which imports it.)
fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}
