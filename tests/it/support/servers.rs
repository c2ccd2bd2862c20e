//! The servers the shared-store tests talk to: plain Redis and PostgreSQL, and those
//! `tests/servers` starts (TLS, a cluster, PgBouncer).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Whether a server the tests need listens on 127.0.0.1:`port`. Locally a missing one
/// skips the test with a message; in CI (`CI=true`) it is a failure.
pub async fn service_available(name: &str, port: u16) -> bool {
    if tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
    {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |ci| ci != "true"),
        "{name} must be running in CI"
    );
    eprintln!("skipped: {name} is not reachable on port {port}");
    false
}

/// The Redis and PostgreSQL on this machine, which the shared-store tests use.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The statements that make a claims table `table` as a version before held keys did: two
/// states, no `hold_reason`, `response_headers` or held index, and one done record,
/// `t:old`, answered `201` `text/plain` `hi`.
pub fn table_from_before_held(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (
           key text PRIMARY KEY,
           state text NOT NULL CHECK (state IN ('in_flight', 'done')),
           owner text,
           claimed_at bigint NOT NULL,
           expires_at bigint NOT NULL,
           completed_at bigint,
           upstream_status integer,
           body_sha256 bytea NOT NULL,
           response_status integer,
           response_content_type text,
           response_body bytea
         );
         INSERT INTO {table} VALUES
           ('t:old', 'done', NULL, 1, 9999999999999, 2, 201, '\\x07', 201, 'text/plain', '\\x6869');"
    )
}

/// A PostgreSQL store's settings for `url` and `table`: a 5 s timeout, 8 connections,
/// no TLS, no pooler.
#[allow(dead_code)]
pub fn postgres_config(url: &str, table: &str) -> dedupe_proxy::config::PostgresConfig {
    use dedupe_proxy::config::{PostgresConfig, ServerUrl, SslMode};
    use dedupe_proxy::values::{HumanDuration, Secret, TableName};
    PostgresConfig {
        url: ServerUrl::Written(Secret::new(url.into())),
        direct_url: None,
        table: TableName(table.into()),
        timeout: HumanDuration(Duration::from_secs(5)),
        pool_size: 8,
        ssl_mode: SslMode::Disable,
        tls: None,
    }
}

/// Drops a proxy's PostgreSQL tables (`table` and those beside it: `_entities`, `_jobs`,
/// `_paused`, `_deliveries`), if they are there.
pub async fn drop_postgres_tables(table: &str) {
    let (client, connection) = tokio_postgres::connect(POSTGRES_URL, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_entities;
             DROP TABLE IF EXISTS {table}_jobs; DROP TABLE IF EXISTS {table}_paused;
             DROP TABLE IF EXISTS {table}_deliveries; DROP TABLE IF EXISTS {table}_replicas; DROP TABLE IF EXISTS {table}_minutes"
        ))
        .await
        .unwrap();
}

/// The servers `tests/servers` starts besides the plain Redis and PostgreSQL: a Redis that
/// speaks only TLS (and wants a client certificate), a PostgreSQL that takes only TLS
/// (its certificate names `localhost` only), a six-node Redis Cluster, and the
/// certificates made for them.
#[allow(dead_code)]
pub struct TestServers {
    pub tls_dir: PathBuf,
    pub redis_tls_port: u16,
    /// A TLS Redis whose certificate names `localhost` only, without client certificates.
    pub redis_tls_named_port: u16,
    pub postgres_tls_port: u16,
    pub cluster_ports: Vec<u16>,
    /// PgBouncer in transaction mode, two server connections, before the plain
    /// PostgreSQL's `test` database.
    pub pgbouncer_port: u16,
}

#[allow(dead_code)]
impl TestServers {
    /// The servers, if `tests/servers` has started them; locally their absence skips the
    /// test with a message, in CI (`CI=true`) it is a failure.
    pub fn get() -> Option<TestServers> {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-servers/env");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let setting = |name: &str| {
            text.lines()
                .rev()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let servers = (|| {
            Some(TestServers {
                tls_dir: setting("TLS_DIR")?.into(),
                redis_tls_port: setting("REDIS_TLS_PORT")?.parse().ok()?,
                redis_tls_named_port: setting("REDIS_TLS_NAMED_PORT")?.parse().ok()?,
                postgres_tls_port: setting("POSTGRES_TLS_PORT")?.parse().ok()?,
                cluster_ports: setting("REDIS_CLUSTER_PORTS")?
                    .split(',')
                    .map(|port| port.parse().ok())
                    .collect::<Option<_>>()?,
                pgbouncer_port: setting("PGBOUNCER_PORT")?.parse().ok()?,
            })
        })();
        if servers.is_none() {
            assert!(
                std::env::var("CI").map_or(true, |ci| ci != "true"),
                "tests/servers must have run in CI"
            );
            eprintln!("skipped: the TLS and cluster servers are not started (run tests/setup)");
        }
        servers
    }

    /// The plain PostgreSQL's `test` database through PgBouncer.
    pub fn pgbouncer_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.pgbouncer_port)
    }

    /// A PEM file made by `tests/servers`: `ca.pem`, `other-ca.pem`, `client.pem`, ...
    pub fn pem(&self, name: &str) -> dedupe_proxy::values::PemFile {
        self.tls_dir.join(name).to_str().unwrap().parse().unwrap()
    }

    /// `tls:` with the test CA and, if `client`, the client certificate.
    pub fn tls(&self, ca: &str, client: bool) -> dedupe_proxy::config::TlsConfig {
        dedupe_proxy::config::TlsConfig {
            ca_file: Some(self.pem(ca)),
            cert_file: client.then(|| self.pem("client.pem")),
            key_file: client.then(|| self.pem("client.key")),
        }
    }
}
