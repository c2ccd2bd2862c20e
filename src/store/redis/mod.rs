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
//! A value is a tag byte and postcard fields (`stored.rs`): in flight, `f`, the owner token
//! (16 bytes) and `Started`; done, `d`, `Finished` and then the `Started` of its claim;
//! held, `h`, `Holding` and then the `Started`: finish and hold keep it from the in-flight
//! value without reading it back to the proxy. Held keys are also listed in the set
//! `{prefix}held`, which the count of held keys reads.
//!
//! An entity's record (`order:`) is `v`, its newest version's sort key, `:`, and the
//! postcard `EntityRecord`, under its store key, for the retention: `RECORD_VERSION`
//! replaces it only with a larger sort key, compared byte by byte in the script (Lua's
//! own string order follows the server's locale).
//!
//! The outcomes of claims made with `announce` are published on `{prefix}outcomes`, to
//! which each store subscribes (`subscription.rs`); `listing.rs` pages through a
//! namespace's keys; the scripts are in `scripts.rs`, the connections in `connection.rs`.

mod connection;
mod listing;
mod log;
mod queue;
mod scripts;
mod stored;
mod subscription;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use tokio_util::sync::CancellationToken;

use self::connection::{Link, Opener, check_version};
use self::log::RedisLog;
use self::queue::RedisQueue;
use self::scripts::{FORGET, RECORD_VERSION, RELEASE, RENEW, REPLACE, SETTLE};
use self::stored::{
    Finished, Holding, Started, Stored, decode_entity, encode, encode_entity, malformed,
    owner_prefix, with_expiry,
};
use self::subscription::hear;
use super::minutes::{KEPT_FOR, MinuteFigures, READ_MAX};
use super::queue::DeliveryQueue;
use super::replicas::{FORGOTTEN_AFTER, ReplicaReport};
use super::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Clock, Completion, EntityRecord, Expiry,
    Fingerprint, Forgotten, Heard, KeyState, Millis, Page, RESOLVED_STATUS, Resolution,
    StateFilter, StoreError, Swept, SystemClock, Version, count_by_namespace, millis, owned,
    store_key, within,
};
use crate::store::settings::RedisConfig;
use crate::workers::{PerWorker, Workers};

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
    queue: Arc<RedisQueue>,
    log: Arc<RedisLog>,
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

/// The most held keys `count_held` reads (each is one `GET`).
const HELD_COUNTED_MAX: usize = 10_000;

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
        let queue = Arc::new(RedisQueue::new(
            outside.clone(),
            &config.prefix,
            config.timeout.0,
        ));
        let log = Arc::new(RedisLog::new(
            outside.clone(),
            &config.prefix,
            config.timeout.0,
        ));
        Ok(RedisStore {
            queue,
            log,
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

    /// The reports in the hash `replicas`, and the fields of those that do not read.
    async fn replicas_reported(
        &self,
        replicas: &str,
    ) -> Result<(Vec<ReplicaReport>, Vec<Vec<u8>>), StoreError> {
        let mut connection = self.connection();
        let mut all = redis::cmd("HGETALL");
        all.arg(replicas);
        let fields: Vec<(Vec<u8>, Vec<u8>)> =
            self.bounded(all.query_async(&mut connection)).await?;
        let (mut reports, mut unreadable) = (Vec::new(), Vec::new());
        for (field, value) in fields {
            match ReplicaReport::decode(&value) {
                Ok(report) => reports.push(report),
                Err(_) => unreadable.push(field),
            }
        }
        Ok((reports, unreadable))
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

    /// Releases, in a task of its own, the claim of `key` by `token` if there is one.
    fn give_back_unanswered(&self, mut connection: Link, key: &str, token: u128) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (release, key) = (self.release.clone(), self.key(key));
        let timeout = self.timeout;
        runtime.spawn(async move {
            let mut invocation = release.key(key);
            invocation.arg(owner_prefix(token));
            let released = within("redis", timeout, invocation.invoke_async::<i64>(&mut connection));
            // At debug: it fails when Redis does, which the claim's caller reports already.
            if let Err(error) = released.await {
                tracing::debug!(%error, "giving back a claim whose caller was gone failed; it ends with its lease");
            }
        });
    }
}

/// How many times a compare-and-swap of a key's value is tried before giving up.
const SWAP_TRIES: usize = 32;

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
        // Should the answer never reach this caller (its sender hung up, its deadline
        // passed), the claim may still have been written: it is given back rather than left
        // to turn retries away for its lease, sent after the claim on its connection.
        let spare = connection.clone();
        let unanswered = scopeguard::guard((), |()| self.give_back_unanswered(spare, key, token));
        let found: Option<Vec<u8>> = self.bounded(claim.query_async(&mut connection)).await?;
        scopeguard::ScopeGuard::into_inner(unanswered);
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
        prefix: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let connection = self.connection();
        let listed = store_key(namespace, prefix);
        listing::list(
            connection,
            &self.prefix,
            self.timeout,
            &listed,
            state,
            after,
            limit,
        )
        .await
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

    async fn set_expiry(&self, key: &str, expires_at: Millis) -> Result<Expiry, StoreError> {
        // A value changed between the read and the swap is read again: a forget or
        // another move raced this one. Each round one of the racers wins, so a few
        // operators at once are all served.
        for _ in 0..SWAP_TRIES {
            let Some((stored, value)) = self.read(key).await? else {
                return Ok(Expiry::Absent);
            };
            match stored {
                Stored::InFlight(_) => return Ok(Expiry::InFlight),
                Stored::Held(..) => return Ok(Expiry::Held),
                Stored::Done(_) => {}
            }
            let moved = with_expiry(&value, expires_at)
                .ok_or_else(|| malformed("a done record cannot be read"))?;
            let ttl = expires_at.saturating_sub(self.clock.now()).max(1);
            let mut connection = self.connection();
            let mut invocation = self.replace.key(self.key(key));
            invocation.arg(value).arg(moved).arg(ttl);
            let replaced: i64 = self
                .bounded(invocation.invoke_async(&mut connection))
                .await?;
            if replaced == 1 {
                return Ok(Expiry::Set);
            }
        }
        Err(StoreError::Backend(
            "the key kept changing while its expiry was set".into(),
        ))
    }

    fn announces_outcomes(&self) -> Option<bool> {
        Some(true)
    }

    /// A field of the hash `<prefix>replicas` (no store key: it has no `:`) per replica.
    async fn report_replica(&self, report: &ReplicaReport) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let replicas = format!("{}replicas", self.prefix);
        let mut set = redis::cmd("HSET");
        set.arg(&replicas).arg(&report.id).arg(report.encode());
        let _: i64 = self.bounded(set.query_async(&mut connection)).await?;
        let forgotten = report.seen_at.saturating_sub(millis(FORGOTTEN_AFTER));
        let (reports, mut old) = self.replicas_reported(&replicas).await?;
        let stale = reports
            .into_iter()
            .filter(|reported| reported.seen_at < forgotten);
        old.extend(stale.map(|reported| reported.id.into_bytes()));
        if !old.is_empty() {
            let mut remove = redis::cmd("HDEL");
            remove.arg(&replicas).arg(old);
            let _: i64 = self.bounded(remove.query_async(&mut connection)).await?;
        }
        Ok(())
    }

    async fn replicas(&self) -> Result<Option<Vec<ReplicaReport>>, StoreError> {
        let replicas = format!("{}replicas", self.prefix);
        Ok(Some(self.replicas_reported(&replicas).await?.0))
    }

    /// Members of the sorted set `<prefix>minutes` (no store key: it has no `:`), each
    /// scored by its minute.
    async fn record_minute(&self, figures: &MinuteFigures) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let minutes = format!("{}minutes", self.prefix);
        let mut add = redis::cmd("ZADD");
        add.arg(&minutes).arg(figures.minute).arg(figures.encode());
        let _: i64 = self.bounded(add.query_async(&mut connection)).await?;
        // By the server's clock, which every replica shares: one whose own runs ahead
        // would drop the others' minutes.
        let (seconds, _): (u64, u64) = self
            .bounded(redis::cmd("TIME").query_async(&mut connection))
            .await?;
        let kept_from = (seconds * 1000).saturating_sub(millis(KEPT_FOR));
        let mut old = redis::cmd("ZREMRANGEBYSCORE");
        old.arg(&minutes).arg("-inf").arg(format!("({kept_from}"));
        let _: i64 = self.bounded(old.query_async(&mut connection)).await?;
        Ok(())
    }

    async fn minutes(&self, since: Millis) -> Result<Vec<MinuteFigures>, StoreError> {
        let mut connection = self.connection();
        let mut range = redis::cmd("ZREVRANGEBYSCORE");
        range
            .arg(format!("{}minutes", self.prefix))
            .arg("+inf")
            .arg(since)
            .arg("LIMIT")
            .arg(0)
            .arg(READ_MAX);
        let stored: Vec<Vec<u8>> = self.bounded(range.query_async(&mut connection)).await?;
        let read = stored
            .iter()
            .filter_map(|bytes| MinuteFigures::decode(bytes).ok());
        Ok(read.collect())
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

    fn delivery_log(&self) -> Option<Arc<dyn crate::store::log::DeliveryLog>> {
        Some(Arc::clone(&self.log) as Arc<dyn crate::store::log::DeliveryLog>)
    }

    fn queue(&self) -> Option<Arc<dyn DeliveryQueue>> {
        Some(Arc::clone(&self.queue) as Arc<dyn DeliveryQueue>)
    }

    fn done_keys(&self) -> Option<u64> {
        None
    }
}
