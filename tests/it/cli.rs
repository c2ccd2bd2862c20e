//! The command line, through the real binary: `-c` before or after `check`, each
//! command's help listing only its own flags, `check --without-secrets` on every shipped
//! configuration, and the admin commands against a running proxy (tables, `--json`,
//! refusals, the API found and its token read through the configuration).

use crate::support;

use std::path::Path;
use std::process::{Command, Output};

use support::*;

/// Runs the binary with `args` and only `env` in its environment (and PATH).
fn dedupe(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(binary_path())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/example.yaml")
        .display()
        .to_string()
}

#[test]
fn the_configuration_goes_before_or_after_the_command() {
    for args in [
        ["-c", &example(), "check"],
        ["check", "-c", &example()],
        ["--config", &example(), "check"],
    ] {
        let output = dedupe(&args, &[]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(stderr(&output).contains("valid, "), "{args:?}");
    }
}

#[test]
fn a_flag_of_run_before_another_command_is_refused() {
    let output = dedupe(
        &["--listen", "127.0.0.1:8080", "check", "-c", &example()],
        &[],
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--listen is a flag of `run`, not of `check`"),
        "{}",
        stderr(&output)
    );
    // Without a command, the flags are `run`'s, as before.
    let help = stdout(&dedupe(&["--help"], &[]));
    assert!(help.contains("--listen") && help.contains("keys"), "{help}");
}

#[test]
fn each_command_lists_only_its_own_flags() {
    let check = stdout(&dedupe(&["check", "--help"], &[]));
    for run_only in ["--workers", "--log-format"] {
        assert!(
            !check.contains(run_only),
            "check --help lists {run_only}:\n{check}"
        );
    }
    assert!(check.contains("--without-secrets") && check.contains("--config"));
    let run = stdout(&dedupe(&["run", "--help"], &[]));
    assert!(run.contains("--listen") && !run.contains("--without-secrets"));
    let keys = stdout(&dedupe(&["keys", "list", "--help"], &[]));
    assert!(keys.contains("--admin") && keys.contains("--json") && !keys.contains("--listen"));
}

/// Every shipped configuration is checked in an environment with no secret at all: the
/// variables are listed, and plain `check` (like `run`) still refuses the files that
/// need one.
#[test]
fn every_shipped_configuration_checks_without_its_secrets() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut needing = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // Beside the configurations, their JSON Schema.
        if path.extension().is_none_or(|ext| ext != "yaml") {
            continue;
        }
        let file = path.display().to_string();
        let without = dedupe(&["check", "--without-secrets", "-c", &file], &[]);
        assert_eq!(
            without.status.code(),
            Some(0),
            "{file}: {}",
            stderr(&without)
        );
        let strict = dedupe(&["check", "-c", &file], &[]);
        if stderr(&without).contains("not checked: the secrets of ") {
            needing += 1;
            assert_eq!(strict.status.code(), Some(2), "{file}: {}", stderr(&strict));
            assert!(stderr(&strict).contains("is not set"), "{file}");
        } else {
            assert_eq!(strict.status.code(), Some(0), "{file}: {}", stderr(&strict));
        }
    }
    assert!(needing >= 6, "{needing} shipped files name a secret");
    let stripe = dir.join("stripe.yaml").display().to_string();
    let listed = stderr(&dedupe(&["check", "--without-secrets", "-c", &stripe], &[]));
    assert!(listed.contains("STRIPE_WEBHOOK_SECRET"), "{listed}");
}

/// A value a secret's form check would refuse is still refused when it is set.
#[test]
fn a_set_secret_is_still_checked_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sw.yaml");
    std::fs::write(
        &file,
        "upstream: http://127.0.0.1:8080\nroutes:\n  - name: sw\n    match: { path: /sw }\n    preset: standard_webhooks\n    verify: { standard_webhooks: { secret_env: SW_SECRET } }\n",
    )
    .unwrap();
    let file = file.display().to_string();
    let output = dedupe(
        &["check", "--without-secrets", "-c", &file],
        &[("SW_SECRET", "not base64!")],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("SW_SECRET"), "{}", stderr(&output));
}

/// A free port on loopback, for a configuration that must name its admin port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_commands_drive_a_running_proxy() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), &json_route("")),
    )
    .unwrap();
    let proxy = Binary::start(&config);
    // The first delivery is slow, so that the listing shows a key in flight.
    upstream.script([Answer::ok().after(std::time::Duration::from_secs(2))]);
    let slow = tokio::spawn(post_event(proxy.addr, "evt_slow"));
    upstream.wait_for_requests(1).await;
    post_event(proxy.addr, "evt/one two").await;
    let admin = format!("http://{}", proxy.admin);
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--admin", &admin]);
        dedupe(&all, &[])
    };

    let routes = run(&["routes"]);
    assert_eq!(routes.status.code(), Some(0), "{}", stderr(&routes));
    let table = stdout(&routes);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("hooks") && table.contains("{json:/id}"),
        "{table}"
    );

    let listed = run(&["keys", "list", "--route", "hooks"]);
    let table = stdout(&listed);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("evt_slow") && line.contains("in_flight")),
        "{table}"
    );

    let json = run(&[
        "keys",
        "list",
        "--route",
        "hooks",
        "--state",
        "in-flight",
        "--json",
    ]);
    let page: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(page["keys"][0]["key"], "evt_slow");
    slow.await.unwrap();

    // A key with a slash and a space reaches its own record.
    let shown = run(&["keys", "show", "hooks", "evt/one two", "--json"]);
    let record: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(
        (record["key"].as_str(), record["state"].as_str()),
        (Some("evt/one two"), Some("done"))
    );

    // Resolving a key that is not held is the API's refusal: its detail, exit 1.
    let resolved = run(&[
        "keys",
        "resolve",
        "hooks",
        "evt/one two",
        "--outcome",
        "release",
    ]);
    assert_eq!(resolved.status.code(), Some(1));
    assert!(
        stderr(&resolved).contains("(not_held, HTTP 409)"),
        "{}",
        stderr(&resolved)
    );

    // Its expiry moves; a duration the API cannot read is its refusal; --at or --in is
    // required.
    let expired = run(&[
        "keys",
        "expire",
        "hooks",
        "evt/one two",
        "--in",
        "30d",
        "--json",
    ]);
    assert_eq!(expired.status.code(), Some(0), "{}", stderr(&expired));
    let moved: serde_json::Value = serde_json::from_str(&stdout(&expired)).unwrap();
    assert_ne!(moved["expires_at"], record["expires_at"], "{moved}");
    let unreadable = run(&["keys", "expire", "hooks", "evt/one two", "--in", "soon"]);
    assert_eq!(unreadable.status.code(), Some(1));
    assert!(
        stderr(&unreadable).contains("(bad_request, HTTP 400)"),
        "{}",
        stderr(&unreadable)
    );
    let neither = run(&["keys", "expire", "hooks", "evt/one two"]);
    assert_eq!(neither.status.code(), Some(2));

    let forgotten = run(&["keys", "forget", "hooks", "evt/one two", "--json"]);
    assert_eq!(forgotten.status.code(), Some(0), "{}", stderr(&forgotten));
    let said: serde_json::Value = serde_json::from_str(&stdout(&forgotten)).unwrap();
    assert_eq!(said["forgotten"]["key"], "evt/one two");
    assert_eq!(
        post_event(proxy.addr, "evt/one two").await.dedupe(),
        "forwarded"
    );

    let absent = run(&["keys", "show", "hooks", "never"]);
    assert_eq!(absent.status.code(), Some(1));
    assert!(
        stderr(&absent).contains("(absent, HTTP 404)"),
        "{}",
        stderr(&absent)
    );

    let reloaded = run(&["reload"]);
    assert_eq!(reloaded.status.code(), Some(0), "{}", stderr(&reloaded));
    assert!(
        stdout(&reloaded).contains("reloaded: 1 route(s)"),
        "{}",
        stdout(&reloaded)
    );

    let too_many = run(&["keys", "list", "--route", "hooks", "--limit", "5000"]);
    assert_eq!(too_many.status.code(), Some(2), "a wrong command");

    let entity = run(&["entities", "show", "hooks", "e1"]);
    assert_eq!(entity.status.code(), Some(1));
    assert!(stderr(&entity).contains("no_order"), "{}", stderr(&entity));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_commands_count_list_and_clear_keys() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let data = dir.path().join("data");
    std::fs::write(&config, config_text(upstream.addr, &data, &json_route(""))).unwrap();
    let proxy = Binary::start(&config);
    for id in ["a_1", "a_2", "b_1"] {
        assert_eq!(post_event(proxy.addr, id).await.dedupe(), "forwarded");
    }
    upstream.script([Answer::ok().after(std::time::Duration::from_secs(3))]);
    let slow = tokio::spawn(post_event(proxy.addr, "b_slow"));
    upstream.wait_for_requests(4).await;
    let admin = format!("http://{}", proxy.admin);
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--admin", &admin]);
        dedupe(&all, &[])
    };

    let scopes = run(&["scopes"]);
    assert_eq!(scopes.status.code(), Some(0), "{}", stderr(&scopes));
    let table = stdout(&scopes);
    assert!(table.starts_with("SCOPE"), "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row, ["hooks", "hooks", "1", "3", "0"], "{table}");

    let listed = run(&[
        "keys", "list", "--route", "hooks", "--prefix", "a_", "--json",
    ]);
    let page: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let mut names: Vec<_> = page["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["key"].clone())
        .collect();
    names.sort_by_key(|name| name.to_string());
    assert_eq!(names, ["a_1", "a_2"], "{page}");

    // A key of the scope is in flight: clearing all of it is refused, exit 1; clearing
    // a prefix it is not under goes ahead.
    let refused = run(&["keys", "clear", "hooks"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("(in_flight, HTTP 409)"),
        "{}",
        stderr(&refused)
    );
    let cleared = run(&["keys", "clear", "hooks", "--prefix", "a_", "--json"]);
    assert_eq!(cleared.status.code(), Some(0), "{}", stderr(&cleared));
    let said: serde_json::Value = serde_json::from_str(&stdout(&cleared)).unwrap();
    assert_eq!(
        (said["removed"].as_u64(), said["complete"].as_bool()),
        (Some(2), Some(true)),
        "{said}"
    );
    for (id, fate) in [("a_1", "forwarded"), ("b_1", "duplicate")] {
        assert_eq!(post_event(proxy.addr, id).await.dedupe(), fate, "{id}");
    }
    slow.await.unwrap();

    // With nothing in flight, the whole scope goes; a scope that is not is said so.
    let cleared = run(&["keys", "clear", "hooks"]);
    assert_eq!(cleared.status.code(), Some(0), "{}", stderr(&cleared));
    assert!(stdout(&cleared).contains("removed"), "{}", stdout(&cleared));
    assert_eq!(post_event(proxy.addr, "b_1").await.dedupe(), "forwarded");
    let unknown = run(&["keys", "clear", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("no_such_scope"),
        "{}",
        stderr(&unknown)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_commands_watch_pause_and_replay_dead_letters() {
    let upstream = Upstream::start().await;
    // Refused by the app: straight to dead letters, with its answer (a terminal escape
    // in it, which the table must not pass on).
    let refusal = Answer::status(422).body("no such \u{1b}[31mcustomer");
    upstream.script([refusal.clone(), refusal]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let route = json_route("    delivery: queued\n");
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), &route),
    )
    .unwrap();
    let proxy = Binary::start(&config);
    let admin = format!("http://{}", proxy.admin);
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--admin", &admin]);
        let output = dedupe(&all, &[]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        stdout(&output)
    };
    for id in ["evt/a 1", "evt_b"] {
        assert_eq!(post_event(proxy.addr, id).await.status, 202);
    }
    eventually(
        std::time::Duration::from_secs(10),
        "two dead letters",
        || async {
            run(&["queue", "dead", "hooks", "--json"])
                .matches("\"dead_at\"")
                .count()
                == 2
        },
    )
    .await;

    let status = run(&["queue", "status"]);
    assert!(status.starts_with("ROUTE"), "{status}");
    let row = status
        .lines()
        .find(|line| line.starts_with("hooks"))
        .unwrap();
    assert_eq!(
        row.split_whitespace().nth(5),
        Some("2"),
        "two dead: {status}"
    );

    // Filters and pages: one per page, both with --all.
    let refused = run(&["queue", "dead", "hooks", "--status", "422", "--limit", "1"]);
    assert!(refused.contains("more: --after "), "{refused}");
    let all = run(&["queue", "dead", "hooks", "--limit", "1", "--all"]);
    assert_eq!(all.matches("refused").count(), 2, "{all}");
    assert_eq!(all.matches("KEY").count(), 1, "one heading: {all}");
    for filter in [
        ["--key-prefix", "zzz"],
        ["--reason", "max_age"],
        ["--since", "2999-01-01T00:00:00Z"],
    ] {
        let mut args = vec!["queue", "dead", "hooks", "--json"];
        args.extend(filter);
        let none: serde_json::Value = serde_json::from_str(&run(&args)).unwrap();
        assert_eq!(none["jobs"].as_array().unwrap().len(), 0, "{filter:?}");
    }
    let picked = run(&[
        "queue",
        "dead",
        "hooks",
        "--reason",
        "refused",
        "--key-prefix",
        "evt_",
    ]);
    assert!(
        picked.contains("evt_b") && !picked.contains("evt/a 1"),
        "{picked}"
    );
    // The cursor to paste is quoted: the key in it holds a space.
    let first = run(&["queue", "dead", "hooks", "--limit", "1"]);
    let hint = first
        .lines()
        .find(|line| line.starts_with("more:"))
        .unwrap();
    assert!(
        hint.starts_with("more: --after '") && hint.ends_with('\''),
        "{hint}"
    );
    for (args, code) in [
        (vec!["queue", "dead", "hooks", "--reason", "bored"], 2),
        (vec!["queue", "dead", "hooks", "--status", "42"], 2),
        (vec!["queue", "dead", "nosuch"], 1),
    ] {
        let mut all = args.clone();
        all.extend(["--admin", &admin]);
        assert_eq!(dedupe(&all, &[]).status.code(), Some(code), "{args:?}");
    }

    // A key with a slash and a space reaches its own job; the app's answer is shown
    // without its control characters.
    let shown = run(&["queue", "show", "hooks", "evt/a 1"]);
    assert!(
        shown.contains("ATTEMPT AT") && shown.contains("422"),
        "{shown}"
    );
    assert!(
        shown.contains("customer") && !shown.contains('\u{1b}'),
        "{shown}"
    );

    // Paused, a replayed job waits; resumed, it is delivered.
    assert!(run(&["queue", "pause", "hooks"]).contains("paused: hooks"));
    assert!(run(&["queue", "replay", "hooks", "evt/a 1"]).contains("replayed"));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(upstream.executions("evt/a 1"), 0);
    assert!(run(&["queue", "resume", "hooks"]).contains("resumed: hooks"));
    eventually(
        std::time::Duration::from_secs(10),
        "evt/a 1 delivered",
        || async { upstream.executions("evt/a 1") == 1 },
    )
    .await;

    // The other: replayed in bulk and watched, refused again, and discarded.
    upstream.script([Answer::status(422)]);
    let bulk = run(&["queue", "replay-all", "hooks", "--reason", "refused"]);
    assert!(
        bulk.starts_with("replay ") && bulk.contains("started"),
        "{bulk}"
    );
    let id = bulk.split_whitespace().nth(1).unwrap().to_owned();
    eventually(
        std::time::Duration::from_secs(10),
        "the bulk replay done",
        || async { run(&["queue", "replays", &id]).contains("done") },
    )
    .await;
    eventually(
        std::time::Duration::from_secs(10),
        "evt_b dead again",
        || async { run(&["queue", "dead", "hooks"]).contains("evt_b") },
    )
    .await;
    let discarded = run(&["queue", "discard", "hooks", "evt_b", "--json"]);
    assert!(discarded.contains(r#""discarded""#), "{discarded}");
    let missing = dedupe(&["queue", "show", "hooks", "evt_b", "--admin", &admin], &[]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("no_such_job"),
        "{}",
        stderr(&missing)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_commands_find_the_api_and_its_token_through_the_configuration() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let port = free_port();
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:{port}, token_env: CLI_TEST_TOKEN }}\n{}",
        json_route("")
    );
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), &rest),
    )
    .unwrap();
    let token = ("CLI_TEST_TOKEN", "a-token-of-the-test");
    let _proxy = Binary::start_with_env(&config, &[token]);
    let config = config.display().to_string();

    let listed = dedupe(&["-c", &config, "routes"], &[token]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("hooks"));

    let without = dedupe(&["routes", "-c", &config], &[]);
    assert_eq!(without.status.code(), Some(2));
    assert!(
        stderr(&without).contains("CLI_TEST_TOKEN"),
        "{}",
        stderr(&without)
    );

    let wrong = dedupe(&["-c", &config, "routes"], &[("CLI_TEST_TOKEN", "wrong")]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        stderr(&wrong).contains("(unauthorized, HTTP 401)"),
        "{}",
        stderr(&wrong)
    );
}

/// A configuration file naming an `admin.listen` that is no address of this machine
/// (one the proxy could not listen on) never gets the operator's token: the command
/// refuses before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_naming_another_machines_admin_address_gets_no_token() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    // A listener on this machine that records anything sent to it, named through an
    // address that is not this machine's (TEST-NET-3): nothing must reach either.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    std::fs::write(
        &config,
        format!("admin: {{ listen: \"203.0.113.9:{port}\" }}\nroutes: []\n"),
    )
    .unwrap();
    let token = ("DEDUPE_ADMIN_TOKEN", "the-operators-token");
    let output = dedupe(&["-c", &config.display().to_string(), "routes"], &[token]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not an address of this machine"),
        "{}",
        stderr(&output)
    );
    assert!(!stderr(&output).contains("the-operators-token"));
    // An address of this machine is still read from the file.
    std::fs::write(
        &config,
        format!("admin: {{ listen: \"0.0.0.0:{port}\" }}\nroutes: []\n"),
    )
    .unwrap();
    let reader = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = vec![0; 4096];
        let read = stream.read(&mut head).await.unwrap();
        String::from_utf8_lossy(&head[..read]).into_owned()
    });
    let config = config.display().to_string();
    let command =
        tokio::task::spawn_blocking(move || dedupe(&["-c", &config, "routes", "--json"], &[token]));
    let head = tokio::time::timeout(std::time::Duration::from_secs(20), reader)
        .await
        .unwrap()
        .unwrap();
    assert!(head.contains("Bearer the-operators-token"), "{head}");
    // The listener hung up without an answer: the command says so.
    assert_eq!(command.await.unwrap().status.code(), Some(1));
}

#[test]
fn an_admin_api_out_of_reach_is_said_so() {
    let port = free_port();
    let output = dedupe(&["routes", "--admin", &format!("127.0.0.1:{port}")], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("cannot reach the admin API"),
        "{}",
        stderr(&output)
    );
    let tls = dedupe(&["routes", "--admin", "https://127.0.0.1:9091"], &[]);
    assert_eq!(tls.status.code(), Some(2));
    assert!(stderr(&tls).contains("plain HTTP"));
}
