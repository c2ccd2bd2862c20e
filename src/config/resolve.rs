//! From the file to what runs: each route's settings resolved against `defaults:` and the
//! built-in values, field by field, into a [`Route`]; the command-line overrides applied;
//! the warnings about settings that are valid but probably mistakes; and
//! [`Config::routing`], what a reload puts in force.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

use super::file::{ConfigFile, DuplicateResponseFile, LogFile, MatchFile, RouteFile};
use super::{Config, Overrides, defaults};
use crate::key::KeyTemplate;
use crate::preset::{FingerprintScope, Preset};
use crate::route::logging::LogPolicy;
use crate::route::{
    DeliveryMode, DuplicateResponse, Matcher, Policy, ReplayGuard, Route, Unmatched,
};
use crate::values::{HumanDuration, Name, Size, UpstreamUrl};
use crate::verify::{Verify, VerifySetting};

impl ConfigFile {
    pub(super) fn resolve(self, path: &Path, overrides: &Overrides) -> Config {
        let upstream = overrides.upstream.clone().unwrap_or(self.upstream);
        let routes: Vec<Route> = self
            .routes
            .into_iter()
            .map(|route| resolve_route(route, &self.defaults, &upstream))
            .collect();
        let warnings = warnings(&routes, self.unmatched, self.store.timeout());
        Config {
            source: path.to_owned(),
            listen: overrides.listen.unwrap_or(self.listen),
            upstream,
            admin: self.admin,
            store: self.store,
            shutdown_grace: self.shutdown_grace,
            limits: self.limits,
            telemetry: self.telemetry,
            delivery_log: self.delivery_log,
            unmatched: self.unmatched,
            defaults: resolve_policy(&self.defaults, &RouteFile::default()),
            routes,
            overrides: overrides.clone(),
            warnings,
        }
    }
}

/// Settings that are valid but probably not what the operator meant, each a sentence.
fn warnings(
    routes: &[Route],
    unmatched: Unmatched,
    store_timeout: Option<Duration>,
) -> Vec<String> {
    let mut warnings: Vec<String> = routes.iter().flat_map(Route::warnings).collect();
    warnings.extend(routes.iter().flat_map(super::provider::unsent_headers));
    if routes.is_empty() {
        warnings.push(match unmatched {
            Unmatched::Forward => "no routes: every request is forwarded unchecked and nothing is deduplicated (add a route under `routes:`)".to_owned(),
            Unmatched::Reject => "no routes: with `unmatched: reject`, every request is refused (add a route under `routes:`)".to_owned(),
        });
    }
    short_leases(routes, store_timeout, &mut warnings);
    scopes_shared_with_clients_keys(routes, &mut warnings);
    routes_never_taken(routes, &mut warnings);
    versions_steered_by_others(routes, &mut warnings);
    if unmatched == Unmatched::Forward {
        checks_passed_by_forward(routes, &mut warnings);
    }
    warnings
}

fn short_leases(routes: &[Route], store_timeout: Option<Duration>, warnings: &mut Vec<String>) {
    // A lease is renewed every third of it; a renewal may take the store's timeout, so
    // a shorter lease could end while its delivery still runs.
    if let Some(timeout) = store_timeout {
        warnings.extend(routes.iter().filter(|route| route.policy.lease < 3 * timeout).map(|route| {
            format!(
                "route `{}`: lease ({}) is shorter than three times the store's timeout ({}): a renewal the store is slow to answer could come after the lease ends, and another replica could run the event while this one still does",
                route.name,
                HumanDuration(route.policy.lease),
                HumanDuration(timeout)
            )
        }));
    }
}

fn scopes_shared_with_clients_keys(routes: &[Route], warnings: &mut Vec<String>) {
    // An API's clients choose their keys: sharing a scope with a webhook route would let
    // one plant a provider's event ID, whose real delivery would then be a duplicate.
    for (index, api) in routes.iter().enumerate() {
        let mixed = routes.iter().skip(index + 1).find(|other| {
            other.namespace == api.namespace && other.policy.fingerprint != api.policy.fingerprint
        });
        if let Some(other) = mixed {
            warnings.push(format!(
                "routes `{}` and `{}` share the scope `{}`, but only one is keyed by its clients (idempotency_key): a client could send a key the other route's events use",
                api.name, other.name, api.namespace
            ));
        }
    }
}

fn routes_never_taken(routes: &[Route], warnings: &mut Vec<String>) {
    // A route an earlier one takes whole is never taken: paths one in normal form (a
    // path's extension and case do not tell routes apart), or a wider route first.
    for (index, later) in routes.iter().enumerate() {
        if let Some(earlier) = routes[..index]
            .iter()
            .find(|earlier| earlier.matcher.covers(&later.matcher))
        {
            warnings.push(format!(
                "route `{}` is never taken: route `{}`, listed before it, takes every request it would (paths are compared in normal form, without case or a last extension)",
                later.name, earlier.name
            ));
        }
    }
}

fn versions_steered_by_others(routes: &[Route], warnings: &mut Vec<String>) {
    // Entities' versions are kept per scope: one route whose versions anyone can set
    // steers every other route of its scope.
    for (index, steered) in routes.iter().enumerate() {
        let steering = routes.iter().enumerate().find(|(other, route)| {
            *other != index && route.namespace == steered.namespace && route.steerable_versions()
        });
        if let (Some(_), Some((_, steering))) = (&steered.order, steering) {
            warnings.push(format!(
                "route `{}` shares the scope `{}` with route `{}`, whose order versions can be set by whoever reaches it: its entities' versions are shared",
                steered.name, steered.namespace, steering.name
            ));
        }
    }
}

/// With `unmatched: forward`, what reaches the upstream past a route's check.
fn checks_passed_by_forward(routes: &[Route], warnings: &mut Vec<String>) {
    warnings.extend(routes.iter().filter_map(|route| {
        let host = route.matcher.host()?;
        Some(format!(
            "route `{}` takes only the host `{host}`: with `unmatched: forward`, the same path under another Host reaches the upstream without its check and claim",
            route.name
        ))
    }));
    // A handler that takes any method (Go's `HandleFunc`, a PHP script, a Django
    // view without `require_POST`) runs what another method sends it.
    warnings.extend(routes.iter().filter(|route| route.verify.is_some()).filter_map(|route| {
        let methods = route.matcher.methods();
        (!methods.is_empty()).then(|| {
            format!(
                "route `{}` checks signatures for {} only: with `unmatched: forward`, another method on its path reaches the upstream without its check and claim, and an app handler that takes any method runs it (set `unmatched: reject`, or check every method)",
                route.name,
                methods.join(", ")
            )
        })
    }));
}

/// Resolves a checked route entry (name, match and key present) against `defaults`.
fn resolve_route(file: RouteFile, defaults: &RouteFile, upstream: &UpstreamUrl) -> Route {
    let mut policy = resolve_policy(&file, defaults);
    let name = file.name.expect("checked: a route has a name").0;
    let key = file.key.expect("checked: a route has a key");
    let verify = match file.verify {
        Some(VerifySetting::On(verify)) => Some(verify),
        Some(VerifySetting::Off) | None => None,
    };
    // A signature header of the route's own naming is never logged either.
    if let Some(signature) = verify.as_ref().and_then(Verify::signature_header) {
        policy.log.headers.retain(|name| name != signature);
    }
    let replay_guard = file
        .replay_guard
        .or(defaults.replay_guard)
        .unwrap_or_else(|| default_replay_guard(&key, verify.as_ref()));
    let MatchFile {
        method,
        path,
        path_prefix,
        host,
    } = file.matcher.expect("checked: a route has a match");
    Route {
        namespace: file.scope.map_or_else(|| name.clone(), |Name(scope)| scope),
        name,
        matcher: Matcher::new(method.0, path, path_prefix, host.as_deref()),
        key,
        preset: file.preset,
        verify,
        replay_guard,
        order: file.order,
        upstream: inherit(&file.upstream, &defaults.upstream, upstream.clone()),
        policy,
    }
}

/// Picks a route's own value, else the default's, else the built-in one.
fn inherit<T: Clone>(own: &Option<T>, default: &Option<T>, builtin: T) -> T {
    own.as_ref()
        .or(default.as_ref())
        .cloned()
        .unwrap_or(builtin)
}

/// A route's own settings, else the defaults', else the built-in ones. With an empty
/// `own`, this resolves the defaults themselves.
fn resolve_policy(own: &RouteFile, defaults: &RouteFile) -> Policy {
    let d = defaults;
    let duration = |own: &Option<HumanDuration>, default: &Option<HumanDuration>, builtin| {
        inherit(own, default, HumanDuration(builtin)).0
    };
    Policy {
        retention: duration(&own.retention, &d.retention, defaults::RETENTION),
        lease: duration(&own.lease, &d.lease, defaults::LEASE),
        max_body: inherit(&own.max_body, &d.max_body, Size(defaults::MAX_BODY)).0,
        upstream_timeout: duration(
            &own.upstream_timeout,
            &d.upstream_timeout,
            defaults::UPSTREAM_TIMEOUT,
        ),
        success_status: inherit(
            &own.success_status,
            &d.success_status,
            defaults::success_status(),
        ),
        on_missing_key: inherit(&own.on_missing_key, &d.on_missing_key, Default::default()),
        on_store_error: inherit(&own.on_store_error, &d.on_store_error, Default::default()),
        on_payload_mismatch: inherit(
            &own.on_payload_mismatch,
            &d.on_payload_mismatch,
            Default::default(),
        ),
        on_in_flight: inherit(&own.on_in_flight, &d.on_in_flight, Default::default()),
        in_flight_wait: duration(
            &own.in_flight_wait,
            &d.in_flight_wait,
            defaults::IN_FLIGHT_WAIT,
        ),
        on_ambiguous: inherit(&own.on_ambiguous, &d.on_ambiguous, Default::default()),
        duplicate_response: resolve_duplicate_response(own, d),
        in_flight_status: own
            .in_flight_status
            .or(d.in_flight_status)
            .map_or(defaults::IN_FLIGHT_STATUS, |status| status.0),
        retry_after: duration(&own.retry_after, &d.retry_after, defaults::RETRY_AFTER),
        forward_key_header: inherit(
            &own.forward_key_header,
            &d.forward_key_header,
            defaults::FORWARD_KEY_HEADER,
        ),
        fingerprint: own
            .preset
            .map_or(FingerprintScope::Body, Preset::fingerprint_scope),
        problem_details: own.preset.is_some_and(Preset::problem_details),
        delivery: own.delivery.unwrap_or_default(),
        log: resolve_log(own, d),
        queue: (own.delivery == Some(DeliveryMode::Queued))
            .then(|| super::queue::QueueFile::resolve(own.queue.as_ref())),
    }
}

/// `log`: each field the route's own, else `defaults:`'s, else built in.
fn resolve_log(own: &RouteFile, defaults: &RouteFile) -> LogPolicy {
    let none = LogFile::default();
    let own = own.log.as_ref().unwrap_or(&none);
    let default = defaults.log.as_ref().unwrap_or(&none);
    let builtin = LogPolicy::default();
    LogPolicy {
        bodies: own.bodies.or(default.bodies).unwrap_or(builtin.bodies),
        max_body_bytes: own
            .max_body_bytes
            .or(default.max_body_bytes)
            .map_or(builtin.max_body_bytes, |size| size.0),
        headers: own
            .headers
            .as_ref()
            .or(default.headers.as_ref())
            .map_or(builtin.headers, |names| {
                names.iter().map(|name| name.0.clone()).collect()
            }),
    }
}

/// `duplicate_response`: each field the route's own, else `defaults:`'s, else built in.
fn resolve_duplicate_response(own: &RouteFile, defaults: &RouteFile) -> DuplicateResponse {
    let none = DuplicateResponseFile::default();
    let own_dup = own.duplicate_response.as_ref().unwrap_or(&none);
    let default_dup = defaults.duplicate_response.as_ref().unwrap_or(&none);
    DuplicateResponse {
        status: own_dup
            .status
            .or(default_dup.status)
            .map_or(defaults::DUPLICATE_STATUS, |status| status.0),
        body: Bytes::from(inherit(
            &own_dup.body,
            &default_dup.body,
            defaults::DUPLICATE_BODY.to_owned(),
        )),
        content_type: own_dup
            .content_type
            .as_ref()
            .or(default_dup.content_type.as_ref())
            .map_or(defaults::DUPLICATE_CONTENT_TYPE, |text| text.0.clone()),
        replay: inherit(
            &own_dup.replay,
            &default_dup.replay,
            defaults::DUPLICATE_REPLAY,
        ),
        replay_headers: own_dup
            .replay_headers
            .as_ref()
            .or(default_dup.replay_headers.as_ref())
            .map_or_else(
                || {
                    defaults::REPLAY_HEADERS
                        .iter()
                        .map(|name| http::HeaderName::from_static(name))
                        .collect()
                },
                |names| names.iter().map(|name| name.0.clone()).collect(),
            ),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;
    use crate::route::fixtures::{ROUTES, table};
    use crate::values::{EnvSecret, Secret};
    use crate::verify::{Secrets, StandardWebhooks};

    #[test]
    fn routes_inherit_field_by_field() {
        let routes = table(ROUTES);
        let exact = routes.by_name("exact").unwrap();
        assert_eq!(exact.namespace, "exact");
        assert_eq!(exact.policy.retention, Duration::from_secs(3600));
        assert_eq!(exact.policy.lease, Duration::from_secs(300));
        assert_eq!(exact.policy.duplicate_response.status, StatusCode::ACCEPTED);
        assert_eq!(
            exact.policy.duplicate_response.body,
            defaults::DUPLICATE_BODY
        );
        let prefix = routes.by_name("prefix").unwrap();
        assert_eq!(prefix.namespace, "shared");
        assert_eq!(prefix.policy.retention, Duration::from_secs(3 * 86400));
        assert_eq!(
            prefix.policy.duplicate_response.status,
            StatusCode::ACCEPTED
        );
        assert_eq!(prefix.policy.duplicate_response.body, "dup");
        assert!(prefix.is_success(StatusCode::OK));
        assert!(!prefix.is_success(StatusCode::MOVED_PERMANENTLY));
    }

    #[test]
    fn a_lease_shorter_than_the_forward_is_no_longer_a_warning_it_is_renewed() {
        let text = "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: {}\n    key: \"{json:/id}\"\n    lease: 10s\n";
        let config = Config::parse(text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn an_api_route_sharing_a_scope_with_a_webhook_route_is_warned_about() {
        let text = "upstream: http://127.0.0.1:8080\nroutes:\n  - name: api\n    match: { path: /api }\n    preset: idempotency_key\n    scope: shared\n  - name: hooks\n    match: { path: /hooks }\n    key: \"{json:/id}\"\n    scope: shared\n";
        let config = Config::parse(text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("share the scope `shared`"));
    }

    #[test]
    fn a_hold_that_cannot_keep_its_promise_is_warned_about() {
        let text = "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: {}\n    key: \"{json:/id}\"\n    on_ambiguous: hold\n    lease: 10s\n    on_store_error: forward\n";
        let config = Config::parse(text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("on_store_error: forward"));
    }

    #[test]
    fn a_lease_a_slow_store_could_let_lapse_is_warned_about() {
        let text = |store: &str| {
            format!(
                "upstream: http://127.0.0.1:8080\nstore: {store}\nroutes:\n  - name: a\n    match: {{}}\n    key: \"{{json:/id}}\"\n    lease: 5s\n"
            )
        };
        let warnings = |store: &str| {
            Config::parse(&text(store), Path::new("t.yaml"), &Overrides::default())
                .unwrap()
                .warnings
        };
        let slow = warnings("{ redis: { url: \"redis://127.0.0.1\", timeout: 2s } }");
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert!(
            slow[0].contains("three times the store's timeout (2s)"),
            "{slow:?}"
        );
        assert!(warnings("{ redis: { url: \"redis://127.0.0.1\", timeout: 1s } }").is_empty());
        assert!(
            warnings("{ sled: {} }").is_empty(),
            "the embedded store has no timeout"
        );
    }

    #[test]
    fn an_order_guard_an_outsider_could_steer_is_warned_about() {
        let route = |name: &str, extra: &str, version: &str, on_stale: &str| {
            format!(
                "  - name: {name}\n    match: {{ path: /{name} }}\n    key: \"{{json:/id}}\"\n{extra}    order: {{ entity: \"{{json:/o}}\", version: \"{version}\", on_stale: {on_stale} }}\n"
            )
        };
        let verify = "    verify: { hmac: { secret_env: PATH, header: X-Sig } }\n";
        let shared = format!("{verify}    scope: shared\n");
        let text = format!(
            "upstream: http://127.0.0.1:8080\nroutes:\n{}{}{}{}{}{}",
            route("open-skip", "", "{json:/v}", "skip"),
            route("open-mark", "", "{json:/v}", "mark"),
            route("signed-header", verify, "{header:X-Version}", "mark"),
            route("signed-body", verify, "{json:/v}", "skip"),
            route("shared-signed", &shared, "{json:/v}", "skip"),
            route("shared-open", &shared, "{header:X-Version}", "mark"),
        );
        let config = Config::parse(&text, Path::new("t.yaml"), &Overrides::default()).unwrap();
        let warned: Vec<&str> = config
            .warnings
            .iter()
            .filter(|warning| warning.contains("order"))
            .map(|warning| warning.split('`').nth(1).unwrap())
            .collect();
        assert_eq!(
            warned,
            [
                "open-skip",
                "open-mark",
                "signed-header",
                "shared-open",
                "shared-signed"
            ],
            "{:?}",
            config.warnings
        );
        let skip = &config.warnings[0];
        assert!(skip.contains("real events are skipped"), "{skip}");
        let steered = config.warnings.last().unwrap();
        assert!(steered.contains("with route `shared-open`"), "{steered}");
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
        let standard = Verify::new(standard);
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
}
