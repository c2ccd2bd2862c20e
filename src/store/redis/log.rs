//! The delivery log on Redis: the stream `{prefix}deliveries` (no `:` after the prefix, so
//! no store key is it), one stream entry per batch the writer stores, its fields `n` (how
//! many entries) and `c` (their [`chunk`]). The server names each stream entry (`XADD *`:
//! its milliseconds and a sequence), so every replica's batches are in one order; an
//! entry's [`LogId`] is that name with its place in the chunk added to the sequence
//! shifted left by [`PLACE_BITS`]. A stream entry per logged delivery cost the server an
//! `XADD` each, on the cores the proxy runs on (`docs/performance.md`).
//!
//! Beside the stream, the sorted set `{prefix}deliveries_batches{{prefix}deliveries}` (in
//! the stream's hash slot) counts: each batch's member is its stream id and entry count
//! (`<ms>-<seq>/<n>`), scored by how many entries were stored up to and including it, so
//! that trimming to the newest `keep` finds its bound without reading the chunks.
//! Trimming is `XTRIM MINID` for the retention (by the server's time of each batch), then
//! for the count, both in one script with the sorted set's members. Stream entries of
//! earlier versions (one delivery each, field `e`) read on, and are trimmed by age, and
//! by count once the batches after them hold `keep` entries.
//!
//! [`chunk`]: crate::store::log::chunk

use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::connection::Link;
use crate::store::log::chunk::{ChunkVersion, decode_chunk, encode_chunk, newest_first};
use crate::store::log::{DeliveryLog, LogId, LoggedDelivery};
use crate::store::{Millis, StoreError, within};

/// Bits of an entry's id that hold its place in its batch; a batch holds at most
/// `1 << PLACE_BITS` entries.
const PLACE_BITS: u32 = 16;

/// How many stream entries a read asks for at a time, at most: one may hold a batch of
/// bodies.
const BATCHES_READ: usize = 4;

/// Adds each pair of ARGV (an entry count, a chunk) to the stream KEYS[1] as an entry
/// whose fields `n` and `c` they are, and its member to the sorted set KEYS[2]; returns
/// their ids, in order, joined by commas (one value for the driver to parse).
const APPEND: &str = r"
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local total = tonumber(newest[2]) or 0
local ids = {}
for i = 1, #ARGV, 2 do
  local id = redis.call('XADD', KEYS[1], '*', 'n', ARGV[i], 'c', ARGV[i + 1])
  total = total + tonumber(ARGV[i])
  redis.call('ZADD', KEYS[2], string.format('%.0f', total), id .. '/' .. ARGV[i])
  ids[#ids + 1] = id
end
return table.concat(ids, ',')
";

/// Removes from the stream KEYS[1] the entries older than ARGV[1] milliseconds, then
/// the batches whose every entry is beyond the newest ARGV[2] (and whatever is older),
/// and their members from the sorted set KEYS[2]; returns how many logged deliveries
/// went (a batch its count, an earlier version's entry one).
const TRIM: &str = r"
local older = tonumber(ARGV[1])
local removed = 0
-- By age: the stream's ids are the server's times; its batches' members go alike.
local trimmed = redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1] .. '-0')
local batches = 0
while true do
  local first = redis.call('ZRANGE', KEYS[2], 0, 99)
  local gone = {}
  for _, member in ipairs(first) do
    local ms, n = string.match(member, '^(%d+)%-%d+/(%d+)$')
    if ms and tonumber(ms) >= older then break end
    gone[#gone + 1] = member
    removed = removed + (tonumber(n) or 0)
  end
  if #gone > 0 then redis.call('ZREM', KEYS[2], unpack(gone)) end
  batches = batches + #gone
  if #gone < 100 then break end
end
removed = removed + math.max(trimmed - batches, 0)
-- By count: the first batch that holds one of the newest ARGV[2] stays, and all after it.
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if newest[2] then
  local bound = string.format('%.0f', tonumber(newest[2]) - tonumber(ARGV[2]))
  local beyond = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', bound, 'WITHSCORES', 'LIMIT', 0, 1)
  if beyond[1] then
    local last = redis.call('ZREVRANGEBYSCORE', KEYS[2], bound, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    local kept = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. bound, '+inf', 'LIMIT', 0, 1)
    local first_count = tonumber(string.match(beyond[1], '/(%d+)$')) or 0
    local count = redis.call('ZCOUNT', KEYS[2], '-inf', bound)
    if kept[1] then
      trimmed = redis.call('XTRIM', KEYS[1], 'MINID', string.match(kept[1], '^[^/]+'))
    else
      trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', bound)
    removed = removed + tonumber(last[2]) - tonumber(beyond[2]) + first_count
      + math.max(trimmed - count, 0)
  end
end
return removed
";

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
            // The stream's whole name as the hash tag: the same slot on a cluster.
            batches: format!("{prefix}deliveries_batches{{{stream}}}"),
            stream,
            timeout,
            append: Script::new(APPEND),
            trim: Script::new(TRIM),
        }
    }

    /// `XRANGE` or `XREVRANGE` from `start` to `end`, up to `count`.
    async fn range(
        &self,
        command: &str,
        start: &str,
        end: &str,
        count: usize,
    ) -> Result<Vec<(LogId, Vec<Option<LoggedDelivery>>)>, StoreError> {
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
        Ok(batches(reply))
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

/// The stream entries of an `XRANGE` reply, each with its first entry's id and its
/// entries (`None` for one that does not read); an earlier version's holds one.
fn batches(reply: Value) -> Vec<(LogId, Vec<Option<LoggedDelivery>>)> {
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
        let Some(Value::Array(fields)) = fields else {
            continue;
        };
        let mut entries = Vec::new();
        for pair in fields.chunks(2) {
            match pair {
                [Value::BulkString(name), Value::BulkString(value)] if name == b"c" => {
                    entries = decode_chunk(value);
                }
                [Value::BulkString(name), Value::BulkString(value)] if name == b"e" => {
                    entries = vec![LoggedDelivery::decode(value)];
                }
                _ => {}
            }
        }
        found.push((id, entries));
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
        let mut stored = Vec::with_capacity(entries.len());
        for (id, batch) in ids.split(',').zip(&batches) {
            let first = first_id(id)
                .ok_or_else(|| StoreError::of("redis", "the log's append returned no id"))?;
            stored.extend((0..batch.len() as u64).map(|place| LogId(first.0, first.1 + place)));
        }
        Ok(stored)
    }

    async fn read(
        &self,
        before: Option<LogId>,
        limit: usize,
    ) -> Result<Vec<(LogId, LoggedDelivery)>, StoreError> {
        // From the batch `before` is in, which may hold entries stored before it.
        let mut end = before.map_or("+".to_owned(), |id| stream_id(id).0);
        let mut found = Vec::new();
        // At most `limit` batches in all besides the one `before` is in, as many as an
        // entry per batch took: batches that do not read end the page early.
        let mut batches_left = limit.saturating_add(1);
        while found.len() < limit && batches_left > 0 {
            let asked = (limit - found.len()).min(BATCHES_READ).min(batches_left);
            batches_left -= asked;
            let batches = self.range("XREVRANGE", &end, "-", asked).await?;
            let Some(&(oldest, _)) = batches.last() else {
                break;
            };
            let full = batches.len() == asked;
            for (first, entries) in batches {
                if newest_first(first, entries, before, limit, &mut found) {
                    return Ok(found);
                }
            }
            if !full {
                break;
            }
            end = format!("({}", stream_id(oldest).0);
        }
        Ok(found)
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let (stream_id, place) = stream_id(id);
        let found = self.range("XRANGE", &stream_id, &stream_id, 1).await?;
        Ok(found.into_iter().next().and_then(|(_, entries)| {
            entries
                .into_iter()
                .nth(usize::try_from(place).ok()?)
                .flatten()
        }))
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
