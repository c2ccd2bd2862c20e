//! Fuzzes the cheap half of every signature check: any header values are read by each
//! scheme (Stripe, Paddle, Slack, GitHub, Shopify, Linear, the generic HMAC, Standard
//! Webhooks with a secret, with public keys, and with both). Never a panic; a check left to do hashes
//! the body at most `MAX_PASSES` times, however many signatures the headers carry; and
//! checking it against a body never panics.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use dedupe_proxy::config::{Config, Overrides};
use dedupe_proxy::route::Route;
use dedupe_proxy::verify::MAX_PASSES;
use libfuzzer_sys::fuzz_target;

/// Each scheme on a route of its own. The secrets are variables every process has (the
/// fuzzer sets none); the Ed25519 routes read a key set before the configuration loads.
const CONFIG: &str = r#"
upstream: http://127.0.0.1:9
routes:
  - { name: stripe, match: { path: /a }, key: "{json:/id}", verify: { stripe: { secret_env: [PATH, HOME] } } }
  - { name: paddle, match: { path: /b }, key: "{json:/id}", verify: { paddle: { secret_env: PATH } } }
  - { name: slack, match: { path: /c }, key: "{json:/id}", verify: { slack: { secret_env: PATH } } }
  - { name: github, match: { path: /d }, key: "{json:/id}", verify: { github: { secret_env: PATH } } }
  - { name: shopify, match: { path: /e }, key: "{json:/id}", verify: { shopify: { secret_env: PATH } } }
  - { name: hmac, match: { path: /f }, key: "{json:/id}", verify: { hmac: { secret_env: PATH, header: X-Sig, encoding: base64, prefix: "v=" } } }
  - { name: sw, match: { path: /g }, key: "{json:/id}", verify: { standard_webhooks: { secret_env: FUZZ_WHSEC } } }
  - { name: swpk, match: { path: /h }, key: "{json:/id}", verify: { standard_webhooks: { secret_env: [FUZZ_WHPK, FUZZ_WHPK] } } }
  - { name: mixed, match: { path: /i }, key: "{json:/id}", verify: { standard_webhooks: { secret_env: [FUZZ_WHSEC, FUZZ_WHSEC, FUZZ_WHPK, FUZZ_WHPK] } } }
  - { name: linear, match: { path: /j }, key: "{json:/id}", verify: { linear: { secret_env: PATH } } }
"#;

/// The headers the schemes read, one of which each input line sets (new ones go last:
/// the seeds name headers by their place).
const NAMES: [&str; 15] = [
    "stripe-signature",
    "paddle-signature",
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-hub-signature-256",
    "x-shopify-hmac-sha256",
    "x-sig",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "content-type",
    "linear-signature",
];

fn routes() -> &'static [Route] {
    static ROUTES: OnceLock<Vec<Route>> = OnceLock::new();
    ROUTES.get_or_init(|| {
        // Set once, before the configuration reads them; nothing else reads the
        // environment meanwhile.
        unsafe {
            std::env::set_var("FUZZ_WHSEC", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
            std::env::set_var("FUZZ_WHPK", "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=");
        }
        Config::parse(CONFIG, Path::new("fuzz.yaml"), &Overrides::default())
            .expect("the fuzz configuration is valid")
            .routes
    })
}

fuzz_target!(|data: &[u8]| {
    // Lines of a byte `n` and a value, for the header NAMES[n % NAMES.len()]; after an
    // empty line, the body.
    let (head, body) = match data.windows(2).position(|pair| pair == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &b""[..]),
    };
    let mut headers = http::HeaderMap::new();
    for line in head.split(|&byte| byte == b'\n') {
        let Some((&which, value)) = line.split_first() else {
            continue;
        };
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            headers.append(NAMES[usize::from(which) % NAMES.len()], value);
        }
    }
    for route in routes() {
        let verify = route.verify.as_ref().expect("every fuzz route checks");
        for now in [0, 1_700_000_000, i64::MAX] {
            let delivery = dedupe_proxy::verify::Signed { headers: &headers, body };
            let Ok(pending) = verify.prepare(delivery, now) else {
                continue;
            };
            assert!(
                pending.passes() <= MAX_PASSES,
                "{}: {} passes",
                route.name,
                pending.passes()
            );
            let _ = pending.check(body);
        }
    }
});
