//! No store password reaches anything the proxy writes or serves, in any form a driver
//! accepts it (a URL's user information or query, libpq's `key=value`, a URL held in a
//! variable), with a password made of every character those forms treat specially: not
//! `check`'s output, not a start-up failure, not the log (at debug level), not
//! `/v1/routes` or `/metrics`, not a parser's message quoting the file.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;

/// A password with every character a URL or a `key=value` string treats specially.
const PASSWORD: &str = "p@ss:w/rd?#%&'=\\ x;\"é";

fn encoded() -> String {
    percent(PASSWORD)
}

/// The password as a libpq `key=value` value: quoted, `\` and `'` escaped.
fn quoted() -> String {
    format!("'{}'", PASSWORD.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Every spelling of the password that would give it away.
fn giveaways() -> Vec<String> {
    let json = serde_json::to_string(PASSWORD).unwrap();
    vec![
        PASSWORD.to_owned(),
        encoded(),
        quoted(),
        json.trim_matches('"').to_owned(),
        format!("{PASSWORD:?}").trim_matches('"').to_owned(),
        "ss:w/rd".to_owned(),
        "ss%3Aw%2Frd".to_owned(),
        "w%2Frd".to_owned(),
    ]
}

fn assert_no_password(what: &str, text: &str) {
    for giveaway in giveaways() {
        assert!(
            !text.contains(&giveaway),
            "{what} gives the password away as `{giveaway}`:\n{text}"
        );
    }
}

/// A form's name, its `store:` line, and the environment it needs.
type StoreForm = (&'static str, String, Vec<(String, String)>);

/// Each form, against a server at `port`.
fn store_forms(port: u16, table: &str) -> Vec<StoreForm> {
    let encoded = encoded();
    let quoted = quoted().replace('\\', "\\\\").replace('"', "\\\"");
    let url_env = format!("postgres://postgres:{encoded}@127.0.0.1:{port}/test");
    vec![
        (
            "URL user information",
            format!(
                "store: {{ postgres: {{ url: \"postgres://postgres:{encoded}@127.0.0.1:{port}/test\", table: {table} }} }}"
            ),
            vec![],
        ),
        (
            "URL query",
            format!(
                "store: {{ postgres: {{ url: \"postgres://postgres@127.0.0.1:{port}/test?password={encoded}\", table: {table} }} }}"
            ),
            vec![],
        ),
        (
            "key=value",
            format!(
                "store: {{ postgres: {{ url: \"host=127.0.0.1 port={port} user=postgres dbname=test password={quoted}\", table: {table} }} }}"
            ),
            vec![],
        ),
        (
            "direct URL past a pooler",
            format!(
                "store: {{ postgres: {{ url: \"postgres://postgres@127.0.0.1:{port}/test\", direct_url: \"postgres://postgres:{encoded}@127.0.0.1:{port}/test\", table: {table} }} }}"
            ),
            vec![],
        ),
        (
            "URL in a variable",
            format!("store: {{ postgres: {{ url_env: DEDUPE_TEST_DB_URL, table: {table} }} }}"),
            vec![("DEDUPE_TEST_DB_URL".to_owned(), url_env)],
        ),
    ]
}

fn write(dir: &Path, store: &str) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    let text = format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nupstream: http://127.0.0.1:9\n{store}\n{}",
        json_route("")
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn run_to_end(args: &[&str], config: &Path, env: &[(String, String)]) -> (Option<i32>, String) {
    let output = Command::new(binary_path())
        .args(args)
        .arg(config)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .env("RUST_LOG", "debug")
        .env_remove("DEDUPE_PROXY_CONFIG")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// `check` prints the resolved configuration, and a start against a server that is not
/// there fails with the reason: neither holds the password, in any form.
#[test]
fn check_and_a_failed_start_never_show_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let closed_port = 1;
    for (form, store, env) in store_forms(closed_port, "dedupe_secrets_unused") {
        let config = write(dir.path(), &store);
        let (code, text) = run_to_end(&["check", "-c"], &config, &env);
        assert_eq!(code, Some(0), "{form}: {text}");
        assert!(
            text.contains("***") || text.contains("url_env"),
            "{form}: {text}"
        );
        assert_no_password(&format!("check, {form}"), &text);
        let (code, text) = run_to_end(&["run", "-c"], &config, &env);
        assert_ne!(code, Some(0), "{form}: started without its store: {text}");
        assert!(text.contains("postgres"), "{form}: {text}");
        assert_no_password(&format!("a failed start, {form}"), &text);
    }
    let redis = write(
        dir.path(),
        &format!(
            "store: {{ redis: {{ url: \"redis://:{}@127.0.0.1:{closed_port}/0\" }} }}",
            encoded()
        ),
    );
    for args in [["check", "-c"], ["run", "-c"]] {
        let (_, text) = run_to_end(&args, &redis, &[]);
        assert_no_password(&format!("{args:?} on Redis"), &text);
    }
}

/// A parser's message that quotes the file's value (a URL where a map belongs) masks it.
#[test]
fn a_configuration_error_quoting_the_url_masks_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!(
            "store: {{ postgres: \"postgres://postgres:{}@127.0.0.1/test\" }}",
            encoded()
        ),
    );
    let (code, text) = run_to_end(&["check", "-c"], &config, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("config.yaml:"), "{text}");
    assert_no_password("a configuration error", &text);
    let unescaped = write(
        dir.path(),
        "store: { postgres: { url: \"postgres://postgres:pa/ss@word@127.0.0.1/test\" } }",
    );
    let (code, text) = run_to_end(&["check", "-c"], &unescaped, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("percent-encode"), "{text}");
    assert!(!text.contains("pa/ss"), "{text}");
}

/// A `key=value` password with unquoted spaces, which libpq would refuse quoting the
/// words after the first, is refused before any connection, and no word of it is shown.
#[test]
fn an_unquoted_password_with_spaces_is_refused_unshown() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "store: { postgres: { url: \"host=127.0.0.1 port=1 user=postgres password=correct horse battery dbname=test\" } }",
    );
    for args in [["check", "-c"], ["run", "-c"]] {
        let (code, text) = run_to_end(&args, &config, &[]);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(text.contains("single quotes"), "{args:?}: {text}");
        for word in ["correct", "horse", "battery"] {
            assert!(!text.contains(word), "{args:?} shows {word}: {text}");
        }
    }
}

/// A running proxy on PostgreSQL (which, trusting local connections, takes any password)
/// shows none: not in its debug log, `/v1/routes` or `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_proxy_never_shows_the_password() {
    if !service_available("PostgreSQL", 5432).await {
        return;
    }
    let table = format!("dedupe_secrets_{:08x}", rand::random::<u32>());
    let dir = tempfile::tempdir().unwrap();
    for (form, store, env) in store_forms(5432, &table) {
        let config = write(dir.path(), &store);
        let mut env: Vec<(&str, &str)> = env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        env.push(("RUST_LOG", "debug"));
        let proxy = Binary::start_with_env(&config, &env);
        let routes = send(proxy.admin, "GET", "/v1/routes", &[], "").await;
        assert_eq!(routes.status, 200, "{form}");
        assert_no_password(&format!("/v1/routes, {form}"), &routes.body);
        let metrics = send(proxy.admin, "GET", "/metrics", &[], "").await;
        assert_no_password(&format!("/metrics, {form}"), &metrics.body);
        let reply = post_event(proxy.addr, "evt_secret").await;
        assert_eq!(reply.status, 502, "{form}: the app is not there");
        let log = proxy.log_text();
        assert!(log.contains("DEBUG"), "{form}: a debug log");
        assert_no_password(&format!("the log, {form}"), &log);
    }
    drop_postgres_tables(&table).await;
}

/// Signature secrets and the admin token are never shown either: not by `check`, the log,
/// `/v1/routes` or `/v1/overview`, and a message that would quote one (a reload refused for
/// a value that happens to be the token) shows `***` in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signature_secrets_and_the_admin_token_never_show() {
    const SIGNING: &str = "sig-s3cret-value-123";
    const TOKEN: &str = "tok-s3cret-value-456";
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let text = |upstream_url: &str| {
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0, token_env: TEST_ADMIN_TOKEN }}\nupstream: {upstream_url}\nstore: {{ sled: {{ path: \"{}\" }} }}\nroutes:\n  - name: hooks\n    match: {{ path: /hooks }}\n    key: \"{{json:/id}}\"\n    verify: {{ hmac: {{ secret_env: TEST_SIGNING_SECRET, header: X-Signature }} }}\n",
            dir.path().join("data").display()
        )
    };
    std::fs::write(&config, text(&format!("http://{}", upstream.addr))).unwrap();
    let env = [
        ("TEST_SIGNING_SECRET", SIGNING),
        ("TEST_ADMIN_TOKEN", TOKEN),
        ("RUST_LOG", "debug"),
    ];
    let owned_env: Vec<(String, String)> = env
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    let (code, checked) = run_to_end(&["check", "-c"], &config, &owned_env);
    assert_eq!(code, Some(0), "{checked}");
    let proxy = Binary::start_with_env(&config, &env);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let routes = send(proxy.admin, "GET", "/v1/routes", &auth, "").await;
    assert_eq!(routes.status, 200);
    // A reload refused for a value that is the token: the message must not quote it.
    std::fs::write(&config, text(TOKEN)).unwrap();
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    let refused = send(proxy.admin, "POST", "/v1/reload", &headers, "").await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.body.contains("***"), "{}", refused.body);
    // The overview (the console's first page) shows the last reload's message too.
    let overview = send(proxy.admin, "GET", "/v1/overview", &auth, "").await;
    assert_eq!(overview.json()["reload"]["ok"], false, "{}", overview.body);
    assert!(overview.body.contains("***"), "{}", overview.body);
    for (what, text) in [
        ("check", checked.as_str()),
        ("/v1/routes", routes.body.as_str()),
        ("the refused reload", refused.body.as_str()),
        ("/v1/overview", overview.body.as_str()),
        ("the log", &proxy.log_text()),
    ] {
        assert!(
            !text.contains(SIGNING),
            "{what} shows the signing secret:\n{text}"
        );
        assert!(
            !text.contains(TOKEN),
            "{what} shows the admin token:\n{text}"
        );
    }
}

/// A queued job's view masks a configured secret wherever the app's answer or the request
/// echoes it, string by string: the answer stays JSON, and the secret shows nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_view_masks_a_configured_secret_the_app_echoed() {
    const TOKEN: &str = "tok-s3cret-value-789";
    let upstream = Upstream::start().await;
    // Refused by the app (not retried): the job is a dead letter at once.
    upstream.script([Answer::status(400).body(&format!("bad key \"{TOKEN}\", null"))]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0, token_env: TEST_ADMIN_TOKEN }}\nupstream: http://{}\nstore: {{ sled: {{ path: \"{}\" }} }}\nroutes:\n  - name: hooks\n    match: {{ path: /hooks }}\n    key: \"{{json:/id}}\"\n    delivery: queued\n",
            upstream.addr,
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let proxy = Binary::start_with_env(&config, &[("TEST_ADMIN_TOKEN", TOKEN)]);
    let body = format!(r#"{{"id":"evt_echo","note":"{TOKEN}"}}"#);
    let target = format!("/hooks?echo={TOKEN}");
    let sent = post_json(proxy.addr, &target, &body).await;
    assert_eq!(sent.status, 202, "{}", sent.body);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let path = "/v1/queue/hooks/jobs/evt_echo";
    eventually(Duration::from_secs(10), "a dead letter", || async {
        let job = send(proxy.admin, "GET", path, &auth, "").await;
        job.status == 200 && job.json()["state"] == "dead"
    })
    .await;
    let job = send(proxy.admin, "GET", path, &auth, "").await;
    let answer = job.json()["history"][0]["answer"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(answer, "bad key \"***\", null", "{}", job.body);
    assert!(!job.body.contains(TOKEN), "{}", job.body);
}
