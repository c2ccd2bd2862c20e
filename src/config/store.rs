//! `store:` read from the file into the store's settings (`crate::store::settings`):
//! exactly one backend; a server URL holding a password can come from a variable. The
//! shared stores may speak TLS (`rediss://`, `sslmode=`) with the files of `tls:`, and
//! Redis may be a cluster.

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};

use super::defaults;
use super::whole_map::map_then;
use crate::dsn;
use crate::store::settings::{
    DirectUrl, PostgresConfig, RedisConfig, ServerUrl, SledConfig, SslMode, StoreConfig, TlsConfig,
};
use crate::values::{EnvSecret, HumanDuration, Secret, TableName};

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
