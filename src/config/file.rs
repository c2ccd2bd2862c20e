//! The file as written: the serde types of the top level, `defaults:` and each route, whose
//! every field is optional where a default or an inherited value fills it in (see
//! `resolve`), and the checks that run while each map is read.
//!
//! Every check runs while serde reads the value it concerns: scalars parse inside their
//! visitors (see `values`), and checks that span a whole map (a route's required fields,
//! duplicate route names, `path` with `path_prefix`) run inside that map's visitor through
//! [`map_then`]. serde_yaml only attaches a position to errors raised inside a visitor, so
//! this is what lets every error point at its line.

use std::fmt;
use std::net::SocketAddr;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};

use super::defaults;
use super::queue::{QueueFile, queue_section};
use super::sections::{AdminConfig, DeliveryLogConfig, Limits, TelemetryConfig};
use super::store::store_section;
use super::whole_map::map_then;
use crate::key::KeyTemplate;
use crate::order::Order;
use crate::preset::Preset;
use crate::route::logging::LoggedHeader;
use crate::route::{
    DeliveryMode, OnAmbiguous, OnInFlight, OnMissingKey, OnPayloadMismatch, OnStoreError,
    ReplayGuard, Unmatched,
};
use crate::store::settings::StoreConfig;
use crate::values::{
    HeaderText, HumanDuration, Methods, Name, RefusalStatus, ReplayHeader, Size, StatusPattern,
    StatusValue, UpstreamUrl, socket_address,
};
use crate::verify::{Verify, VerifySetting};

/// The top level of the file.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ConfigFile {
    /// Where providers connect: an `IP:port`.
    #[serde(default = "defaults::listen", deserialize_with = "socket_address")]
    pub(super) listen: SocketAddr,
    pub(super) upstream: UpstreamUrl,
    /// The admin port: health, readiness, metrics, the admin API, `/mcp` and the console.
    #[serde(default, deserialize_with = "admin_section")]
    pub(super) admin: AdminConfig,
    /// Where claims are kept: exactly one of `sled` (embedded, the default), `redis`, `postgres`.
    #[serde(default, deserialize_with = "store_section")]
    #[schemars(with = "super::store::StoreFile")]
    pub(super) store: StoreConfig,
    /// Route settings every route inherits where it sets none (not `name`, `match`, `key`, `scope`, `preset`, `verify`, `order`, `delivery`, `queue`).
    #[serde(default, deserialize_with = "defaults_section")]
    pub(super) defaults: RouteFile,
    /// Requests no route takes: `forward` them untouched, or `reject` them (404).
    #[serde(default)]
    pub(super) unmatched: Unmatched,
    #[serde(default = "defaults::shutdown_grace")]
    pub(super) shutdown_grace: HumanDuration,
    /// What one sender may cost the proxy: connections, requests, sizes and timeouts.
    #[serde(default, deserialize_with = "limits_section")]
    pub(super) limits: Limits,
    /// OpenTelemetry traces over OTLP; fields left out fall back to the `OTEL_*` variables.
    #[serde(default)]
    pub(super) telemetry: Option<TelemetryConfig>,
    /// The log of what became of each request, kept in the store.
    #[serde(default, deserialize_with = "delivery_log_section")]
    pub(super) delivery_log: DeliveryLogConfig,
    /// The routes, in order: the first that takes a request wins.
    #[serde(default, deserialize_with = "route_list")]
    pub(super) routes: Vec<RouteFile>,
}

/// One entry of `routes:`, and also the shape of `defaults:` (which may not set `name`,
/// `match`, `key`, `scope`, `preset`, `verify` or `order`). Every policy field is optional: a route inherits what it
/// leaves out from `defaults`, and `defaults` from the built-in values in `defaults.rs`.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    /// The route's name: `[a-z0-9_-]+`, unique; its keys' scope unless `scope` is set.
    pub(super) name: Option<Name>,
    /// Which requests the route takes: `method`, `path` or `path_prefix`, `host`.
    #[serde(rename = "match", default, deserialize_with = "match_section")]
    pub(super) matcher: Option<MatchFile>,
    /// The event's key, a template: literal text and `{json:/pointer}`, `{header:name}`,
    /// `{sf-string:name}`, `{header-hash:name}`, `{query:name}`, `{form:field}` parts.
    pub(super) key: Option<KeyTemplate>,
    /// A provider's key and signature check in one line; the route's own `key` and
    /// `verify` win.
    pub(super) preset: Option<Preset>,
    /// The signature check: one scheme, or `none` to turn a preset's off.
    pub(super) verify: Option<VerifySetting>,
    /// Where the route keeps its keys (default: its name); routes sharing one share keys.
    pub(super) scope: Option<Name>,
    /// This route's app (default: the top-level `upstream`).
    pub(super) upstream: Option<UpstreamUrl>,
    /// How long a done key is remembered: it must outlast the provider's retries.
    #[serde(default, deserialize_with = "longer_than_zero")]
    pub(super) retention: Option<HumanDuration>,
    /// How long an in-flight claim holds its key unrenewed (renewed while its delivery
    /// runs): it ends only when its proxy died. At least 100ms.
    #[serde(default, deserialize_with = "longer_than_zero")]
    pub(super) lease: Option<HumanDuration>,
    /// The largest body taken; larger ones get 413.
    pub(super) max_body: Option<Size>,
    /// Time for the app's answer head; then 504.
    #[serde(default, deserialize_with = "longer_than_zero")]
    pub(super) upstream_timeout: Option<HumanDuration>,
    /// Classes (`"2xx"`) and codes (`200`) of the app's answer that mean the work is done.
    pub(super) success_status: Option<Vec<StatusPattern>>,
    /// A request without a key: `reject` (400) or `forward` without a claim.
    pub(super) on_missing_key: Option<OnMissingKey>,
    /// The store failing: `reject` (503) or `forward` without a claim.
    pub(super) on_store_error: Option<OnStoreError>,
    /// A done key arriving with another body: answered as a `duplicate`, or `reject`ed
    /// (422).
    pub(super) on_payload_mismatch: Option<OnPayloadMismatch>,
    /// A delivery whose key another delivery holds: `respond` at once with
    /// `in_flight_status`, or `wait` for that delivery's outcome.
    pub(super) on_in_flight: Option<OnInFlight>,
    /// With `on_in_flight: wait`, the longest a delivery waits; at most 1m.
    #[serde(default, deserialize_with = "longer_than_zero")]
    pub(super) in_flight_wait: Option<HumanDuration>,
    /// A forward that may or may not have reached the app: `release` its key for the
    /// provider's retry (at least once), or `hold` it for an operator (at most once).
    pub(super) on_ambiguous: Option<OnAmbiguous>,
    /// The answer to a duplicate; `replay: true` answers with the app's recorded one.
    pub(super) duplicate_response: Option<DuplicateResponseFile>,
    /// The answer while another delivery holds the key, or while it is held: a 4xx or 5xx.
    pub(super) in_flight_status: Option<RefusalStatus>,
    /// `Retry-After` on 409 and 503 answers.
    pub(super) retry_after: Option<HumanDuration>,
    /// Add `Dedupe-Key` to forwarded requests.
    pub(super) forward_key_header: Option<bool>,
    /// `body`: a signed body already done under another key in the scope is a duplicate;
    /// `none`: off. Default: `body` where the key reads what the signature does not cover.
    pub(super) replay_guard: Option<ReplayGuard>,
    /// The stale-event guard: an event older than one done for its entity is marked or
    /// skipped.
    pub(super) order: Option<Order>,
    /// `direct`, or `queued`: stored, acknowledged, and delivered with retries.
    pub(super) delivery: Option<DeliveryMode>,
    /// With `delivery: queued`: the queue's settings.
    #[serde(default, deserialize_with = "queue_section")]
    pub(super) queue: Option<QueueFile>,
    /// What the delivery log records of this route's requests beyond the entry.
    pub(super) log: Option<LogFile>,
}

/// `log:`; each field inherits separately.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LogFile {
    /// Record each request's body in the delivery log.
    pub(super) bodies: Option<bool>,
    pub(super) max_body_bytes: Option<Size>,
    /// Headers recorded in the delivery log (never a signature, credential or cookie header).
    pub(super) headers: Option<Vec<LoggedHeader>>,
}

/// `duplicate_response:`; each field inherits separately.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DuplicateResponseFile {
    pub(super) status: Option<StatusValue>,
    /// The body of a duplicate's answer.
    pub(super) body: Option<String>,
    pub(super) content_type: Option<HeaderText>,
    /// Answer with the upstream's recorded status, headers and body instead.
    pub(super) replay: Option<bool>,
    /// The app's headers recorded and replayed.
    pub(super) replay_headers: Option<Vec<ReplayHeader>>,
}

/// `match:`.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MatchFile {
    /// A method like POST, or a list of them; any method when left out.
    #[serde(default)]
    pub(super) method: Methods,
    /// A path, matched in its normal form (case, repeated slashes, escapes and a trailing slash aside).
    pub(super) path: Option<String>,
    /// Every path below this one, segment by segment; not with `path`.
    pub(super) path_prefix: Option<String>,
    /// Only requests for this host (case and a trailing dot aside; the port only if given).
    pub(super) host: Option<String>,
}

/// The fields of a route that `defaults:` may not set, in the order [`RouteFile::check_defaults`]
/// looks at them.
pub(super) const ROUTE_ONLY: [&str; 9] = [
    "name", "match", "key", "scope", "preset", "verify", "order", "delivery", "queue",
];

impl RouteFile {
    /// Checks shared by routes and `defaults`.
    fn check_policy(&self) -> Result<(), String> {
        if self
            .lease
            .is_some_and(|lease| lease.0 < defaults::LEASE_MIN)
        {
            return Err(format!(
                "`lease` must be at least {} (it is renewed every third of it while its delivery runs)",
                crate::values::HumanDuration(defaults::LEASE_MIN)
            ));
        }
        if self
            .in_flight_wait
            .is_some_and(|wait| wait.0 > defaults::IN_FLIGHT_WAIT_MAX)
        {
            return Err(format!(
                "`in_flight_wait` must be at most {} (a sender waits that long for an answer)",
                crate::values::HumanDuration(defaults::IN_FLIGHT_WAIT_MAX)
            ));
        }
        if self.success_status.as_ref().is_some_and(Vec::is_empty) {
            return Err("`success_status` must list at least one status or class".into());
        }
        if let Some(limit) = self.log.as_ref().and_then(|log| log.max_body_bytes)
            && limit.0 > defaults::LOG_BODY_LIMIT
        {
            return Err(format!(
                "`log.max_body_bytes` must be at most {} (each entry is kept in the store)",
                Size(defaults::LOG_BODY_LIMIT)
            ));
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
        if preset.provider().for_api {
            // The draft's answers: the same key with another request is 422, a completed
            // key is answered with the first response. Set on the route, so that
            // `defaults:` (written for webhook routes) cannot turn on the body guard,
            // which would answer a second identical request under a new key as the
            // first, or replay a cookie to another client.
            self.on_payload_mismatch
                .get_or_insert(OnPayloadMismatch::Reject);
            self.replay_guard.get_or_insert(ReplayGuard::Off);
            let duplicate = self
                .duplicate_response
                .get_or_insert_with(DuplicateResponseFile::default);
            duplicate.replay.get_or_insert(true);
            duplicate.replay_headers.get_or_insert_with(|| {
                defaults::REPLAY_HEADERS
                    .iter()
                    .map(|name| ReplayHeader(http::HeaderName::from_static(name)))
                    .collect()
            });
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
        self.check_scope(name, earlier)?;
        self.check_delivery(name)?;
        self.check_templates()?;
        self.check_policy()
    }

    /// What queued delivery cannot combine with: its sender is answered before the app
    /// runs, so there is no app answer to replay and no outcome to hold.
    fn check_delivery(&self, name: &Name) -> Result<(), String> {
        if self.delivery != Some(DeliveryMode::Queued) {
            return match self.queue {
                Some(_) => Err(format!(
                    "route `{name}` has `queue:` settings but no `delivery: queued`"
                )),
                None => Ok(()),
            };
        }
        let conflict = if self.order.is_some() {
            Some("`order` (queued events are not yet checked against their entity's version)")
        } else if self.on_ambiguous == Some(OnAmbiguous::Hold) {
            Some("`on_ambiguous: hold` (a queued delivery with no answer is tried again)")
        } else if self
            .duplicate_response
            .as_ref()
            .is_some_and(|duplicate| duplicate.replay == Some(true))
        {
            Some(
                "`duplicate_response.replay` (a duplicate gets the acknowledgment, as its first delivery did)",
            )
        } else {
            None
        };
        match conflict {
            Some(what) => Err(format!(
                "route `{name}` has `delivery: queued`, which does not go with {what}"
            )),
            None => Ok(()),
        }
    }

    /// The key and `order` templates against the route's provider's own delivery, where
    /// its preset or signature check names the provider.
    fn check_templates(&self) -> Result<(), String> {
        let provider = match (&self.preset, &self.verify) {
            (Some(preset), _) => preset.name(),
            (None, Some(VerifySetting::On(verify))) => verify.scheme_name(),
            _ => return Ok(()),
        };
        let mut templates = Vec::new();
        templates.extend(self.key.as_ref().map(|key| ("key", key)));
        if let Some(order) = &self.order {
            templates.push(("order.entity", &order.entity));
            templates.push(("order.version", &order.version));
        }
        super::provider::check(provider, &templates)
    }

    /// The key namespace: `scope`, else the name.
    fn namespace(&self) -> Option<&str> {
        self.scope
            .as_ref()
            .or(self.name.as_ref())
            .map(|Name(name)| name.as_str())
    }

    /// The signature check in force, preset included.
    fn check_in_force(&self) -> Option<&Verify> {
        match &self.verify {
            Some(VerifySetting::On(verify)) => Some(verify),
            Some(VerifySetting::Off) | None => None,
        }
    }

    /// Routes that share a scope share their keys, so each must check signatures exactly
    /// as the others do: through a route with no check, or another secret, anyone could
    /// mark a real event's ID done first, and the real event would be answered as its
    /// duplicate and never run.
    fn check_scope(&self, name: &Name, earlier: &[RouteFile]) -> Result<(), String> {
        let namespace = self.namespace();
        let Some(other) = earlier.iter().find(|route| {
            route.namespace() == namespace && route.check_in_force() != self.check_in_force()
        }) else {
            return Ok(());
        };
        let describe = |route: &RouteFile| {
            route
                .check_in_force()
                .map_or_else(|| "no signature check".to_owned(), Verify::describe)
        };
        Err(format!(
            "route `{name}` shares the scope `{}` with route `{}` but checks signatures differently ({} here, {} there): whoever passes the weaker check could mark the other route's event IDs done first, and those events would be dropped as duplicates. Give each route its own `scope`, or the same `verify`",
            namespace.unwrap_or_default(),
            other.name.as_ref().map_or("", |Name(name)| name.as_str()),
            describe(self),
            describe(other),
        ))
    }

    fn check_defaults(&self) -> Result<(), String> {
        let per_route = [
            self.name.is_some(),
            self.matcher.is_some(),
            self.key.is_some(),
            self.scope.is_some(),
            self.preset.is_some(),
            self.verify.is_some(),
            self.order.is_some(),
            self.delivery.is_some(),
            self.queue.is_some(),
        ];
        if let Some((field, _)) = ROUTE_ONLY.iter().zip(per_route).find(|(_, set)| *set) {
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
            if let Err(error) = crate::target::normal_path(path) {
                return Err(format!(
                    "path `{path}`: {error}; requests with one are refused, so no route can match it"
                ));
            }
        }
        Ok(())
    }
}

/// A duration that must be longer than zero (`retention`, `lease`, `upstream_timeout`,
/// `in_flight_wait`), refused inside its visitor so that the error points at the value.
fn longer_than_zero<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<HumanDuration>, D::Error> {
    struct Positive;

    impl Visitor<'_> for Positive {
        type Value = Option<HumanDuration>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration longer than zero, like 30s")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            let duration: HumanDuration = text.parse().map_err(E::custom)?;
            if duration.0.is_zero() {
                return Err(E::custom(format!(
                    "`{text}`: the duration must be longer than zero"
                )));
            }
            Ok(Some(duration))
        }
    }

    deserializer.deserialize_str(Positive)
}

fn admin_section<'de, D: Deserializer<'de>>(deserializer: D) -> Result<AdminConfig, D::Error> {
    map_then(deserializer, |admin: AdminConfig| {
        if let Some(viewer) = &admin.viewer_token_env {
            let Some(operator) = &admin.token_env else {
                return Err("`viewer_token_env` needs `token_env`: without a token, every caller on loopback may change keys".into());
            };
            if viewer.secret.expose() == operator.secret.expose() {
                return Err(format!(
                    "`viewer_token_env` ({viewer}) holds the same token as `token_env` ({operator}): a viewer would be an operator"
                ));
            }
        }
        Ok(admin)
    })
}

fn delivery_log_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<DeliveryLogConfig, D::Error> {
    map_then(deserializer, |log: DeliveryLogConfig| {
        if log.max_entries == 0 || log.max_entries > defaults::LOG_MAX_ENTRIES_LIMIT {
            return Err(format!(
                "`max_entries` must be from 1 to {}",
                defaults::LOG_MAX_ENTRIES_LIMIT
            ));
        }
        if log.retention.0.is_zero() {
            return Err("`retention` must be longer than zero".into());
        }
        Ok(log)
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
