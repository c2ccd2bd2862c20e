//! The shared claim store on Redis: every replica's proxy claims in the same Redis.
//!
//! One string value per key (`{prefix}{namespace}:{key}`), so every transition touches a
//! single key and works on Redis Cluster (`cluster: true`: the cluster client follows
//! `MOVED`, `ASK` and failovers). A claim is one native `SET ... NX PX ... GET`: it writes
//! the in-flight record only where the key is absent and otherwise returns what is there.
//! Finish and hold (`SETTLE`), release, renew and forget are short Lua scripts that check
//! the owner token (or the tag) and change the key atomically on the server; resolve replaces
//! a held value only if it is still the one read (`REPLACE`). `rediss://` is TLS. Leases
//! and retention are the key's native TTL: an expired lease or record is simply gone, so
//! there is nothing to sweep.
//!
//! A value is a tag byte and postcard fields: in flight, `f`, the owner token (16 bytes)
//! and [`Started`]; done, `d`, [`Finished`] and then the [`Started`] of its claim; held,
//! `h`, [`Holding`] and then the [`Started`]: finish and hold keep it from the in-flight
//! value without reading it back to the proxy. Held keys are also listed in the set
//! `{prefix}held`, which the count of held keys reads.
//!
//! An entity's record (`order:`) is `v`, its newest version's sort key, `:`, and the
//! postcard [`EntityRecord`], under its store key, for the retention: `RECORD_VERSION`
//! replaces it only with a larger sort key, compared byte by byte in the script (Lua's
//! own string order follows the server's locale).
//!
//! The outcomes of claims made with `announce` are published on `{prefix}outcomes`, to
//! which each store subscribes ([`hear`]); `listing` pages through a namespace's keys.

mod listing;

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Script, Value};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::tls;
use super::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Clock, Completion, DoneRecord, EntityRecord,
    Fingerprint, Forgotten, Heard, HeldRecord, KeyState, Millis, Page, RESOLVED_STATUS,
    RecordedResponse, Resolution, StateFilter, StoreError, Swept, SystemClock, Version,
    count_by_namespace, millis, owned, within,
};
use crate::config::RedisConfig;
use crate::workers::{PerWorker, Workers};

/// The tag and owner token that open an in-flight value: `f` and 16 bytes.
const OWNER_LEN: usize = 17;

/// Settles a claim if the value still opens with the caller's tag and token (ARGV[1]):
/// becomes ARGV[2] (`d` and the completion, or `h` and the hold) followed by the claim's
/// own fields, for ARGV[3] ms. With ARGV[4], publishes the key on that channel.
const SETTLE: &str = r"
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(value, #ARGV[1] + 1), 'PX', ARGV[3])
if ARGV[4] then
  redis.call('PUBLISH', ARGV[4], KEYS[1])
end
return 1
";

/// Deletes the key if its value opens with the caller's tag and token (ARGV[1]). With
/// ARGV[2], publishes the key on that channel.
const RELEASE: &str = r"
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] then
    redis.call('PUBLISH', ARGV[2], KEYS[1])
  end
  return 1
end
return 0
";

/// Renews a claim if the value still opens with the caller's tag and token (ARGV[1]):
/// its `lease_until` (the varint after `claimed_at`'s) becomes ARGV[2], and its time to
/// live ARGV[3] ms.
const RENEW: &str = r"
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
local function past_varint(at)
  while true do
    local byte = string.byte(value, at)
    if not byte then
      return nil
    end
    if byte < 128 then
      return at + 1
    end
    at = at + 1
  end
end
local lease_at = past_varint(#ARGV[1] + 1)
local after = lease_at and past_varint(lease_at)
if not after then
  return 0
end
redis.call('SET', KEYS[1], string.sub(value, 1, lease_at - 1) .. ARGV[2] .. string.sub(value, after), 'PX', ARGV[3])
return 1
";

/// Deletes a done key; reports an in-flight or held one, an absent one, or a value the
/// proxy did not write (left alone).
const FORGET: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'absent'
end
local tag = redis.call('GETRANGE', KEYS[1], 0, 0)
if tag == 'd' then
  redis.call('DEL', KEYS[1])
  return 'removed'
end
if tag == 'f' then
  return 'in_flight'
end
if tag == 'h' then
  return 'held'
end
return 'unknown'
";

/// Replaces the value if it is still ARGV[1]: by ARGV[2] for ARGV[3] ms, or deletes the
/// key when ARGV[2] is empty.
const REPLACE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
";

/// Sets an entity's record to ARGV[2] for ARGV[3] ms unless the live one holds a sort key
/// as large as ARGV[1] (a value of another form counts as none). Returns 1 if set, else 0.
const RECORD_VERSION: &str = r"
local current = redis.call('GET', KEYS[1])
local newest = current and string.match(current, '^v(%d+):')
if newest then
  local wanted = ARGV[1]
  local larger = false
  for i = 1, math.max(#wanted, #newest) do
    local a, b = string.byte(wanted, i) or -1, string.byte(newest, i) or -1
    if a ~= b then
      larger = a > b
      break
    end
  end
  if not larger then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
";

/// What a claim writes, kept once the key is done.
#[derive(Serialize, Deserialize)]
struct Started {
    claimed_at: Millis,
    lease_until: Millis,
    fingerprint: Fingerprint,
}

/// What a finish adds.
#[derive(Serialize, Deserialize)]
struct Finished {
    completed_at: Millis,
    expires_at: Millis,
    upstream_status: u16,
    #[serde(with = "crate::store::recorded_response")]
    response: Option<RecordedResponse>,
}

/// What a hold adds.
#[derive(Serialize, Deserialize)]
struct Holding {
    held_at: Millis,
    expires_at: Millis,
    reason: Ambiguity,
}

/// A value as read back.
enum Stored {
    InFlight(Started),
    Done(DoneRecord),
    /// A held key, and the claim's fields as they are encoded.
    Held(HeldRecord, Vec<u8>),
}

impl Stored {
    fn state(self) -> KeyState {
        match self {
            Stored::InFlight(started) => KeyState::InFlight {
                claimed_at: started.claimed_at,
                lease_until: started.lease_until,
                fingerprint: started.fingerprint,
            },
            Stored::Done(record) => KeyState::Done(record),
            Stored::Held(record, _) => KeyState::Held(record),
        }
    }

    fn decode(value: &[u8]) -> Result<Stored, StoreError> {
        fn unreadable<E>(_: E) -> StoreError {
            malformed("a claim record is cut short or cannot be read")
        }
        match value.split_first() {
            Some((b'f', rest)) => {
                let started = rest.get(OWNER_LEN - 1..).ok_or_else(|| unreadable(()))?;
                Ok(Stored::InFlight(
                    postcard::from_bytes(started).map_err(unreadable)?,
                ))
            }
            Some((b'd', rest)) => {
                let (finished, rest): (Finished, _) =
                    postcard::take_from_bytes(rest).map_err(unreadable)?;
                let started: Started = postcard::from_bytes(rest).map_err(unreadable)?;
                Ok(Stored::Done(DoneRecord {
                    claimed_at: started.claimed_at,
                    completed_at: finished.completed_at,
                    expires_at: finished.expires_at,
                    upstream_status: finished.upstream_status,
                    fingerprint: started.fingerprint,
                    response: finished.response,
                }))
            }
            Some((b'h', rest)) => {
                let (holding, claim): (Holding, _) =
                    postcard::take_from_bytes(rest).map_err(unreadable)?;
                let started: Started = postcard::from_bytes(claim).map_err(unreadable)?;
                let record = HeldRecord {
                    claimed_at: started.claimed_at,
                    held_at: holding.held_at,
                    expires_at: holding.expires_at,
                    fingerprint: started.fingerprint,
                    reason: holding.reason,
                };
                Ok(Stored::Held(record, claim.to_vec()))
            }
            _ => Err(malformed("a claim record has an unknown tag")),
        }
    }
}

/// An entity's record as stored: `v`, the sort key, `:`, the record.
fn encode_entity(record: &EntityRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + record.newest.text.len());
    out.push(b'v');
    out.extend_from_slice(record.newest.sort_key.as_bytes());
    out.push(b':');
    encode(record, out)
}

fn decode_entity(value: &[u8]) -> Option<EntityRecord> {
    let rest = value.strip_prefix(b"v")?;
    let colon = rest.iter().position(|&byte| byte == b':')?;
    postcard::from_bytes(&rest[colon + 1..]).ok()
}

/// The opening of an in-flight value: the tag and the owner's token.
fn owner_prefix(token: u128) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(OWNER_LEN);
    prefix.push(b'f');
    prefix.extend_from_slice(&token.to_be_bytes());
    prefix
}

/// Serializes into `out`; the types here always serialize.
fn encode(value: &impl Serialize, out: Vec<u8>) -> Vec<u8> {
    postcard::to_extend(value, out).expect("a claim record always serializes")
}

/// The Redis store.
pub struct RedisStore {
    /// The connection opened at start, for callers outside the workers, then one per
    /// worker, opened on it: a connection's task runs on the runtime that opened it, and
    /// a reply that wakes another thread costs CPU.
    connections: PerWorker<Link>,
    prefix: String,
    timeout: Duration,
    clock: Box<dyn Clock>,
    settle: Script,
    release: Script,
    renew: Script,
    forget: Script,
    replace: Script,
    record_version: Script,
    /// Where finishes and releases of announced claims are published: `{prefix}outcomes`.
    outcomes_channel: String,
    /// Clients for the subscription to that channel: the server, or each cluster node
    /// named in the configuration (a published message reaches every node).
    subscribers: Vec<redis::Client>,
    /// Ends the subscription when the store is dropped.
    stop_hearing: CancellationToken,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.stop_hearing.cancel();
    }
}

impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> StoreError {
        StoreError::caused("redis", &error)
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

    /// Clients of the server, or of each node the configuration names, for a
    /// subscription: classic Pub/Sub messages reach every node of a cluster.
    fn subscribers(config: &RedisConfig) -> Result<Vec<redis::Client>, StoreError> {
        let nodes = config
            .cluster
            .then_some(&config.nodes)
            .into_iter()
            .flatten();
        let urls = std::iter::once(config.url.expose()).chain(nodes.map(|node| node.expose()));
        urls.map(|url| {
            let client = if url.starts_with("rediss://") {
                let certificates = tls::redis_certificates(config.tls.as_ref());
                redis::Client::build_with_tls(url, certificates)
            } else {
                redis::Client::open(url)
            };
            client.map_err(|error| {
                StoreError::Backend(format!("redis URL {}: {error}", config.url.masked()))
            })
        })
        .collect()
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

/// Refuses a Redis that would fail every claim: `SET` with both `NX` and `GET` needs Redis
/// 7.0. The probe key cannot be a store key (those hold a `:`) and lives a millisecond.
async fn check_version(connection: &mut Link, config: &RedisConfig) -> Result<(), StoreError> {
    let mut probe = redis::cmd("SET");
    probe
        .arg(format!("{}version-probe", config.prefix))
        .arg("")
        .arg("NX")
        .arg("PX")
        .arg(1)
        .arg("GET");
    let answer: redis::RedisResult<Option<Vec<u8>>> = probe.query_async(connection).await;
    answer.map(drop).map_err(|error| {
        StoreError::from(error).context(&format!(
            "redis at {} refuses SET with NX and GET (dedupe-proxy needs Redis 7.0 or later)",
            config.url.masked()
        ))
    })
}

/// The most held keys `count_held` reads (each is one `GET`).
const HELD_COUNTED_MAX: usize = 10_000;

/// How often the subscription's connection is checked: one that died without a word
/// would otherwise leave waiters to their rechecks for good.
const SUBSCRIPTION_CHECK: Duration = Duration::from_secs(30);

/// Subscribes to `channel` and passes each store key published on it to `heard`, for
/// ever: when the subscription ends (the server went away), the next client in
/// `subscribers` subscribes again, after a pause that grows up to 5 s while none answers.
async fn hear(
    subscribers: Vec<redis::Client>,
    channel: String,
    prefix: String,
    timeout: Duration,
    heard: Heard,
) {
    let mut pause = Duration::from_millis(100);
    for client in subscribers.iter().cycle() {
        let subscribing = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        };
        match tokio::time::timeout(timeout, subscribing).await {
            Ok(Ok(pubsub)) => {
                let (mut sink, mut messages) = pubsub.split();
                let mut checks = tokio::time::interval(SUBSCRIPTION_CHECK);
                checks.tick().await;
                loop {
                    tokio::select! {
                        message = messages.next() => {
                            let Some(message) = message else { break };
                            if let Some(key) = message.get_payload_bytes().strip_prefix(prefix.as_bytes())
                                && let Ok(key) = std::str::from_utf8(key)
                            {
                                heard(key);
                            }
                        }
                        _ = checks.tick() => {
                            let answer = tokio::time::timeout(timeout, sink.ping::<Value>()).await;
                            if !matches!(answer, Ok(Ok(_))) {
                                break;
                            }
                            // Held for a while: a server that drops it at once is not
                            // subscribed to again at once.
                            pause = Duration::from_millis(100);
                        }
                    }
                }
                tracing::warn!("the subscription to announced outcomes ended; subscribing again");
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot subscribe to announced outcomes; waiters look at the store again from time to time");
            }
            Err(_) => {
                tracing::warn!("subscribing to announced outcomes took longer than {timeout:?}")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
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
        let mut outside = opener.clone().open(config.clone()).await?;
        check_version(&mut outside, config).await?;
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
            outcomes_channel: format!("{}outcomes", config.prefix),
            subscribers: Opener::subscribers(config)?,
            stop_hearing: CancellationToken::new(),
            prefix: config.prefix.clone(),
            timeout: config.timeout.0,
            clock: Box::new(SystemClock),
            settle: Script::new(SETTLE),
            release: Script::new(RELEASE),
            renew: Script::new(RENEW),
            forget: Script::new(FORGET),
            replace: Script::new(REPLACE),
            record_version: Script::new(RECORD_VERSION),
        })
    }

    /// The connection for the caller's thread.
    fn connection(&self) -> Link {
        self.connections.get().clone()
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The set of the store keys that are (or are about to be) held, for counting them:
    /// `<prefix>held`, which no store key can be, having no `:`.
    fn held_index(&self) -> String {
        format!("{}held", self.prefix)
    }

    /// Replaces an owned in-flight value by `opening` followed by the claim's fields, for
    /// `ttl` ms, announcing it if the claim says so.
    async fn settle(&self, claim: &Claim, opening: Vec<u8>, ttl: Millis) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let mut invocation = self.settle.key(self.key(&claim.key));
        invocation
            .arg(owner_prefix(claim.token))
            .arg(opening)
            .arg(ttl);
        if claim.announce {
            invocation.arg(&self.outcomes_channel);
        }
        let settled: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        owned(settled == 1)
    }

    /// The decoded value of a key, and its bytes.
    async fn read(&self, key: &str) -> Result<Option<(Stored, Vec<u8>)>, StoreError> {
        let mut connection = self.connection();
        let value: Option<Vec<u8>> = self.bounded(connection.get(self.key(key))).await?;
        value
            .map(|value| Ok((Stored::decode(&value)?, value)))
            .transpose()
    }

    /// Runs a Redis call with the configured timeout.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        within("redis", self.timeout, call).await
    }
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
        let started = Started {
            claimed_at: now,
            lease_until: now.saturating_add(lease_ms),
            fingerprint,
        };
        let opening = owner_prefix(token);
        let value = encode(&started, opening.clone());
        let mut connection = self.connection();
        // Written only where the key is absent; otherwise what is there comes back.
        let mut claim = redis::cmd("SET");
        claim
            .arg(self.key(key))
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .arg("GET");
        let found: Option<Vec<u8>> = self.bounded(claim.query_async(&mut connection)).await?;
        // A claim the client sent again (its first reply lost) finds its own value.
        let found = found.filter(|value| !value.starts_with(&opening));
        match found.as_deref().map(Stored::decode).transpose()? {
            None => Ok(ClaimOutcome::Claimed(Claim::new(key, token))),
            Some(Stored::InFlight(started)) => Ok(ClaimOutcome::InFlight {
                lease_until: started.lease_until,
            }),
            Some(Stored::Done(record)) => Ok(ClaimOutcome::Done(record)),
            Some(Stored::Held(record, _)) => Ok(ClaimOutcome::Held(record)),
        }
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let now = self.clock.now();
        let retention = millis(completion.retention).max(1);
        let finished = Finished {
            completed_at: now,
            expires_at: now.saturating_add(retention),
            upstream_status: completion.upstream_status,
            response: completion.response,
        };
        self.settle(claim, encode(&finished, vec![b'd']), retention)
            .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), StoreError> {
        let lease_ms = millis(lease).max(1);
        let lease_until = postcard::to_stdvec(&self.clock.now().saturating_add(lease_ms))
            .expect("a number always encodes");
        let mut connection = self.connection();
        let mut invocation = self.renew.key(self.key(&claim.key));
        invocation
            .arg(owner_prefix(claim.token))
            .arg(lease_until)
            .arg(lease_ms);
        let renewed: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        owned(renewed == 1)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let mut invocation = self.release.key(self.key(&claim.key));
        invocation.arg(owner_prefix(claim.token));
        if claim.announce {
            invocation.arg(&self.outcomes_channel);
        }
        let released: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        owned(released == 1)
    }

    async fn hold(
        &self,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let retention = millis(retention).max(1);
        let holding = Holding {
            held_at: now,
            expires_at: now.saturating_add(retention),
            reason,
        };
        self.settle(claim, encode(&holding, vec![b'h']), retention)
            .await?;
        // The count's list is another key (on a cluster, maybe another node): its failure
        // must not fail the hold, which stands; the key is then missing from the count.
        let mut connection = self.connection();
        let listed: Result<i64, _> = self
            .bounded(connection.sadd(self.held_index(), &claim.key))
            .await;
        if let Err(error) = listed {
            tracing::warn!(%error, key = %claim.key, "a held key is missing from dedupe_keys_held");
        }
        Ok(())
    }

    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError> {
        let Some((Stored::Held(_, claim), value)) = self.read(key).await? else {
            return Ok(false);
        };
        let (replacement, ttl) = match resolution {
            Resolution::Release => (Vec::new(), 1),
            Resolution::Done { retention } => {
                let now = self.clock.now();
                let retention = millis(retention).max(1);
                let finished = Finished {
                    completed_at: now,
                    expires_at: now.saturating_add(retention),
                    upstream_status: RESOLVED_STATUS,
                    response: None,
                };
                let mut done = encode(&finished, vec![b'd']);
                done.extend_from_slice(&claim);
                (done, retention)
            }
        };
        let mut connection = self.connection();
        let mut invocation = self.replace.key(self.key(key));
        invocation.arg(value).arg(replacement).arg(ttl);
        let replaced: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        if replaced == 1 {
            // Best effort: the count drops a member that is no longer held by itself.
            let _: Result<i64, _> = self.bounded(connection.srem(self.held_index(), key)).await;
        }
        Ok(replaced == 1)
    }

    async fn count_held(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut connection = self.connection();
        let mut listed: Vec<String> = Vec::new();
        let mut cursor = 0u64;
        // Bounded, whatever the set holds: beyond that many the count stops growing.
        while listed.len() < HELD_COUNTED_MAX {
            let mut scan = redis::cmd("SSCAN");
            scan.arg(self.held_index())
                .arg(cursor)
                .arg("COUNT")
                .arg(1000);
            let (next, members): (String, Vec<String>) =
                self.bounded(scan.query_async(&mut connection)).await?;
            listed.extend(members);
            cursor = next.parse().unwrap_or(0);
            if cursor == 0 {
                break;
            }
        }
        listed.sort();
        listed.dedup();
        let mut held = Vec::new();
        for key in listed {
            match self.read(&key).await {
                Ok(Some((Stored::Held(..), _))) => held.push(key),
                // Resolved, expired, or never held (its hold failed): no longer listed.
                Ok(None | Some((Stored::Done(_), _))) => {
                    let _: i64 = self
                        .bounded(connection.srem(self.held_index(), &key))
                        .await?;
                }
                // In flight again (a hold on its way, or taken over after it expired).
                Ok(Some((Stored::InFlight(_), _))) | Err(_) => {}
            }
        }
        Ok(count_by_namespace(held.iter().map(String::as_str)))
    }

    async fn list(
        &self,
        namespace: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        listing::list(self, namespace, state, after, limit).await
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        Ok(self.read(key).await?.map(|(stored, _)| stored.state()))
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let mut connection = self.connection();
        let invocation = self.forget.key(self.key(key));
        let outcome: String = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        match outcome.as_str() {
            "removed" => Ok(Forgotten::Removed),
            "in_flight" => Ok(Forgotten::InFlight),
            "held" => Ok(Forgotten::Held),
            "absent" => Ok(Forgotten::Absent),
            _ => Err(malformed("a claim record has an unknown tag")),
        }
    }

    fn hear_outcomes(&self, heard: Heard) {
        let subscribers = self.subscribers.clone();
        let (channel, prefix) = (self.outcomes_channel.clone(), self.prefix.clone());
        let (stop, timeout) = (self.stop_hearing.clone(), self.timeout);
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = hear(subscribers, channel, prefix, timeout, heard) => {}
            }
        });
    }

    async fn newest_version(&self, entity: &str) -> Result<Option<EntityRecord>, StoreError> {
        let mut connection = self.connection();
        let value: Option<Vec<u8>> = self.bounded(connection.get(self.key(entity))).await?;
        // A value of another form guards nothing (as on every store): the next version
        // recorded replaces it.
        Ok(value.as_deref().and_then(decode_entity))
    }

    async fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let retention = millis(retention).max(1);
        let record = EntityRecord {
            newest: version.clone(),
            recorded_at: now,
            expires_at: now.saturating_add(retention),
        };
        let mut connection = self.connection();
        let mut invocation = self.record_version.key(self.key(entity));
        invocation
            .arg(&version.sort_key)
            .arg(encode_entity(&record))
            .arg(retention);
        let recorded: i64 = self
            .bounded(invocation.invoke_async(&mut connection))
            .await?;
        Ok(recorded == 1)
    }

    async fn forget_entity(&self, entity: &str) -> Result<bool, StoreError> {
        let mut connection = self.connection();
        let removed: i64 = self.bounded(connection.del(self.key(entity))).await?;
        Ok(removed == 1)
    }

    /// Redis expires leases, done records and entity records itself.
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
