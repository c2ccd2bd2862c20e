//! Routes as the proxy runs them: each [`Route`] with every setting resolved (the
//! configuration resolves them, see `config::resolve`), and the [`RouteTable`] that finds
//! the first route matching a request.

pub mod delivery;
pub mod logging;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde::{Deserialize, Serialize};

use self::delivery::QueuePolicy;
use crate::key::KeyTemplate;
use crate::order::{OnStale, Order};
use crate::preset::{FingerprintScope, Preset};
use crate::target::{self, Addressed, TargetError};
use crate::values::{MethodValue, StatusPattern, UpstreamUrl, as_written};
use crate::verify::Verify;

/// A route with every setting resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Route {
    pub name: String,
    /// The key namespace: `scope` when set, else the route's name.
    pub namespace: String,
    #[serde(rename = "match")]
    pub matcher: Matcher,
    pub key: KeyTemplate,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// The signature check, before anything is claimed or forwarded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
    /// Whether a signed body already done under another key is a duplicate.
    pub replay_guard: ReplayGuard,
    /// The stale-event guard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
    pub upstream: UpstreamUrl,
    #[serde(flatten)]
    pub policy: Policy,
}

/// The per-route settings that `defaults` can also set.
#[derive(Debug, Clone, Serialize)]
pub struct Policy {
    #[serde(serialize_with = "as_written::duration")]
    pub retention: Duration,
    #[serde(serialize_with = "as_written::duration")]
    pub lease: Duration,
    #[serde(serialize_with = "as_written::size")]
    pub max_body: u64,
    #[serde(serialize_with = "as_written::duration")]
    pub upstream_timeout: Duration,
    pub success_status: Vec<StatusPattern>,
    pub on_missing_key: OnMissingKey,
    pub on_store_error: OnStoreError,
    pub on_payload_mismatch: OnPayloadMismatch,
    pub on_in_flight: OnInFlight,
    #[serde(serialize_with = "as_written::duration")]
    pub in_flight_wait: Duration,
    pub on_ambiguous: OnAmbiguous,
    pub duplicate_response: DuplicateResponse,
    /// A 4xx or 5xx: the configuration refuses a success here.
    #[serde(serialize_with = "as_written::status")]
    pub in_flight_status: StatusCode,
    #[serde(serialize_with = "as_written::duration")]
    pub retry_after: Duration,
    pub forward_key_header: bool,
    /// What a delivery's fingerprint covers (`idempotency_key`: the request).
    pub fingerprint: FingerprintScope,
    /// The proxy's own refusals as RFC 9457 problems (`idempotency_key`).
    pub problem_details: bool,
    pub delivery: DeliveryMode,
    /// With `delivery: queued`, and only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueuePolicy>,
    /// What the delivery log records beyond the entry.
    pub log: logging::LogPolicy,
}

/// `delivery:`: how a route delivers what it accepts.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    /// Forwarded while the sender waits; the sender's retry is the retry.
    #[default]
    Direct,
    /// Stored, acknowledged, then delivered by the proxy's workers with retries.
    Queued,
}

/// What a duplicate of a done key is answered with.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicateResponse {
    #[serde(serialize_with = "as_written::status")]
    pub status: StatusCode,
    #[serde(serialize_with = "as_written::text")]
    pub body: Bytes,
    #[serde(serialize_with = "as_written::header")]
    pub content_type: HeaderValue,
    /// Answer with the upstream's recorded answer when the store holds one.
    pub replay: bool,
    /// The app's headers recorded with its answer and replayed.
    #[serde(serialize_with = "as_written::header_names")]
    pub replay_headers: Vec<http::HeaderName>,
}

/// What happens to a request no route matches.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Unmatched {
    #[default]
    Forward,
    Reject,
}

/// `on_missing_key:`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnMissingKey {
    #[default]
    Reject,
    Forward,
}

/// `on_in_flight:`: what a delivery whose key another delivery holds gets.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnInFlight {
    /// `in_flight_status` and `Retry-After` at once.
    #[default]
    Respond,
    /// The first delivery's outcome, waited for up to `in_flight_wait`.
    Wait,
}

/// `on_ambiguous:`: what becomes of a key whose forward may or may not have run (the
/// upstream timed out, or closed the connection after the request went out).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnAmbiguous {
    /// Released: the provider's retry runs the work (at least once).
    #[default]
    Release,
    /// Held until an operator resolves it: nothing runs the work again (at most once).
    Hold,
}

/// `on_store_error:`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    #[default]
    Reject,
    Forward,
}

/// `on_payload_mismatch:`: a duplicate key whose body differs from the recorded one.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplayGuard {
    Body,
    #[serde(rename = "none")]
    Off,
}

/// Which requests a route takes.
#[derive(Debug, Clone, Serialize)]
pub struct Matcher {
    /// Empty: any method.
    #[serde(rename = "method", skip_serializing_if = "Vec::is_empty")]
    methods: Vec<MethodValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_prefix: Option<String>,
    /// Lowercase, without a trailing dot; compared with the request's host without its
    /// port unless this has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    /// `path` or `path_prefix` in the normal form requests are matched in
    /// ([`target::normal_path`]).
    #[serde(skip)]
    normal: Option<Vec<u8>>,
    /// The paths below which this matcher takes every path: a `path_prefix`'s, or a
    /// script's `path` (one whose last segment has an extension), each in normal form
    /// with that extension kept ([`target::with_extension`]).
    #[serde(skip)]
    below: Option<Vec<u8>>,
}

impl Matcher {
    /// A matcher for `methods` (none: any), `path` or else `path_prefix` (none: any), and
    /// `host` (none: any).
    pub fn new(
        methods: Vec<MethodValue>,
        path: Option<String>,
        path_prefix: Option<String>,
        host: Option<&str>,
    ) -> Matcher {
        let written = path.as_deref().or(path_prefix.as_deref());
        // The configuration refuses a `..`; were one here, the path as written would match
        // no request rather than every one.
        let normal = written.map(|path| {
            target::normal_path(path).map_or_else(|_| path.as_bytes().to_vec(), |n| n.into_owned())
        });
        let below = match (&path, &path_prefix) {
            (Some(script), _) => target::with_extension(script),
            (None, Some(prefix)) => target::with_extension(prefix).or_else(|| normal.clone()),
            (None, None) => None,
        };
        Matcher {
            methods,
            normal,
            below,
            path,
            path_prefix,
            host: host.map(|host| {
                let (name, port) = target::split_port(host);
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                port.map_or_else(|| name.clone(), |port| format!("{name}:{port}"))
            }),
        }
    }

    /// The host this matcher is limited to, if any.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// Whether this matcher takes every request `later` would, so that a route listed
    /// after it with `later` is never taken. Answers for the plain cases (the same or a
    /// wider host and method list, and a path of `later`'s this one takes); others count as
    /// not covered.
    pub(crate) fn covers(&self, later: &Matcher) -> bool {
        let host = self.host.is_none() || self.host == later.host;
        let methods = self.methods.is_empty()
            || (!later.methods.is_empty()
                && later.methods.iter().all(|MethodValue(method)| {
                    self.methods.iter().any(|MethodValue(ours)| {
                        ours.as_str().eq_ignore_ascii_case(method.as_str())
                    })
                }));
        let path = match (&later.normal, later.path_prefix.is_some()) {
            _ if self.normal.is_none() => true,
            (Some(exact), false) => self.path_matches(exact),
            (Some(prefix), true) => {
                self.path_prefix.is_some()
                    && self
                        .below
                        .as_ref()
                        .zip(later.below.as_ref())
                        .is_some_and(|(ours, theirs)| target::under(theirs, ours))
                    && self.path_matches(prefix)
            }
            (None, _) => false,
        };
        host && methods && path
    }

    /// Why this matcher does not take one reading of a request (see [`Matcher::takes`]),
    /// in words, or none when it takes it: for a dry run's account of an unmatched request.
    pub fn refuses(&self, method: &str, host: Option<&str>, path: &[u8]) -> Option<String> {
        if !self.method_matches(method) {
            return Some(format!(
                "it takes {}, not {method}",
                self.methods().join(", ")
            ));
        }
        if !self.path_matches(path) {
            let wanted = match (&self.path, &self.path_prefix) {
                (Some(path), _) => format!("the path {path}"),
                (None, Some(prefix)) => format!("paths under {prefix}"),
                (None, None) => "any path".to_owned(),
            };
            return Some(format!(
                "it takes {wanted}, not {}",
                String::from_utf8_lossy(path)
            ));
        }
        if !self.host_matches(host) {
            return Some(format!(
                "it takes the host {}, not {}",
                self.host.as_deref().unwrap_or_default(),
                host.unwrap_or("none")
            ));
        }
        None
    }

    /// The methods this matcher is limited to (none: any).
    pub fn methods(&self) -> Vec<&str> {
        self.methods
            .iter()
            .map(|MethodValue(method)| method.as_str())
            .collect()
    }

    /// Whether the matcher takes one reading of a request: `method`, `host` (none for an
    /// HTTP/1.0 request without one) and a normal path. `path` matches the path in its
    /// normal form (and, for a script, every path below it); `path_prefix` also every path
    /// below it, segment by segment. Methods compare without regard to case (servers
    /// differ), and a `GET` route takes `HEAD`, which frameworks run through the `GET`
    /// handler.
    pub fn takes(&self, method: &str, host: Option<&str>, path: &[u8]) -> bool {
        self.method_matches(method) && self.path_matches(path) && self.host_matches(host)
    }

    /// Whether the matcher takes `host` and `path` under some method other than POST: then
    /// a POST's `_method` could lead to it.
    fn takes_other_than_post(&self, host: Option<&str>, path: &[u8]) -> bool {
        (self.methods.is_empty()
            || self
                .methods
                .iter()
                .any(|MethodValue(ours)| *ours != Method::POST))
            && self.path_matches(path)
            && self.host_matches(host)
    }

    fn method_matches(&self, method: &str) -> bool {
        self.methods.is_empty()
            || self.methods.iter().any(|MethodValue(ours)| {
                ours.as_str().eq_ignore_ascii_case(method)
                    || (*ours == Method::GET && method.eq_ignore_ascii_case("HEAD"))
            })
    }

    fn path_matches(&self, path: &[u8]) -> bool {
        let Some(normal) = &self.normal else {
            return true;
        };
        path == normal.as_slice()
            || self
                .below
                .as_ref()
                .is_some_and(|below| target::under(path, below))
    }

    fn host_matches(&self, host: Option<&str>) -> bool {
        match (&self.host, host) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(wanted), Some(host)) => target::same_host(wanted, host),
        }
    }
}

impl Route {
    /// Settings that are valid but probably mistakes, each worth a line in the log.
    pub fn warnings(&self) -> Vec<String> {
        let policy = &self.policy;
        let holds = policy.on_ambiguous == OnAmbiguous::Hold;
        let mut warnings = Vec::new();
        if holds && policy.on_store_error == OnStoreError::Forward {
            warnings.push(format!(
                "route `{}`: on_store_error: forward sends deliveries unclaimed while the store fails, so on_ambiguous: hold cannot keep them from running twice",
                self.name
            ));
        }
        if self.order.is_some() && self.steerable_versions() {
            let outcome = match self.order.as_ref().map(|order| order.on_stale) {
                Some(OnStale::Skip) => "skipped",
                _ => "marked stale",
            };
            warnings.push(format!(
                "route `{}`: order's version can be set by whoever reaches the route (no verify, or read from a part the signature does not cover): one event with a version far ahead, and the entity's real events are {outcome}",
                self.name
            ));
        }
        if self.steerable_lanes() {
            warnings.push(format!(
                "route `{}`: queue.order_by can be set by whoever reaches the route (no verify, or read from a part the signature does not cover): events that fail on purpose in a victim's lane hold its real events back until max_attempts or max_age",
                self.name
            ));
        }
        warnings
    }

    /// Whether someone without the signing secret can choose the lane of an event
    /// (`queue.order_by`).
    fn steerable_lanes(&self) -> bool {
        let Some(order_by) = self
            .policy
            .queue
            .as_ref()
            .and_then(|queue| queue.order_by.as_ref())
        else {
            return false;
        };
        self.settable_unsigned(|signed| order_by.reads_unsigned_parts(signed))
    }

    /// Whether a value the route reads as `reads` says (given the headers its signature
    /// covers) can be chosen without the signing secret: always when nothing is verified.
    fn settable_unsigned(&self, reads_unsigned: impl Fn(&[&str]) -> bool) -> bool {
        self.verify
            .as_ref()
            .is_none_or(|verify| reads_unsigned(verify.signed_headers()))
    }

    /// Whether someone without the signing secret can choose an event's entity and version
    /// (`order:`): the route checks no signature, or reads them from a part it does not sign.
    /// A version far ahead, once done, makes the entity's real events stale.
    pub(crate) fn steerable_versions(&self) -> bool {
        self.order.as_ref().is_some_and(|order| {
            self.settable_unsigned(|signed| order.reads_unsigned_parts(signed))
        })
    }

    /// Whether the upstream's status counts as success for this route.
    pub fn is_success(&self, status: StatusCode) -> bool {
        self.policy
            .success_status
            .iter()
            .any(|pattern| pattern.matches(status))
    }
}

/// What a configuration reload replaces, all at once: the routes, and where requests
/// no route takes go.
#[derive(Debug)]
pub struct Routing {
    pub table: RouteTable,
    pub unmatched: Unmatched,
    pub fallback_upstream: UpstreamUrl,
    pub unmatched_timeout: Duration,
}

/// The routes in file order; the first match wins.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
    /// Whether any route is limited to a host, so that forwarded hosts matter.
    limits_hosts: bool,
    /// Whether any route takes a method other than POST, so that a POST's body could
    /// name one (`_method`).
    takes_other_than_post: bool,
}

impl RouteTable {
    pub fn new(routes: Vec<Route>) -> RouteTable {
        RouteTable {
            limits_hosts: routes.iter().any(|route| route.matcher.host.is_some()),
            takes_other_than_post: routes.iter().any(|route| {
                let methods = &route.matcher.methods;
                methods.is_empty()
                    || methods
                        .iter()
                        .any(|MethodValue(ours)| *ours != Method::POST)
            }),
            routes: routes.into_iter().map(Arc::new).collect(),
        }
    }

    /// Whether a request's forwarded hosts are among its readings
    /// ([`target::addressed`]).
    pub fn limits_hosts(&self) -> bool {
        self.limits_hosts
    }

    /// The route a request goes to: the first that takes it in each of its readings
    /// ([`target::Addressed`]). A reading no route takes adds nothing; readings that lead
    /// to two different routes are refused: the app could run the request as either, and
    /// checking it as one would let it past the other's check.
    pub fn find(&self, target: &Addressed<'_>) -> Result<Option<&Arc<Route>>, TargetError> {
        if target.is_plain() {
            return Ok(self.first(target.method.as_str(), target.host, &target.path));
        }
        let mut found: Option<&Arc<Route>> = None;
        for method in target.methods() {
            for host in target.hosts() {
                for path in target.paths() {
                    match (found, self.first(method, host, path)) {
                        (_, None) => {}
                        (None, Some(route)) => found = Some(route),
                        (Some(earlier), Some(route)) if Arc::ptr_eq(earlier, route) => {}
                        (Some(_), Some(_)) => return Err(TargetError::TwoRoutes),
                    }
                }
            }
        }
        Ok(found)
    }

    /// Whether a POST to `target`, found to go to `found`, could be read as another
    /// route's request through a `_method` in its body: then its body is read for one
    /// ([`crate::method_override::body_methods`]). Most requests need not be.
    pub fn body_may_reroute(&self, target: &Addressed<'_>, found: Option<&Arc<Route>>) -> bool {
        self.takes_other_than_post
            && *target.method == Method::POST
            && self.routes.iter().any(|route| {
                found.is_none_or(|found| !Arc::ptr_eq(found, route))
                    && target.hosts().any(|host| {
                        target
                            .paths()
                            .any(|path| route.matcher.takes_other_than_post(host, path))
                    })
            })
    }

    /// The first route taking one reading.
    fn first(&self, method: &str, host: Option<&str>, path: &[u8]) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .find(|route| route.matcher.takes(method, host, path))
    }

    /// Whether a route of `namespace` (a scope) guards against replays by body: then a
    /// key of the namespace may have a body's record beside it.
    pub(crate) fn guards_bodies(&self, namespace: &str) -> bool {
        self.routes()
            .any(|route| route.namespace == namespace && route.replay_guard == ReplayGuard::Body)
    }

    pub fn by_name(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|route| route.name == name)
    }

    /// Each route's name, whether it checks signatures, and whether it guards order.
    pub(crate) fn names_and_checks(&self) -> impl Iterator<Item = (&str, bool, bool)> {
        self.routes.iter().map(|route| {
            (
                route.name.as_str(),
                route.verify.is_some(),
                route.order.is_some(),
            )
        })
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter().map(|route| route.as_ref())
    }

    /// The routes as deliveries share them.
    pub(crate) fn shared_routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }
}

/// Route tables built from YAML, for this module's tests and `config::resolve`'s.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::Path;

    use super::RouteTable;
    use crate::config::{Config, Overrides};

    pub(crate) fn table(yaml: &str) -> RouteTable {
        let text = format!("upstream: http://127.0.0.1:8080\n{yaml}");
        let config = Config::parse(&text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        RouteTable::new(config.routes)
    }

    pub(crate) const ROUTES: &str = r#"
defaults:
  retention: 3d
  duplicate_response: { status: 202 }
routes:
  - name: exact
    match: { method: POST, path: /hooks/a }
    key: "{json:/id}"
    retention: 1h
  - name: prefix
    match: { method: [post, PUT], path_prefix: /hooks/, host: Hooks.Example.com }
    key: "{query:id}"
    scope: shared
    duplicate_response: { body: "dup" }
  - name: any
    match: {}
    key: "{header:x-id}"
"#;
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::fixtures::{ROUTES, table};
    use super::*;

    /// A request stating `method`, `host` and `path`, with no other reading.
    fn stated<'a>(method: &'a Method, host: Option<&'a str>, path: &str) -> Addressed<'a> {
        Addressed {
            method,
            host,
            path: Cow::Owned(target::normal_path(path).unwrap().into_owned()),
            other_methods: Vec::new(),
            other_hosts: Vec::new(),
            other_paths: Vec::new(),
        }
    }

    fn found<'t>(routes: &'t RouteTable, target: &Addressed<'_>) -> Option<&'t str> {
        routes
            .find(target)
            .expect("one route")
            .map(|route| route.name.as_str())
    }

    #[test]
    fn first_match_wins() {
        let routes = table(ROUTES);
        let find = |method: Method, host, path: &str| {
            found(&routes, &stated(&method, host, path)).map(str::to_owned)
        };
        assert_eq!(
            find(Method::POST, None, "/hooks/a").as_deref(),
            Some("exact")
        );
        assert_eq!(find(Method::GET, None, "/hooks/a").as_deref(), Some("any"));
        assert_eq!(
            find(Method::PUT, Some("hooks.example.com:8081"), "/hooks/b").as_deref(),
            Some("prefix")
        );
        assert_eq!(
            find(Method::PUT, Some("other.example.com"), "/hooks/b").as_deref(),
            Some("any")
        );
        assert_eq!(find(Method::PUT, None, "/hooks/b").as_deref(), Some("any"));
    }

    #[test]
    fn every_spelling_of_a_path_finds_its_route() {
        let routes = table(ROUTES);
        for path in [
            "/hooks/a/",
            "//hooks/a",
            "/HOOKS/a",
            "/hooks/./a",
            "/hooks/%61",
            "/./hooks/a",
            "/hooks/a.json",
        ] {
            let target = stated(&Method::POST, None, path);
            assert_eq!(found(&routes, &target), Some("exact"), "{path}");
        }
    }

    #[test]
    fn every_spelling_of_a_method_finds_its_route() {
        let routes = table(
            "routes:\n  - name: post\n    match: { method: POST, path: /a }\n    key: \"{json:/id}\"\n  - name: get\n    match: { method: GET, path: /b }\n    key: \"{json:/id}\"\n",
        );
        for method in ["post", "Post", "pOsT"] {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(found(&routes, &stated(&method, None, "/a")), Some("post"));
        }
        assert_eq!(
            found(&routes, &stated(&Method::HEAD, None, "/b")),
            Some("get")
        );
        assert_eq!(found(&routes, &stated(&Method::HEAD, None, "/a")), None);
        let mut overridden = stated(&Method::GET, None, "/a");
        assert_eq!(found(&routes, &overridden), None);
        overridden.other_methods.push(Cow::Borrowed("post"));
        assert_eq!(found(&routes, &overridden), Some("post"));
    }

    #[test]
    fn a_rewritten_path_or_a_forwarded_host_finds_its_route() {
        let routes = table(
            "routes:\n  - name: exact\n    match: { method: POST, path: /hooks/a }\n    key: \"{json:/id}\"\n  - name: hosted\n    match: { host: hooks.example.com }\n    key: \"{json:/id}\"\n",
        );
        let mut rewritten = stated(&Method::POST, Some("x"), "/elsewhere");
        assert_eq!(found(&routes, &rewritten), None);
        rewritten.other_paths.push(b"/hooks/a".to_vec());
        assert_eq!(found(&routes, &rewritten), Some("exact"));
        let mut forwarded = stated(&Method::PUT, Some("internal:8080"), "/b");
        assert_eq!(found(&routes, &forwarded), None);
        forwarded.other_hosts.push("Hooks.Example.com.");
        assert_eq!(found(&routes, &forwarded), Some("hosted"));
    }

    /// A reading that leads to another route than the request's own is refused: checked
    /// as one route, it would reach the other's handler unchecked.
    #[test]
    fn readings_that_lead_to_two_routes_are_refused() {
        let routes = table(ROUTES);
        let mut rewritten = stated(&Method::POST, Some("x"), "/hooks/a");
        rewritten.other_paths.push(b"/elsewhere".to_vec());
        assert_eq!(routes.find(&rewritten).unwrap_err(), TargetError::TwoRoutes);
        let mut overridden = stated(&Method::POST, Some("x"), "/hooks/a");
        overridden.other_methods.push(Cow::Borrowed("GET"));
        assert_eq!(
            routes.find(&overridden).unwrap_err(),
            TargetError::TwoRoutes
        );
        let mut forwarded = stated(&Method::PUT, Some("other"), "/hooks/b");
        forwarded.other_hosts.push("hooks.example.com");
        assert_eq!(routes.find(&forwarded).unwrap_err(), TargetError::TwoRoutes);
        let mut same = stated(&Method::POST, Some("x"), "/hooks/a");
        same.other_paths.push(b"/hooks/a".to_vec());
        same.other_methods.push(Cow::Borrowed("post"));
        assert_eq!(
            found(&routes, &same),
            Some("exact"),
            "two readings, one route"
        );
    }

    #[test]
    fn a_script_takes_the_paths_below_it() {
        let routes = table(
            "routes:\n  - name: php\n    match: { path: /webhook.php }\n    key: \"{json:/id}\"\n",
        );
        for path in [
            "/webhook.php",
            "/webhook",
            "/WEBHOOK.PHP/anything",
            "/webhook.php/a/b",
            "/webhook.php;x/a",
            "/webhook.php%2Fa",
        ] {
            let target = stated(&Method::POST, None, path);
            assert_eq!(found(&routes, &target), Some("php"), "{path}");
        }
        for path in ["/webhook.php.bak/a", "/webhook/a", "/other.php"] {
            let target = stated(&Method::POST, None, path);
            assert_eq!(found(&routes, &target), None, "{path}");
        }
    }

    #[test]
    fn a_route_an_earlier_one_takes_whole_is_told_apart() {
        let matcher =
            |methods: &[&str], path: Option<&str>, prefix: Option<&str>, host: Option<&str>| {
                let methods = methods.iter().map(|m| m.parse().unwrap()).collect();
                Matcher::new(
                    methods,
                    path.map(str::to_owned),
                    prefix.map(str::to_owned),
                    host,
                )
            };
        let created = matcher(&["POST"], Some("/hooks/order.created"), None, None);
        let paid = matcher(&["POST"], Some("/hooks/order.paid"), None, None);
        assert!(created.covers(&paid), "one path in normal form");
        assert!(
            matcher(&[], None, None, None).covers(&paid),
            "a route of everything"
        );
        assert!(matcher(&[], None, Some("/hooks"), None).covers(&paid));
        assert!(matcher(&[], None, Some("/hooks"), None).covers(&matcher(
            &[],
            None,
            Some("/hooks/a"),
            None
        )));
        assert!(
            !paid.covers(&matcher(&["PUT"], Some("/hooks/order"), None, None)),
            "another method"
        );
        assert!(
            !paid.covers(&matcher(&[], Some("/hooks/order"), None, None)),
            "every method"
        );
        assert!(
            !matcher(&["POST"], Some("/a"), None, Some("a.example")).covers(&matcher(
                &["POST"],
                Some("/a"),
                None,
                None
            ))
        );
        assert!(!matcher(&[], None, Some("/hooks/a"), None).covers(&matcher(
            &[],
            None,
            Some("/hooks"),
            None
        )));
        assert!(!created.covers(&matcher(&["POST"], Some("/hooks/other"), None, None)));
    }

    #[test]
    fn ports_are_split_from_hosts() {
        use target::split_port;
        assert_eq!(split_port("a.example:80"), ("a.example", Some("80")));
        assert_eq!(split_port("a.example"), ("a.example", None));
        assert_eq!(split_port("[::1]:80"), ("[::1]", Some("80")));
        assert_eq!(split_port("[::1]"), ("[::1]", None));
    }

    /// A prefix whose last segment has a dot takes the paths below it, and its own path
    /// with a format; a path that merely starts alike is another path.
    #[test]
    fn a_dotted_prefix_takes_its_subtree() {
        let routes = table(
            "routes:\n  - name: api\n    match: { path_prefix: /api/v1.2 }\n    key: \"{json:/id}\"\n",
        );
        for path in [
            "/api/v1.2/hook",
            "/API/V1.2/a/b",
            "/api/v1.2",
            "/api/v1.2/",
            "/api/v1.2.json",
        ] {
            assert_eq!(
                found(&routes, &stated(&Method::POST, None, path)),
                Some("api"),
                "{path}"
            );
        }
        for path in ["/api/v1/hook", "/api/v1.3/hook", "/api/v1.20/hook"] {
            assert_eq!(
                found(&routes, &stated(&Method::POST, None, path)),
                None,
                "{path}"
            );
        }
    }

    #[test]
    fn a_host_matches_in_any_case_with_or_without_a_trailing_dot() {
        let text = "routes:\n  - name: a\n    match: { host: A.example.:8443 }\n    key: \"{json:/id}\"\n  - name: b\n    match: { host: b.example }\n    key: \"{json:/id}\"\n";
        let routes = table(text);
        let find =
            |host| found(&routes, &stated(&Method::POST, Some(host), "/")).map(str::to_owned);
        for host in ["a.example:8443", "A.EXAMPLE.:8443", "a.example.:8443"] {
            assert_eq!(find(host).as_deref(), Some("a"), "{host}");
        }
        assert_eq!(find("a.example"), None);
        assert_eq!(find("a.example:443"), None);
        for host in ["b.example", "b.example.", "B.example.:81", "b.example:1"] {
            assert_eq!(find(host).as_deref(), Some("b"), "{host}");
        }
        assert_eq!(find("b.example.evil"), None);
    }
}
