//! Operating the proxy: metrics, the resolved routes, live reload (POST, SIGHUP, a file
//! change, a ConfigMap-style symlink swap), what a reload cannot change, the logs, and
//! the worker threads (how many, and each with upstream connections of its own).

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dedupe_proxy::config::{Config, Overrides};
use support::*;

/// A configuration file in `dir` with the given routes, in front of `upstream`.
fn write_file(path: &Path, upstream: std::net::SocketAddr, data: &Path, rest: &str) {
    std::fs::write(path, config_text(upstream, data, rest)).unwrap();
}

fn route(name: &str, path: &str) -> String {
    format!(
        "  - name: {name}\n    match: {{ method: POST, path: {path} }}\n    key: \"{{json:/id}}\"\n"
    )
}

/// The proxy started in-process from a real file, so that it can reload it.
async fn start_from_file(path: &Path) -> dedupe_proxy::App {
    let config = Config::load(path, &Overrides::default()).unwrap();
    dedupe_proxy::start(config).await.unwrap()
}

/// An upstream, and the proxy in front of it started from a configuration file that a
/// test then rewrites.
struct Reloadable {
    upstream: Upstream,
    dir: tempfile::TempDir,
    app: dedupe_proxy::App,
}

impl Reloadable {
    async fn start(upstream: Upstream, rest: &str) -> Reloadable {
        let dir = tempfile::tempdir().unwrap();
        write_file(
            &dir.path().join("config.yaml"),
            upstream.addr,
            &dir.path().join("data"),
            rest,
        );
        let app = start_from_file(&dir.path().join("config.yaml")).await;
        Reloadable { upstream, dir, app }
    }

    /// Writes a new configuration over the same store.
    fn rewrite(&self, rest: &str) {
        write_file(
            &self.dir.path().join("config.yaml"),
            self.upstream.addr,
            &self.dir.path().join("data"),
            rest,
        );
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }
}

/// Writes one request on a kept-alive connection and reads its whole answer (by its
/// `content-length`).
async fn exchange(stream: &mut tokio::net::TcpStream, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(read > 0, "the connection was closed");
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
    }
}

#[tokio::test]
async fn metrics_count_what_happened() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok(), Answer::status(500)]);
    let proxy = Proxy::start(upstream.addr, &json_route("    retention: 1s\n")).await;
    post_event(proxy.addr, "evt_1").await;
    post_event(proxy.addr, "evt_1").await;
    post_json(proxy.addr, "/hooks", r#"{"id":"evt_1","changed":true}"#).await;
    post_event(proxy.addr, "evt_2").await;
    send(proxy.addr, "GET", "/elsewhere", &[], "").await;
    eventually(
        Duration::from_secs(5),
        "the sweep removes the expired key",
        || async {
            let text = scrape(proxy.admin).await;
            text.contains("dedupe_sweep_removed_total 1")
        },
    )
    .await;

    let reply = send(proxy.admin, "GET", "/metrics", &[], "").await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = reply.body;
    // The sweep that removed it succeeded within the last seconds.
    let swept_at = series_value(&text, "dedupe_sweep_last_success_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 10.0..=now + 1.0).contains(&swept_at),
        "{swept_at} at {now}"
    );
    assert_eq!(
        series_value(
            &text,
            r#"dedupe_requests_total{route="hooks",outcome="forwarded"}"#
        ),
        1.0
    );
    assert_eq!(
        series_value(
            &text,
            r#"dedupe_requests_total{route="hooks",outcome="duplicate"}"#
        ),
        2.0
    );
    assert_eq!(
        series_value(
            &text,
            r#"dedupe_requests_total{route="hooks",outcome="released"}"#
        ),
        1.0
    );
    assert_eq!(
        series_value(
            &text,
            r#"dedupe_requests_total{route="(unmatched)",outcome="unmatched"}"#
        ),
        1.0
    );
    assert_eq!(
        series_value(
            &text,
            r#"dedupe_upstream_duration_seconds_count{route="hooks"}"#
        ),
        2.0
    );
    assert_eq!(
        series_value(
            &text,
            r#"dedupe_claims_released_total{route="hooks",reason="upstream_status"}"#
        ),
        1.0
    );
    assert_eq!(
        series_value(&text, r#"dedupe_payload_mismatch_total{route="hooks"}"#),
        1.0
    );
    assert_eq!(series_value(&text, "dedupe_store_errors_total"), 0.0);
    assert_eq!(
        series_value(&text, r#"dedupe_store_keys{state="in_flight"}"#),
        0.0
    );
    assert_eq!(
        series_value(&text, r#"dedupe_store_keys{state="done"}"#),
        0.0,
        "the one done key was swept"
    );
    assert!(text.ends_with("# EOF\n"));
}

#[tokio::test]
async fn metrics_and_probes_stay_open_when_a_token_guards_v1() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: DEDUPE_OPS_TOKEN }}\n{}",
        json_route("")
    );
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), &rest),
    )
    .unwrap();
    let proxy = tokio::task::spawn_blocking(move || {
        Binary::start_with_env(&config, &[("DEDUPE_OPS_TOKEN", "t0ken")])
    })
    .await
    .unwrap();
    assert_eq!(
        send(proxy.admin, "GET", "/metrics", &[], "").await.status,
        200
    );
    assert_eq!(
        send(proxy.admin, "GET", "/v1/routes", &[], "").await.status,
        401
    );
    assert_eq!(admin_post(proxy.admin, "/v1/reload", "").await.status, 401);
    let routes = send(
        proxy.admin,
        "GET",
        "/v1/routes",
        &[("authorization", "Bearer t0ken")],
        "",
    )
    .await;
    assert_eq!(routes.status, 200);
    assert!(
        !proxy.log_text().contains("t0ken"),
        "the token must never be logged"
    );
}

#[tokio::test]
async fn the_resolved_routes_are_listed() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!(
            "defaults: {{ retention: 3d }}\n{}",
            json_route("    lease: 1m\n")
        ),
    )
    .await;
    let reply = send(proxy.admin, "GET", "/v1/routes", &[], "").await;
    assert_eq!(reply.status, 200);
    let body = reply.json();
    let route = &body["routes"][0];
    assert_eq!(route["name"], "hooks");
    assert_eq!(route["key"], "{json:/id}");
    assert_eq!(route["retention"], "3d");
    assert_eq!(route["lease"], "1m");
    assert_eq!(route["match"]["path"], "/hooks");
    assert_eq!(body["unmatched"], "forward");
}

#[tokio::test]
async fn post_reload_applies_new_routes_and_refuses_invalid_files() {
    let proxy = Reloadable::start(
        Upstream::start().await,
        &format!("routes:\n{}", route("a", "/a")),
    )
    .await;
    let (addr, admin) = (proxy.app.proxy_addr, proxy.app.admin_addr);
    assert_eq!(
        post_json(addr, "/b", r#"{"id":"e1"}"#).await.dedupe(),
        "<none>"
    );

    proxy.rewrite(&format!(
        "routes:\n{}{}",
        route("a", "/a"),
        route("b", "/b")
    ));
    let reloaded = admin_post(admin, "/v1/reload", "").await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);
    assert_eq!(reloaded.json()["routes"], 2);
    assert_eq!(reloaded.json()["restart_needed"], serde_json::json!([]));
    assert_eq!(
        post_json(addr, "/b", r#"{"id":"e1"}"#).await.dedupe(),
        "forwarded"
    );

    let invalid =
        "upstream: http://127.0.0.1:1\nroutes:\n  - name: a\n    match: { path: /a }\n    kee: x\n";
    std::fs::write(proxy.path(), invalid).unwrap();
    let refused = admin_post(admin, "/v1/reload", "").await;
    assert_eq!(refused.status, 422);
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("config.yaml:5:5: routes[0]: unknown field `kee`"),
        "{detail}"
    );
    // The running routes stay.
    assert_eq!(
        post_json(addr, "/b", r#"{"id":"e1"}"#).await.dedupe(),
        "duplicate"
    );
    let text = scrape(admin).await;
    assert_eq!(
        series_value(&text, r#"dedupe_config_reloads_total{result="failure"}"#),
        1.0
    );
    assert_eq!(
        series_value(&text, "dedupe_config_last_reload_successful"),
        0.0
    );
    // Mended, reloaded: the gauge says so.
    proxy.rewrite(&format!("routes:\n{}", route("a", "/a")));
    assert_eq!(admin_post(admin, "/v1/reload", "").await.status, 200);
    let text = scrape(admin).await;
    assert_eq!(
        series_value(&text, "dedupe_config_last_reload_successful"),
        1.0
    );
    proxy.app.shutdown().await.unwrap();
}

#[tokio::test]
async fn settings_that_need_a_restart_are_reported() {
    let proxy = Reloadable::start(Upstream::start().await, &json_route("")).await;
    let rest = format!(
        "limits: {{ max_connections: 7 }}\nshutdown_grace: 3s\n{}",
        json_route("")
    );
    write_file(
        &proxy.path(),
        proxy.upstream.addr,
        &proxy.dir.path().join("elsewhere"),
        &rest,
    );
    let reloaded = admin_post(proxy.app.admin_addr, "/v1/reload", "").await;
    assert_eq!(reloaded.status, 200);
    assert_eq!(
        reloaded.json()["restart_needed"],
        serde_json::json!(["store", "limits", "shutdown_grace"])
    );
    proxy.app.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_reload_keeps_connections_and_in_flight_deliveries() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok(), Answer::ok().after(Duration::from_millis(600))]);
    let proxy = Reloadable::start(upstream, &format!("routes:\n{}", route("a", "/a"))).await;
    let (addr, admin) = (proxy.app.proxy_addr, proxy.app.admin_addr);
    // A keep-alive connection opened before the reload, used once before and once after.
    let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{{\"id\":\"k\"}}")
    };
    assert!(
        exchange(&mut kept, &request("/a"))
            .await
            .starts_with("HTTP/1.1 200")
    );
    let in_flight = tokio::spawn(post_json(addr, "/a", r#"{"id":"slow"}"#));
    proxy.upstream.wait_for_requests(2).await;
    // The route the delivery matched disappears while it is in flight.
    proxy.rewrite(&format!("routes:\n{}", route("b", "/b")));
    assert_eq!(admin_post(admin, "/v1/reload", "").await.status, 200);
    let answer = in_flight.await.unwrap();
    assert_eq!((answer.status, answer.dedupe()), (200, "forwarded"));
    let after = exchange(&mut kept, &request("/b")).await;
    assert!(after.starts_with("HTTP/1.1 200"), "{after}");
    assert!(
        after.contains("dedupe-status: forwarded"),
        "the new route answers on the old connection: {after}"
    );
    proxy.app.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_changed_file_is_reloaded_by_itself() {
    let proxy = Reloadable::start(
        Upstream::start().await,
        &format!("routes:\n{}", route("a", "/a")),
    )
    .await;
    proxy.rewrite(&format!("routes:\n{}", route("b", "/b")));
    let addr = proxy.app.proxy_addr;
    eventually(
        Duration::from_secs(5),
        "the new route is in force",
        || async { post_json(addr, "/b", r#"{"id":"w1"}"#).await.dedupe() != "<none>" },
    )
    .await;
    proxy.app.shutdown().await.unwrap();
}

/// Lays out a directory the way the kubelet mounts a ConfigMap: `config.yaml` is a
/// symlink through `..data`, itself a symlink to a timestamped directory.
fn configmap_version(dir: &Path, version: &str, text: &str) {
    configmap_swap(dir, version, |file| std::fs::write(file, text).unwrap());
}

/// A ConfigMap version whose `config.yaml` `make` lays down (a file, or anything else).
fn configmap_swap(dir: &Path, version: &str, make: impl FnOnce(&Path)) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir(&versioned).unwrap();
    make(&versioned.join("config.yaml"));
    let staged = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &staged).unwrap();
    std::fs::rename(&staged, dir.join("..data")).unwrap();
    let link = dir.join("config.yaml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/config.yaml", &link).unwrap();
    }
}

#[tokio::test]
async fn a_configmap_update_is_reloaded() {
    let upstream = Upstream::start().await;
    let mount = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("db");
    configmap_version(
        mount.path(),
        "v1",
        &config_text(
            upstream.addr,
            &db,
            &format!("routes:\n{}", route("a", "/a")),
        ),
    );
    let app = start_from_file(&mount.path().join("config.yaml")).await;
    assert_eq!(
        post_json(app.proxy_addr, "/a", r#"{"id":"c1"}"#)
            .await
            .dedupe(),
        "forwarded"
    );
    configmap_version(
        mount.path(),
        "v2",
        &config_text(
            upstream.addr,
            &db,
            &format!("routes:\n{}", route("b", "/b")),
        ),
    );
    eventually(
        Duration::from_secs(5),
        "the ConfigMap's new routes are in force",
        || async {
            post_json(app.proxy_addr, "/b", r#"{"id":"c2"}"#)
                .await
                .dedupe()
                == "forwarded"
        },
    )
    .await;
    assert_eq!(
        post_json(app.proxy_addr, "/a", r#"{"id":"c3"}"#)
            .await
            .dedupe(),
        "<none>"
    );
    app.shutdown().await.unwrap();
}

/// A ConfigMap's file swapped for a FIFO, a directory or a half-written file is refused
/// (the running routes stay), and neither port stops answering meanwhile: the binary
/// once read a FIFO on a worker thread and stopped both. A whole, valid version after
/// them is put in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_swaps_of_the_file_keep_the_routes_and_both_ports_answering() {
    let upstream = Upstream::start().await;
    let mount = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let text = |routes: &str| config_text(upstream.addr, &data.path().join("db"), routes);
    configmap_version(
        mount.path(),
        "v1",
        &text(&format!("routes:\n{}", route("a", "/a"))),
    );
    let proxy = Binary::start(&mount.path().join("config.yaml"));
    let mut n = 0;
    let mut both_answer = async |what: &str| {
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            n += 1;
            let probe = send(proxy.admin, "GET", "/healthz", &[], "").await;
            assert_eq!(probe.status, 200, "{what}");
            let delivery = post_json(proxy.addr, "/a", &format!(r#"{{"id":"h{n}"}}"#)).await;
            assert_eq!(delivery.dedupe(), "forwarded", "{what}: the route stays");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    both_answer("the first version").await;
    let mkfifo = |file: &Path| {
        let made = std::process::Command::new("mkfifo")
            .arg(file)
            .status()
            .unwrap();
        assert!(made.success());
    };
    configmap_swap(mount.path(), "v2", mkfifo);
    both_answer("a FIFO in its place").await;
    let started = Instant::now();
    let json = [("content-type", "application/json")];
    let reload = send(proxy.admin, "POST", "/v1/reload", &json, "").await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reload.status, 422, "{}", reload.body);
    assert!(
        reload.body.contains("not a regular file"),
        "{}",
        reload.body
    );
    configmap_swap(mount.path(), "v3", |file| {
        std::fs::create_dir(file).unwrap()
    });
    both_answer("a directory in its place").await;
    let half = text(&format!("routes:\n{}", route("b", "/b")));
    let half = &half[..half.len() - 12];
    configmap_version(mount.path(), "v4", half);
    both_answer("a half-written file").await;
    configmap_version(
        mount.path(),
        "v5",
        &text(&format!("routes:\n{}", route("b", "/b"))),
    );
    eventually(
        Duration::from_secs(5),
        "the whole new version is in force",
        || async { post_json(proxy.addr, "/b", r#"{"id":"w1"}"#).await.dedupe() == "forwarded" },
    )
    .await;
    let log = proxy.log_text();
    assert!(log.contains("not a regular file"), "{log}");
    assert_eq!(log.matches("configuration reloaded").count(), 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_binary_and_logs_say_what_happened_without_secrets() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("config.yaml");
    let data = dir.path().join("data");
    write_file(
        &path,
        upstream.addr,
        &data,
        &format!("routes:\n{}", route("a", "/a")),
    );
    let config = path.clone();
    let mut proxy = tokio::task::spawn_blocking(move || Binary::start(&config))
        .await
        .unwrap();
    let secret_body = r#"{"id":"evt_log","card":"4242424242424242"}"#;
    assert_eq!(
        post_json(proxy.addr, "/a", secret_body).await.dedupe(),
        "forwarded"
    );

    // An invalid file first: logged with its location, the routes stay.
    std::fs::write(&path, "upstream: [\n").unwrap();
    proxy.signal("HUP");
    eventually(
        Duration::from_secs(5),
        "the failed reload is logged",
        || async { proxy.log_text().contains("configuration reload failed") },
    )
    .await;
    assert!(
        proxy.log_text().contains("config.yaml:"),
        "{}",
        proxy.log_text()
    );
    assert_eq!(
        post_json(proxy.addr, "/a", secret_body).await.dedupe(),
        "duplicate"
    );

    write_file(
        &path,
        upstream.addr,
        &data,
        &format!("routes:\n{}", route("b", "/b")),
    );
    proxy.signal("HUP");
    eventually(
        Duration::from_secs(5),
        "the new route is in force",
        || async {
            post_json(proxy.addr, "/b", r#"{"id":"evt_b"}"#)
                .await
                .dedupe()
                == "forwarded"
        },
    )
    .await;

    let log = proxy.log_text();
    let delivery = proxy
        .log_entry("delivery answered")
        .expect("a delivery line");
    assert_eq!(delivery["span"]["route"], "a");
    assert_eq!(delivery["span"]["key"], "evt_log");
    assert_eq!(delivery["fields"]["outcome"], "forwarded");
    assert_eq!(delivery["fields"]["status"], 200);
    assert_eq!(delivery["span"]["upstream_status"], 200);
    assert!(delivery["fields"]["elapsed_ms"].is_number());
    assert!(!log.contains("4242424242424242"), "bodies are never logged");
    proxy.signal("TERM");
    assert_eq!(proxy.wait(Duration::from_secs(10)).code(), Some(0));
    assert!(proxy.log_text().contains("dedupe-proxy stopped"));
}

/// How many worker threads the binary runs, counted by their names in /proc.
fn worker_threads(proxy: &Binary) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", proxy.child.id()))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("comm")).ok())
        .filter(|name| name.starts_with("dedupe-worker-"))
        .count()
}

/// The `workers` field of the binary's ready line.
fn logged_workers(proxy: &Binary) -> u64 {
    proxy
        .log_entry("dedupe-proxy ready")
        .and_then(|entry| entry["fields"]["workers"].as_u64())
        .expect("the ready line names its workers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_count_follows_the_flag_the_environment_or_the_cpus() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    write_file(
        &path,
        upstream.addr,
        &dir.path().join("data"),
        &format!("routes:\n{}", route("a", "/a")),
    );
    let config = path.display().to_string();
    let args = |extra: &[&str]| -> Vec<String> {
        ["run", "-c", &config, "--log-format", "json"]
            .iter()
            .chain(extra)
            .map(|arg| arg.to_string())
            .collect()
    };
    let cpus = std::thread::available_parallelism().unwrap().get();
    // The flag wins over the environment, which wins over the CPU count.
    let env_two = [("DEDUPE_PROXY_WORKERS", "2")];
    let env_one = [("DEDUPE_PROXY_WORKERS", "1")];
    for (case, (args, env, expected)) in [
        (args(&[]), &[][..], cpus),
        (args(&["--workers", "3"]), &env_two[..], 3),
        (args(&[]), &env_one[..], 1),
    ]
    .into_iter()
    .enumerate()
    {
        let env = env.to_vec();
        let proxy = tokio::task::spawn_blocking(move || Binary::spawn(&args, &env))
            .await
            .unwrap();
        assert_eq!(logged_workers(&proxy), expected as u64);
        assert_eq!(worker_threads(&proxy), expected);
        for event in 0..4 {
            let id = format!(r#"{{"id":"evt_{case}_{event}"}}"#);
            assert_eq!(post_json(proxy.addr, "/a", &id).await.dedupe(), "forwarded");
        }
    }

    let refused = std::process::Command::new(binary_path())
        .args(args(&["--workers", "0"]))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--workers"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// Each worker forwards on upstream connections of its own, so that a delivery never
/// wakes another thread: deliveries taking turns on two sender connections (one per
/// worker) reach the app on two connections, where a pool shared by the workers would
/// use one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_forwards_on_upstream_connections_of_its_own() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;

    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    let upstream = raw_upstream(move |mut stream| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            while let Some(head) = read_head(&mut stream).await {
                assert!(head.to_ascii_lowercase().contains("content-length: 12\r\n"));
                let mut body = [0u8; 12];
                tokio::io::AsyncReadExt::read_exact(&mut stream, &mut body)
                    .await
                    .unwrap();
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if stream.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(upstream, &dir.path().join("db"), &json_route(""));
    let overrides = Overrides {
        workers: std::num::NonZeroUsize::new(2),
        ..Overrides::default()
    };
    let config = Config::parse(&text, Path::new("test.yaml"), &overrides).unwrap();
    let app = dedupe_proxy::start(config).await.unwrap();

    // Accepted one after the other, the two connections go to the two workers in turn.
    let mut senders = [
        tokio::net::TcpStream::connect(app.proxy_addr)
            .await
            .unwrap(),
        tokio::net::TcpStream::connect(app.proxy_addr)
            .await
            .unwrap(),
    ];
    for event in 0..12 {
        let body = format!(r#"{{"id":"e{event:02}"}}"#);
        assert_eq!(body.len(), 12);
        let request = format!(
            "POST /hooks HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{body}"
        );
        let answer = exchange(&mut senders[event % 2], &request).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // Time for the upstream connection to be free again before the next delivery.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    app.shutdown().await.unwrap();
}

/// Every series of a route is exported at zero before its first event, so that `rate()`
/// and alerts have a series to read: at start, and for a route a reload adds.
#[tokio::test]
async fn every_route_has_its_series_before_its_first_event() {
    let proxy = Reloadable::start(
        Upstream::start().await,
        &format!("routes:\n{}", route("a", "/a")),
    )
    .await;
    let admin = proxy.app.admin_addr;
    let text = scrape(admin).await;
    for series in [
        r#"dedupe_claims_released_total{route="a",reason="upstream_status"}"#,
        r#"dedupe_claims_released_total{route="a",reason="upstream_timeout"}"#,
        r#"dedupe_payload_mismatch_total{route="a"}"#,
        r#"dedupe_requests_total{route="a",outcome="duplicate"}"#,
        r#"dedupe_config_reloads_total{result="failure"}"#,
        "dedupe_store_errors_total",
    ] {
        assert_eq!(series_value(&text, series), 0.0, "{series}");
    }
    proxy.rewrite(&format!(
        "routes:\n{}{}    verify: {{ hmac: {{ secret_env: PATH, header: X-Signature }} }}\n",
        route("a", "/a"),
        route("b", "/b")
    ));
    assert_eq!(admin_post(admin, "/v1/reload", "").await.status, 200);
    let text = scrape(admin).await;
    for series in [
        r#"dedupe_claims_released_total{route="b",reason="upstream_unreachable"}"#,
        r#"dedupe_signatures_refused_total{route="b",reason="signature_mismatch"}"#,
        r#"dedupe_signatures_refused_total{route="b",reason="missing_signature"}"#,
        r#"dedupe_payload_mismatch_total{route="b"}"#,
    ] {
        assert_eq!(series_value(&text, series), 0.0, "{series}");
    }
    proxy.app.shutdown().await.unwrap();
}

/// A route without a signature check cannot join a signed route's scope, at start or on
/// reload: through it, anyone could mark a real event's ID done first, and the real event
/// would be dropped as its duplicate. The reload is refused, the forgery reaches no claim,
/// and the real event runs.
#[tokio::test]
async fn a_reload_cannot_put_an_unchecked_route_in_a_signed_routes_scope() {
    use hmac::{KeyInit, Mac};
    let signed = "routes:\n  - name: signed\n    match: { method: POST, path: /signed }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Reloadable::start(Upstream::start().await, signed).await;
    let (addr, admin) = (proxy.app.proxy_addr, proxy.app.admin_addr);
    proxy.rewrite(&format!(
        "{signed}  - name: test\n    match: {{ method: POST, path: /test }}\n    key: \"{{json:/id}}\"\n    scope: signed\n"
    ));
    let refused = admin_post(admin, "/v1/reload", "").await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("shares the scope `signed` with route `signed`"),
        "{detail}"
    );
    let body = r#"{"id":"evt_real"}"#;
    let forged = post_json(addr, "/test", body).await;
    assert_eq!(forged.dedupe(), "<none>", "no route took the forgery");
    let secret = std::env::var("PATH").unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    let headers = [
        ("content-type", "application/json"),
        ("x-signature", signature.as_str()),
    ];
    let real = send(addr, "POST", "/signed", &headers, body).await;
    assert_eq!((real.status, real.dedupe()), (200, "forwarded"));
    proxy.app.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_reload_turns_queued_delivery_on_and_off_and_refuses_a_bad_queue() {
    let queued = |extra: &str| {
        format!(
            "routes:\n{}    delivery: queued\n    queue: {{ backoff_base: 50ms, backoff_cap: 100ms{extra} }}\n",
            route("a", "/a")
        )
    };
    let proxy = Reloadable::start(
        Upstream::start().await,
        &format!("routes:\n{}", route("a", "/a")),
    )
    .await;
    let (addr, admin) = (proxy.app.proxy_addr, proxy.app.admin_addr);
    assert_eq!(
        post_json(addr, "/a", r#"{"id":"e1"}"#).await.dedupe(),
        "forwarded"
    );

    proxy.rewrite(&queued(""));
    assert_eq!(admin_post(admin, "/v1/reload", "").await.status, 200);
    let accepted = post_json(addr, "/a", r#"{"id":"e2"}"#).await;
    assert_eq!((accepted.status, accepted.dedupe()), (202, "queued"));
    proxy.upstream.wait_for_requests(2).await;

    proxy.rewrite(&queued(", max_attempts: 0"));
    let refused = admin_post(admin, "/v1/reload", "").await;
    assert_eq!(refused.status, 422);
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("`max_attempts` must be from 1 to 1000"),
        "{detail}"
    );
    // Still queued, as before the refused file.
    assert_eq!(
        post_json(addr, "/a", r#"{"id":"e3"}"#).await.dedupe(),
        "queued"
    );
    proxy.upstream.wait_for_requests(3).await;

    proxy.rewrite(&format!("routes:\n{}", route("a", "/a")));
    assert_eq!(admin_post(admin, "/v1/reload", "").await.status, 200);
    assert_eq!(
        post_json(addr, "/a", r#"{"id":"e4"}"#).await.dedupe(),
        "forwarded"
    );
    // The queue's endpoints know the route no longer queues.
    let paused = admin_post(admin, "/v1/queue/a/pause", "").await;
    assert_eq!(paused.json()["error"], "not_queued");
}

#[tokio::test]
async fn reloads_while_queued_deliveries_run_keep_them_within_max_concurrency() {
    let upstream = Upstream::start().await;
    upstream.script(std::iter::repeat_n(
        Answer::ok().after(Duration::from_millis(300)),
        12,
    ));
    let queued = "    delivery: queued\n    queue: { max_concurrency: 2 }\n";
    let proxy =
        Reloadable::start(upstream, &format!("routes:\n{}{queued}", route("a", "/a"))).await;
    let (addr, admin) = (proxy.app.proxy_addr, proxy.app.admin_addr);
    for n in 0..12 {
        let reply = post_json(addr, "/a", &format!(r#"{{"id":"e{n}"}}"#)).await;
        assert_eq!(reply.status, 202);
    }
    // Reloads that leave the route as it was, and one that adds another route.
    for extra in ["", "", &route("b", "/b")] {
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.rewrite(&format!("routes:\n{}{queued}{extra}", route("a", "/a")));
        assert_eq!(admin_post(admin, "/v1/reload", "").await.status, 200);
    }
    eventually(Duration::from_secs(10), "all delivered", || async {
        proxy.upstream.total_executions() == 12
    })
    .await;
    assert_eq!(proxy.upstream.most_running(), 2);
}

/// A reload asked right after the file is saved meets the watcher's read of it (which
/// starts 200 ms after the save): it waits for that read instead of failing as if the
/// filesystem hung (the console's Reload button, pressed after an edit, failed so now and
/// then). Many routes make each read long enough to meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_asked_as_the_watcher_reads_the_file_waits_for_it() {
    let upstream = Upstream::start().await;
    let many: String = (0..1500)
        .map(|n| route(&format!("r{n}"), &format!("/r{n}")))
        .collect();
    let proxy = Reloadable::start(upstream, &format!("routes:\n{many}")).await;
    let admin = proxy.app.admin_addr;
    for round in 0..12u64 {
        let extra = if round % 2 == 0 {
            route("b", "/b")
        } else {
            String::new()
        };
        proxy.rewrite(&format!("routes:\n{many}{extra}"));
        tokio::time::sleep(Duration::from_millis(190 + round * 10)).await;
        let reloaded = admin_post(admin, "/v1/reload", "").await;
        assert_eq!(reloaded.status, 200, "round {round}: {}", reloaded.body);
        assert_eq!(reloaded.json()["routes"], 1501 - round % 2, "round {round}");
    }
}
