//! The configuration file: serde structs mirroring the YAML `docs/configuration.md` documents, and
//! `Config::load`, which turns a file into a validated [`Config`] or a [`ConfigError`]
//! naming the file, line and column.
//!
//! Every check runs while serde reads the value it concerns: scalars parse inside their
//! visitors (see `values`), and checks that span a whole map (a route's required fields,
//! duplicate route names, `path` with `path_prefix`) run inside that map's visitor through
//! `map_then`. serde_yaml only attaches a position to errors raised inside a visitor, so
//! this is what lets every error point at its line.

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::key::KeyTemplate;
use crate::preset::Preset;
use crate::route::{Policy, Route};
use crate::verify::VerifySetting;
use crate::values::{
    EnvSecret, HeaderText, HumanDuration, Methods, Name, RefusalStatus, Secret, Size,
    StatusPattern, StatusValue, TableName, UpstreamUrl,
};

/// A loaded, validated configuration. It serializes to what `dedupe-proxy check` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The file it came from, for reloads and messages.
    #[serde(skip)]
    pub source: PathBuf,
    pub listen: SocketAddr,
    /// Where unmatched requests go, and routes without an `upstream` of their own.
    pub upstream: UpstreamUrl,
    pub admin: AdminConfig,
    pub store: StoreConfig,
    pub shutdown_grace: HumanDuration,
    pub limits: Limits,
    pub unmatched: Unmatched,
    /// `defaults:` resolved against the built-in values; unmatched requests use its
    /// `upstream_timeout`.
    pub defaults: Policy,
    pub routes: Vec<Route>,
    /// The command-line settings applied over the file, kept to apply them again on
    /// every reload.
    #[serde(skip)]
    pub overrides: Overrides,
    /// Settings that are valid but probably not what the operator meant.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read the configuration: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
}

/// Command-line settings that win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub upstream: Option<UpstreamUrl>,
    /// The number of worker threads; the file has no such setting, since a reload
    /// could not change it.
    pub workers: Option<NonZeroUsize>,
}

impl Config {
    /// Reads and validates the file at `path`, then applies `overrides`.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, path, overrides)
    }

    /// Validates configuration text; `path` is used in messages and kept as the source.
    pub fn parse(text: &str, path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let file: ConfigFile = serde_yaml::from_str(text).map_err(|error| located(path, &error))?;
        Ok(file.resolve(path, overrides))
    }
}

/// Turns a serde_yaml error into `file:line:column: message`.
fn located(path: &Path, error: &serde_yaml::Error) -> ConfigError {
    let (line, column) = error
        .location()
        .map_or((1, 1), |location| (location.line(), location.column()));
    let text = error.to_string();
    let suffix = format!(" at line {line} column {column}");
    let message = text.strip_suffix(&suffix).unwrap_or(&text).to_owned();
    ConfigError::Invalid {
        file: path.display().to_string(),
        line,
        column,
        message,
    }
}

/// The top level of the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    upstream: UpstreamUrl,
    #[serde(default)]
    admin: AdminConfig,
    #[serde(default, deserialize_with = "store_section")]
    store: StoreConfig,
    #[serde(default, deserialize_with = "defaults_section")]
    defaults: RouteFile,
    #[serde(default)]
    unmatched: Unmatched,
    #[serde(default = "default_shutdown_grace")]
    shutdown_grace: HumanDuration,
    #[serde(default, deserialize_with = "limits_section")]
    limits: Limits,
    #[serde(default, deserialize_with = "route_list")]
    routes: Vec<RouteFile>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8081))
}

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9091))
}

fn default_shutdown_grace() -> HumanDuration {
    HumanDuration(Duration::from_secs(25))
}

impl ConfigFile {
    fn resolve(self, path: &Path, overrides: &Overrides) -> Config {
        let upstream = overrides.upstream.clone().unwrap_or(self.upstream);
        let routes: Vec<Route> = self
            .routes
            .into_iter()
            .map(|route| Route::resolve(route, &self.defaults, &upstream))
            .collect();
        let mut warnings: Vec<String> = routes.iter().filter_map(Route::warning).collect();
        if self.unmatched == Unmatched::Forward {
            warnings.extend(routes.iter().filter_map(|route| {
                let host = route.matcher.host.as_ref()?;
                Some(format!(
                    "route `{}` takes only the host `{host}`: with `unmatched: forward`, the same path under another Host reaches the upstream without its check and claim",
                    route.name
                ))
            }));
        }
        Config {
            source: path.to_owned(),
            listen: overrides.listen.unwrap_or(self.listen),
            upstream,
            admin: self.admin,
            store: self.store,
            shutdown_grace: self.shutdown_grace,
            limits: self.limits,
            unmatched: self.unmatched,
            defaults: Policy::resolve(&self.defaults, &RouteFile::default()),
            routes,
            overrides: overrides.clone(),
            warnings,
        }
    }
}

/// `admin:`: the listener for health, readiness and key inspection.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// When set, `/v1/*` needs `Authorization: Bearer <the variable's value>`.
    #[serde(default)]
    pub token_env: Option<EnvSecret>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
            token_env: None,
        }
    }
}

/// `limits:`: what one sender may cost the proxy, on the provider-facing listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Open connections at most; one more closes the connection idle longest, or, with
    /// none idle, is answered 503 and closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Requests in progress, over all connections (HTTP/2 streams included), each until
    /// its forward has ended and its response is sent; one more is answered 503 at once.
    /// Requests no route takes may use half. Buffered bodies stay under this × `max_body`.
    #[serde(default = "default_max_requests")]
    pub max_requests: usize,
    /// Time for a new connection to choose its protocol (HTTP/2: preface and SETTINGS)
    /// and send a request's head, and the most a connection may idle between requests.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: HumanDuration,
    /// Time to send a request's body (then 408), and the most a response may wait for its
    /// sender to take it (then its connection is closed).
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout: HumanDuration,
    /// Size of a request's head (request line and headers); more gets 431.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: Size,
}

fn default_max_connections() -> usize {
    1024
}

fn default_max_requests() -> usize {
    1024
}

fn default_header_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

fn default_body_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

fn default_max_header_bytes() -> Size {
    Size(64 << 10)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: default_max_connections(),
            max_requests: default_max_requests(),
            header_read_timeout: default_header_read_timeout(),
            body_read_timeout: default_body_read_timeout(),
            max_header_bytes: default_max_header_bytes(),
        }
    }
}

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

fn store_section<'de, D: Deserializer<'de>>(deserializer: D) -> Result<StoreConfig, D::Error> {
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
    #[serde(default = "default_redis_prefix")]
    prefix: String,
    #[serde(default = "default_server_timeout")]
    timeout: HumanDuration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PostgresFile {
    url: Option<String>,
    url_env: Option<EnvSecret>,
    #[serde(default = "default_table")]
    table: TableName,
    #[serde(default = "default_server_timeout")]
    timeout: HumanDuration,
    #[serde(default = "default_pool_size")]
    pool_size: usize,
}

fn default_redis_prefix() -> String {
    "dedupe:".into()
}

fn default_table() -> TableName {
    TableName("dedupe_claims".into())
}

fn default_server_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(2))
}

fn default_pool_size() -> usize {
    16
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
    #[serde(default = "default_sled_path")]
    pub path: PathBuf,
    #[serde(default)]
    pub durability: Durability,
    /// How often `batched` durability flushes to disk.
    #[serde(default = "default_flush_every")]
    pub flush_every: HumanDuration,
    /// sled's page cache, as sled counts it (its pages take two to three times as much
    /// memory as this).
    #[serde(default = "default_cache")]
    pub cache: Size,
}

fn default_sled_path() -> PathBuf {
    PathBuf::from("./dedupe-data")
}

fn default_flush_every() -> HumanDuration {
    HumanDuration(Duration::from_millis(100))
}

/// 8 MiB: a larger sled cache cost memory without a measured gain (`docs/design.md`).
fn default_cache() -> Size {
    Size(8 << 20)
}

impl Default for SledConfig {
    fn default() -> Self {
        SledConfig {
            path: default_sled_path(),
            durability: Durability::default(),
            flush_every: default_flush_every(),
            cache: default_cache(),
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

/// What happens to a request no route matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unmatched {
    #[default]
    Forward,
    Reject,
}

/// `on_missing_key:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissingKey {
    #[default]
    Reject,
    Forward,
}

/// `on_store_error:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    #[default]
    Reject,
    Forward,
}

/// `on_payload_mismatch:`: a duplicate key whose body differs from the recorded one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPayloadMismatch {
    #[default]
    Duplicate,
    Reject,
}

/// `replay_guard:`: whether a signed body already done in the route's scope, under any
/// key, is a duplicate. It stops a captured delivery from running again when it is resent
/// with a fresh ID in a header the signature does not cover (GitHub's
/// `X-GitHub-Delivery`, Shopify's `X-Shopify-Event-Id`); its cost is that two genuine
/// events with byte-identical bodies are one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayGuard {
    Body,
    #[serde(rename = "none")]
    Off,
}

/// One entry of `routes:`, and also the shape of `defaults:` (which may not set `name`,
/// `match`, `key` or `scope`). Every policy field is optional: a route inherits what it
/// leaves out from `defaults`, and `defaults` from the built-in values in `route.rs`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub name: Option<Name>,
    #[serde(rename = "match", default, deserialize_with = "match_section")]
    pub matcher: Option<MatchFile>,
    pub key: Option<KeyTemplate>,
    /// A provider's key and signature check; the route's own `key` and `verify` win.
    pub preset: Option<Preset>,
    /// The signature check; `none` turns off a preset's.
    pub verify: Option<VerifySetting>,
    pub scope: Option<Name>,
    pub upstream: Option<UpstreamUrl>,
    pub retention: Option<HumanDuration>,
    pub lease: Option<HumanDuration>,
    pub max_body: Option<Size>,
    pub upstream_timeout: Option<HumanDuration>,
    pub success_status: Option<Vec<StatusPattern>>,
    pub on_missing_key: Option<OnMissingKey>,
    pub on_store_error: Option<OnStoreError>,
    pub on_payload_mismatch: Option<OnPayloadMismatch>,
    pub duplicate_response: Option<DuplicateResponseFile>,
    pub in_flight_status: Option<RefusalStatus>,
    pub retry_after: Option<HumanDuration>,
    pub forward_key_header: Option<bool>,
    pub replay_guard: Option<ReplayGuard>,
}

/// `duplicate_response:`; each field inherits separately.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DuplicateResponseFile {
    pub status: Option<StatusValue>,
    pub body: Option<String>,
    pub content_type: Option<HeaderText>,
    /// Answer with the upstream's recorded status, content type and body instead.
    pub replay: Option<bool>,
}

/// `match:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    #[serde(default)]
    pub method: Methods,
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    pub host: Option<String>,
}

impl RouteFile {
    /// Checks shared by routes and `defaults`.
    fn check_policy(&self) -> Result<(), String> {
        let positive = [
            ("retention", self.retention),
            ("lease", self.lease),
            ("upstream_timeout", self.upstream_timeout),
        ];
        for (field, value) in positive {
            if value.is_some_and(|duration| duration.0.is_zero()) {
                return Err(format!("`{field}` must be longer than zero"));
            }
        }
        if self.success_status.as_ref().is_some_and(Vec::is_empty) {
            return Err("`success_status` must list at least one status or class".into());
        }
        Ok(())
    }

    /// Fills in the preset's key and signature check where the route has none.
    fn apply_preset(&mut self) -> Result<(), String> {
        let Some(preset) = self.preset else {
            return Ok(());
        };
        if self.key.is_none() {
            self.key = Some(preset.key());
        }
        if self.verify.is_none() {
            self.verify = preset.verify()?.map(VerifySetting::On);
        }
        Ok(())
    }

    fn check_route(&self, earlier: &[RouteFile]) -> Result<(), String> {
        let Some(name) = &self.name else {
            return Err("a route needs a `name`".into());
        };
        if self.matcher.is_none() {
            return Err(format!("route `{name}` needs a `match`"));
        }
        if self.key.is_none() {
            return Err(format!(
                "route `{name}` needs a `key` template (or a `preset`)"
            ));
        }
        if earlier
            .iter()
            .any(|route| route.name.as_ref() == Some(name))
        {
            return Err(format!(
                "duplicate route name `{name}`; route names must be unique"
            ));
        }
        self.check_policy()
    }

    fn check_defaults(&self) -> Result<(), String> {
        let per_route = [
            ("name", self.name.is_some()),
            ("match", self.matcher.is_some()),
            ("key", self.key.is_some()),
            ("scope", self.scope.is_some()),
            ("preset", self.preset.is_some()),
            ("verify", self.verify.is_some()),
        ];
        if let Some((field, _)) = per_route.iter().find(|(_, set)| *set) {
            return Err(format!("`{field}` belongs to a route, not to `defaults`"));
        }
        self.check_policy()
    }
}

impl MatchFile {
    fn check(&self) -> Result<(), String> {
        if self.path.is_some() && self.path_prefix.is_some() {
            return Err("`match` takes `path` or `path_prefix`, not both".into());
        }
        for path in [&self.path, &self.path_prefix].into_iter().flatten() {
            if !path.starts_with('/') {
                return Err(format!("path `{path}` must start with `/`"));
            }
            if crate::target::normal_path(path).is_err() {
                return Err(format!(
                    "path `{path}` has a `..` segment; requests with one are refused, so no route can match it"
                ));
            }
        }
        Ok(())
    }
}

/// Deserializes a YAML map as `T`, then converts it with `convert` inside the map's
/// visitor, so that a conversion error carries the map's line and column.
fn map_then<'de, D, T, U, F>(deserializer: D, convert: F) -> Result<U, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    F: FnOnce(T) -> Result<U, String>,
{
    struct MapThen<T, F> {
        convert: F,
        target: PhantomData<T>,
    }

    impl<'de, T, U, F> Visitor<'de> for MapThen<T, F>
    where
        T: Deserialize<'de>,
        F: FnOnce(T) -> Result<U, String>,
    {
        type Value = U;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<U, A::Error> {
            let value = T::deserialize(MapAccessDeserializer::new(map))?;
            (self.convert)(value).map_err(de::Error::custom)
        }
    }

    deserializer.deserialize_map(MapThen {
        convert,
        target: PhantomData,
    })
}

fn limits_section<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Limits, D::Error> {
    map_then(deserializer, |limits: Limits| {
        if limits.max_connections == 0 || limits.max_requests == 0 {
            return Err("`max_connections` and `max_requests` must be at least 1".into());
        }
        if limits.max_header_bytes.0 < 8192 {
            return Err("`max_header_bytes` must be at least 8KiB".into());
        }
        if limits.header_read_timeout.0.is_zero() || limits.body_read_timeout.0.is_zero() {
            return Err("read timeouts must be longer than zero".into());
        }
        Ok(limits)
    })
}

fn defaults_section<'de, D: Deserializer<'de>>(deserializer: D) -> Result<RouteFile, D::Error> {
    map_then(deserializer, |defaults: RouteFile| {
        defaults.check_defaults()?;
        Ok(defaults)
    })
}

fn match_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<MatchFile>, D::Error> {
    map_then(deserializer, |matcher: MatchFile| {
        matcher.check()?;
        Ok(Some(matcher))
    })
}

/// `routes:`: each route is checked against the ones before it for a duplicate name.
fn route_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<RouteFile>, D::Error> {
    struct RouteList;

    impl<'de> Visitor<'de> for RouteList {
        type Value = Vec<RouteFile>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of routes")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut routes = Vec::new();
            while let Some(route) = seq.next_element_seed(CheckedRoute { earlier: &routes })? {
                routes.push(route);
            }
            Ok(routes)
        }
    }

    struct CheckedRoute<'a> {
        earlier: &'a [RouteFile],
    }

    impl<'de> DeserializeSeed<'de> for CheckedRoute<'_> {
        type Value = RouteFile;

        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RouteFile, D::Error> {
            map_then(deserializer, |mut route: RouteFile| {
                route.apply_preset()?;
                route.check_route(self.earlier)?;
                Ok(route)
            })
        }
    }

    deserializer.deserialize_seq(RouteList)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.yaml"), &Overrides::default())
    }

    fn error_at(text: &str) -> (usize, usize, String) {
        match parse(text) {
            Err(ConfigError::Invalid {
                line,
                column,
                message,
                ..
            }) => (line, column, message),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    const MINIMAL: &str = "upstream: http://127.0.0.1:8080\n";

    #[test]
    fn minimal_file_gets_the_documented_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(config.admin.listen, "127.0.0.1:9091".parse().unwrap());
        assert_eq!(config.shutdown_grace.0, Duration::from_secs(25));
        assert_eq!(config.unmatched, Unmatched::Forward);
        let StoreConfig::Sled(sled) = &config.store else {
            panic!("sled by default")
        };
        assert_eq!(sled.path, PathBuf::from("./dedupe-data"));
        assert_eq!(sled.durability, Durability::Batched);
        assert_eq!(sled.flush_every.0, Duration::from_millis(100));
        assert_eq!(sled.cache.0, 8 << 20);
        assert!(config.routes.is_empty());
    }

    #[test]
    fn unknown_field_is_located() {
        let (line, column, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a }\n    key: \"{json:/id}\"\n    retension: 1d\n",
        );
        assert_eq!((line, column), (6, 5));
        assert!(message.contains("unknown field `retension`"), "{message}");
    }

    #[test]
    fn bad_duration_is_located_at_its_scalar() {
        let (line, column, message) =
            error_at("upstream: http://127.0.0.1:8080\ndefaults:\n  lease: 5 parsecs\n");
        assert_eq!((line, column), (3, 10));
        assert!(message.contains("invalid duration"), "{message}");
    }

    #[test]
    fn bad_template_is_located() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a }\n    key: \"{body:/id}\"\n",
        );
        assert_eq!(line, 5);
        assert!(message.contains("not a key part"), "{message}");
    }

    #[test]
    fn duplicate_route_name_is_located_at_the_second_route() {
        let text = "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a }\n    key: \"{json:/id}\"\n  - name: a\n    match: { path: /b }\n    key: \"{json:/id}\"\n";
        let (line, column, message) = error_at(text);
        assert_eq!((line, column), (6, 5));
        assert!(message.contains("duplicate route name `a`"), "{message}");
    }

    #[test]
    fn path_and_prefix_together_are_refused() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match:\n      path: /a\n      path_prefix: /b\n    key: \"{json:/id}\"\n",
        );
        assert_eq!(line, 5);
        assert!(message.contains("not both"), "{message}");
    }

    #[test]
    fn defaults_may_not_name_routes() {
        let (line, _, message) =
            error_at("upstream: http://127.0.0.1:8080\ndefaults:\n  key: \"{json:/id}\"\n");
        assert_eq!(line, 3);
        assert!(message.contains("belongs to a route"), "{message}");
    }

    #[test]
    fn in_flight_status_must_refuse() {
        let (line, _, message) =
            error_at("upstream: http://127.0.0.1:8080\ndefaults:\n  in_flight_status: 200\n");
        assert_eq!(line, 3);
        assert!(message.contains("4xx or 5xx"), "{message}");
    }

    #[test]
    fn missing_upstream_and_unknown_store() {
        let (_, _, message) = error_at("listen: 127.0.0.1:1\n");
        assert!(message.contains("missing field `upstream`"), "{message}");
        let (line, _, message) = error_at("upstream: http://127.0.0.1:8080\nstore:\n  mongo: {}\n");
        assert_eq!(line, 3);
        assert!(message.contains("unknown field `mongo`"), "{message}");
    }

    #[test]
    fn unset_token_variable_is_an_error() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nadmin:\n  token_env: DEDUPE_TEST_SURELY_UNSET_VARIABLE\n",
        );
        assert_eq!(line, 3);
        assert!(message.contains("is not set"), "{message}");
    }

    #[test]
    fn a_host_route_that_other_hosts_pass_by_is_warned_about() {
        let route =
            "routes:\n  - name: a\n    match: { host: a.example }\n    key: \"{json:/id}\"\n";
        let config = parse(&format!("{MINIMAL}{route}")).unwrap();
        assert!(
            config.warnings.iter().any(|w| w.contains("another Host")),
            "{:?}",
            config.warnings
        );
        let config = parse(&format!("{MINIMAL}unmatched: reject\n{route}")).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn a_route_path_cannot_climb() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a/../b }\n    key: \"{json:/id}\"\n",
        );
        assert_eq!(line, 4);
        assert!(message.contains("`..` segment"), "{message}");
    }

    #[test]
    fn overrides_win() {
        let overrides = Overrides {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            upstream: Some("http://10.0.0.1:9".parse().unwrap()),
            workers: None,
        };
        let config = Config::parse(MINIMAL, Path::new("t.yaml"), &overrides).unwrap();
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.upstream.to_string(), "http://10.0.0.1:9");
    }

    #[test]
    fn passwords_in_server_urls_are_masked_when_printed() {
        let config = parse("upstream: http://127.0.0.1:8080\nstore:\n  postgres: { url: \"postgres://app:hunter2@db:5432/app\" }\n").unwrap();
        let printed = serde_yaml::to_string(&config).unwrap();
        assert!(
            printed.contains("url: postgres://app:***@db:5432/app"),
            "{printed}"
        );
        assert!(!printed.contains("hunter2"));
        assert!(!format!("{config:?}").contains("hunter2"));
        let StoreConfig::Postgres(postgres) = &config.store else {
            panic!("postgres expected");
        };
        assert_eq!(postgres.url.expose(), "postgres://app:hunter2@db:5432/app");
        assert_eq!(postgres.table.0, "dedupe_claims");
    }

    #[test]
    fn error_display_names_file_line_and_column() {
        let error = parse("upstream: http://127.0.0.1:8080\nbogus: 1\n").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("test.yaml:2:1: unknown field `bogus`"),
            "{error}"
        );
    }
}
