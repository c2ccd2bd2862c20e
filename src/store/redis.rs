//! The shared claim store on Redis: every replica's proxy claims in the same Redis.
//!
//! One hash per key (`{prefix}{namespace}:{key}`), so every operation touches a single
//! key and works on Redis Cluster (`cluster: true`: the cluster client follows `MOVED`,
//! `ASK` and failovers). Each transition is one Lua script that checks the state and
//! owner token and changes the hash atomically on the server. `rediss://` is TLS. Leases and
//! retention are the key's native TTL: an expired lease or done record is simply gone,
//! so there is nothing to sweep.
//!
//! Hash fields: `s` state (`f` in flight, `d` done), `o` owner token, `c` claimed at,
//! `l` lease end, `p` completed at, `e` expires at, `u` upstream status, `h` body
//! SHA-256, and `rs`/`rt`/`rb` the recorded answer for `replay`.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Script, Value};

use super::tls;
use super::{
    Claim, ClaimOutcome, ClaimStore, Clock, Completion, DoneRecord, Fingerprint, Forgotten,
    KeyState, RecordedResponse, StoreError, Swept, SystemClock, millis, owned, within,
};
use crate::config::RedisConfig;
use crate::workers::{PerWorker, Workers};

const CLAIM: &str = r"
local state = redis.call('HGET', KEYS[1], 's')
if state == 'd' then
  return {'d', redis.call('HMGET', KEYS[1], 'c', 'p', 'e', 'u', 'h', 'rs', 'rt', 'rb')}
end
if state == 'f' then
  return {'f', redis.call('HGET', KEYS[1], 'l')}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'f', 'o', ARGV[1], 'c', ARGV[2], 'l', ARGV[3], 'h', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'c'}
";

const FINISH: &str = r"
if redis.call('HGET', KEYS[1], 's') ~= 'f' or redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 's', 'd', 'p', ARGV[2], 'e', ARGV[3], 'u', ARGV[5])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'rs', ARGV[6], 'rt', ARGV[7], 'rb', ARGV[8])
end
redis.call('HDEL', KEYS[1], 'o', 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
";

const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 's') == 'f' and redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

const FORGET: &str = r"
local state = redis.call('HGET', KEYS[1], 's')
if state == 'd' then
  redis.call('DEL', KEYS[1])
  return 'removed'
end
if state == 'f' then
  return 'in_flight'
end
return 'absent'
";

/// The Redis store.
pub struct RedisStore {
    /// The connection opened at start, for callers outside the workers, then one per
    /// worker, opened on it: a connection's task runs on the runtime that opened it, and
    /// a reply that wakes another thread costs CPU.
    connections: PerWorker<Link>,
    prefix: String,
    timeout: Duration,
    clock: Box<dyn Clock>,
    claim: Script,
    finish: Script,
    release: Script,
    forget: Script,
}

impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> StoreError {
        StoreError::caused("redis", &error)
    }
}

impl From<redis::ParsingError> for StoreError {
    fn from(error: redis::ParsingError) -> StoreError {
        StoreError::of("redis", error)
    }
}

fn malformed(what: &str) -> StoreError {
    StoreError::of("redis", what)
}

/// A connection to one Redis, or to a cluster; both reconnect by themselves.
#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(connection) => connection.req_packed_command(cmd),
            Link::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Link::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(connection) => connection.get_db(),
            Link::Cluster(connection) => connection.get_db(),
        }
    }
}

/// How connections are opened: a client of one server or of a cluster, with TLS when the
/// URLs are `rediss://`.
// Made once per store and cloned once per worker: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Opener {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

impl Opener {
    fn new(config: &RedisConfig) -> Result<Opener, StoreError> {
        let url = config.url.masked();
        let invalid =
            |error: redis::RedisError| StoreError::Backend(format!("redis URL {url}: {error}"));
        let certificates = tls::redis_certificates(config.tls.as_ref());
        let uses_tls = config.url.expose().starts_with("rediss://");
        if config.cluster {
            let seeds = std::iter::once(config.url.expose().to_owned())
                .chain(config.nodes.iter().map(|node| node.expose().to_owned()));
            let mut builder = ClusterClientBuilder::new(seeds)
                .connection_timeout(config.timeout.0)
                .response_timeout(config.timeout.0);
            if uses_tls {
                builder = builder.certs(certificates);
            }
            return builder.build().map(Opener::Cluster).map_err(invalid);
        }
        let client = if uses_tls {
            redis::Client::build_with_tls(config.url.expose(), certificates)
        } else {
            redis::Client::open(config.url.expose())
        };
        client.map(Opener::Single).map_err(invalid)
    }

    /// Opens a connection and checks that Redis answers.
    async fn open(self, config: RedisConfig) -> Result<Link, StoreError> {
        let (url, timeout) = (config.url.masked(), config.timeout.0);
        let opening = async {
            match self {
                Opener::Single(client) => {
                    let manager = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout))
                        .set_number_of_retries(1);
                    client
                        .get_connection_manager_with_config(manager)
                        .await
                        .map(Link::Single)
                }
                Opener::Cluster(client) => client.get_async_connection().await.map(Link::Cluster),
            }
        };
        let mut connection = tokio::time::timeout(timeout, opening)
            .await
            .map_err(|_| {
                StoreError::Backend(format!("redis at {url} did not answer within {timeout:?}"))
            })?
            .map_err(|error| {
                StoreError::from(error).context(&format!("cannot reach redis at {url}"))
            })?;
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .map_err(|error| StoreError::from(error).context(&format!("redis at {url}")))?;
        Ok(connection)
    }
}

impl RedisStore {
    /// Connects to Redis, once and once more on each of `workers`, and checks that it
    /// answers.
    pub async fn connect(
        config: &RedisConfig,
        workers: Option<&Workers>,
    ) -> Result<RedisStore, StoreError> {
        let opener = Opener::new(config)?;
        let outside = opener.clone().open(config.clone()).await?;
        let mut each = Vec::new();
        if let Some(workers) = workers {
            for index in 0..workers.count() {
                let opening = opener.clone().open(config.clone());
                each.push(
                    workers
                        .run_on(index, opening)
                        .await
                        .map_err(|error| StoreError::of("redis", error))??,
                );
            }
        }
        Ok(RedisStore {
            connections: PerWorker::new(outside, each),
            prefix: config.prefix.clone(),
            timeout: config.timeout.0,
            clock: Box::new(SystemClock),
            claim: Script::new(CLAIM),
            finish: Script::new(FINISH),
            release: Script::new(RELEASE),
            forget: Script::new(FORGET),
        })
    }

    /// The connection for the caller's thread.
    fn connection(&self) -> Link {
        self.connections.get().clone()
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Runs a Redis call with the configured timeout.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        within("redis", self.timeout, call).await
    }
}

fn number(field: &Option<Vec<u8>>) -> Result<u64, StoreError> {
    field
        .as_deref()
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| malformed("a claim record has a missing or malformed field"))
}

fn fingerprint(field: &Option<Vec<u8>>) -> Fingerprint {
    field
        .as_deref()
        .and_then(|bytes| bytes.try_into().ok())
        .unwrap_or([0; 32])
}

/// Builds a done record from the fields `c p e u h rs rt rb`, in that order.
fn done_record(fields: &[Option<Vec<u8>>]) -> Result<DoneRecord, StoreError> {
    let [
        claimed,
        completed,
        expires,
        status,
        hash,
        r_status,
        r_type,
        r_body,
    ] = fields
    else {
        return Err(malformed("a done record has the wrong number of fields"));
    };
    let response = match r_status {
        Some(_) => Some(RecordedResponse::read_back(
            number(r_status)?,
            r_type
                .as_deref()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned()),
            r_body.clone(),
        )),
        None => None,
    };
    Ok(DoneRecord {
        claimed_at: number(claimed)?,
        completed_at: number(completed)?,
        expires_at: number(expires)?,
        upstream_status: u16::try_from(number(status)?).unwrap_or(0),
        fingerprint: fingerprint(hash),
        response,
    })
}

#[async_trait]
impl ClaimStore for RedisStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now();
        let token: u128 = rand::random();
        let lease_ms = millis(lease).max(1);
        let mut connection = self.connection();
        let mut invocation = self.claim.key(self.key(key));
        invocation
            .arg(token.to_string())
            .arg(now)
            .arg(now.saturating_add(lease_ms))
            .arg(fingerprint.as_slice())
            .arg(lease_ms);
        let answer: redis::Value = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        let redis::Value::Array(parts) = answer else {
            return Err(malformed("unexpected answer to a claim"));
        };
        let tag: String = parts
            .first()
            .map(redis::from_redis_value_ref)
            .transpose()?
            .unwrap_or_default();
        match tag.as_str() {
            "c" => Ok(ClaimOutcome::Claimed(Claim {
                key: key.to_owned(),
                token,
            })),
            "f" => {
                let lease_until: Option<Vec<u8>> =
                    parts.get(1).map(redis::from_redis_value_ref).transpose()?;
                Ok(ClaimOutcome::InFlight {
                    lease_until: number(&lease_until).unwrap_or(now),
                })
            }
            "d" => {
                let fields: Vec<Option<Vec<u8>>> = parts
                    .get(1)
                    .map(redis::from_redis_value_ref)
                    .transpose()?
                    .unwrap_or_default();
                Ok(ClaimOutcome::Done(done_record(&fields)?))
            }
            other => Err(malformed(&format!("unexpected claim state `{other}`"))),
        }
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let now = self.clock.now();
        let retention = millis(completion.retention).max(1);
        let (status, content_type, body) = match &completion.response {
            Some(recorded) => (
                recorded.status.to_string(),
                recorded.content_type.clone().unwrap_or_default(),
                recorded.body.to_vec(),
            ),
            None => (String::new(), String::new(), Vec::new()),
        };
        let mut connection = self.connection();
        let mut invocation = self.finish.key(self.key(&claim.key));
        invocation
            .arg(claim.token.to_string())
            .arg(now)
            .arg(now.saturating_add(retention))
            .arg(retention)
            .arg(completion.upstream_status)
            .arg(status)
            .arg(content_type)
            .arg(body);
        let finished: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        owned(finished == 1)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let mut invocation = self.release.key(self.key(&claim.key));
        invocation.arg(claim.token.to_string());
        let released: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        owned(released == 1)
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        let mut connection = self.connection();
        // The state, then the fields of a done record in `done_record`'s order, then the
        // lease's end.
        let fields = ["s", "c", "p", "e", "u", "h", "rs", "rt", "rb", "l"];
        let values: Vec<Option<Vec<u8>>> = self
            .bounded(connection.hmget(self.key(key), &fields[..]))
            .await?;
        match values[0].as_deref() {
            Some(b"f") => Ok(Some(KeyState::InFlight {
                claimed_at: number(&values[1])?,
                lease_until: number(&values[9])?,
                fingerprint: fingerprint(&values[5]),
            })),
            Some(b"d") => Ok(Some(KeyState::Done(done_record(&values[1..9])?))),
            _ => Ok(None),
        }
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let mut connection = self.connection();
        let invocation = self.forget.key(self.key(key));
        let outcome: String = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        Ok(match outcome.as_str() {
            "removed" => Forgotten::Removed,
            "in_flight" => Forgotten::InFlight,
            _ => Forgotten::Absent,
        })
    }

    /// Redis expires leases and done records itself.
    async fn sweep(&self, _limit: usize) -> Result<Swept, StoreError> {
        Ok(Swept::default())
    }

    /// Durability is the Redis server's (its `appendfsync` setting).
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn done_keys(&self) -> Option<u64> {
        None
    }
}
