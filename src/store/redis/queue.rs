//! The delivery queue on Redis, shared by every replica. A route's jobs live under keys
//! that share one hash tag (`{prefix}queue/{<route>}/...`), so that each change is one Lua
//! script on one node, also on Redis Cluster (a route's whole queue is on one node):
//!
//! - `jobs`: a hash of each job's record by store key;
//! - `due`: a sorted set of the jobs that are not dead, scored by when each is due. A take
//!   reads the due ones (`ZRANGEBYSCORE`) and scores them at the end of their visibility,
//!   in one script, with a token in `tokens`: replicas taking at once get other jobs, and
//!   a job whose replica died is due again when its visibility ends;
//! - `waiting`: a set of the jobs not tried yet in this round, for the counts;
//! - `received`: a sorted set by time of receipt, for the oldest's age;
//! - `dead`: a sorted set of the dead letters by time of death;
//! - `lane/<lane>`: a list of a lane's jobs (`queue.order_by`) in the order stored; all
//!   but the first wait in `due` at a score no clock reaches ([`BEHIND`]) until the first
//!   is completed or buried;
//! - `{prefix}queue/paused`: a set of the paused routes.
//!
//! No claim's key is one of these: a claim's is `{prefix}<namespace>:<key>`, and a
//! namespace has no `/`.
//!
//! One sorted set holds what a Stream, a delayed set and claiming idle entries back would
//! hold between them: a retry, a delay and a lost worker are all a score in the future.
//! An enqueue is acknowledged once the server has it in memory; what a Redis restart keeps
//! depends on its persistence (`appendonly`), which the queue reads at start and
//! warns of. The queue's times are the replicas' clocks.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use redis::{AsyncCommands, Script};

use super::connection::Link;
use crate::store::queue::{
    BEHIND, DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken, dead_cursor_at,
    parse_dead_cursor, revived,
};
use crate::store::{Clock, Millis, StoreError, SystemClock, millis, within};

/// Stores a job unless one of its key exists; a job of a lane goes to its end, due at
/// ARGV[5] (never) unless it is the first. The lane's first entries whose record is gone
/// (evicted: a take dropped them) are dropped first, and the first left made due, so
/// that an eviction holds no lane for good. KEYS: jobs, due, received, waiting, and the
/// lane if any; ARGV: key, record, now, received at, behind.
const ENQUEUE: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return 0
end
local due = ARGV[3]
if KEYS[5] then
  while true do
    local first = redis.call('LINDEX', KEYS[5], 0)
    if not first or redis.call('HEXISTS', KEYS[1], first) == 1 then
      if first and tonumber(redis.call('ZSCORE', KEYS[2], first)) == tonumber(ARGV[5]) then
        redis.call('ZADD', KEYS[2], ARGV[3], first)
      end
      break
    end
    redis.call('LPOP', KEYS[5])
    redis.call('ZREM', KEYS[2], first)
    redis.call('ZREM', KEYS[3], first)
    redis.call('SREM', KEYS[4], first)
  end
  if redis.call('RPUSH', KEYS[5], ARGV[1]) > 1 then
    due = ARGV[5]
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], due, ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
";

/// Takes up to ARGV[2] jobs due by ARGV[1], each due again at ARGV[3] under the token
/// ARGV[4], counting the take; a due entry whose record is gone (evicted) is dropped.
/// KEYS: due, tokens, jobs, takes. Returns record, takes pairs.
const TAKE: &str = r"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local taken = {}
for _, key in ipairs(due) do
  redis.call('ZADD', KEYS[1], ARGV[3], key)
  redis.call('HSET', KEYS[2], key, ARGV[4])
  local record = redis.call('HGET', KEYS[3], key)
  if record then
    local takes = redis.call('HINCRBY', KEYS[4], key, 1)
    table.insert(taken, record)
    table.insert(taken, tostring(takes))
  else
    redis.call('ZREM', KEYS[1], key)
    redis.call('HDEL', KEYS[2], key)
  end
end
return taken
";

/// Takes the job ARGV[1] out of the lane KEYS[n] and makes the lane's first job that is
/// behind (due at ARGV[3]) due at ARGV[2]; entries of jobs no longer due (delivered,
/// dead) are dropped. KEYS[2]: due. The start of the scripts that settle a job.
const OUT_OF_LANE: &str = r"
local function out_of_lane(lane, key, now, behind)
  redis.call('LREM', lane, 1, key)
  while true do
    local first = redis.call('LINDEX', lane, 0)
    if not first then
      return
    end
    local score = redis.call('ZSCORE', KEYS[2], first)
    if score then
      if tonumber(score) == tonumber(behind) then
        redis.call('ZADD', KEYS[2], now, first)
      end
      return
    end
    redis.call('LPOP', lane)
  end
end
";

/// Removes a delivered job that is not dead, if its take's token is ARGV[4]. KEYS: jobs,
/// due, received, waiting, tokens, takes, and its lane if any; ARGV: key, now, behind,
/// token.
const COMPLETE: &str = r"
if redis.call('HGET', KEYS[5], ARGV[1]) ~= ARGV[4] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
if KEYS[7] then
  out_of_lane(KEYS[7], ARGV[1], ARGV[2], ARGV[3])
end
return 1
";

/// Gives a taken job back unsent, due at ARGV[3], its take uncounted, if its take's token
/// is ARGV[2]. KEYS: due, tokens, takes; ARGV: key, token, due at.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] or not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[3], ARGV[1], -1)
end
return 1
";

/// Stores a taken job's record and makes it due at ARGV[3], if its take's token is ARGV[2].
/// KEYS: jobs, due, tokens, waiting; ARGV: key, token, due at, record.
const RETRY: &str = r"
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
";

/// Stores a taken job's record in dead letters at ARGV[3], if its take's token is ARGV[2].
/// KEYS: jobs, due, tokens, waiting, received, dead, and its lane if any; ARGV: key,
/// token, died at, record, now, behind.
const BURY: &str = r"
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[6], ARGV[3], ARGV[1])
if KEYS[7] then
  out_of_lane(KEYS[7], ARGV[1], ARGV[5], ARGV[6])
end
return 1
";

/// Makes a dead job ready at ARGV[3] with the record ARGV[4], if it is still the one that
/// died at ARGV[2]; a job of a lane goes to its end, behind (ARGV[6]) unless first.
/// KEYS: jobs, due, dead, waiting, received, and its lane if any; ARGV: key, died at,
/// now, record, received at, behind.
const REVIVE: &str = r"
local died = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not died or tonumber(died) ~= tonumber(ARGV[2]) then
  return 0
end
local due = ARGV[3]
if KEYS[6] and redis.call('RPUSH', KEYS[6], ARGV[1]) > 1 then
  due = ARGV[6]
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[2], due, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[1])
return 1
";

/// Removes a dead job. KEYS: jobs, dead, takes; ARGV: key.
const DISCARD: &str = r"
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
";

/// A route's keys.
struct RouteKeys {
    jobs: String,
    due: String,
    tokens: String,
    takes: String,
    waiting: String,
    received: String,
    dead: String,
}

/// The Redis store's queue.
pub(super) struct RedisQueue {
    link: Link,
    prefix: String,
    timeout: Duration,
    clock: Box<dyn Clock>,
    scripts: [Script; 8],
}

impl RedisQueue {
    pub(super) fn new(link: Link, prefix: &str, timeout: Duration) -> RedisQueue {
        RedisQueue {
            link,
            prefix: prefix.to_owned(),
            timeout,
            clock: Box::new(SystemClock),
            scripts: [
                ENQUEUE.to_owned(),
                TAKE.to_owned(),
                format!("{OUT_OF_LANE}{COMPLETE}"),
                RETRY.to_owned(),
                format!("{OUT_OF_LANE}{BURY}"),
                REVIVE.to_owned(),
                DISCARD.to_owned(),
                RELEASE.to_owned(),
            ]
            .map(|code| Script::new(&code)),
        }
    }

    fn keys(&self, route: &str) -> RouteKeys {
        let key = |part: &str| format!("{}queue/{{{route}}}/{part}", self.prefix);
        RouteKeys {
            jobs: key("jobs"),
            due: key("due"),
            tokens: key("tokens"),
            takes: key("takes"),
            waiting: key("waiting"),
            received: key("received"),
            dead: key("dead"),
        }
    }

    /// A lane's list of its jobs' keys, in the order they were stored, the first one
    /// the only one due or taken: under the route's hash tag, like its other keys.
    fn lane_key(&self, job: &Job) -> Option<String> {
        let lane = job.lane.as_ref()?;
        Some(format!(
            "{}queue/{{{}}}/lane/{lane}",
            self.prefix, job.route
        ))
    }

    fn paused_set(&self) -> String {
        format!("{}queue/paused", self.prefix)
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        within("redis", self.timeout, call).await
    }
}

#[async_trait]
impl DeliveryQueue for RedisQueue {
    /// What the server's settings mean for acknowledged jobs, if they can lose any: an
    /// eviction policy other than `noeviction` (a route's jobs are one hash: evicted
    /// whole), or an append-only file written less often than every second, or none.
    async fn durability_warning(&self) -> Option<String> {
        let mut link = self.link.clone();
        let asked: Result<Vec<String>, StoreError> = self
            .bounded(
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("append*")
                    .arg("maxmemory-policy")
                    .query_async(&mut link),
            )
            .await;
        let settings = match asked {
            Ok(settings) => settings,
            Err(error) => {
                return Some(format!(
                    "cannot read Redis's persistence settings ({error}): queued jobs are acknowledged once Redis has them in memory; make sure it keeps an append-only file (appendonly yes), or a restart of Redis loses them"
                ));
            }
        };
        let setting = |name: &str| {
            settings
                .chunks(2)
                .find(|pair| pair[0] == name)
                .and_then(|pair| pair.get(1).cloned())
        };
        if let Some(policy) = setting("maxmemory-policy").filter(|policy| policy != "noeviction") {
            return Some(format!(
                "Redis evicts keys when full (maxmemory-policy {policy}): it can drop a route's queued jobs whole, and hold an ordered lane for good; set maxmemory-policy noeviction for a Redis that keeps queued jobs"
            ));
        }
        match (setting("appendonly").as_deref(), setting("appendfsync").as_deref()) {
            (Some("yes"), Some("always")) => None,
            (Some("yes"), Some("everysec")) => None,
            (Some("yes"), other) => Some(format!(
                "Redis writes its append-only file with appendfsync {}: a crash of its host can lose queued jobs acknowledged in the last seconds (everysec loses at most one)",
                other.unwrap_or("unknown")
            )),
            _ => Some("Redis runs without an append-only file (appendonly no): a restart of Redis loses queued jobs acknowledged since its last snapshot; set appendonly yes".into()),
        }
    }

    async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError> {
        let keys = self.keys(&job.route);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[0].prepare_invoke();
        invocation
            .key(&keys.jobs)
            .key(&keys.due)
            .key(&keys.received)
            .key(&keys.waiting);
        if let Some(lane) = self.lane_key(job) {
            invocation.key(lane);
        }
        invocation
            .arg(&job.key)
            .arg(job.encode()?)
            .arg(self.clock.now())
            .arg(job.received_at)
            .arg(BEHIND);
        let stored: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        Ok(if stored == 1 {
            Enqueued::Stored
        } else {
            Enqueued::AlreadyQueued
        })
    }

    async fn take(
        &self,
        route: &str,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<Taken>, StoreError> {
        let keys = self.keys(route);
        let now = self.clock.now();
        let token = rand::random::<u64>() | 1;
        let mut link = self.link.clone();
        let mut invocation = self.scripts[1].prepare_invoke();
        invocation
            .key(&keys.due)
            .key(&keys.tokens)
            .key(&keys.jobs)
            .key(&keys.takes)
            .arg(now)
            .arg(limit)
            .arg(now.saturating_add(millis(visibility)))
            .arg(token);
        let found: Vec<Vec<u8>> = self.bounded(invocation.invoke_async(&mut link)).await?;
        found
            .chunks(2)
            .filter(|pair| pair.len() == 2)
            .map(|pair| {
                let takes = std::str::from_utf8(&pair[1])
                    .ok()
                    .and_then(|text| text.parse().ok());
                Ok(Taken {
                    job: Job::decode(&pair[0])?,
                    token,
                    attempt: takes.unwrap_or(0),
                })
            })
            .collect()
    }

    async fn complete(&self, taken: &Taken) -> Result<(), StoreError> {
        let keys = self.keys(&taken.job.route);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[2].prepare_invoke();
        invocation
            .key(&keys.jobs)
            .key(&keys.due)
            .key(&keys.received)
            .key(&keys.waiting)
            .key(&keys.tokens)
            .key(&keys.takes);
        if let Some(lane) = self.lane_key(&taken.job) {
            invocation.key(lane);
        }
        invocation
            .arg(&taken.job.key)
            .arg(self.clock.now())
            .arg(BEHIND)
            .arg(taken.token);
        let removed: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        crate::store::owned(removed == 1)
    }

    async fn retry(&self, taken: &Taken, job: &Job, due_at: Millis) -> Result<(), StoreError> {
        let keys = self.keys(&job.route);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[3].prepare_invoke();
        invocation
            .key(&keys.jobs)
            .key(&keys.due)
            .key(&keys.tokens)
            .key(&keys.waiting)
            .arg(&job.key)
            .arg(taken.token)
            .arg(due_at)
            .arg(job.encode()?);
        let changed: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        crate::store::owned(changed == 1)
    }

    async fn release(&self, taken: &Taken, due_at: Millis) -> Result<(), StoreError> {
        let keys = self.keys(&taken.job.route);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[7].prepare_invoke();
        invocation
            .key(&keys.due)
            .key(&keys.tokens)
            .key(&keys.takes)
            .arg(&taken.job.key)
            .arg(taken.token)
            .arg(due_at);
        let changed: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        crate::store::owned(changed == 1)
    }

    async fn bury(&self, taken: &Taken, job: &Job) -> Result<(), StoreError> {
        let keys = self.keys(&job.route);
        let died = job.dead.map_or(self.clock.now(), |(at, _)| at);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[4].prepare_invoke();
        invocation
            .key(&keys.jobs)
            .key(&keys.due)
            .key(&keys.tokens)
            .key(&keys.waiting)
            .key(&keys.received)
            .key(&keys.dead);
        if let Some(lane) = self.lane_key(job) {
            invocation.key(lane);
        }
        invocation
            .arg(&job.key)
            .arg(taken.token)
            .arg(died)
            .arg(job.encode()?)
            .arg(self.clock.now())
            .arg(BEHIND);
        let changed: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        crate::store::owned(changed == 1)
    }

    async fn job(&self, route: &str, key: &str) -> Result<Option<Job>, StoreError> {
        let mut link = self.link.clone();
        let record: Option<Vec<u8>> = self.bounded(link.hget(self.keys(route).jobs, key)).await?;
        record.map(|record| Job::decode(&record)).transpose()
    }

    async fn dead(
        &self,
        route: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        let keys = self.keys(route);
        let (from, past) = match after {
            Some(cursor) => {
                let (died, key) = parse_dead_cursor(cursor)?;
                (died, Some(key.to_owned()))
            }
            None => (0, None),
        };
        let mut link = self.link.clone();
        let mut names: Vec<String> = Vec::new();
        let mut deaths: Vec<Millis> = Vec::new();
        // Members of one score sort by name, as the cursor does: those at the cursor's
        // own time up to its key are skipped.
        let mut offset = 0;
        while names.len() <= limit {
            let batch = limit + 1 - names.len() + 16;
            let found: Vec<(String, f64)> = self
                .bounded(link.zrangebyscore_limit_withscores(
                    &keys.dead,
                    from,
                    "+inf",
                    offset,
                    batch as isize,
                ))
                .await?;
            let ended = found.len() < batch;
            for (name, score) in found {
                let died = score as Millis;
                if died == from && past.as_deref().is_some_and(|past| name.as_str() <= past) {
                    continue;
                }
                names.push(name);
                deaths.push(died);
            }
            if ended {
                break;
            }
            offset += batch as isize;
        }
        let more = names.len() > limit;
        names.truncate(limit);
        deaths.truncate(limit);
        let records: Vec<Option<Vec<u8>>> = if names.is_empty() {
            Vec::new()
        } else {
            self.bounded(
                redis::cmd("HMGET")
                    .arg(&keys.jobs)
                    .arg(&names)
                    .query_async(&mut link),
            )
            .await?
        };
        // A name whose record is gone (evicted) is dropped from dead letters, so that it
        // neither counts against `max_queued` nor ends a listing early.
        let gone: Vec<&String> = names
            .iter()
            .zip(&records)
            .filter_map(|(name, record)| record.is_none().then_some(name))
            .collect();
        if !gone.is_empty() {
            let _: i64 = self.bounded(link.zrem(&keys.dead, &gone)).await?;
        }
        let jobs = records
            .into_iter()
            .flatten()
            .map(|record| Job::decode(&record))
            .collect::<Result<Vec<_>, _>>()?;
        let next = match (more, names.last(), deaths.last()) {
            (true, Some(name), Some(died)) => Some(dead_cursor_at(*died, name)),
            _ => None,
        };
        Ok(DeadPage { jobs, next })
    }

    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let Some((died, job)) = revived(self.job(route, key).await?, now) else {
            return Ok(false);
        };
        let keys = self.keys(route);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[5].prepare_invoke();
        invocation
            .key(&keys.jobs)
            .key(&keys.due)
            .key(&keys.dead)
            .key(&keys.waiting)
            .key(&keys.received);
        if let Some(lane) = self.lane_key(&job) {
            invocation.key(lane);
        }
        invocation
            .arg(key)
            .arg(died)
            .arg(now)
            .arg(job.encode()?)
            .arg(job.received_at)
            .arg(BEHIND);
        let changed: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        Ok(changed == 1)
    }

    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let keys = self.keys(route);
        let mut link = self.link.clone();
        let mut invocation = self.scripts[6].prepare_invoke();
        invocation
            .key(&keys.jobs)
            .key(&keys.dead)
            .key(&keys.takes)
            .arg(key);
        let changed: i64 = self.bounded(invocation.invoke_async(&mut link)).await?;
        Ok(changed == 1)
    }

    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError> {
        let mut link = self.link.clone();
        let mut counts = Vec::with_capacity(routes.len());
        for route in routes {
            let keys = self.keys(route);
            let (waiting, due, dead, oldest): (u64, u64, u64, Vec<(String, f64)>) = self
                .bounded(
                    redis::pipe()
                        .scard(&keys.waiting)
                        .zcard(&keys.due)
                        .zcard(&keys.dead)
                        .zrange_withscores(&keys.received, 0, 0)
                        .query_async(&mut link),
                )
                .await?;
            counts.push(QueueCounts {
                waiting,
                retrying: due.saturating_sub(waiting),
                dead,
                oldest: oldest.first().map(|(_, at)| *at as Millis),
            });
        }
        Ok(counts)
    }

    async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError> {
        let mut link = self.link.clone();
        let set = self.paused_set();
        if paused {
            let _: i64 = self.bounded(link.sadd(set, route)).await?;
        } else {
            let _: i64 = self.bounded(link.srem(set, route)).await?;
        }
        Ok(())
    }

    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        let mut link = self.link.clone();
        self.bounded(link.smembers(self.paused_set())).await
    }
}
