//! A walk over every live done record with its store key, a bounded stretch at a time:
//! what listing a scope's done keys, counting them and clearing them read.
//!
//! Records are visited window by window (oldest first), each window's buckets in sled's
//! key order and a bucket's records in record-key order, so a [`Position`] names where a
//! walk stopped and the next stretch starts just after it. A record that stays where it
//! is throughout is visited once; one written, moved or removed meanwhile may be missed
//! or visited twice. Records written before names were kept cannot be named, so they are
//! passed over (they leave with their retention).

use std::ops::ControlFlow;

use super::bucket::Entry;
use super::record::{RECORD_KEY_LEN, RecordKey, decode_named};
use super::window::Window;
use super::{Epoch, Epochs};
use crate::store::{DoneRecord, Millis};

/// Where a walk stopped: after this record of this window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::sled) struct Position {
    window: Window,
    key: RecordKey,
}

impl Position {
    /// As text, for a listing's cursor: `<window end>.<window width>.<record key in hex>`.
    pub(in crate::store::sled) fn encode(&self) -> String {
        format!(
            "{}.{}.{}",
            self.window.end,
            self.window.width,
            hex::encode(self.key)
        )
    }

    pub(in crate::store::sled) fn decode(text: &str) -> Option<Position> {
        let mut parts = text.splitn(3, '.');
        let end = parts.next()?.parse().ok()?;
        let width = parts.next()?.parse().ok()?;
        let key = hex::decode(parts.next()?).ok()?.try_into().ok()?;
        Some(Position {
            window: Window { end, width },
            key,
        })
    }
}

impl Epochs {
    /// Visits the live named records after `from` (from the first without one), at most
    /// `examined_max` records looked at, until `visit` breaks. Returns where to go on
    /// from, or `None` once every record was looked at.
    pub(in crate::store::sled) fn walk(
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
            let after = from
                .filter(|from| from.window == epoch.window)
                .map(|from| from.key);
            let start: &[u8] = after.as_ref().map_or(&[], |key| epoch.bucket(key));
            for item in epoch.tree.range(start..) {
                let (sled_key, bucket) = item?;
                if !epoch.is_bucket(&sled_key) {
                    continue;
                }
                for (key, record) in epoch.records_of(&sled_key, &bucket)? {
                    if after.is_some_and(|after| key <= after) {
                        continue;
                    }
                    examined += 1;
                    let here = Position {
                        window: epoch.window,
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

impl Epoch {
    /// The records of the bucket at `sled_key`, in record-key order, each decoded with its
    /// name (`None` if unreadable).
    #[allow(clippy::type_complexity)]
    fn records_of(
        &self,
        sled_key: &[u8],
        bucket: &[u8],
    ) -> sled::Result<Vec<(RecordKey, Option<(DoneRecord, Option<String>)>)>> {
        let mut records = Vec::new();
        for (rest, entry) in self.view(bucket).entries() {
            let mut key: RecordKey = [0; RECORD_KEY_LEN];
            key[..sled_key.len()].copy_from_slice(sled_key);
            key[sled_key.len()..].copy_from_slice(rest);
            let decoded = match entry {
                Entry::Inline(bytes) => decode_named(&key, bytes, self.window),
                Entry::StoredApart => {
                    (self.tree.get(key)?).and_then(|bytes| decode_named(&key, &bytes, self.window))
                }
            };
            records.push((key, decoded));
        }
        records.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_as_written() {
        let position = Position {
            window: Window {
                end: 1_800_000_065_536,
                width: 65_536,
            },
            key: [7; RECORD_KEY_LEN],
        };
        assert_eq!(Position::decode(&position.encode()), Some(position));
        for bad in ["", "1.2", "1.2.zz", "1.2.0707", "x.2.07", "1.2.3.4"] {
            assert_eq!(Position::decode(bad), None, "{bad}");
        }
    }
}
