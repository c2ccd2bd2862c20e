//! `store:`: which backend holds the claims, and its settings. Exactly one backend is
//! set; a server URL holding a password can come from a variable, and prints masked. The
//! shared stores may speak TLS (`rediss://`, `sslmode=`) with the files of `tls:`, and
//! Redis may be a cluster.

use std::path::PathBuf;
use std::str::FromStr;

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};

use super::defaults;
use super::whole_map::map_then;
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

/// `store:` as written: one field per backend, exactly one of them set.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StoreFile {
    /// The embedded store: one process, claims on local disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    sled: Option<SledConfig>,
    /// Redis 7 or later, or a Redis Cluster, shared by replicas.
    #[serde(
        default,
        deserialize_with = "redis_section",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<RedisFile>")]
    redis: Option<RedisConfig>,
    /// PostgreSQL, shared by replicas.
    #[serde(
        default,
        deserialize_with = "postgres_section",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<PostgresFile>")]
    postgres: Option<PostgresConfig>,
}

pub(super) fn store_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<StoreConfig, D::Error> {
    map_then(deserializer, |file: StoreFile| match file {
        StoreFile {
            sled: Some(sled),
            redis: None,
            postgres: None,
        } => Ok(StoreConfig::Sled(sled)),
        StoreFile {
            sled: None,
            redis: Some(redis),
            postgres: None,
        } => Ok(StoreConfig::Redis(redis)),
        StoreFile {
            sled: None,
            redis: None,
            postgres: Some(postgres),
        } => Ok(StoreConfig::Postgres(postgres)),
        StoreFile {
            sled: None,
            redis: None,
            postgres: None,
        } => Err("needs one backend, for example `sled: {}` for the defaults".into()),
        _ => Err("takes exactly one backend: `sled`, `redis` or `postgres`".into()),
    })
}

impl Serialize for StoreConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut file = StoreFile {
            sled: None,
            redis: None,
            postgres: None,
        };
        match self {
            StoreConfig::Sled(sled) => file.sled = Some(sled.clone()),
            StoreConfig::Redis(redis) => file.redis = Some(redis.clone()),
            StoreConfig::Postgres(postgres) => file.postgres = Some(postgres.clone()),
        }
        file.serialize(serializer)
    }
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
    fn is_stand_in(&self) -> bool {
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

/// The URL written as `<field>` or named by `<field>_env`.
fn server_url(
    field: &str,
    url: Option<String>,
    url_env: Option<EnvSecret>,
) -> Result<ServerUrl, String> {
    match (url, url_env) {
        (Some(url), None) => {
            dsn::check(&url)?;
            Ok(ServerUrl::Written(Secret::new(url)))
        }
        (None, Some(env)) if env.secret.is_stand_in() => Ok(ServerUrl::FromEnv(env)),
        (None, Some(env)) => {
            dsn::check(env.secret.expose())
                .map_err(|error| format!("the URL in {}: {error}", env.variable))?;
            Ok(ServerUrl::FromEnv(env))
        }
        (None, None) => Err(format!(
            "needs `{field}`, or `{field}_env` naming a variable that holds it"
        )),
        (Some(_), Some(_)) => Err(format!("takes `{field}` or `{field}_env`, not both")),
    }
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
    fn check(&self) -> Result<(), String> {
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
    fn of(url: &str) -> Result<Option<SslMode>, String> {
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

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RedisFile {
    /// `redis://[:password@]host:port/db`, or `rediss://` for TLS; with a password, use `url_env`.
    url: Option<String>,
    url_env: Option<EnvSecret>,
    /// Put in front of every key, so that applications can share a Redis.
    #[serde(default = "defaults::redis_prefix")]
    prefix: String,
    #[serde(default = "defaults::server_timeout")]
    timeout: HumanDuration,
    /// With `rediss://`: the CA, and a client certificate and key (PEM files).
    #[serde(default, deserialize_with = "tls_section")]
    tls: Option<TlsConfig>,
    /// The URLs are seeds of a Redis Cluster.
    #[serde(default)]
    cluster: bool,
    /// More seeds of the cluster (with `cluster: true`).
    #[serde(default)]
    nodes: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PostgresFile {
    /// `postgres://user[:password]@host:port/db[?sslmode=...]`; with a password, use `url_env`.
    url: Option<String>,
    url_env: Option<EnvSecret>,
    /// The server itself, past a pooler in transaction mode: for the schema's steps and listening.
    direct_url: Option<String>,
    direct_url_env: Option<EnvSecret>,
    #[serde(default = "defaults::postgres_table")]
    table: TableName,
    #[serde(default = "defaults::server_timeout")]
    timeout: HumanDuration,
    /// Connections for deliveries, shared out among the workers.
    #[serde(default = "defaults::postgres_pool_size")]
    pool_size: usize,
    /// The CA, and a client certificate and key (PEM files).
    #[serde(default, deserialize_with = "tls_section")]
    tls: Option<TlsConfig>,
}

fn tls_section<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<TlsConfig>, D::Error> {
    map_then(deserializer, |tls: TlsConfig| {
        tls.check()?;
        Ok(Some(tls))
    })
}

fn redis_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<RedisConfig>, D::Error> {
    map_then(deserializer, |file: RedisFile| {
        if file.timeout.0.is_zero() {
            return Err("`timeout` must be longer than zero".into());
        }
        check_redis_prefix(&file.prefix)?;
        let url = server_url("url", file.url, file.url_env)?;
        for node in &file.nodes {
            dsn::check(node)?;
        }
        if !file.nodes.is_empty() && !file.cluster {
            return Err("`nodes` are the seeds of a cluster: set `cluster: true`".into());
        }
        let tls_urls = std::iter::once(url.expose())
            .chain(file.nodes.iter().map(String::as_str))
            .filter(|url| url.starts_with("rediss://"))
            .count();
        // A URL stood in for (`check --without-secrets`) may be either.
        let stand_in = usize::from(url.is_stand_in());
        if tls_urls != 0 && tls_urls + stand_in != 1 + file.nodes.len() {
            return Err("`url` and `nodes` must all be `rediss://` (TLS) or all `redis://`".into());
        }
        if file.tls.is_some() && tls_urls + stand_in == 0 {
            return Err("`tls` needs a `rediss://` URL; `redis://` is plain text".into());
        }
        Ok(Some(RedisConfig {
            url,
            prefix: file.prefix,
            timeout: file.timeout,
            tls: file.tls,
            cluster: file.cluster,
            nodes: file.nodes.into_iter().map(Secret::new).collect(),
        }))
    })
}

/// A prefix is a name and one `:` at its end, so that no two prefixes nest: with
/// `dedupe:` and `dedupe:b:`, the first's scope `b` would list, clear and count the
/// second's keys. Glob characters would make its listings match other keys.
fn check_redis_prefix(prefix: &str) -> Result<(), String> {
    let name = prefix.strip_suffix(':').unwrap_or_default();
    if name.is_empty()
        || name.chars().any(|c| {
            matches!(c, ':' | '*' | '?' | '[' | ']' | '\\' | '{' | '}')
                || c.is_whitespace()
                || c.is_control()
        })
    {
        return Err(format!(
            "`prefix` must be a name and one `:` at its end, like `dedupe:` or `billing:` (no other `:`, glob character, brace or space), so that no two prefixes nest; `{}` is not",
            prefix.escape_debug()
        ));
    }
    Ok(())
}

fn postgres_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<PostgresConfig>, D::Error> {
    map_then(deserializer, |file: PostgresFile| {
        if file.timeout.0.is_zero() {
            return Err("`timeout` must be longer than zero".into());
        }
        if file.pool_size == 0 {
            return Err("`pool_size` must be at least 1".into());
        }
        let url = server_url("url", file.url, file.url_env)?;
        let ssl_mode = match (SslMode::of(url.expose())?, &file.tls) {
            (Some(SslMode::Disable), Some(_)) => {
                return Err("`tls` with `sslmode=disable`: choose one".into());
            }
            (Some(SslMode::VerifyCa), tls)
                if tls.as_ref().is_none_or(|tls| tls.ca_file.is_none()) =>
            {
                // Any certificate the system's roots vouch for, whatever its name, would pass.
                return Err("`sslmode=verify-ca` needs `tls.ca_file`: without a name check, the system's roots vouch for anyone with a public certificate".into());
            }
            (Some(mode), _) => mode,
            (None, Some(_)) => SslMode::VerifyFull,
            (None, None) => SslMode::Disable,
        };
        let direct_url = match (file.direct_url, file.direct_url_env) {
            (None, None) => None,
            (direct_url, direct_env) => {
                let direct = server_url("direct_url", direct_url, direct_env)?;
                let mode = SslMode::of(direct.expose())?;
                let stood_in = url.is_stand_in() || direct.is_stand_in();
                if !stood_in && mode.is_some_and(|mode| mode != ssl_mode) {
                    return Err("`direct_url` takes the same `sslmode` as `url` (or none)".into());
                }
                Some(DirectUrl(direct))
            }
        };
        Ok(Some(PostgresConfig {
            url,
            direct_url,
            table: file.table,
            timeout: file.timeout,
            pool_size: file.pool_size,
            ssl_mode,
            tls: file.tls,
        }))
    })
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
    #[serde(default = "defaults::sled_path")]
    pub path: PathBuf,
    /// `batched` (done marks reach stable storage with sled's sync every `flush_every`) or
    /// `fsync` (each is synced before the sender's answer). Queued jobs and operators'
    /// changes are synced before their answer either way.
    #[serde(default)]
    pub durability: Durability,
    /// How often sled syncs to disk by itself: what `batched` durability may lose in a
    /// crash.
    #[serde(default = "defaults::flush_every")]
    pub flush_every: HumanDuration,
    /// sled's page cache, as sled counts it (its pages take two to three times as much
    /// memory as this).
    #[serde(default = "defaults::sled_cache")]
    pub cache: Size,
}

impl Default for SledConfig {
    fn default() -> Self {
        SledConfig {
            path: defaults::sled_path(),
            durability: Durability::default(),
            flush_every: defaults::flush_every(),
            cache: defaults::sled_cache(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_read_once_and_as_the_driver_reads_it() {
        let of = |url: &str| SslMode::of(url);
        assert_eq!(of("postgres://a@h/db"), Ok(None));
        for (text, mode) in [
            ("disable", SslMode::Disable),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            assert_eq!(
                of(&format!("postgres://a@h/db?sslmode={text}")),
                Ok(Some(mode))
            );
        }
        assert_eq!(
            of("host=h user=a sslmode = require"),
            Ok(Some(SslMode::Require)),
            "libpq's key=value form, spaces and all"
        );
        for refused in [
            "postgres://a@h/db?sslmode=prefer",
            "postgres://a@h/db?sslmode=allow",
            "postgres://a@h/db?sslmode=VERIFY-FULL",
            "postgres://a@h/db?sslmode=disable&sslmode=verify-full",
            "postgres://a:sslmode=disable@h/db?sslmode=verify-full",
            "host=h sslmode",
        ] {
            assert!(of(refused).is_err(), "{refused}");
        }
    }
}
