//! Listing a namespace's keys on Redis (`GET /v1/keys?route=...`): `SCAN` with a `MATCH`
//! pattern, on the one server, or on each primary of a cluster in turn.
//!
//! A page's cursor (opaque to callers: hex) names where the scan stands: the primary (by
//! its place among the primaries sorted by their first slot), the `SCAN` cursor of the
//! batch the page ended in, and the last key the page took from that batch. The next page
//! reads that batch again, sorted, and skips up to that key. As with `SCAN` itself, a key
//! written or removed during the listing (or a cluster resharded) may be missed or shown
//! twice; a key that stays throughout is shown.

use std::time::Duration;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Value};

use super::connection::Link;
use super::stored::Stored;
use crate::store::{KeyState, Page, StateFilter, StoreError, within};

/// Keys `SCAN` looks at per call.
const BATCH: usize = 1000;

/// Calls per page at most: a page that finds few keys of the namespace (or in the state
/// asked for) in a large keyspace ends early, with a cursor to go on from.
const BATCHES_PER_PAGE: usize = 32;

/// Where a listing stands.
#[derive(Debug, Default, PartialEq, Eq)]
struct Cursor {
    node: usize,
    scan: u64,
    /// The last key taken from the batch at `scan`, if the page ended inside it.
    after: Option<Vec<u8>>,
}

impl Cursor {
    fn encode(&self) -> String {
        let mut text = format!("{}.{}.", self.node, self.scan).into_bytes();
        text.extend_from_slice(self.after.as_deref().unwrap_or_default());
        hex::encode(text)
    }

    fn decode(text: &str) -> Option<Cursor> {
        let bytes = hex::decode(text).ok()?;
        let mut parts = bytes.splitn(3, |byte| *byte == b'.');
        let number = |part: Option<&[u8]>| std::str::from_utf8(part?).ok()?.parse().ok();
        let node = number(parts.next())?;
        let scan = number(parts.next())?;
        let after = parts.next()?;
        Some(Cursor {
            node: usize::try_from(node).ok()?,
            scan,
            after: (!after.is_empty()).then(|| after.to_vec()),
        })
    }
}

/// Escapes a glob pattern's special characters.
fn glob_literal(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        if matches!(character, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(character);
    }
    escaped
}

/// Up to `limit` live keys whose store keys start with `listed` (in `state`, if given),
/// after `after`. `prefix` is the store's own, before every Redis key.
pub(super) async fn list(
    mut connection: Link,
    prefix: &str,
    timeout: Duration,
    listed: &str,
    state: Option<StateFilter>,
    after: Option<&str>,
    limit: usize,
) -> Result<Page, StoreError> {
    let mut cursor = match after {
        Some(text) => Cursor::decode(text)
            .ok_or_else(|| StoreError::BadRequest(format!("`{text}` is not a listing cursor")))?,
        None => Cursor::default(),
    };
    let nodes = primaries(&mut connection).await?;
    let pattern = format!("{}{}*", glob_literal(prefix), glob_literal(listed));
    let mut page = Page::default();
    for _ in 0..BATCHES_PER_PAGE {
        let Some(node) = nodes.get(cursor.node) else {
            return Ok(page);
        };
        let (next_scan, mut batch) = scan(&mut connection, *node, cursor.scan, &pattern).await?;
        batch.sort();
        batch.dedup();
        if let Some(after) = &cursor.after {
            batch.retain(|key| key > after);
        }
        for key in batch {
            let Some(state_found) = live_state(&mut connection, timeout, &key).await? else {
                continue;
            };
            if state.is_some_and(|state| !state.admits(&state_found)) {
                continue;
            }
            let store_key = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            page.keys.push((store_key, state_found));
            if page.keys.len() == limit {
                cursor.after = Some(key);
                page.next = Some(cursor.encode());
                return Ok(page);
            }
        }
        cursor.after = None;
        if next_scan == 0 {
            cursor = Cursor {
                node: cursor.node + 1,
                ..Cursor::default()
            };
        } else {
            cursor.scan = next_scan;
        }
    }
    page.next = (cursor.node < nodes.len()).then(|| cursor.encode());
    Ok(page)
}

/// The state of the Redis key `key`, if it is live and reads as a claim record.
async fn live_state(
    connection: &mut Link,
    timeout: Duration,
    key: &[u8],
) -> Result<Option<KeyState>, StoreError> {
    let mut get = redis::cmd("GET");
    get.arg(key);
    let value: Option<Vec<u8>> = within("redis", timeout, get.query_async(connection)).await?;
    Ok(value
        .and_then(|value| Stored::decode(&value).ok())
        .map(Stored::state))
}

/// The servers to scan: the one server (`None`), or a slot of each primary of the cluster,
/// in the order of their first slots.
async fn primaries(connection: &mut Link) -> Result<Vec<Option<u16>>, StoreError> {
    let Link::Cluster(cluster) = connection else {
        return Ok(vec![None]);
    };
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(cluster)
        .await?;
    let mut ranges: Vec<(u16, String)> = Vec::new();
    if let Value::Array(ranges_found) = slots {
        for range in ranges_found {
            let Value::Array(fields) = range else {
                continue;
            };
            let (Some(Value::Int(start)), Some(Value::Array(primary))) =
                (fields.first(), fields.get(2))
            else {
                continue;
            };
            let address = format!("{:?}", primary.get(..2));
            if let Ok(start) = u16::try_from(*start) {
                ranges.push((start, address));
            }
        }
    }
    ranges.sort();
    let mut seen = std::collections::HashSet::new();
    Ok(ranges
        .into_iter()
        .filter(|(_, address)| seen.insert(address.clone()))
        .map(|(start, _)| Some(start))
        .collect())
}

/// One `SCAN` call on the server, or on the primary that serves `slot`.
async fn scan(
    connection: &mut Link,
    slot: Option<u16>,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
    let mut command: Cmd = redis::cmd("SCAN");
    command
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(BATCH);
    let reply: Value = match (connection, slot) {
        (Link::Cluster(cluster), Some(slot)) => {
            let primary = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            cluster
                .route_command(command, RoutingInfo::SingleNode(primary))
                .await?
        }
        (connection, _) => command.query_async(connection).await?,
    };
    let (next, keys): (String, Vec<Vec<u8>>) =
        redis::from_redis_value(reply).map_err(|error| StoreError::of("redis", error))?;
    let next = next
        .parse()
        .map_err(|_| StoreError::of("redis", "SCAN answered an unreadable cursor"))?;
    Ok((next, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written_whatever_its_key_holds() {
        for cursor in [
            Cursor::default(),
            Cursor {
                node: 2,
                scan: 81_920,
                after: Some(b"dedupe:stripe:evt.1.2:x".to_vec()),
            },
        ] {
            assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        }
        assert_eq!(Cursor::decode("zz"), None);
        assert_eq!(Cursor::decode(&hex::encode("1.x.")), None);
    }

    #[test]
    fn glob_characters_in_a_prefix_match_only_themselves() {
        assert_eq!(glob_literal(r"a*b?[c]\"), r"a\*b\?\[c\]\\");
    }
}
