//! The delivery log on Redis: the stream `<prefix>deliveries` (no `:` after the prefix,
//! so no store key is it), one stream entry per batch the writer stores, its field `c`
//! the batch's [`chunk`]. The server names each stream entry (`XADD *`: its milliseconds
//! and a sequence), so every replica's batches are in one order; an entry's id is
//! `LogId(milliseconds, (sequence << PLACE_BITS) + place in the batch)`. A stream entry
//! per logged delivery cost the server an `XADD` each, on the cores the proxy runs on
//! (`docs/performance.md`).
//!
//! Beside the stream, the sorted set `<prefix>deliveries_batches{<prefix>deliveries}`
//! (the stream's name as its hash tag: the same slot on a cluster) has a member per
//! batch, `<stream id>/<entry count>`, scored by how many entries were stored up to and
//! including it; its order by rank is the stream's. Trimming (one script) finds its
//! bounds there without reading a chunk: by age, `XTRIM MINID` at the retention and the
//! members stored before it (found by halving the ranks); by count, the batches whose
//! every entry is beyond the newest `keep`, by `XTRIM MINID` at the first batch kept.
//! Stream entries of earlier versions (one delivery each, field `e`) read on; they go by
//! age, and by count once a batch stored after them goes.
//!
//! [`chunk`]: crate::store::log::chunk

use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::connection::Link;
use crate::store::log::chunk::{ChunkVersion, decode_chunk, encode_chunk, entry_at, read_batches};
use crate::store::log::{DeliveryLog, LogId, LogRead, LoggedDelivery};
use crate::store::{Millis, StoreError, within};

/// Bits of an entry's id that hold its place in its batch; a batch holds at most
/// `1 << PLACE_BITS` entries.
const PLACE_BITS: u32 = 16;

/// How many stream entries a read asks for at a time, at most: one may hold a batch of
/// bodies.
const BATCHES_READ: usize = 4;

/// Adds each pair of ARGV (an entry count, a chunk) to the stream KEYS[1] as an entry
/// whose field `c` is the chunk, and its member to the sorted set KEYS[2]; returns their
/// stream ids, in order, joined by commas (one value for the driver to parse).
const APPEND: &str = r"
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local total = tonumber(newest[2]) or 0
local ids = {}
for i = 1, #ARGV, 2 do
  local id = redis.call('XADD', KEYS[1], '*', 'c', ARGV[i + 1])
  total = total + tonumber(ARGV[i])
  redis.call('ZADD', KEYS[2], string.format('%.0f', total), id .. '/' .. ARGV[i])
  ids[#ids + 1] = id
end
return table.concat(ids, ',')
";

/// Removes from the stream KEYS[1] the entries stored before the time ARGV[1] (Unix
/// milliseconds), then the batches whose every entry is beyond the newest ARGV[2] (and
/// whatever is older), and their members from the sorted set KEYS[2]; returns how many
/// logged deliveries went (a batch its count, an earlier version's entry one).
const TRIM: &str = r"
-- A member this log wrote: its stream id and entry count. One it did not write is
-- dropped, and the trim goes on at the next call.
local function own(member)
  local id, count = string.match(member, '^(%d+%-%d+)/(%d+)$')
  if not id then
    redis.call('ZREM', KEYS[2], member)
  end
  return id, tonumber(count)
end
-- The entries of the members of ranks 0 to last; nil when either end was not this log's.
local function entries(last)
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local final = redis.call('ZRANGE', KEYS[2], last, last, 'WITHSCORES')
  local _, count = own(first[1])
  if not count or not own(final[1]) then
    return nil
  end
  return tonumber(final[2]) - tonumber(first[2]) + count
end
local older = tonumber(ARGV[1])
-- By age: the stream's ids are the server's times, and the members' order is the stream's.
local trimmed = redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1] .. '-0')
local low, high = 0, redis.call('ZCARD', KEYS[2])
while low < high do
  local middle = math.floor((low + high) / 2)
  local id = own(redis.call('ZRANGE', KEYS[2], middle, middle)[1])
  if not id then
    return trimmed
  end
  if tonumber(string.match(id, '^%d+')) < older then low = middle + 1 else high = middle end
end
local removed = 0
if low > 0 then
  removed = entries(low - 1)
  if not removed then
    return trimmed
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, low - 1)
end
removed = removed + math.max(trimmed - low, 0)
-- By count: the first batch holding one of the newest ARGV[2] stays, and all after it.
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if not newest[2] then
  return removed
end
local bound = string.format('%.0f', tonumber(newest[2]) - tonumber(ARGV[2]))
local beyond = redis.call('ZCOUNT', KEYS[2], '-inf', bound)
if beyond == 0 then
  return removed
end
local kept = redis.call('ZRANGE', KEYS[2], beyond, beyond)[1]
local kept_id = kept and own(kept)
local counted = entries(beyond - 1)
if (kept and not kept_id) or not counted then
  return removed
end
if kept_id then
  trimmed = redis.call('XTRIM', KEYS[1], 'MINID', kept_id)
else
  trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, beyond - 1)
return removed + counted + math.max(trimmed - beyond, 0)
";

/// A stream entry's value: a batch's chunk, or an earlier version's one entry.
enum Stored {
    Batch(Vec<u8>),
    Single(Vec<u8>),
    Unknown,
}

impl Stored {
    fn entries(&self) -> Vec<Option<LoggedDelivery>> {
        let mut entries = match self {
            Stored::Batch(chunk) => decode_chunk(chunk),
            Stored::Single(entry) => vec![LoggedDelivery::decode(entry)],
            Stored::Unknown => Vec::new(),
        };
        // Places beyond what an id holds would name the next sequence's entries.
        entries.truncate(1 << PLACE_BITS);
        entries
    }

    fn entry_at(&self, place: u64) -> Option<LoggedDelivery> {
        match self {
            Stored::Batch(chunk) => entry_at(chunk, place),
            Stored::Single(entry) => (place == 0).then(|| LoggedDelivery::decode(entry))?,
            Stored::Unknown => None,
        }
    }
}

/// The Redis store's log.
pub(super) struct RedisLog {
    connection: Link,
    stream: String,
    batches: String,
    timeout: Duration,
    append: Script,
    trim: Script,
}

impl RedisLog {
    pub(super) fn new(connection: Link, prefix: &str, timeout: Duration) -> RedisLog {
        let stream = format!("{prefix}deliveries");
        RedisLog {
            connection,
            batches: format!("{prefix}deliveries_batches{{{stream}}}"),
            stream,
            timeout,
            append: Script::new(APPEND),
            trim: Script::new(TRIM),
        }
    }

    /// `XRANGE` or `XREVRANGE` from `start` to `end`, up to `count`: each stream entry
    /// with its first entry's id.
    async fn range(
        &self,
        command: &str,
        start: &str,
        end: &str,
        count: usize,
    ) -> Result<Vec<(LogId, Stored)>, StoreError> {
        let mut range = redis::cmd(command);
        range
            .arg(&self.stream)
            .arg(start)
            .arg(end)
            .arg("COUNT")
            .arg(count);
        let mut connection = self.connection.clone();
        let reply: Value =
            within("redis", self.timeout, range.query_async(&mut connection)).await?;
        Ok(stream_entries(reply))
    }
}

/// The stream id of the batch that holds `id`, and `id`'s place in it.
fn stream_id(id: LogId) -> (String, u64) {
    let place = id.1 & ((1 << PLACE_BITS) - 1);
    (format!("{}-{}", id.0, id.1 >> PLACE_BITS), place)
}

/// The id of the first entry of the batch stored under the stream id `text`.
fn first_id(text: &str) -> Option<LogId> {
    let (ms, seq) = text.split_once('-')?;
    let seq: u64 = seq.parse().ok()?;
    (seq < 1 << (64 - PLACE_BITS)).then_some(LogId(ms.parse().ok()?, seq << PLACE_BITS))
}

/// The stream entries of an `XRANGE` reply, each with its first entry's id.
fn stream_entries(reply: Value) -> Vec<(LogId, Stored)> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let mut found = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut parts) = item else {
            continue;
        };
        if parts.len() != 2 {
            continue;
        }
        let fields = parts.pop();
        let id = match parts.pop() {
            Some(Value::BulkString(id)) => first_id(&String::from_utf8_lossy(&id)),
            Some(Value::SimpleString(id)) => first_id(&id),
            _ => None,
        };
        let Some(id) = id else { continue };
        let mut stored = Stored::Unknown;
        if let Some(Value::Array(fields)) = fields {
            let mut fields = fields.into_iter();
            while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                if let (Value::BulkString(name), Value::BulkString(value)) = (name, value) {
                    match name.as_slice() {
                        b"c" => stored = Stored::Batch(value),
                        b"e" => stored = Stored::Single(value),
                        _ => {}
                    }
                }
            }
        }
        found.push((id, stored));
    }
    found
}

#[async_trait]
impl DeliveryLog for RedisLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let batches: Vec<_> = entries.chunks(1 << PLACE_BITS).collect();
        let mut invocation = self.append.key(&self.stream);
        invocation.key(&self.batches);
        for batch in &batches {
            invocation
                .arg(batch.len())
                .arg(encode_chunk(ChunkVersion::Batches, batch));
        }
        let mut connection = self.connection.clone();
        let ids: String = within(
            "redis",
            self.timeout,
            invocation.invoke_async(&mut connection),
        )
        .await?;
        let firsts: Vec<_> = ids.split(',').map(first_id).collect();
        if firsts.len() != batches.len() {
            return Err(StoreError::of(
                "redis",
                "the log's append returned other ids",
            ));
        }
        let mut stored = Vec::with_capacity(entries.len());
        for (first, batch) in firsts.into_iter().zip(&batches) {
            let first =
                first.ok_or_else(|| StoreError::of("redis", "the log's append returned no id"))?;
            stored.extend((0..batch.len() as u64).map(|place| LogId(first.0, first.1 + place)));
        }
        Ok(stored)
    }

    async fn read(&self, before: Option<LogId>, limit: usize) -> Result<LogRead, StoreError> {
        read_batches(before, limit, BATCHES_READ, |after, asked| async move {
            let end = match after {
                None => before.map_or_else(|| "+".to_owned(), |id| stream_id(id).0),
                Some(first) => format!("({}", stream_id(first).0),
            };
            let found = self.range("XREVRANGE", &end, "-", asked).await?;
            Ok(found
                .into_iter()
                .map(|(first, stored)| (first, stored.entries()))
                .collect())
        })
        .await
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let (stream_id, place) = stream_id(id);
        let found = self.range("XRANGE", &stream_id, &stream_id, 1).await?;
        Ok(found
            .into_iter()
            .next()
            .and_then(|(_, stored)| stored.entry_at(place)))
    }

    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError> {
        let mut invocation = self.trim.key(&self.stream);
        invocation.key(&self.batches).arg(older_than).arg(keep);
        let mut connection = self.connection.clone();
        within(
            "redis",
            self.timeout,
            invocation.invoke_async(&mut connection),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entrys_id_names_its_batch_and_place() {
        let first = first_id("1733160000000-2").unwrap();
        assert_eq!(first, LogId(1_733_160_000_000, 2 << PLACE_BITS));
        let fifth = LogId(first.0, first.1 + 4);
        assert_eq!(stream_id(fifth), ("1733160000000-2".to_owned(), 4));
        assert_eq!(stream_id(first_id("7-0").unwrap()), ("7-0".to_owned(), 0));
        for text in ["", "7", "7-", "-1", "x-1", "7-281474976710656"] {
            assert_eq!(first_id(text), None, "{text}");
        }
    }
}
