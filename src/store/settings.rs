//! A store's settings, as the backends take them: which backend, its server's URL (a
//! password in it kept masked when printed), TLS files, timeouts and pools, and sled's
//! directory and durability. `config/` reads them from `store:`; nothing here reads a file.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dsn;
use crate::values::{EnvSecret, HumanDuration, PemFile, Secret, Size, TableName};

/// The connections of the PostgreSQL queue's own pool (`delivery: queued`), beside
/// `pool_size`.
pub(crate) const QUEUE_POOL: usize = 2;

/// The connections PostgreSQL's delivery log opens: its writer's, and one for readers.
pub(crate) const LOG_POOL: usize = 2;

/// `store:`: exactly one backend.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    Sled(SledConfig),
    Redis(RedisConfig),
    Postgres(PostgresConfig),
}

impl StoreConfig {
    /// The backend's name, as `store:` writes it.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreConfig::Sled(_) => "sled",
            StoreConfig::Redis(_) => "redis",
            StoreConfig::Postgres(_) => "postgres",
        }
    }

    /// How long one command may take, for a shared store.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        match self {
            StoreConfig::Sled(_) => None,
            StoreConfig::Redis(redis) => Some(redis.timeout.0),
            StoreConfig::Postgres(postgres) => Some(postgres.timeout.0),
        }
    }

    /// About how many connections the store opens with `workers` workers: each worker's
    /// and one more for callers outside them, the subscriber's or listener's, and on a
    /// cluster each of those to every node (6 counted where fewer seeds are named).
    pub fn connections(&self, workers: usize) -> u64 {
        let workers = workers as u64;
        match self {
            StoreConfig::Sled(_) => 0,
            StoreConfig::Redis(redis) if redis.cluster => {
                (workers + 2) * (redis.nodes.len() as u64 + 1).max(6)
            }
            StoreConfig::Redis(_) => workers + 2,
            StoreConfig::Postgres(postgres) => {
                let share = (postgres.pool_size as u64).div_ceil(workers.max(1)).max(1);
                workers * share + 3 + (QUEUE_POOL + LOG_POOL) as u64
            }
        }
    }

    /// The passwords in its servers' URLs.
    pub fn passwords(&self) -> Vec<String> {
        match self {
            StoreConfig::Sled(_) => Vec::new(),
            StoreConfig::Redis(redis) => {
                let nodes = redis
                    .nodes
                    .iter()
                    .flat_map(|node| dsn::passwords(node.expose()));
                redis.url.passwords().into_iter().chain(nodes).collect()
            }
            StoreConfig::Postgres(postgres) => {
                let direct = postgres.direct_url.iter().flat_map(|url| url.0.passwords());
                postgres.url.passwords().into_iter().chain(direct).collect()
            }
        }
    }
}

/// A server's URL, written in the file or, when it holds a password, named by `url_env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerUrl {
    Written(Secret),
    FromEnv(EnvSecret),
}

/// `url: <with the password masked>` or `url_env: <the variable's name>`.
impl Serialize for ServerUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize_as("url", serializer)
    }
}

/// `postgres.direct_url`: the server itself, past a pooler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectUrl(pub ServerUrl);

/// `direct_url: <with the password masked>` or `direct_url_env: <the variable's name>`.
impl Serialize for DirectUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_as("direct_url", serializer)
    }
}

impl ServerUrl {
    fn serialize_as<S: serde::Serializer>(
        &self,
        field: &str,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            ServerUrl::Written(url) => map.serialize_entry(field, &mask_password(url.expose()))?,
            ServerUrl::FromEnv(env) => {
                map.serialize_entry(&format!("{field}_env"), &env.variable)?
            }
        }
        map.end()
    }
}

impl ServerUrl {
    pub(crate) fn expose(&self) -> &str {
        match self {
            ServerUrl::Written(url) => url.expose(),
            ServerUrl::FromEnv(env) => env.secret.expose(),
        }
    }

    /// Whether the URL's variable is stood in for (`check --without-secrets`).
    pub(crate) fn is_stand_in(&self) -> bool {
        matches!(self, ServerUrl::FromEnv(env) if env.secret.is_stand_in())
    }

    /// The URL with any password replaced by `***`, for messages and `check`.
    pub fn masked(&self) -> String {
        mask_password(self.expose())
    }

    /// Its passwords, as written and as the driver reads them.
    pub fn passwords(&self) -> Vec<String> {
        dsn::passwords(self.expose())
    }
}

fn mask_password(url: &str) -> String {
    dsn::masked(url).into_owned()
}

/// `store.redis:`: claims shared by every replica through one Redis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisConfig {
    #[serde(flatten)]
    pub url: ServerUrl,
    /// Put in front of every key, so that several applications can share a Redis.
    pub prefix: String,
    /// How long one Redis command may take before it counts as a store failure.
    pub timeout: HumanDuration,
    /// With a `rediss://` URL: the files that replace the system's roots and identify the
    /// proxy; without, the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// `url` (and `nodes`) are the seeds of a Redis Cluster.
    #[serde(skip_serializing_if = "is_false")]
    pub cluster: bool,
    /// More seeds of the cluster besides `url`.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "masked_urls")]
    pub nodes: Vec<Secret>,
}

/// `store.postgres:`: claims shared by every replica through one PostgreSQL table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PostgresConfig {
    #[serde(flatten)]
    pub url: ServerUrl,
    /// The server itself, when `url` goes through a pooler in transaction mode: the
    /// schema's steps at start and the listening connection need sessions of their own,
    /// and statements on `url` then leave nothing in theirs.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub direct_url: Option<DirectUrl>,
    /// The claims table, created at start if missing.
    pub table: TableName,
    /// How long one statement may take before it counts as a store failure.
    pub timeout: HumanDuration,
    /// Connections for deliveries, shared out among the workers.
    pub pool_size: usize,
    /// From the URL's `sslmode`; `verify-full` when it has none and `tls:` is set.
    #[serde(rename = "sslmode")]
    pub ssl_mode: SslMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

/// `tls:` of a shared store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The authority that signs the server's certificate, in place of the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PemFile>,
    /// A client certificate (with `key_file`), for servers that ask for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PemFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PemFile>,
}

impl TlsConfig {
    pub(crate) fn check(&self) -> Result<(), String> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) | (None, Some(_)) => {
                Err("`tls` takes `cert_file` and `key_file` together".into())
            }
            _ => Ok(()),
        }
    }
}

/// How a PostgreSQL connection uses TLS, as libpq's `sslmode` says it. `prefer` and
/// `allow` are refused: they fall back to plain text without a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain text.
    Disable,
    /// TLS; the server's certificate is checked against `tls.ca_file` when there is one
    /// (as `verify-ca`), else not at all.
    Require,
    /// TLS; the certificate must chain to the roots, whatever name it has.
    VerifyCa,
    /// TLS; the certificate must chain to the roots and name the host.
    VerifyFull,
}

impl SslMode {
    /// The mode a URL (or a `key=value` connection string) asks for, if it names one. It
    /// must name it once, in a form the driver reads the same way, so that what is checked
    /// here is what the connection does.
    pub(crate) fn of(url: &str) -> Result<Option<SslMode>, String> {
        let lower = url.to_ascii_lowercase();
        let at = match lower.match_indices("sslmode").collect::<Vec<_>>()[..] {
            [] => return Ok(None),
            [(at, _)] => at,
            _ => return Err("`sslmode` appears more than once in the URL; write it once".into()),
        };
        let value = url[at + "sslmode".len()..]
            .trim_start_matches(' ')
            .strip_prefix('=')
            .map(|rest| {
                rest.trim_start_matches(' ')
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect::<String>()
            })
            .ok_or("write `sslmode=` followed by disable, require, verify-ca or verify-full")?;
        let mode = match value.as_str() {
            "disable" => SslMode::Disable,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "prefer" | "allow" => {
                return Err(format!(
                    "`sslmode={value}` may fall back to plain text without a word; write disable, require, verify-ca or verify-full"
                ));
            }
            other => {
                return Err(format!(
                    "unknown `sslmode={other}`; write disable, require, verify-ca or verify-full"
                ));
            }
        };
        let driver = tokio_postgres::Config::from_str(&driver_url(url))
            .map_err(|error| format!("the PostgreSQL driver cannot read the URL: {error}"))?;
        let agrees = match driver.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => mode == SslMode::Disable,
            tokio_postgres::config::SslMode::Require => mode != SslMode::Disable,
            _ => false,
        };
        if !agrees {
            return Err(format!(
                "the PostgreSQL driver reads another `sslmode` in the URL than `{value}`; write it once, as `sslmode={value}`"
            ));
        }
        Ok(Some(mode))
    }
}

/// The URL as tokio-postgres reads it: it knows `disable`, `prefer` and `require` only, so
/// `verify-ca` and `verify-full` become `require` (their certificate checks are the rustls
/// configuration's).
pub(crate) fn driver_url(url: &str) -> String {
    url.replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require")
}

fn is_false(value: &bool) -> bool {
    !value
}

fn masked_urls<S: serde::Serializer>(urls: &[Secret], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(urls.iter().map(|url| mask_password(url.expose())))
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Sled(SledConfig::default())
    }
}

/// `store.sled:`: the embedded store.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SledConfig {
    /// The data directory, relative to the working directory.
    #[serde(default = "sled_path")]
    pub path: PathBuf,
    /// `batched` (done marks reach stable storage with sled's sync every `flush_every`) or
    /// `fsync` (each is synced before the sender's answer). Queued jobs and operators'
    /// changes are synced before their answer either way.
    #[serde(default)]
    pub durability: Durability,
    /// How often sled syncs to disk by itself: what `batched` durability may lose in a
    /// crash.
    #[serde(default = "flush_every")]
    pub flush_every: HumanDuration,
    /// sled's page cache, as sled counts it (its pages take two to three times as much
    /// memory as this).
    #[serde(default = "sled_cache")]
    pub cache: Size,
}

impl Default for SledConfig {
    fn default() -> Self {
        SledConfig {
            path: sled_path(),
            durability: Durability::default(),
            flush_every: flush_every(),
            cache: sled_cache(),
        }
    }
}

/// When a `done` mark reaches stable storage.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Synced every `flush_every`; a crash of the process or the machine may forget the
    /// last interval's done marks.
    #[default]
    Batched,
    /// Synced (`fdatasync`) before the sender gets its answer (answers waiting at once share
    /// one sync).
    Fsync,
}

pub(crate) fn sled_path() -> PathBuf {
    PathBuf::from("./dedupe-data")
}

pub fn flush_every() -> HumanDuration {
    HumanDuration(std::time::Duration::from_millis(100))
}

/// 8 MiB: a larger sled cache costs memory without a steady measured gain
/// (`docs/performance.md`).
pub(crate) fn sled_cache() -> Size {
    Size(8 << 20)
}
