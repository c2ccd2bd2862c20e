//! Routes: each `routes:` entry resolved against `defaults` and the built-in values into
//! a [`Route`] whose every setting is known, and the [`RouteTable`] that finds the first
//! route matching a request.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde::Serialize;

use crate::values::{
    HeaderText, HumanDuration, MethodValue, Name, RefusalStatus, Size, StatusPattern, StatusValue,
    UpstreamUrl,
};
use crate::config::{
    Config, DuplicateResponseFile, MatchFile, OnMissingKey, OnPayloadMismatch, OnStoreError,
    ReplayGuard, RouteFile, Unmatched,
};
use crate::key::KeyTemplate;
use crate::preset::Preset;
use crate::target;
use crate::verify::{Verify, VerifySetting};

/// The default duplicate answer's body.
pub const DEFAULT_DUPLICATE_BODY: &str = r#"{"received":true,"duplicate":true}"#;

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
    pub upstream: UpstreamUrl,
    #[serde(flatten)]
    pub policy: Policy,
}

/// The per-route settings that `defaults` can also set.
#[derive(Debug, Clone, Serialize)]
pub struct Policy {
    pub retention: HumanDuration,
    pub lease: HumanDuration,
    pub max_body: Size,
    pub upstream_timeout: HumanDuration,
    pub success_status: Vec<StatusPattern>,
    pub on_missing_key: OnMissingKey,
    pub on_store_error: OnStoreError,
    pub on_payload_mismatch: OnPayloadMismatch,
    pub duplicate_response: DuplicateResponse,
    pub in_flight_status: RefusalStatus,
    pub retry_after: HumanDuration,
    pub forward_key_header: bool,
}

/// What a duplicate of a done key is answered with.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicateResponse {
    pub status: StatusValue,
    #[serde(serialize_with = "serialize_body")]
    pub body: Bytes,
    pub content_type: HeaderText,
    /// Answer with the upstream's recorded answer when the store holds one.
    pub replay: bool,
}

fn serialize_body<S: serde::Serializer>(body: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&String::from_utf8_lossy(body))
}

/// Which requests a route takes.
#[derive(Debug, Clone, Serialize)]
pub struct Matcher {
    /// Empty: any method.
    #[serde(rename = "method", skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<MethodValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Lowercase, without a trailing dot; compared with the request's host without its
    /// port unless this has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// `path` or `path_prefix` in the normal form requests are matched in
    /// ([`target::normal_path`]).
    #[serde(skip)]
    normal: Option<Vec<u8>>,
}

impl Matcher {
    fn from_file(file: MatchFile) -> Matcher {
        let written = file.path.as_deref().or(file.path_prefix.as_deref());
        Matcher {
            methods: file.method.0,
            // The file's check refused a `..`; were one here, the path as written would
            // match no request rather than every one.
            normal: written.map(|path| {
                target::normal_path(path).map_or_else(|_| path.as_bytes().to_vec(), Cow::into_owned)
            }),
            path: file.path,
            path_prefix: file.path_prefix,
            host: file.host.as_deref().map(|host| {
                let (name, port) = split_port(host);
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                port.map_or_else(|| name.clone(), |port| format!("{name}:{port}"))
            }),
        }
    }

    /// Whether a request with this method, host (from `Host` or the URI) and normal path
    /// ([`target::normal_path`]) matches. `path` matches the path in its normal form;
    /// `path_prefix` also every path below it, segment by segment.
    pub fn matches(&self, method: &Method, host: Option<&str>, normal_path: &[u8]) -> bool {
        let method_ok = self.methods.is_empty() || self.methods.iter().any(|m| m.0 == method);
        let path_ok = match &self.normal {
            None => true,
            Some(exact) if self.path.is_some() => normal_path == exact.as_slice(),
            Some(prefix) => target::under(normal_path, prefix),
        };
        method_ok && path_ok && self.host_matches(host)
    }

    fn host_matches(&self, host: Option<&str>) -> bool {
        let Some(wanted) = &self.host else {
            return true;
        };
        let Some(host) = host else {
            return false;
        };
        // `example.com.` is `example.com` to a resolver, and to the frameworks that check
        // hosts, with or without a port after it.
        let (wanted_name, wanted_port) = split_port(wanted);
        let (name, port) = split_port(host);
        name.trim_end_matches('.').eq_ignore_ascii_case(wanted_name)
            && (wanted_port.is_none() || port == wanted_port)
    }
}

/// A host's name and its port, if it has one.
fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        // An IPv6 literal keeps its brackets; only a port after them is split off.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => {
            (name, Some(port))
        }
        _ => (host, None),
    }
}

/// Picks a route's own value, else the default's, else the built-in one.
fn inherit<T: Clone>(own: &Option<T>, default: &Option<T>, builtin: T) -> T {
    own.as_ref()
        .or(default.as_ref())
        .cloned()
        .unwrap_or(builtin)
}

fn seconds(secs: u64) -> HumanDuration {
    HumanDuration(Duration::from_secs(secs))
}

impl Policy {
    /// A route's own settings, else the defaults', else the built-in ones. With an empty
    /// `own`, this resolves the defaults themselves.
    pub fn resolve(own: &RouteFile, defaults: &RouteFile) -> Policy {
        let d = defaults;
        let none = DuplicateResponseFile::default();
        let own_dup = own.duplicate_response.as_ref().unwrap_or(&none);
        let default_dup = d.duplicate_response.as_ref().unwrap_or(&none);
        Policy {
            retention: inherit(&own.retention, &d.retention, seconds(7 * 24 * 3600)),
            lease: inherit(&own.lease, &d.lease, seconds(300)),
            max_body: inherit(&own.max_body, &d.max_body, Size(1 << 20)),
            upstream_timeout: inherit(&own.upstream_timeout, &d.upstream_timeout, seconds(30)),
            success_status: inherit(
                &own.success_status,
                &d.success_status,
                vec![StatusPattern::Class(2)],
            ),
            on_missing_key: inherit(&own.on_missing_key, &d.on_missing_key, OnMissingKey::Reject),
            on_store_error: inherit(&own.on_store_error, &d.on_store_error, OnStoreError::Reject),
            on_payload_mismatch: inherit(
                &own.on_payload_mismatch,
                &d.on_payload_mismatch,
                OnPayloadMismatch::Duplicate,
            ),
            duplicate_response: DuplicateResponse {
                status: inherit(
                    &own_dup.status,
                    &default_dup.status,
                    StatusValue(StatusCode::OK),
                ),
                body: Bytes::from(inherit(
                    &own_dup.body,
                    &default_dup.body,
                    DEFAULT_DUPLICATE_BODY.to_owned(),
                )),
                content_type: inherit(
                    &own_dup.content_type,
                    &default_dup.content_type,
                    HeaderText(HeaderValue::from_static("application/json")),
                ),
                replay: inherit(&own_dup.replay, &default_dup.replay, false),
            },
            in_flight_status: inherit(
                &own.in_flight_status,
                &d.in_flight_status,
                RefusalStatus(StatusCode::CONFLICT),
            ),
            retry_after: inherit(&own.retry_after, &d.retry_after, seconds(5)),
            forward_key_header: inherit(&own.forward_key_header, &d.forward_key_header, true),
        }
    }
}

impl Route {
    /// Resolves a checked route entry (name, match and key present) against `defaults`.
    pub fn resolve(file: RouteFile, defaults: &RouteFile, upstream: &UpstreamUrl) -> Route {
        let policy = Policy::resolve(&file, defaults);
        let name = file.name.expect("checked: a route has a name").0;
        let key = file.key.expect("checked: a route has a key");
        let verify = match file.verify {
            Some(VerifySetting::On(verify)) => Some(verify),
            Some(VerifySetting::Off) | None => None,
        };
        let replay_guard = file
            .replay_guard
            .or(defaults.replay_guard)
            .unwrap_or_else(|| default_replay_guard(&key, verify.as_ref()));
        Route {
            namespace: file.scope.map_or_else(|| name.clone(), |Name(scope)| scope),
            name,
            matcher: Matcher::from_file(file.matcher.expect("checked: a route has a match")),
            key,
            preset: file.preset,
            verify,
            replay_guard,
            upstream: inherit(&file.upstream, &defaults.upstream, upstream.clone()),
            policy,
        }
    }

    /// A setting that is valid but probably a mistake, worth a line in the log.
    pub fn warning(&self) -> Option<String> {
        let policy = &self.policy;
        (policy.lease.0 <= policy.upstream_timeout.0).then(|| {
            format!(
                "route `{}`: lease ({}) is not longer than upstream_timeout ({}); a retry may be forwarded while a slow first delivery still runs",
                self.name, policy.lease, policy.upstream_timeout
            )
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

/// On where a signed delivery's key comes from a header or query parameter its signature
/// does not cover: anyone holding a captured delivery could resend it with a fresh ID.
/// Off without a check (a forger needs no captured delivery) and where the key is signed.
fn default_replay_guard(key: &KeyTemplate, verify: Option<&Verify>) -> ReplayGuard {
    match verify {
        Some(verify) if key.reads_unsigned_parts(verify.signed_headers()) => ReplayGuard::Body,
        _ => ReplayGuard::Off,
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

impl Routing {
    pub fn from_config(config: &Config) -> Routing {
        Routing {
            table: RouteTable::new(config.routes.clone()),
            unmatched: config.unmatched,
            fallback_upstream: config.upstream.clone(),
            unmatched_timeout: config.defaults.upstream_timeout.0,
        }
    }
}

/// The routes in file order; the first match wins.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
}

impl RouteTable {
    pub fn new(routes: Vec<Route>) -> RouteTable {
        RouteTable {
            routes: routes.into_iter().map(Arc::new).collect(),
        }
    }

    /// The first route taking a request with this method, host and normal path
    /// ([`target::normal_path`]).
    pub fn find(
        &self,
        method: &Method,
        host: Option<&str>,
        normal_path: &[u8],
    ) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .find(|route| route.matcher.matches(method, host, normal_path))
    }

    pub fn by_name(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|route| route.name == name)
    }

    /// Each route's name, and whether it checks signatures.
    pub fn names_and_checks(&self) -> impl Iterator<Item = (&str, bool)> {
        self.routes
            .iter()
            .map(|route| (route.name.as_str(), route.verify.is_some()))
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter().map(|route| route.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{EnvSecret, Secret};
    use crate::config::{Config, Overrides};
    use crate::verify::{Secrets, StandardWebhooks};
    use std::path::Path;

    fn table(yaml: &str) -> RouteTable {
        let text = format!("upstream: http://127.0.0.1:8080\n{yaml}");
        let config = Config::parse(&text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        RouteTable::new(config.routes)
    }

    const ROUTES: &str = r#"
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

    #[test]
    fn first_match_wins() {
        let routes = table(ROUTES);
        let find = |method: Method, host, path: &str| {
            let path = target::normal_path(path).unwrap();
            routes.find(&method, host, &path).map(|r| r.name.as_str())
        };
        assert_eq!(find(Method::POST, None, "/hooks/a"), Some("exact"));
        assert_eq!(find(Method::GET, None, "/hooks/a"), Some("any"));
        assert_eq!(
            find(Method::PUT, Some("hooks.example.com:8081"), "/hooks/b"),
            Some("prefix")
        );
        assert_eq!(
            find(Method::PUT, Some("other.example.com"), "/hooks/b"),
            Some("any")
        );
        assert_eq!(find(Method::PUT, None, "/hooks/b"), Some("any"));
    }

    #[test]
    fn routes_inherit_field_by_field() {
        let routes = table(ROUTES);
        let exact = routes.by_name("exact").unwrap();
        assert_eq!(exact.namespace, "exact");
        assert_eq!(exact.policy.retention.0, Duration::from_secs(3600));
        assert_eq!(exact.policy.lease.0, Duration::from_secs(300));
        assert_eq!(
            exact.policy.duplicate_response.status.0,
            StatusCode::ACCEPTED
        );
        assert_eq!(exact.policy.duplicate_response.body, DEFAULT_DUPLICATE_BODY);
        let prefix = routes.by_name("prefix").unwrap();
        assert_eq!(prefix.namespace, "shared");
        assert_eq!(prefix.policy.retention.0, Duration::from_secs(3 * 86400));
        assert_eq!(
            prefix.policy.duplicate_response.status.0,
            StatusCode::ACCEPTED
        );
        assert_eq!(prefix.policy.duplicate_response.body, "dup");
        assert!(prefix.is_success(StatusCode::OK));
        assert!(!prefix.is_success(StatusCode::MOVED_PERMANENTLY));
    }

    #[test]
    fn short_lease_is_warned_about() {
        let text = "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: {}\n    key: \"{json:/id}\"\n    lease: 10s\n";
        let config = Config::parse(text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        assert_eq!(config.warnings.len(), 1);
        assert!(config.warnings[0].contains("lease (10s)"));
    }

    #[test]
    fn the_replay_guard_is_on_where_a_signed_delivery_keys_on_something_unsigned() {
        let text = r#"
defaults: {}
routes:
  - name: header
    match: { path: /a }
    key: "{header:X-Delivery}"
    verify: { hmac: { secret_env: PATH, header: X-Sig } }
  - name: query
    match: { path: /b }
    key: "{json:/id}-{query:attempt}"
    verify: { hmac: { secret_env: PATH, header: X-Sig } }
  - name: body
    match: { path: /c }
    key: "{json:/id}"
    verify: { hmac: { secret_env: PATH, header: X-Sig } }
  - name: unsigned
    match: { path: /d }
    key: "{header:X-Delivery}"
  - name: turned-off
    match: { path: /f }
    key: "{header:X-Delivery}"
    verify: { hmac: { secret_env: PATH, header: X-Sig } }
    replay_guard: none
"#;
        let routes = table(text);
        let guard = |name| routes.by_name(name).unwrap().replay_guard;
        assert_eq!(guard("header"), ReplayGuard::Body);
        assert_eq!(guard("query"), ReplayGuard::Body);
        assert_eq!(guard("body"), ReplayGuard::Off);
        assert_eq!(guard("unsigned"), ReplayGuard::Off);
        assert_eq!(guard("turned-off"), ReplayGuard::Off);
        // Standard Webhooks signs its message ID, under either spelling.
        let secret = EnvSecret {
            variable: "TEST".into(),
            secret: Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
        };
        let standard = StandardWebhooks::preset(Secrets(vec![secret])).unwrap();
        let standard = Verify::StandardWebhooks(standard);
        for key in ["{header:svix-id}", "{header:webhook-id}"] {
            let key: KeyTemplate = key.parse().unwrap();
            assert_eq!(
                default_replay_guard(&key, Some(&standard)),
                ReplayGuard::Off
            );
        }
        let other: KeyTemplate = "{header:x-other}".parse().unwrap();
        assert_eq!(
            default_replay_guard(&other, Some(&standard)),
            ReplayGuard::Body
        );
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
        ] {
            let normal = target::normal_path(path).unwrap();
            let found = routes
                .find(&Method::POST, None, &normal)
                .map(|r| r.name.as_str());
            assert_eq!(found, Some("exact"), "{path}");
        }
    }

    #[test]
    fn ports_are_split_from_hosts() {
        assert_eq!(split_port("a.example:80"), ("a.example", Some("80")));
        assert_eq!(split_port("a.example"), ("a.example", None));
        assert_eq!(split_port("[::1]:80"), ("[::1]", Some("80")));
        assert_eq!(split_port("[::1]"), ("[::1]", None));
    }

    #[test]
    fn a_host_matches_in_any_case_with_or_without_a_trailing_dot() {
        let text = "routes:\n  - name: a\n    match: { host: A.example.:8443 }\n    key: \"{json:/id}\"\n  - name: b\n    match: { host: b.example }\n    key: \"{json:/id}\"\n";
        let routes = table(text);
        let find = |host| {
            routes
                .find(&Method::POST, Some(host), b"/")
                .map(|route| route.name.as_str())
        };
        for host in ["a.example:8443", "A.EXAMPLE.:8443", "a.example.:8443"] {
            assert_eq!(find(host), Some("a"), "{host}");
        }
        assert_eq!(find("a.example"), None);
        assert_eq!(find("a.example:443"), None);
        for host in ["b.example", "b.example.", "B.example.:81", "b.example:1"] {
            assert_eq!(find(host), Some("b"), "{host}");
        }
        assert_eq!(find("b.example.evil"), None);
    }
}
