//! The stores under test: each backend opened as the contract tests use it (sled on a
//! manual clock; Redis, PostgreSQL, their TLS servers, the Redis Cluster and PgBouncer
//! on real time), skipped with a message when its server is missing, except in CI.

use std::sync::Arc;
use std::time::Duration;

use dedupe_proxy::config::{
    DirectUrl, PostgresConfig, RedisConfig, ServerUrl, SledConfig, SslMode,
};
use dedupe_proxy::store::postgres::PostgresStore;
use dedupe_proxy::store::redis::RedisStore;
use dedupe_proxy::store::sled::SledStore;
use dedupe_proxy::store::{
    Claim, ClaimOutcome, ClaimStore, KeyState, ManualClock, StoreError, entity_key,
};
use dedupe_proxy::testing::parse_version;
use dedupe_proxy::values::{HumanDuration, Secret, TableName};

/// The lease of the harness's claims: no test outlives it unless it waits on purpose.
pub const LEASE: Duration = Duration::from_secs(60);
/// The body fingerprint of the harness's claims.
pub const BODY: [u8; 32] = [7; 32];

/// A store under test, and how time passes for it.
pub struct Harness {
    pub store: Arc<dyn ClaimStore>,
    pub clock: Option<Arc<ManualClock>>,
    /// Keys are unique to each test, so tests can share a Redis or a table.
    pub run: String,
    _dir: Option<tempfile::TempDir>,
}

/// A server the tests need: present, skipped locally, or a failure in CI.
pub fn unavailable(what: &str, error: StoreError) -> Option<Harness> {
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{what} must be running in CI: {error}");
    }
    eprintln!("skipped: {what} is not reachable ({error})");
    None
}

pub fn plain_redis_config() -> RedisConfig {
    RedisConfig {
        url: ServerUrl::Written(Secret::new(super::REDIS_URL.into())),
        prefix: "dedupe-test:".into(),
        timeout: HumanDuration(Duration::from_secs(2)),
        tls: None,
        cluster: false,
        nodes: Vec::new(),
    }
}

pub fn plain_postgres_config() -> PostgresConfig {
    PostgresConfig {
        url: ServerUrl::Written(Secret::new(super::POSTGRES_URL.into())),
        direct_url: None,
        table: TableName("dedupe_conformance".into()),
        timeout: HumanDuration(Duration::from_secs(5)),
        pool_size: 8,
        ssl_mode: SslMode::Disable,
        tls: None,
    }
}

/// The Redis that speaks only TLS, with the test CA and client certificate.
pub fn redis_tls_config(servers: &super::TestServers) -> RedisConfig {
    let url = format!("rediss://127.0.0.1:{}/0", servers.redis_tls_port);
    RedisConfig {
        url: ServerUrl::Written(Secret::new(url)),
        tls: Some(servers.tls("ca.pem", true)),
        ..plain_redis_config()
    }
}

/// The Redis Cluster, seeded with its first node and two more.
pub fn redis_cluster_config(servers: &super::TestServers) -> RedisConfig {
    let url = |port: &u16| format!("redis://127.0.0.1:{port}");
    RedisConfig {
        url: ServerUrl::Written(Secret::new(url(&servers.cluster_ports[0]))),
        cluster: true,
        nodes: servers.cluster_ports[1..3]
            .iter()
            .map(|port| Secret::new(url(port)))
            .collect(),
        ..plain_redis_config()
    }
}

/// The PostgreSQL that takes only TLS, checked in full (its certificate names `localhost`).
pub fn postgres_tls_config(servers: &super::TestServers) -> PostgresConfig {
    let url = format!(
        "postgres://postgres@localhost:{}/test?sslmode=verify-full",
        servers.postgres_tls_port
    );
    PostgresConfig {
        url: ServerUrl::Written(Secret::new(url)),
        ssl_mode: SslMode::VerifyFull,
        tls: Some(servers.tls("ca.pem", false)),
        ..plain_postgres_config()
    }
}

/// The plain PostgreSQL through PgBouncer in transaction mode, with `direct_url` past it.
pub fn postgres_pooled_config(servers: &super::TestServers) -> PostgresConfig {
    PostgresConfig {
        url: ServerUrl::Written(Secret::new(servers.pgbouncer_url())),
        direct_url: Some(DirectUrl(ServerUrl::Written(Secret::new(
            super::POSTGRES_URL.into(),
        )))),
        table: TableName("dedupe_conformance_pooled".into()),
        ..plain_postgres_config()
    }
}

impl Harness {
    pub async fn sled() -> Option<Harness> {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_800_000_000_000);
        let config = SledConfig {
            path: dir.path().join("db"),
            ..SledConfig::default()
        };
        let store = SledStore::open_with_clock(&config, clock.clone()).unwrap();
        Some(Harness {
            store: Arc::new(store),
            clock: Some(clock),
            run: String::new(),
            _dir: Some(dir),
        })
    }

    pub async fn redis() -> Option<Harness> {
        match RedisStore::connect(&plain_redis_config(), None).await {
            Ok(store) => Some(Harness::shared(Arc::new(store))),
            Err(error) => unavailable("Redis", error),
        }
    }

    pub async fn postgres() -> Option<Harness> {
        match PostgresStore::connect(&plain_postgres_config(), None).await {
            Ok(store) => Some(Harness::shared(Arc::new(store))),
            Err(error) => unavailable("PostgreSQL", error),
        }
    }

    pub async fn redis_tls() -> Option<Harness> {
        let config = redis_tls_config(&super::TestServers::get()?);
        match RedisStore::connect(&config, None).await {
            Ok(store) => Some(Harness::shared(Arc::new(store))),
            Err(error) => unavailable("Redis over TLS", error),
        }
    }

    pub async fn redis_cluster() -> Option<Harness> {
        let config = redis_cluster_config(&super::TestServers::get()?);
        match RedisStore::connect(&config, None).await {
            Ok(store) => Some(Harness::shared(Arc::new(store))),
            Err(error) => unavailable("the Redis Cluster", error),
        }
    }

    pub async fn postgres_tls() -> Option<Harness> {
        let config = postgres_tls_config(&super::TestServers::get()?);
        match PostgresStore::connect(&config, None).await {
            Ok(store) => Some(Harness::shared(Arc::new(store))),
            Err(error) => unavailable("PostgreSQL over TLS", error),
        }
    }

    pub async fn postgres_pooled() -> Option<Harness> {
        let config = postgres_pooled_config(&super::TestServers::get()?);
        match PostgresStore::connect(&config, None).await {
            Ok(store) => Some(Harness::shared(Arc::new(store))),
            Err(error) => unavailable("PostgreSQL through PgBouncer", error),
        }
    }

    pub fn shared(store: Arc<dyn ClaimStore>) -> Harness {
        Harness {
            store,
            clock: None,
            run: format!("{:016x}:", rand::random::<u64>()),
            _dir: None,
        }
    }

    pub fn key(&self, name: &str) -> String {
        format!("t:{}{name}", self.run)
    }

    /// Lets `duration` pass: the manual clock moves, real time is slept.
    pub async fn pass(&self, duration: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(duration),
            None => tokio::time::sleep(duration).await,
        }
    }

    pub async fn claimed(&self, name: &str) -> Claim {
        self.claimed_for(name, LEASE).await
    }

    pub async fn claimed_for(&self, name: &str, lease: Duration) -> Claim {
        match self
            .store
            .claim(&self.key(name), BODY, lease)
            .await
            .unwrap()
        {
            ClaimOutcome::Claimed(claim) => claim,
            other => panic!("expected a claim of {name}, got {other:?}"),
        }
    }

    /// The store key of entity `name`, in the namespace of [`Harness::key`].
    pub fn entity(&self, name: &str) -> String {
        entity_key("t", &format!("{}{name}", self.run))
    }

    pub async fn newest(&self, name: &str) -> Option<String> {
        let record = self.store.newest_version(&self.entity(name)).await.unwrap();
        record.map(|record| record.newest.text)
    }

    pub async fn record(&self, name: &str, version: &str, retention: Duration) -> bool {
        let version = parse_version(version).unwrap();
        self.store
            .record_version(&self.entity(name), &version, retention)
            .await
            .unwrap()
    }

    pub async fn state(&self, name: &str) -> Option<KeyState> {
        self.store.inspect(&self.key(name)).await.unwrap()
    }
}
