//! A chunk: one batch of the delivery log's entries as one value, as sled's files,
//! PostgreSQL's rows and Redis's stream entries keep it: its header (the encoding's
//! version, how many entries, the newest entry's time), then each entry, its length and
//! its encoding. Also the reading of batches newest first that the shared stores share.

use std::future::Future;

use crate::store::log::{LogId, LogRead, LoggedDelivery};
use crate::store::{Millis, StoreError};

/// A chunk's first byte, its version; both are read, in the same layout. sled's files
/// keep writing 1, which an earlier version reads (and would remove, not reading it,
/// after a rollback). PostgreSQL's rows and Redis's stream entries are 2, no entry's
/// encoding: an earlier version, which read each row as one entry, passes a chunk over
/// (an earlier Redis version reads only the field `e`, which a batch does not have).
#[derive(Clone, Copy)]
pub(crate) enum ChunkVersion {
    Files = 1,
    Batches = 2,
}
const HEADER: usize = 1 + 4 + 8;

/// A chunk's header.
struct Header {
    entries: u32,
    newest_at: Millis,
}

impl Header {
    fn read(chunk: &[u8]) -> Option<Header> {
        let versions = [ChunkVersion::Files as u8, ChunkVersion::Batches as u8];
        if chunk.len() < HEADER || !versions.contains(&chunk[0]) {
            return None;
        }
        Some(Header {
            entries: u32::from_le_bytes(chunk[1..5].try_into().ok()?),
            newest_at: u64::from_le_bytes(chunk[5..13].try_into().ok()?),
        })
    }
}

/// `entries` as one chunk of `version`.
pub(crate) fn encode_chunk(version: ChunkVersion, entries: &[LoggedDelivery]) -> Vec<u8> {
    let newest_at = entries.iter().map(|entry| entry.at).max().unwrap_or(0);
    // About 200 bytes an entry without a body: one allocation for most chunks.
    let bodies: usize = entries
        .iter()
        .filter_map(|entry| entry.body.as_ref())
        .map(|body| body.len())
        .sum();
    let mut chunk = Vec::with_capacity(HEADER + entries.len() * 256 + bodies);
    chunk.push(version as u8);
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

/// The encodings of a chunk's entries, in order, up to the first whose length the bytes
/// do not hold.
fn encodings(chunk: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = chunk.get(HEADER..).unwrap_or_default();
    std::iter::from_fn(move || {
        let length = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let encoded = rest.get(4..4 + length)?;
        rest = &rest[4 + length..];
        Some(encoded)
    })
}

/// A chunk's entries, each with its place; one that does not read is `None`.
pub(crate) fn decode_chunk(chunk: &[u8]) -> Vec<Option<LoggedDelivery>> {
    let Some(header) = Header::read(chunk) else {
        return Vec::new();
    };
    // The count as written, up to what the bytes can hold (each entry takes 5 or more).
    let mut entries = Vec::with_capacity((header.entries as usize).min(chunk.len() / 5));
    entries.extend(encodings(chunk).map(LoggedDelivery::decode));
    entries
}

/// The entry at `place` in a chunk, decoding no other.
pub(crate) fn entry_at(chunk: &[u8], place: u64) -> Option<LoggedDelivery> {
    Header::read(chunk)?;
    let place = usize::try_from(place).ok()?;
    encodings(chunk).nth(place).and_then(LoggedDelivery::decode)
}

/// A batch as a store read it: its first entry's id (each next entry's is one more) and
/// its entries, `None` for one that does not read.
pub(crate) type Batch = (LogId, Vec<Option<LoggedDelivery>>);

/// Up to `limit` entries stored before `before` (from the newest when none), newest
/// first, from the batches `fetch(after, most)` reads, newest first, at most `most` at a
/// time: with `after` none, from the one `before` is in (which may hold entries stored
/// before it); else those stored before the batch whose first entry is `after`. It asks
/// for one batch first and twice as many each time after, up to `most_at_once` (a batch
/// may hold hundreds of entries), and looks at `limit + 1` batches at most, as many as an
/// entry per batch would take: past batches that do not read, the read ends early and
/// says where to go on from.
pub(crate) async fn read_batches<F, Reading>(
    before: Option<LogId>,
    limit: usize,
    most_at_once: usize,
    mut fetch: F,
) -> Result<LogRead, StoreError>
where
    F: FnMut(Option<LogId>, usize) -> Reading,
    Reading: Future<Output = Result<Vec<Batch>, StoreError>>,
{
    if limit == 0 {
        return Ok(LogRead {
            entries: Vec::new(),
            more_before: before,
        });
    }
    let mut entries = Vec::new();
    let mut after = None;
    let (mut batches_left, mut at_once) = (limit.saturating_add(1), 1);
    while entries.len() < limit && batches_left > 0 {
        let asked = at_once.min(limit - entries.len()).min(batches_left);
        at_once = (at_once * 2).min(most_at_once);
        batches_left -= asked;
        let batches = fetch(after, asked).await?;
        let full = batches.len() == asked;
        let Some(&(oldest, _)) = batches.last() else {
            return Ok(LogRead {
                entries,
                more_before: None,
            });
        };
        for (first, batch) in batches {
            if newest_first(first, batch, before, limit, &mut entries) {
                let more_before = entries.last().map(|&(id, _)| id);
                return Ok(LogRead {
                    entries,
                    more_before,
                });
            }
        }
        after = Some(oldest);
        if !full {
            return Ok(LogRead {
                entries,
                more_before: None,
            });
        }
    }
    Ok(LogRead {
        entries,
        more_before: after,
    })
}

/// Adds the entries of a chunk (as [`decode_chunk`] reads them), the first of which is
/// `first` and each next one more, that were stored before `before`, newest first, to
/// `found` until it holds `limit`; returns whether it does. Entries that do not read are
/// passed over.
pub(crate) fn newest_first(
    first: LogId,
    entries: Vec<Option<LoggedDelivery>>,
    before: Option<LogId>,
    limit: usize,
    found: &mut Vec<(LogId, LoggedDelivery)>,
) -> bool {
    for (place, entry) in entries.into_iter().enumerate().rev() {
        if found.len() >= limit {
            return true;
        }
        let id = LogId(first.0, first.1 + place as u64);
        if before.is_some_and(|before| id >= before) {
            continue;
        }
        if let Some(entry) = entry {
            found.push((id, entry));
        }
    }
    found.len() >= limit
}

/// How many entries a chunk holds and its newest entry's time; nothing for one that does
/// not read.
pub(crate) fn summary(chunk: &[u8]) -> (u64, Millis) {
    Header::read(chunk).map_or((0, 0), |header| {
        (u64::from(header.entries), header.newest_at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_reads_back_and_never_as_one_entry() {
        let entries = [
            LoggedDelivery::sample("a", 10, 0),
            LoggedDelivery::sample("b", 30, 3),
        ];
        for version in [ChunkVersion::Files, ChunkVersion::Batches] {
            let chunk = encode_chunk(version, &entries);
            assert_eq!(summary(&chunk), (2, 30));
            let read: Vec<_> = decode_chunk(&chunk).into_iter().flatten().collect();
            assert_eq!(read, entries);
        }
        // A version that reads a PostgreSQL row as one entry passes a chunk over: its
        // first byte is no entry's.
        let mut row = encode_chunk(ChunkVersion::Batches, &entries);
        assert_ne!(row[0], entries[0].encode()[0]);
        assert_eq!(LoggedDelivery::decode(&row), None);
        assert_eq!(entry_at(&row, 1), Some(entries[1].clone()));
        assert_eq!(entry_at(&row, 2), None);
        assert_eq!(entry_at(&row[..row.len() - 1], 1), None, "a cut entry");
        row[0] = 9;
        assert_eq!(entry_at(&row, 0), None);
        assert!(
            decode_chunk(&row).is_empty(),
            "an unknown version reads as nothing"
        );
    }
}
