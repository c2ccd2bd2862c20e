//! The delivery log on Redis: the stream `{prefix}deliveries` (no `:` after the prefix, so
//! no store key is it), one stream entry per logged delivery, its one field `e` the
//! entry's encoding. The server names each entry (`XADD *`: its milliseconds and a
//! sequence), so every replica's entries are in one order; a batch is one script call
//! ([`APPEND`]): one command and one reply for the driver to encode and parse, where a
//! pipeline of an `XADD` per entry cost the proxy about 4% of a delivery's CPU.
//! Trimming is `XTRIM MINID` for the retention (by the server's time of each entry) and
//! `XTRIM MAXLEN` for the count, both exact.

use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::connection::Link;
use crate::store::log::{DeliveryLog, LogId, LoggedDelivery};
use crate::store::{Millis, StoreError, within};

/// Appends each ARGV to the stream KEYS[1] as an entry whose field `e` is it; returns
/// their ids, in order, joined by commas (one value for the driver to parse, not one
/// per entry).
const APPEND: &str = r"
local ids = {}
for i = 1, #ARGV do
  ids[i] = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
end
return table.concat(ids, ',')
";

/// The Redis store's log.
pub(super) struct RedisLog {
    connection: Link,
    stream: String,
    timeout: Duration,
    append: Script,
}

impl RedisLog {
    pub(super) fn new(connection: Link, prefix: &str, timeout: Duration) -> RedisLog {
        RedisLog {
            connection,
            stream: format!("{prefix}deliveries"),
            timeout,
            append: Script::new(APPEND),
        }
    }

    async fn run<T: redis::FromRedisValue>(&self, command: redis::Cmd) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        within("redis", self.timeout, command.query_async(&mut connection)).await
    }

    /// `XRANGE` or `XREVRANGE` from `start` to `end`, up to `count`.
    async fn range(
        &self,
        command: &str,
        start: &str,
        end: &str,
        count: usize,
    ) -> Result<Vec<(LogId, Option<LoggedDelivery>)>, StoreError> {
        let mut range = redis::cmd(command);
        range
            .arg(&self.stream)
            .arg(start)
            .arg(end)
            .arg("COUNT")
            .arg(count);
        let reply: Value = self.run(range).await?;
        Ok(entries(reply))
    }
}

/// The entries of an `XRANGE` reply, each with its id; one that does not read is `None`.
fn entries(reply: Value) -> Vec<(LogId, Option<LoggedDelivery>)> {
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
            Some(Value::BulkString(id)) => String::from_utf8_lossy(&id).parse::<LogId>().ok(),
            Some(Value::SimpleString(id)) => id.parse::<LogId>().ok(),
            _ => None,
        };
        let Some(id) = id else { continue };
        let entry = match fields {
            Some(Value::Array(fields)) => match fields.as_slice() {
                [Value::BulkString(name), Value::BulkString(value)] if name == b"e" => {
                    LoggedDelivery::decode(value)
                }
                _ => None,
            },
            _ => None,
        };
        found.push((id, entry));
    }
    found
}

#[async_trait]
impl DeliveryLog for RedisLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.append.key(&self.stream);
        for entry in entries {
            invocation.arg(entry.encode());
        }
        let mut connection = self.connection.clone();
        let ids: String = within(
            "redis",
            self.timeout,
            invocation.invoke_async(&mut connection),
        )
        .await?;
        ids.split(',').map(str::parse).collect()
    }

    async fn read(
        &self,
        before: Option<LogId>,
        limit: usize,
    ) -> Result<Vec<(LogId, LoggedDelivery)>, StoreError> {
        let mut found = Vec::new();
        let mut end = before.map_or("+".to_owned(), |id| format!("({id}"));
        // Entries that do not read are passed over: a few more calls at most.
        for _ in 0..8 {
            let batch = self.range("XREVRANGE", &end, "-", limit).await?;
            let Some((last, _)) = batch.last() else {
                break;
            };
            end = format!("({last}");
            let full = batch.len() == limit;
            for (id, entry) in batch {
                if let Some(entry) = entry {
                    found.push((id, entry));
                }
            }
            if found.len() >= limit || !full {
                break;
            }
        }
        found.truncate(limit);
        Ok(found)
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let id = id.to_string();
        let found = self.range("XRANGE", &id, &id, 1).await?;
        Ok(found.into_iter().next().and_then(|(_, entry)| entry))
    }

    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError> {
        let mut by_age = redis::cmd("XTRIM");
        by_age
            .arg(&self.stream)
            .arg("MINID")
            .arg(format!("{older_than}-0"));
        let aged: u64 = self.run(by_age).await?;
        let mut by_count = redis::cmd("XTRIM");
        by_count.arg(&self.stream).arg("MAXLEN").arg(keep);
        let counted: u64 = self.run(by_count).await?;
        Ok(aged + counted)
    }
}
