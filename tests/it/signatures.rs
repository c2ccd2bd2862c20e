//! Signature verification on the real binary, with signatures made by the providers'
//! own SDKs (tests/signers: npm `stripe`, `@octokit/webhooks-methods`, `standardwebhooks`,
//! `svix`, `@paddle/paddle-node-sdk`, `@linear/sdk`, and Python's `slack_sdk`): a valid delivery is
//! forwarded; a tampered body, a wrong secret, a stale or future timestamp, a missing or
//! malformed header get 401 naming the reason, and nothing is forwarded or stored. Then
//! presets. `tests/setup` installs the signers; without them these tests are skipped locally.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use support::*;

const STRIPE: &str = "whsec_stripe_current_secret";
const STRIPE_OLD: &str = "whsec_stripe_previous_secret";
const GITHUB: &str = "github-hook-secret";
const STANDARD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SVIX: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
/// The seed of the Ed25519 key that signs `v1a` Standard Webhooks deliveries.
const ED25519_SEED: &str = "nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
const SHOPIFY: &str = "shpss_client_secret";
const SLACK: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const PADDLE: &str = "pdl_ntfset_01gkpjp8bkh3tbsxsmgbrnmdd7_6hm2";
const HMAC: &str = "in-house-hmac-secret";
const LINEAR: &str = "lin_wh_signing_secret";
/// A secret none of the routes knows, valid in every scheme's format.
const WRONG_SECRET: &str = "whsec_d3JvbmctYnV0LXdlbGwtZm9ybWVkLXNlY3JldA==";

fn signers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/signers")
}

/// Whether the SDK signers are installed; in CI they must be.
fn signers_ready() -> bool {
    let node = signers().join("node_modules/stripe").exists();
    let python = Command::new("python3")
        .args(["-c", "import slack_sdk"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !(node && python) {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "CI must install tests/signers (npm ci) and slack_sdk"
        );
        eprintln!("skipped: the provider SDK signers are not installed (run tests/setup)");
    }
    node && python
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The headers a provider's SDK puts on `body`.
fn sign(scheme: &str, secret: &str, body: &str, timestamp: i64, id: &str) -> Vec<(String, String)> {
    let request = serde_json::json!({ "scheme": scheme, "secret": secret, "body": body, "timestamp": timestamp, "id": id });
    headers_of(run_signer(scheme, &request))
}

/// Signs each of `requests` (scheme, secret, body, timestamp, id) as [`sign`] does, all
/// that Node signs in one process: a process each took most of this file's time.
fn sign_each(requests: &[(&str, &str, &str, i64, &str)]) -> Vec<Vec<(String, String)>> {
    let as_json = |&(scheme, secret, body, timestamp, id): &(&str, &str, &str, i64, &str)| serde_json::json!({ "scheme": scheme, "secret": secret, "body": body, "timestamp": timestamp, "id": id });
    let by_node: Vec<_> = (requests.iter())
        .filter(|request| request.0 != "slack")
        .map(as_json)
        .collect();
    let serde_json::Value::Array(mut from_node) = run_signer("", &serde_json::json!(by_node))
    else {
        panic!("sign.mjs answers an array to an array");
    };
    assert_eq!(from_node.len(), by_node.len());
    from_node.reverse();
    (requests.iter())
        .map(|request| match request.0 {
            "slack" => headers_of(run_signer("slack", &as_json(request))),
            _ => headers_of(from_node.pop().unwrap()),
        })
        .collect()
}

/// What the signer for `scheme` (Python's for Slack, Node's for the rest) answers to
/// `request`.
fn run_signer(scheme: &str, request: &serde_json::Value) -> serde_json::Value {
    let output = if scheme == "slack" {
        Command::new("python3")
            .arg(signers().join("slack_sign.py"))
            .arg(request.to_string())
            .output()
    } else {
        Command::new("node")
            .arg(signers().join("sign.mjs"))
            .arg(request.to_string())
            .output()
    }
    .unwrap();
    assert!(
        output.status.success(),
        "{scheme}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn headers_of(signed: serde_json::Value) -> Vec<(String, String)> {
    let serde_json::Value::Object(headers) = signed else {
        panic!("a signer answers an object of headers: {signed}");
    };
    headers
        .into_iter()
        .map(|(name, value)| (name, value.as_str().unwrap().to_owned()))
        .collect()
}

fn ed25519_public_key() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| {
        let headers = sign("standard_webhooks_ed25519", ED25519_SEED, "{}", 0, "m");
        headers
            .into_iter()
            .find(|(name, _)| name == "x-test-public-key")
            .unwrap()
            .1
    })
}

const ROUTES: &str = r#"routes:
  - name: stripe
    match: { path: /stripe }
    key: "{json:/id}"
    verify: { stripe: { secret_env: [STRIPE_OLD, STRIPE_SECRET] } }
  - name: github
    match: { path: /github }
    key: "{header:X-GitHub-Delivery}"
    verify: { github: { secret_env: GITHUB_SECRET } }
  - name: github-unguarded
    match: { path: /github-unguarded }
    key: "{header:X-GitHub-Delivery}"
    verify: { github: { secret_env: GITHUB_SECRET } }
    replay_guard: none
  - name: standard
    match: { path: /standard }
    key: "{header:webhook-id}"
    verify: { standard_webhooks: { secret_env: [STANDARD_SECRET, STANDARD_PUBLIC_KEY] } }
  - name: svix
    match: { path: /svix }
    key: "{header:svix-id}"
    verify: { standard_webhooks: { secret_env: SVIX_SECRET } }
  - name: shopify
    match: { path: /shopify }
    key: "{header:X-Shopify-Event-Id}"
    verify: { shopify: { secret_env: SHOPIFY_SECRET } }
  - name: slack
    match: { path: /slack }
    key: "{json:/event_id}"
    verify: { slack: { secret_env: SLACK_SECRET } }
  - name: paddle
    match: { path: /paddle }
    key: "{json:/event_id}"
    verify: { paddle: { secret_env: PADDLE_SECRET } }
  - name: hmac
    match: { path: /hmac }
    key: "{json:/id}"
    verify: { hmac: { secret_env: HMAC_SECRET, header: X-Signature, prefix: "sha256=" } }
  - name: preset-stripe
    match: { path: /preset/stripe }
    preset: stripe
  - name: preset-github
    match: { path: /preset/github }
    preset: github
  - name: preset-twilio
    match: { path: /preset/twilio }
    preset: twilio
  - name: preset-linear
    match: { path: /preset/linear }
    preset: linear
  - name: preset-off
    match: { path: /preset/off }
    preset: stripe
    verify: none
"#;

/// The proxy binary with every scheme's route and secret, and its upstream.
async fn proxy() -> (Binary, Upstream, tempfile::TempDir) {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), ROUTES),
    )
    .unwrap();
    let public_key = ed25519_public_key().to_owned();
    let binary = tokio::task::spawn_blocking(move || {
        Binary::start_with_env(
            &config,
            &[
                ("STRIPE_SECRET", STRIPE),
                ("STRIPE_OLD", STRIPE_OLD),
                ("GITHUB_SECRET", GITHUB),
                ("STANDARD_SECRET", STANDARD),
                ("STANDARD_PUBLIC_KEY", &public_key),
                ("SVIX_SECRET", SVIX),
                ("SHOPIFY_SECRET", SHOPIFY),
                ("SLACK_SECRET", SLACK),
                ("PADDLE_SECRET", PADDLE),
                ("HMAC_SECRET", HMAC),
                ("STRIPE_WEBHOOK_SECRET", STRIPE),
                ("GITHUB_WEBHOOK_SECRET", GITHUB),
                ("LINEAR_WEBHOOK_SECRET", LINEAR),
            ],
        )
    })
    .await
    .unwrap();
    (binary, upstream, dir)
}

/// One scheme under test: how a delivery is signed and keyed.
struct Scheme {
    name: &'static str,
    path: &'static str,
    secret: &'static str,
    /// The header that carries the event ID, when the key is a header.
    id_header: Option<&'static str>,
    /// The headers to remove to make the signature missing.
    signature_headers: &'static [&'static str],
    timestamped: bool,
}

const SCHEMES: &[Scheme] = &[
    Scheme {
        name: "stripe",
        path: "/stripe",
        secret: STRIPE,
        id_header: None,
        signature_headers: &["stripe-signature"],
        timestamped: true,
    },
    Scheme {
        name: "github",
        path: "/github",
        secret: GITHUB,
        id_header: Some("x-github-delivery"),
        signature_headers: &["x-hub-signature-256"],
        timestamped: false,
    },
    Scheme {
        name: "standard_webhooks",
        path: "/standard",
        secret: STANDARD,
        id_header: None,
        signature_headers: &["webhook-signature"],
        timestamped: true,
    },
    Scheme {
        name: "svix",
        path: "/svix",
        secret: SVIX,
        id_header: None,
        signature_headers: &["svix-signature"],
        timestamped: true,
    },
    Scheme {
        name: "shopify",
        path: "/shopify",
        secret: SHOPIFY,
        id_header: Some("x-shopify-event-id"),
        signature_headers: &["x-shopify-hmac-sha256"],
        timestamped: false,
    },
    Scheme {
        name: "slack",
        path: "/slack",
        secret: SLACK,
        id_header: None,
        signature_headers: &["x-slack-signature"],
        timestamped: true,
    },
    Scheme {
        name: "paddle",
        path: "/paddle",
        secret: PADDLE,
        id_header: None,
        signature_headers: &["paddle-signature"],
        timestamped: true,
    },
];

fn event_body(id: &str) -> String {
    format!(r#"{{"id":"{id}","event_id":"{id}","type":"invoice.paid","amount":4200}}"#)
}

/// Sends `body` with `headers` (and the event ID header the route keys on).
async fn deliver(
    proxy: &Binary,
    scheme: &Scheme,
    id: &str,
    body: &str,
    headers: &[(String, String)],
) -> Reply {
    let mut all: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    if let Some(name) = scheme.id_header {
        all.push((name, id));
    }
    all.push(("content-type", "application/json"));
    send(proxy.addr, "POST", scheme.path, &all, body.to_owned()).await
}

fn assert_refused(reply: &Reply, code: &str, what: &str) {
    assert_eq!(reply.status, 401, "{what}: {}", reply.body);
    assert_eq!(reply.dedupe(), "rejected", "{what}");
    assert_eq!(reply.json()["error"], code, "{what}: {}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scheme_accepts_its_sdk_signature_and_refuses_the_rest() {
    if !signers_ready() {
        return;
    }
    let (proxy, upstream, _dir) = proxy().await;
    for scheme in SCHEMES {
        let what = scheme.name;
        let id = format!("evt_{what}_{:x}", rand::random::<u32>());
        let body = event_body(&id);
        // The scheme's signatures, made at once just before its deliveries (Paddle's
        // timestamps are good for 5 s): signed, with the wrong secret, an hour early and
        // an hour late.
        let (name, secret, now) = (scheme.name, scheme.secret, now());
        let [signed, forged, early, late]: [_; 4] = sign_each(&[
            (name, secret, &body, now, &id),
            (name, WRONG_SECRET, &body, now, &id),
            (name, secret, &body, now - 3600, &id),
            (name, secret, &body, now + 3600, &id),
        ])
        .try_into()
        .unwrap();
        let before = upstream.requests();

        // Refusals first: none of them may claim the key.
        let tampered = body.replace("4200", "1");
        assert_refused(
            &deliver(&proxy, scheme, &id, &tampered, &signed).await,
            "signature_mismatch",
            &format!("{what}: tampered body"),
        );
        assert_refused(
            &deliver(&proxy, scheme, &id, &body, &forged).await,
            "signature_mismatch",
            &format!("{what}: wrong secret"),
        );
        let unsigned: Vec<(String, String)> = signed
            .iter()
            .filter(|(name, _)| !scheme.signature_headers.contains(&name.as_str()))
            .cloned()
            .collect();
        assert_refused(
            &deliver(&proxy, scheme, &id, &body, &unsigned).await,
            "missing_signature",
            &format!("{what}: no signature"),
        );
        let garbled: Vec<(String, String)> = signed
            .iter()
            .map(|(name, value)| {
                let value = if scheme.signature_headers.contains(&name.as_str()) {
                    "garbage".to_owned()
                } else {
                    value.clone()
                };
                (name.clone(), value)
            })
            .collect();
        assert_refused(
            &deliver(&proxy, scheme, &id, &body, &garbled).await,
            "malformed_signature",
            &format!("{what}: malformed"),
        );
        if scheme.timestamped {
            for (offset, off) in [(-3600, &early), (3600, &late)] {
                assert_refused(
                    &deliver(&proxy, scheme, &id, &body, off).await,
                    "stale_signature",
                    &format!("{what}: timestamp {offset:+} s"),
                );
            }
        }
        assert_eq!(
            upstream.requests(),
            before,
            "{what}: a refused delivery reached the upstream"
        );
        let route = scheme.path.trim_start_matches('/');
        let stored = send(
            proxy.admin,
            "GET",
            &format!("/v1/keys/{route}/{id}"),
            &[],
            "",
        )
        .await;
        assert_eq!(stored.status, 404, "{what}: a refused delivery left a key");

        // The valid delivery goes through, signature headers intact.
        let reply = deliver(&proxy, scheme, &id, &body, &signed).await;
        assert_eq!(
            (reply.status, reply.dedupe()),
            (200, "forwarded"),
            "{what}: {}",
            reply.body
        );
        let received = upstream.received().pop().unwrap();
        for name in scheme.signature_headers {
            assert!(
                received.headers.contains_key(*name),
                "{what}: {name} reaches the app"
            );
        }
        assert_eq!(
            deliver(&proxy, scheme, &id, &body, &signed).await.dedupe(),
            "duplicate",
            "{what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_secrets_and_ed25519_keys_are_accepted() {
    if !signers_ready() {
        return;
    }
    let (proxy, _upstream, _dir) = proxy().await;
    let stripe = &SCHEMES[0];
    for secret in [STRIPE_OLD, STRIPE] {
        let id = format!("evt_rotation_{:x}", rand::random::<u32>());
        let body = event_body(&id);
        let reply = deliver(
            &proxy,
            stripe,
            &id,
            &body,
            &sign("stripe", secret, &body, now(), &id),
        )
        .await;
        assert_eq!(
            reply.dedupe(),
            "forwarded",
            "signed with {secret}: {}",
            reply.body
        );
    }
    let standard = &SCHEMES[2];
    let id = format!("msg_ed25519_{:x}", rand::random::<u32>());
    let body = event_body(&id);
    let signed: Vec<(String, String)> =
        sign("standard_webhooks_ed25519", ED25519_SEED, &body, now(), &id)
            .into_iter()
            .filter(|(name, _)| name != "x-test-public-key")
            .collect();
    assert_eq!(
        deliver(&proxy, standard, &id, &body, &signed)
            .await
            .dedupe(),
        "forwarded"
    );
    let forged = sign(
        "standard_webhooks_ed25519",
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        &body,
        now(),
        &id,
    );
    let forged: Vec<(String, String)> = forged
        .into_iter()
        .filter(|(name, _)| name != "x-test-public-key")
        .collect();
    assert_refused(
        &deliver(&proxy, standard, &id, &body.replace("4200", "1"), &forged).await,
        "signature_mismatch",
        "another Ed25519 key",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_hmac_checks_a_named_header() {
    use hmac::{KeyInit, Mac};
    let (proxy, upstream, _dir) = proxy().await;
    let body = r#"{"id":"evt_hmac"}"#;
    let mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(HMAC.as_bytes())
        .unwrap()
        .chain_update(body)
        .finalize()
        .into_bytes();
    let good = format!("sha256={}", hex::encode(mac));
    let reply = send(proxy.addr, "POST", "/hmac", &[("x-signature", &good)], body).await;
    assert_eq!(reply.dedupe(), "forwarded", "{}", reply.body);
    let bad = format!("sha256={}", hex::encode([0u8; 32]));
    assert_refused(
        &send(proxy.addr, "POST", "/hmac", &[("x-signature", &bad)], body).await,
        "signature_mismatch",
        "hmac",
    );
    assert_refused(
        &send(
            proxy.addr,
            "POST",
            "/hmac",
            &[("x-signature", &hex::encode(mac))],
            body,
        )
        .await,
        "malformed_signature",
        "no prefix",
    );
    assert_refused(
        &send(proxy.addr, "POST", "/hmac", &[], body).await,
        "missing_signature",
        "no header",
    );
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presets_fill_in_the_key_and_the_check() {
    if !signers_ready() {
        return;
    }
    let (proxy, upstream, _dir) = proxy().await;
    let body = event_body("evt_preset");
    // Stripe's preset keys on the body's id and checks STRIPE_WEBHOOK_SECRET.
    let signed = sign("stripe", STRIPE, &body, now(), "");
    let headers: Vec<(&str, &str)> = signed
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let reply = send(proxy.addr, "POST", "/preset/stripe", &headers, body.clone()).await;
    assert_eq!(reply.dedupe(), "forwarded", "{}", reply.body);
    assert_eq!(
        upstream.received().pop().unwrap().headers["dedupe-key"],
        "evt_preset"
    );
    assert_refused(
        &send(proxy.addr, "POST", "/preset/stripe", &[], body.clone()).await,
        "missing_signature",
        "preset stripe",
    );
    // GitHub's keys on X-GitHub-Delivery.
    let signed = sign("github", GITHUB, &body, now(), "");
    let delivery = [
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("x-hub-signature-256", signed[0].1.as_str()),
    ];
    assert_eq!(
        send(
            proxy.addr,
            "POST",
            "/preset/github",
            &delivery,
            body.clone()
        )
        .await
        .dedupe(),
        "forwarded"
    );
    // Twilio's keys on I-Twilio-Idempotency-Token and checks nothing.
    let twilio = [
        ("i-twilio-idempotency-token", "tok-1"),
        ("content-type", "application/x-www-form-urlencoded"),
    ];
    assert_eq!(
        send(
            proxy.addr,
            "POST",
            "/preset/twilio",
            &twilio,
            "MessageSid=SM1"
        )
        .await
        .dedupe(),
        "forwarded"
    );
    assert_eq!(
        send(
            proxy.addr,
            "POST",
            "/preset/twilio",
            &twilio,
            "MessageSid=SM1"
        )
        .await
        .dedupe(),
        "duplicate"
    );
    // `verify: none` keeps the preset's key without its check.
    assert_eq!(
        send(
            proxy.addr,
            "POST",
            "/preset/off",
            &[],
            event_body("evt_off")
        )
        .await
        .dedupe(),
        "forwarded"
    );
    let routes = send(proxy.admin, "GET", "/v1/routes", &[], "").await.json();
    let stripe = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "preset-stripe")
        .unwrap()
        .clone();
    assert_eq!(stripe["key"], "{json:/id}");
    assert_eq!(
        stripe["verify"]["stripe"]["secret_env"],
        serde_json::json!(["STRIPE_WEBHOOK_SECRET"])
    );
    assert!(
        !routes.to_string().contains(STRIPE),
        "secrets are never shown"
    );
}

/// Posts `body` with `headers` to the Linear route, as delivery `delivery`.
async fn post_linear(
    proxy: &Binary,
    delivery: &str,
    body: &str,
    headers: &[(String, String)],
) -> Reply {
    let mut all: Vec<(&str, &str)> = (headers.iter())
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    all.push(("linear-delivery", delivery));
    all.push(("content-type", "application/json"));
    send(proxy.addr, "POST", "/preset/linear", &all, body.to_owned()).await
}

/// Linear signs the time it sent a delivery inside the body (`webhookTimestamp`, ms): a
/// delivery signed as Linear documents, and accepted by Linear's SDK, goes through keyed
/// on `Linear-Delivery`; a wrong secret, a tampered body, a well-signed body sent two
/// minutes ago, and a signed body without the field are refused, and none of them claims the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linear_judges_the_time_inside_the_signed_body() {
    if !signers_ready() {
        return;
    }
    let (proxy, upstream, _dir) = proxy().await;
    let body_at = |millis: i64| {
        format!(
            r#"{{"action":"create","type":"Issue","data":{{"id":"iss_7","priority":2}},"webhookTimestamp":{millis}}}"#
        )
    };
    let now = now();
    let fresh = body_at(now * 1000);
    let old = body_at((now - 120) * 1000);
    let unstamped = r#"{"action":"create","type":"Issue","data":{"id":"iss_7"}}"#.to_owned();
    // The signer checks the fresh one with Linear's SDK before answering (a timestamp far
    // from now tells it not to: the SDK refuses the other two, as the proxy must).
    let [signed, forged, signed_old, signed_unstamped]: [_; 4] = sign_each(&[
        ("linear", LINEAR, &fresh, now, ""),
        ("linear", WRONG_SECRET, &fresh, 0, ""),
        ("linear", LINEAR, &old, now - 120, ""),
        ("linear", LINEAR, &unstamped, 0, ""),
    ])
    .try_into()
    .unwrap();
    let delivery = format!("{:x}-linear", rand::random::<u64>());
    let tampered = fresh.replace("\"priority\":2", "\"priority\":0");
    assert_refused(
        &post_linear(&proxy, &delivery, &fresh, &forged).await,
        "signature_mismatch",
        "wrong secret",
    );
    assert_refused(
        &post_linear(&proxy, &delivery, &tampered, &signed).await,
        "signature_mismatch",
        "tampered",
    );
    assert_refused(
        &post_linear(&proxy, &delivery, &old, &signed_old).await,
        "stale_signature",
        "sent 2 minutes ago",
    );
    assert_refused(
        &post_linear(&proxy, &delivery, &unstamped, &signed_unstamped).await,
        "malformed_signature",
        "no webhookTimestamp",
    );
    assert_eq!(upstream.requests(), 0, "a refused delivery reached the app");
    let reply = post_linear(&proxy, &delivery, &fresh, &signed).await;
    assert_eq!(
        (reply.status, reply.dedupe()),
        (200, "forwarded"),
        "{}",
        reply.body
    );
    let again = post_linear(&proxy, &delivery, &fresh, &signed).await;
    assert_eq!(
        (again.status, again.dedupe()),
        (200, "duplicate"),
        "{}",
        again.body
    );
    assert_eq!(upstream.requests(), 1);
    let received = upstream.received().pop().unwrap();
    assert_eq!(received.headers["dedupe-key"], delivery.as_str());
}

fn scheme(name: &str) -> &'static Scheme {
    SCHEMES.iter().find(|scheme| scheme.name == name).unwrap()
}

/// Svix keys on `svix-id`; a delivery signed under its `webhook-*` spelling whose `svix-id`
/// is not the signed ID is refused, so a captured delivery cannot come back under a fresh
/// `svix-id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_svix_delivery_whose_ids_disagree_is_refused() {
    if !signers_ready() {
        return;
    }
    let (proxy, upstream, _dir) = proxy().await;
    let svix = scheme("svix");
    let body = event_body("evt_svix_capture");
    let mut signed = sign("standard_webhooks", SVIX, &body, now(), "msg_captured");
    signed.push(("svix-id".into(), "msg_captured".into()));
    let reply = deliver(&proxy, svix, "", &body, &signed).await;
    assert_eq!(reply.dedupe(), "forwarded", "{}", reply.body);
    let fresh: Vec<(String, String)> = signed
        .iter()
        .map(|(name, value)| match name.as_str() {
            "svix-id" => (name.clone(), "msg_fresh".to_owned()),
            _ => (name.clone(), value.clone()),
        })
        .collect();
    assert_refused(
        &deliver(&proxy, svix, "", &body, &fresh).await,
        "malformed_signature",
        "svix: a fresh svix-id beside the signed webhook-id",
    );
    assert_eq!(upstream.requests(), 1);
}

/// GitHub and Shopify sign no ID and no time: their routes guard by the signed body, so a
/// delivery signed by the provider's SDK and resent with a fresh ID is a duplicate, and the
/// fresh ID stays free for a genuine event; `replay_guard: none` turns that off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_or_shopify_delivery_resent_with_a_fresh_id_is_a_duplicate() {
    if !signers_ready() {
        return;
    }
    let (proxy, upstream, _dir) = proxy().await;
    for name in ["github", "shopify"] {
        let scheme = scheme(name);
        let body = event_body(&format!("evt_{name}_capture"));
        let signed = sign(scheme.name, scheme.secret, &body, now(), "");
        let before = upstream.requests();
        let first = deliver(&proxy, scheme, "id-1", &body, &signed).await;
        assert_eq!(first.dedupe(), "forwarded");
        for fresh in ["id-2", "id-3"] {
            let reply = deliver(&proxy, scheme, fresh, &body, &signed).await;
            assert_eq!(
                (reply.status, reply.dedupe()),
                (200, "duplicate"),
                "{name} {fresh}"
            );
        }
        let other = event_body(&format!("evt_{name}_other"));
        let other_signed = sign(scheme.name, scheme.secret, &other, now(), "");
        let genuine = deliver(&proxy, scheme, "id-2", &other, &other_signed).await;
        assert_eq!(genuine.dedupe(), "forwarded");
        assert_eq!(upstream.requests(), before + 2, "{name}");
    }
    let unguarded = Scheme {
        path: "/github-unguarded",
        ..*scheme("github")
    };
    let body = event_body("evt_unguarded");
    let signed = sign("github", GITHUB, &body, now(), "");
    for id in ["id-1", "id-2"] {
        let reply = deliver(&proxy, &unguarded, id, &body, &signed).await;
        assert_eq!(reply.dedupe(), "forwarded");
    }
}

/// The guard is on by default exactly where a signed route's key reads what its signature
/// does not cover, as `/v1/routes` shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_guard_is_on_where_the_key_is_unsigned() {
    if !signers_ready() {
        return;
    }
    let (proxy, _upstream, _dir) = proxy().await;
    let routes = send(proxy.admin, "GET", "/v1/routes", &[], "").await.json();
    let guard = |name: &str| {
        routes["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|route| route["name"] == name)
            .unwrap()["replay_guard"]
            .clone()
    };
    assert_eq!(guard("github"), "body");
    assert_eq!(guard("shopify"), "body");
    assert_eq!(guard("preset-github"), "body");
    assert_eq!(guard("github-unguarded"), "none");
    assert_eq!(guard("stripe"), "none", "the key is in the signed body");
    assert_eq!(guard("svix"), "none", "the key is the signed ID");
    assert_eq!(guard("preset-twilio"), "none", "nothing is signed");
}
