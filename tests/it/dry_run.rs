//! `dedupe-proxy try`, the dry run, as a user runs it: every preset's shipped sample
//! gives the key its documentation names; broken samples (a changed body, a wrong secret,
//! a stale timestamp, no signature, no key, no route) give the documented refusal and exit
//! status; the samples are what the providers' own SDKs sign; and the key a dry run names
//! is the key a running proxy gives the app for the same request.

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use dedupe_proxy::testing::Preset;
use serde_json::Value;
use support::*;

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `dedupe-proxy try` with `args`, in the repository, with no provider secret set.
fn try_run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary_path());
    command.arg("try").args(args).current_dir(repository());
    for variable in Preset::all().filter_map(Preset::secret_env) {
        command.env_remove(variable);
    }
    command.env_remove("DEDUPE_PROXY_CONFIG");
    command.envs(env.iter().copied());
    command.output().unwrap()
}

/// The JSON report of `try --json` with `args`, and its exit status.
fn judged(args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let mut args = args.to_vec();
    args.push("--json");
    let output = try_run(&args, env);
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{error}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap(), report)
}

/// The configuration shipped for `preset`: `config/<name>.yaml`, with `-` for `_`.
fn shipped_config(preset: Preset) -> String {
    format!("config/{}.yaml", preset.name().replace('_', "-"))
}

/// The key `examples/deliveries/README.md` says `sample` gives, checking that its row
/// names `config`.
fn documented_key(sample: &str, config: &str) -> String {
    let documented =
        std::fs::read_to_string(repository().join("examples/deliveries/README.md")).unwrap();
    let row = format!("| `{sample}` |");
    let line = (documented.lines())
        .find(|line| line.starts_with(&row))
        .unwrap_or_else(|| panic!("examples/deliveries/README.md has no row for {sample}"));
    assert!(line.contains(&format!("`{config}`")), "{line}");
    let key = line
        .trim_end_matches(['|', ' '])
        .rsplit('|')
        .next()
        .unwrap();
    key.trim().trim_matches('`').to_owned()
}

/// Every provider preset has what a user reaches for: a sample delivery signed by the
/// provider's SDK or documented algorithm (`regenerate.py --check` below), taken by the
/// configuration shipped for it with the key documented, a row in docs/configuration.md's
/// table, and its name in the configuration's schema.
#[test]
fn every_presets_sample_is_taken_with_the_documented_key() {
    let docs = std::fs::read_to_string(repository().join("docs/configuration.md")).unwrap();
    let schema = std::fs::read_to_string(repository().join("config/schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&schema).unwrap();
    let mut walked = 0;
    for preset in Preset::all().filter(|preset| !preset.provider().for_api) {
        let sample = preset.name();
        let config = &shipped_config(preset);
        assert!(
            preset.provider().sample.is_some(),
            "{sample} ships a sample delivery"
        );
        let row = (docs.lines())
            .find(|line| line.starts_with(&format!("| `{sample}` | `{}`", preset.provider().key)))
            .unwrap_or_else(|| {
                panic!("docs/configuration.md's preset table has no row for {sample} with its key")
            });
        assert!(
            row.contains(preset.secret_env().unwrap_or("| none |")),
            "{row}"
        );
        assert!(
            schema["definitions"]["Preset"]["enum"]
                .as_array()
                .unwrap()
                .contains(&Value::from(sample)),
            "the schema names {sample}"
        );
        let key = &documented_key(sample, config);
        walked += 1;
        // The file's test secret, set in the environment: a file's `# secret:` lines are
        // not read (only a shipped sample's).
        let file = format!("examples/deliveries/{sample}.http");
        let text = std::fs::read_to_string(repository().join(&file)).unwrap();
        let secret = text
            .lines()
            .find_map(|line| line.strip_prefix("# secret: "))
            .and_then(|secret| secret.split_once('='));
        let env: Vec<(&str, &str)> = secret.into_iter().collect();
        for (request, env) in [
            (vec!["-c", config, "--sample", sample], &[][..]),
            (vec!["-c", config, &file], &env[..]),
        ] {
            let (status, report) = judged(&request, env);
            assert_eq!(
                (status, &report["verdict"]),
                (0, &Value::from("taken")),
                "{sample}: {report:#}"
            );
            assert_eq!(report["key"]["value"], key.as_str(), "{sample}");
            let signature = &report["signature"]["result"];
            let expected = match preset.secret_env() {
                None => "none",
                Some(_) => "verified",
            };
            assert_eq!(signature, expected, "{sample}");
        }
    }
    // The text a person reads names the same.
    let text = try_run(&["-c", "config/stripe.yaml", "--sample", "stripe"], &[]);
    let text = String::from_utf8(text.stdout).unwrap();
    for line in [
        "route      stripe (scope stripe, direct delivery)",
        "signature  verified: stripe with STRIPE_WEBHOOK_SECRET",
        "key        evt_1QSampleStripe0001 from {json:/id}",
        "store key  stripe:evt_1QSampleStripe0001",
        "duplicate  200: {\"received\":true,\"duplicate\":true}",
        "verdict    taken",
    ] {
        assert!(text.contains(line), "`{line}` in:\n{text}");
    }
    assert!(walked >= 8, "{walked} provider presets");
}

/// A broken request's arguments and environment, and the refusal's status, code and words.
type Broken<'a> = (
    Vec<&'a str>,
    &'a [(&'a str, &'a str)],
    u16,
    &'a str,
    &'a str,
);

#[test]
fn broken_samples_get_the_documented_refusal() {
    let stripe = ["-c", "config/stripe.yaml", "--sample", "stripe"];
    let with = |extra: &[&'static str]| -> Vec<&str> { [&stripe[..], extra].concat() };
    let cases: [Broken; 4] = [
        (
            with(&["-d", r#"{"id":"evt_changed"}"#]),
            &[],
            401,
            "signature_mismatch",
            "the body changed",
        ),
        (
            stripe.to_vec(),
            &[("STRIPE_WEBHOOK_SECRET", "whsec_another")],
            401,
            "signature_mismatch",
            "the secret differs",
        ),
        (
            with(&["--at", "2026-12-01T12:10:00Z"]),
            &[],
            401,
            "stale_signature",
            "more than 5m from 2026-12-01T12:10:00.000Z",
        ),
        (
            with(&["-H", "Stripe-Signature: t=1796126400"]),
            &[],
            401,
            "malformed_signature",
            "malformed",
        ),
    ];
    for (args, env, status, error, detail) in cases {
        let (exit, report) = judged(&args, env);
        assert_eq!(exit, 1, "{args:?}: {report:#}");
        assert_eq!(report["verdict"], "refused");
        assert_eq!(report["refusal"]["status"], status, "{args:?}");
        assert_eq!(report["refusal"]["error"], error, "{args:?}");
        let said = report["signature"]["detail"].as_str().unwrap();
        assert!(said.contains(detail), "{args:?}: {said}");
        // The key is still read: a rule can be checked without the sender's secret.
        assert!(report["key"]["value"].is_string(), "{args:?}: {report:#}");
        assert!(report.get("first_delivery").is_none(), "{report:#}");
    }

    // No key where the route needs one: its part says why.
    let (exit, report) = judged(
        &[
            "-c",
            "config/twilio.yaml",
            "--path",
            "/twilio/sms",
            "-d",
            "Body=hi",
        ],
        &[],
    );
    assert_eq!(
        (exit, &report["refusal"]["error"]),
        (1, &Value::from("missing_key"))
    );
    assert_eq!(report["key"]["parts"][0]["missing"], "form field absent");

    // No route: each route says why not; `unmatched: forward` passes it on unchecked.
    let twilio = ["-c", "config/twilio.yaml", "--path"];
    let (exit, report) = judged(&[&twilio[..], &["/twilio/other"]].concat(), &[]);
    assert_eq!((exit, &report["verdict"]), (1, &Value::from("unmatched")));
    assert_eq!(
        report["not_taken_by"][0]["because"],
        "it takes the path /twilio/sms, not /twilio/other"
    );
    assert!(
        report["first_delivery"]
            .as_str()
            .unwrap()
            .contains("no deduplication")
    );
    let (_, report) = judged(&[&twilio[..], &["/twilio/sms", "-X", "GET"]].concat(), &[]);
    assert_eq!(
        report["not_taken_by"][0]["because"],
        "it takes POST, not GET"
    );

    // Without the secret (nothing in the environment; a file's `# secret:` lines are not
    // read): what needs no secret is still checked; past that, not checked, said so, and
    // not counted as taken.
    let file = [
        "-c",
        "config/stripe.yaml",
        "examples/deliveries/stripe.http",
    ];
    let (exit, report) = judged(&file, &[]);
    assert_eq!((exit, &report["verdict"]), (1, &Value::from("unverified")));
    assert_eq!(report["signature"]["result"], "not_checked");
    let said = report["signature"]["detail"].as_str().unwrap();
    assert!(said.contains("STRIPE_WEBHOOK_SECRET not set"), "{said}");
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .contains("a request file's `# secret:` lines are not read")
    );
    let unsigned = [
        "-c",
        "config/stripe.yaml",
        "--path",
        "/webhooks/stripe",
        "-d",
        "{}",
    ];
    let (exit, report) = judged(&unsigned, &[]);
    assert_eq!(
        (exit, &report["refusal"]["error"]),
        (1, &Value::from("missing_signature")),
        "no secret is needed to see that no signature came: {report:#}"
    );
    let (_, report) = judged(
        &[&file[..], &["--at", "2026-12-02T00:00:00Z"]].concat(),
        &[],
    );
    assert_eq!(report["refusal"]["error"], "stale_signature", "{report:#}");

    // `-d` on a file changes its body and length, and makes up nothing: a file without
    // `Host` stays refused; `-H` cannot set what `-d` sets.
    let dir = tempfile::tempdir().unwrap();
    let hostless = dir.path().join("hostless.http");
    std::fs::write(
        &hostless,
        "POST /twilio/sms HTTP/1.1\nContent-Length: 3\n\na=b",
    )
    .unwrap();
    let hostless = ["-c", "config/twilio.yaml", hostless.to_str().unwrap()];
    let (_, report) = judged(&[&hostless[..], &["-d", "MessageSid=SM9"]].concat(), &[]);
    assert_eq!(report["refusal"]["error"], "bad_request", "{report:#}");
    assert_eq!(report["request"]["body_bytes"], 14);
    let output = try_run(&[&hostless[..], &["-H", "Content-Length: 1"]].concat(), &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("-H cannot set content-length"));

    // A header the request's `Connection` names is gone before anything reads it, as the
    // proxy strips it: the signature goes with it.
    let (exit, report) = judged(
        &[&stripe[..], &["-H", "Connection: stripe-signature"]].concat(),
        &[],
    );
    assert_eq!(
        (exit, &report["refusal"]["error"]),
        (1, &Value::from("missing_signature"))
    );
}

#[test]
fn bad_requests_and_files_are_refused_with_a_reason_and_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.http");
    let mut text = b"POST /webhooks/stripe HTTP/1.1\n\n".to_vec();
    text.resize(5 << 20, b'a');
    std::fs::write(&huge, text).unwrap();
    let garbled = dir.path().join("garbled.http");
    std::fs::write(&garbled, "POST\n\n").unwrap();
    for (args, said) in [
        (
            vec!["-c", "config/stripe.yaml", huge.to_str().unwrap()],
            "over 4 MiB",
        ),
        (
            vec!["-c", "config/stripe.yaml", garbled.to_str().unwrap()],
            "not a request line",
        ),
        (
            vec!["-c", "config/stripe.yaml", "--sample", "strip"],
            "the samples are stripe, github",
        ),
        (vec!["-c", "config/stripe.yaml"], "no request"),
        (
            vec!["-c", "config/nope.yaml", "--sample", "stripe"],
            "nope.yaml",
        ),
        (
            vec![
                "-c",
                "config/stripe.yaml",
                "--sample",
                "stripe",
                "-H",
                "bad header",
            ],
            "is not a header",
        ),
        (
            vec![
                "-c",
                "config/stripe.yaml",
                "--sample",
                "stripe",
                "--at",
                "soon",
            ],
            "not an RFC 3339",
        ),
    ] {
        let output = try_run(&args, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    // A key holding what a terminal would act on is refused, and said so without it.
    let escape = dir.path().join("escape.http");
    std::fs::write(
        &escape,
        "POST /twilio/sms\nHost: a.example\n\nMessageSid=SM%1B%5B31mred",
    )
    .unwrap();
    let output = try_run(&["-c", "config/twilio.yaml", escape.to_str().unwrap()], &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(!stdout.contains('\u{1b}'), "{stdout}");
    assert!(
        stdout.contains("value contains a control or formatting character"),
        "{stdout}"
    );
    // Without `Host`, as the proxy's server refuses an HTTP/1.1 request without one; a
    // `Host` another than the target's authority likewise.
    for (head, says) in [
        ("POST /twilio/sms HTTP/1.1\n", "0 Host header lines"),
        (
            "POST http://a.example/twilio/sms HTTP/1.1\nHost: b.example\n",
            "differs from the request's authority",
        ),
    ] {
        let file = dir.path().join("host.http");
        std::fs::write(&file, format!("{head}\nMessageSid=SM1")).unwrap();
        let output = try_run(
            &["-c", "config/twilio.yaml", "--json", file.to_str().unwrap()],
            &[],
        );
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["refusal"]["error"], "bad_request", "{report:#}");
        assert!(
            report["refusal"]["detail"].as_str().unwrap().contains(says),
            "{report:#}"
        );
    }
}

#[test]
fn the_samples_are_what_the_providers_sdks_sign() {
    let node_sdks = repository().join("tests/signers/node_modules/stripe");
    if !node_sdks.exists() || !python_module_installed("slack_sdk") {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "CI must install the signing SDKs (tests/setup)"
        );
        eprintln!("skipped: the signing SDKs are not installed (run tests/setup)");
        return;
    }
    let checked = Command::new("python3")
        .arg(repository().join("examples/deliveries/regenerate.py"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The key the dry run names is the one a running proxy hands the app (`Dedupe-Key`), for
/// the samples without a timestamp a live proxy would find stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_proxy_gives_the_app_the_key_the_dry_run_names() {
    for sample in ["github", "shopify", "twilio"] {
        let config = &shipped_config(Preset::named(sample).unwrap());
        let key = &documented_key(sample, config);
        let upstream = Upstream::start().await;
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(repository().join(config)).unwrap();
        let text = text
            .replace(
                "http://127.0.0.1:8080",
                &format!("http://{}", upstream.addr),
            )
            .replace("0.0.0.0:8081", "127.0.0.1:0")
            .replace(
                "./dedupe-data",
                &dir.path().join("data").display().to_string(),
            );
        let config_path = dir.path().join("config.yaml");
        std::fs::write(
            &config_path,
            format!("admin: {{ listen: 127.0.0.1:0 }}\n{text}"),
        )
        .unwrap();
        let sample_text = std::fs::read_to_string(
            repository().join(format!("examples/deliveries/{sample}.http")),
        )
        .unwrap();
        let secret = sample_text
            .lines()
            .find_map(|line| line.strip_prefix("# secret: "))
            .and_then(|secret| secret.split_once('='));
        let env: Vec<(&str, &str)> = secret.into_iter().collect();
        let proxy = Binary::start_with_env(&config_path, &env);
        let (head, body) = sample_text.split_once("\n\n").unwrap();
        let mut lines = head.lines().filter(|line| !line.starts_with('#'));
        let path = lines
            .next()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_owned();
        let headers: Vec<(String, String)> = lines
            .filter(|line| {
                !line.to_ascii_lowercase().starts_with("content-length")
                    && !line.to_ascii_lowercase().starts_with("host")
            })
            .map(|line| {
                let (name, value) = line.split_once(": ").unwrap();
                (name.to_owned(), value.to_owned())
            })
            .collect();
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let answer = send(
            proxy.addr,
            "POST",
            &path,
            &headers,
            body.strip_suffix('\n').unwrap().to_owned(),
        )
        .await;
        assert!(
            answer.status < 300,
            "{sample}: {} {}",
            answer.status,
            answer.body
        );
        eventually(
            std::time::Duration::from_secs(10),
            "the app ran it",
            || async { upstream.executions(key) == 1 },
        )
        .await;
    }
}

/// `POST /v1/try`: the same report from the running routes, for the operator and the
/// viewer alike (it changes nothing), with bad bodies refused and nothing stored or sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_dry_runs_against_the_running_routes_and_changes_nothing() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: TRY_TOKEN, viewer_token_env: TRY_VIEWER }}\n{}",
        json_route(
            "    verify: { hmac: { secret_env: TRY_SECRET, header: X-Signature, prefix: \"sha256=\" } }\n"
        )
    );
    let config = write_config(dir.path(), upstream.addr, &rest);
    let env = [
        ("TRY_TOKEN", "operator-t"),
        ("TRY_VIEWER", "viewer-t"),
        ("TRY_SECRET", "s3cret"),
    ];
    let proxy = Binary::start_with_env(&config, &env);
    let body = r#"{"id":"evt_try"}"#;
    let signature = hmac_sha256_hex(b"s3cret", body.as_bytes());
    let message = format!(
        "POST /hooks HTTP/1.1\nHost: localhost\nContent-Type: application/json\nX-Signature: sha256={signature}\nContent-Length: {}\n\n{body}",
        body.len()
    );
    let asked = serde_json::json!({ "request": message }).to_string();
    for token in ["operator-t", "viewer-t"] {
        let bearer = format!("Bearer {token}");
        let headers = [
            ("authorization", bearer.as_str()),
            ("content-type", "application/json"),
        ];
        let answer = send(proxy.admin, "POST", "/v1/try", &headers, asked.clone()).await;
        assert_eq!(answer.status, 200, "{token}: {}", answer.body);
        let report = answer.json();
        assert_eq!(report["verdict"], "taken");
        assert_eq!(report["signature"]["result"], "verified");
        assert_eq!(report["key"]["value"], "evt_try");
        // A changed body: refused, and said why.
        let changed = message.replace("evt_try", "evt_tr2");
        let asked = serde_json::json!({ "request": changed }).to_string();
        let answer = send(proxy.admin, "POST", "/v1/try", &headers, asked).await;
        assert_eq!(answer.json()["refusal"]["error"], "signature_mismatch");
    }
    let bearer = "Bearer operator-t";
    let headers = [
        ("authorization", bearer),
        ("content-type", "application/json"),
    ];
    let huge =
        serde_json::json!({ "request": format!("POST /hooks\n\n{}", "a".repeat(300 << 10)) });
    // As many header names as would make a header map panic (32 768): refused long before.
    let base36 = |mut n: u32| {
        let mut name = String::new();
        loop {
            name.push(char::from_digit(n % 36, 36).unwrap());
            n /= 36;
            if n == 0 {
                return name;
            }
        }
    };
    let names: String = (0..33_000).map(|n| format!("{}:\n", base36(n))).collect();
    let many_headers = serde_json::json!({ "request": format!("POST /hooks\n{names}\n") });
    for (body, says) in [
        ("{}".to_owned(), "missing field `request`"),
        (r#"{"request":"POST\n\n"}"#.to_owned(), "not a request line"),
        (
            r#"{"request":"POST /hooks\n\n{}","at":"soon"}"#.to_owned(),
            "not an RFC 3339",
        ),
        (huge.to_string(), "body exceeds max_body of 262144 bytes"),
        (many_headers.to_string(), "more than 100 header lines"),
    ] {
        let answer = send(proxy.admin, "POST", "/v1/try", &headers, body).await;
        assert_eq!(answer.status, 400, "{says}: {}", answer.body);
        assert!(answer.body.contains(says), "{says}: {}", answer.body);
    }
    // Nothing was claimed, logged as a delivery, or sent to the app.
    let key = send(proxy.admin, "GET", "/v1/keys/hooks/evt_try", &headers, "").await;
    assert_eq!(key.status, 404);
    let log = send(proxy.admin, "GET", "/v1/deliveries", &headers, "").await;
    assert_eq!(log.json()["deliveries"], serde_json::json!([]));
    assert_eq!(upstream.total_executions(), 0);
}

fn hmac_sha256_hex(secret: &[u8], body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// 70 connections holding back the bodies of `POST /v1/try` with the viewer's token (an
/// attack that once made `/healthz` and `/readyz` answer 503 for 30 s) leave the probes
/// their places: bodies beyond the credential's share are refused at once, and every
/// probe answers within 100 ms while the rest hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_dry_run_bodies_leave_the_probes_their_places() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: TRY_TOKEN, viewer_token_env: TRY_VIEWER }}\n{}",
        json_route("")
    );
    let config = write_config(dir.path(), upstream.addr, &rest);
    let env = [("TRY_TOKEN", "operator-t"), ("TRY_VIEWER", "viewer-t")];
    let proxy = Binary::start_with_env(&config, &env);
    let head = "POST /v1/try HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer viewer-t\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"request\":\"";
    let mut held = Vec::new();
    for _ in 0..70 {
        let mut stream = tokio::net::TcpStream::connect(proxy.admin).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        held.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..20 {
        for probe in ["/healthz", "/readyz"] {
            let answer = send(proxy.admin, "GET", probe, &[], "").await;
            assert_eq!(answer.status, 200, "{probe}: {}", answer.body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only the share's 8 wait for their bodies: the others were answered 429 at once (or,
    // past the port's 64 connections, 503 or closed).
    let (mut waiting, mut over_share) = (0, 0);
    for stream in &mut held {
        let mut answer = vec![0; 512];
        match tokio::time::timeout(Duration::from_millis(20), stream.read(&mut answer)).await {
            Err(_) => waiting += 1,
            Ok(read) => {
                let read = read.unwrap_or(0);
                over_share += usize::from(answer[..read].starts_with(b"HTTP/1.1 429"));
            }
        }
    }
    assert_eq!(waiting, 8, "{over_share} answered 429");
    assert!(over_share >= 64 - 8, "{over_share} answered 429");
    // The operator's token has places of its own meanwhile.
    let asked = serde_json::json!({ "request": "GET / HTTP/1.1\nHost: localhost\n\n" });
    let answer = send(
        proxy.admin,
        "POST",
        "/v1/try",
        &[
            ("authorization", "Bearer operator-t"),
            ("content-type", "application/json"),
        ],
        asked.to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}
