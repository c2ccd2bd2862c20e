//! The delivery log's files: chunks appended to **segment** files in one directory, each
//! file named by the number of its first chunk, the oldest files removed whole.
//!
//! A chunk is written as a frame: its number, its length, a CRC-32 of those and of the
//! chunk, then the chunk. Numbers grow by one from chunk to chunk, across files and
//! restarts. Nothing is synced: the log is a record for operators, not a promise to a
//! sender, so a power cut may take its last chunks; a frame that does not check (torn, or
//! never written) ends its file, which is cut back to the frames before it at open.
//!
//! Trimming removes whole files, and within the oldest file it moves a mark, kept in
//! the file `trimmed`: chunks numbered below it are gone to every read.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Header;
use crate::store::Millis;

/// A frame's header: the chunk's number, its length, and the CRC-32 of both and the chunk.
const FRAME_HEADER: usize = 8 + 4 + 4;
/// A segment takes no new chunk once it holds this many bytes.
const SEGMENT_BYTES: u64 = 1 << 20;
const MARK: &str = "trimmed";
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
    /// The newest entry's time, over all its chunks.
    newest_at: Millis,
    /// A write to it failed: the next chunk starts a new file.
    sealed: bool,
}

/// A segment as a read sees it: the bytes written when the read began.
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
}

/// The log's files, their totals and where the next chunk goes.
pub(super) struct Segments {
    dir: PathBuf,
    /// Oldest first; the last takes the next chunk.
    segments: VecDeque<Segment>,
    next_number: u64,
    /// Chunks numbered below it are trimmed.
    trimmed_before: u64,
    /// The entries not trimmed, and the bytes of the files.
    entries: u64,
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
        let mut floor = 0;
        for first in numbers {
            if let Some(last) = opened.open_segment(first, floor)? {
                floor = last + 1;
                opened.next_number = opened.next_number.max(floor);
            }
        }
        Ok(opened)
    }

    /// Opens the file of chunks numbered from `first`, none below `floor`; returns its
    /// last chunk's number, if it holds any.
    fn open_segment(&mut self, first: u64, floor: u64) -> io::Result<Option<u64>> {
        let path = self.path(first);
        let mut file = OpenOptions::new().read(true).append(true).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut segment = Segment {
            first,
            file: Arc::new(file),
            len: 0,
            entries: 0,
            newest_at: 0,
            sealed: false,
        };
        let mut frames = Frames::new(&bytes, floor);
        let mut last = None;
        for (number, chunk) in frames.by_ref() {
            last = Some(number);
            let (entries, newest_at) = summary(chunk);
            if number >= self.trimmed_before {
                segment.entries += entries;
            }
            segment.newest_at = segment.newest_at.max(newest_at);
        }
        segment.len = frames.read;
        if last.is_none_or(|last| last < self.trimmed_before) {
            // Every chunk of it trimmed, or none there.
            remove(&path)?;
            return Ok(last);
        }
        if segment.len < bytes.len() as u64 {
            segment.file.set_len(segment.len)?;
        }
        self.entries += segment.entries;
        self.bytes += segment.len;
        self.segments.push_back(segment);
        Ok(last)
    }

    fn path(&self, first: u64) -> PathBuf {
        self.dir.join(format!("{first:020}.{EXTENSION}"))
    }

    /// The number the next chunk gets.
    pub(super) fn next_number(&self) -> u64 {
        self.next_number
    }

    /// Appends `chunk` under the next number and returns it.
    pub(super) fn append(&mut self, chunk: &[u8]) -> io::Result<u64> {
        let number = self.next_number;
        self.append_as(number, chunk)?;
        Ok(number)
    }

    /// Appends `chunk` under `number`, which must be above every number written before.
    pub(super) fn append_as(&mut self, number: u64, chunk: &[u8]) -> io::Result<()> {
        debug_assert!(number >= self.next_number);
        let full = |segment: &Segment| segment.sealed || segment.len >= SEGMENT_BYTES;
        if self.segments.back().is_none_or(full) {
            let path = self.path(number);
            let file = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .open(path)?;
            self.segments.push_back(Segment {
                first: number,
                file: Arc::new(file),
                len: 0,
                entries: 0,
                newest_at: 0,
                sealed: false,
            });
        }
        let segment = self.segments.back_mut().expect("a segment was just made");
        let frame = frame(number, chunk);
        if let Err(error) = (&*segment.file).write_all(&frame) {
            // Whatever part of the frame was written is cut off, or left past the end
            // that reads stop at; either way the next chunk goes to a new file.
            segment.sealed = true;
            let _ = segment.file.set_len(segment.len);
            return Err(error);
        }
        let (entries, newest_at) = summary(chunk);
        segment.len += frame.len() as u64;
        segment.entries += entries;
        segment.newest_at = segment.newest_at.max(newest_at);
        self.entries += entries;
        self.bytes += frame.len() as u64;
        self.next_number = number + 1;
        Ok(())
    }

    /// Removes the oldest files while the files hold more than `most` bytes, keeping the
    /// one being written; returns how many entries went.
    pub(super) fn keep_bytes(&mut self, most: u64) -> io::Result<u64> {
        let mut removed = 0;
        while self.bytes > most && self.segments.len() > 1 {
            removed += self.remove_oldest()?;
        }
        Ok(removed)
    }

    /// Removes the chunks whose newest entry is older than `older_than`, then those whose
    /// every entry is beyond the newest `keep`, oldest first; returns how many entries
    /// went.
    pub(super) fn trim(&mut self, older_than: Millis, keep: u64) -> io::Result<u64> {
        let goes = |entries: u64, newest_at: Millis, left: u64| {
            newest_at < older_than || left.saturating_sub(entries) >= keep
        };
        let mut removed = 0;
        while let Some(oldest) = self.segments.front() {
            if oldest.entries > 0 && !goes(oldest.entries, oldest.newest_at, self.entries) {
                break;
            }
            removed += self.remove_oldest()?;
        }
        let Some(oldest) = self.segments.front_mut() else {
            return Ok(removed);
        };
        let bytes = view(oldest).read()?;
        let mut mark = self.trimmed_before;
        for (number, chunk) in Frames::new(&bytes, 0) {
            if number < mark {
                continue;
            }
            let (entries, newest_at) = summary(chunk);
            if !goes(entries, newest_at, self.entries) {
                break;
            }
            mark = number + 1;
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

    /// Removes the oldest file; returns how many entries it held. The mark moves past it,
    /// so that numbers keep growing even after every file has gone.
    fn remove_oldest(&mut self) -> io::Result<u64> {
        let Some(oldest) = self.segments.pop_front() else {
            return Ok(0);
        };
        let next = self
            .segments
            .front()
            .map_or(self.next_number, |next| next.first);
        write_mark(&self.dir, next)?;
        self.trimmed_before = next;
        remove(&self.path(oldest.first))?;
        self.entries -= oldest.entries.min(self.entries);
        self.bytes -= oldest.len.min(self.bytes);
        Ok(oldest.entries)
    }

    /// The files that may hold chunks numbered up to `last`, newest first, and the mark.
    pub(super) fn views(&self, last: u64) -> (Vec<SegmentView>, u64) {
        let views = (self.segments.iter().rev())
            .filter(|segment| segment.first <= last)
            .map(view)
            .collect();
        (views, self.trimmed_before)
    }
}

fn view(segment: &Segment) -> SegmentView {
    SegmentView {
        first: segment.first,
        file: Arc::clone(&segment.file),
        len: segment.len,
    }
}

/// How many entries a chunk holds and its newest entry's time; nothing for one that does
/// not read.
fn summary(chunk: &[u8]) -> (u64, Millis) {
    Header::read(chunk).map_or((0, 0), |header| {
        (u64::from(header.entries), header.newest_at)
    })
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
/// short, a wrong checksum, or a number not above the one before (and not below `floor`).
pub(super) struct Frames<'a> {
    rest: &'a [u8],
    floor: u64,
    /// The bytes of the frames read so far.
    read: u64,
}

impl<'a> Frames<'a> {
    pub(super) fn new(bytes: &'a [u8], floor: u64) -> Frames<'a> {
        Frames {
            rest: bytes,
            floor,
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
        if number < self.floor || checksum(&head[..12], chunk) != crc {
            self.rest = &[];
            return None;
        }
        self.floor = number + 1;
        self.rest = &self.rest[FRAME_HEADER + length..];
        self.read += (FRAME_HEADER + length) as u64;
        Some((number, chunk))
    }
}

fn read_mark(dir: &Path) -> io::Result<u64> {
    match fs::read(dir.join(MARK)) {
        Ok(bytes) => Ok(bytes.try_into().map_or(0, u64::from_le_bytes)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(error),
    }
}

/// Replaces the mark whole (a new file renamed over it), so that it never reads half
/// written.
fn write_mark(dir: &Path, mark: u64) -> io::Result<()> {
    let fresh = dir.join(format!("{MARK}.new"));
    fs::write(&fresh, mark.to_le_bytes())?;
    fs::rename(fresh, dir.join(MARK))
}

fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}
