//! `store:`: which backend holds the claims, and its settings. Exactly one backend is
//! set; a server URL holding a password can come from a variable, and prints masked.

use std::path::PathBuf;

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};

use super::defaults;
use super::file::map_then;
use crate::values::{EnvSecret, HumanDuration, Secret, Size, TableName};

/// `store:`: exactly one backend.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    Sled(SledConfig),
    Redis(RedisConfig),
    Postgres(PostgresConfig),
}

/// `store:` as written: one field per backend, exactly one of them set.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    sled: Option<SledConfig>,
    #[serde(
        default,
        deserialize_with = "redis_section",
        skip_serializing_if = "Option::is_none"
    )]
    redis: Option<RedisConfig>,
    #[serde(
        default,
        deserialize_with = "postgres_section",
        skip_serializing_if = "Option::is_none"
    )]
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

/// A server's URL, written in the file or, when it holds a password, named by `url_env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerUrl {
    Written(Secret),
    FromEnv(EnvSecret),
}

/// `url: <with the password masked>` or `url_env: <the variable's name>`.
impl Serialize for ServerUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            ServerUrl::Written(url) => map.serialize_entry("url", &mask_password(url.expose()))?,
            ServerUrl::FromEnv(env) => map.serialize_entry("url_env", &env.variable)?,
        }
        map.end()
    }
}

impl ServerUrl {
    pub fn expose(&self) -> &str {
        match self {
            ServerUrl::Written(url) => url.expose(),
            ServerUrl::FromEnv(env) => env.secret.expose(),
        }
    }

    /// The URL with any password replaced by `***`, for messages and `check`.
    pub fn masked(&self) -> String {
        mask_password(self.expose())
    }
}

fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

fn server_url(url: Option<String>, url_env: Option<EnvSecret>) -> Result<ServerUrl, String> {
    match (url, url_env) {
        (Some(url), None) => Ok(ServerUrl::Written(Secret::new(url))),
        (None, Some(env)) => Ok(ServerUrl::FromEnv(env)),
        (None, None) => Err("needs `url`, or `url_env` naming a variable that holds it".into()),
        (Some(_), Some(_)) => Err("takes `url` or `url_env`, not both".into()),
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
}

/// `store.postgres:`: claims shared by every replica through one PostgreSQL table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PostgresConfig {
    #[serde(flatten)]
    pub url: ServerUrl,
    /// The claims table, created at start if missing.
    pub table: TableName,
    /// How long one statement may take before it counts as a store failure.
    pub timeout: HumanDuration,
    /// Connections for deliveries, shared out among the workers.
    pub pool_size: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedisFile {
    url: Option<String>,
    url_env: Option<EnvSecret>,
    #[serde(default = "defaults::redis_prefix")]
    prefix: String,
    #[serde(default = "defaults::server_timeout")]
    timeout: HumanDuration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PostgresFile {
    url: Option<String>,
    url_env: Option<EnvSecret>,
    #[serde(default = "defaults::postgres_table")]
    table: TableName,
    #[serde(default = "defaults::server_timeout")]
    timeout: HumanDuration,
    #[serde(default = "defaults::postgres_pool_size")]
    pool_size: usize,
}

fn redis_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<RedisConfig>, D::Error> {
    map_then(deserializer, |file: RedisFile| {
        if file.timeout.0.is_zero() {
            return Err("`timeout` must be longer than zero".into());
        }
        Ok(Some(RedisConfig {
            url: server_url(file.url, file.url_env)?,
            prefix: file.prefix,
            timeout: file.timeout,
        }))
    })
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
        Ok(Some(PostgresConfig {
            url: server_url(file.url, file.url_env)?,
            table: file.table,
            timeout: file.timeout,
            pool_size: file.pool_size,
        }))
    })
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Sled(SledConfig::default())
    }
}

/// `store.sled:`: the embedded store.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SledConfig {
    /// The data directory, relative to the working directory.
    #[serde(default = "defaults::sled_path")]
    pub path: PathBuf,
    #[serde(default)]
    pub durability: Durability,
    /// How often `batched` durability flushes to disk.
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

/// When a `done` mark reaches the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Flushed every `flush_every`; a crash may forget the last interval's done marks.
    #[default]
    Batched,
    /// Flushed before the sender gets its answer (many claims share one flush).
    Fsync,
}
