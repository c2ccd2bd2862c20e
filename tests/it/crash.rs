//! Promise 5 (crash-safe) and shutdown, on the real binary: `kill -9` while a delivery
//! is in flight, SIGTERM with and without open forwards, durable done marks with
//! `durability: fsync`, and a second process on the same data directory.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupe_proxy::config::StoreConfig;
use dedupe_proxy::store::ClaimStore;
use dedupe_proxy::store::sled::SledStore;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_delivery_then_the_retry_is_forwarded_at_once() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_secs(30))]);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), upstream.addr, &json_route(""));
    let mut proxy = Binary::start(&config);
    let sender = tokio::spawn(post_event_fallible(proxy.addr, "evt_crash"));
    upstream.wait_for_requests(1).await;
    proxy.kill9();
    assert!(
        sender.await.unwrap().is_err(),
        "the sender saw the connection die, not a success"
    );

    let restarted = Binary::start(&config);
    let retry = post_event(restarted.addr, "evt_crash").await;
    assert_eq!(
        (retry.status, retry.dedupe()),
        (200, "forwarded"),
        "not held back by the dead claim"
    );
    assert_eq!(
        post_event(restarted.addr, "evt_crash").await.dedupe(),
        "duplicate"
    );
    assert_eq!(
        upstream.requests(),
        2,
        "at most one extra execution for the in-flight event"
    );
}

/// Like `post_event`, but a dropped connection is an `Err`, not a panic.
async fn post_event_fallible(addr: std::net::SocketAddr, id: &str) -> Result<u16, String> {
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    let client: Client<_, Full<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("http://{addr}/hooks"))
        .body(Full::new(bytes::Bytes::from(format!(r#"{{"id":"{id}"}}"#))))
        .unwrap();
    client
        .request(request)
        .await
        .map(|response| response.status().as_u16())
        .map_err(|error| error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_0_and_done_keys_survive_the_restart() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), upstream.addr, &json_route(""));
    let mut proxy = Binary::start(&config);
    assert_eq!(
        post_event(proxy.addr, "evt_term").await.dedupe(),
        "forwarded"
    );
    proxy.signal("TERM");
    let status = proxy.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "log:\n{}", proxy.log_text());
    assert!(proxy.log_text().contains("dedupe-proxy stopped"));

    let restarted = Binary::start(&config);
    assert_eq!(
        post_event(restarted.addr, "evt_term").await.dedupe(),
        "duplicate"
    );
    assert_eq!(upstream.executions("evt_term"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_is_a_clean_shutdown_too() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = Binary::start(&write_config(dir.path(), upstream.addr, &json_route("")));
    proxy.signal("INT");
    assert_eq!(proxy.wait(Duration::from_secs(10)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_forward_finish_and_record_its_outcome() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(800))]);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), upstream.addr, &json_route(""));
    let mut proxy = Binary::start(&config);
    let sender = tokio::spawn(post_event(proxy.addr, "evt_drain"));
    upstream.wait_for_requests(1).await;
    proxy.signal("TERM");
    let answer = sender.await.unwrap();
    assert_eq!((answer.status, answer.dedupe()), (200, "forwarded"));
    assert_eq!(proxy.wait(Duration::from_secs(10)).code(), Some(0));

    let restarted = Binary::start(&config);
    assert_eq!(
        post_event(restarted.addr, "evt_drain").await.dedupe(),
        "duplicate"
    );
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_is_bounded_and_open_claims_are_released() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_secs(5))]);
    let data = tempfile::tempdir().unwrap();
    let config = parse_config(&config_text(
        upstream.addr,
        &data.path().join("db"),
        &format!("shutdown_grace: 300ms\n{}", json_route("")),
    ));
    let StoreConfig::Sled(sled) = &config.store else {
        panic!("sled expected")
    };
    let store = Arc::new(SledStore::open(sled).unwrap());
    let app = dedupe_proxy::start_with_store(config, store.clone())
        .await
        .unwrap();
    let _sender = tokio::spawn(post_event_fallible(app.proxy_addr, "evt_slow"));
    upstream.wait_for_requests(1).await;
    assert!(
        store.inspect("hooks:evt_slow").await.unwrap().is_some(),
        "in flight"
    );
    let started = Instant::now();
    app.shutdown().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        store.inspect("hooks:evt_slow").await.unwrap(),
        None,
        "released at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fsync_a_done_mark_survives_kill_9_right_after_the_answer() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    // sled's own background flush is pushed out of the way: only fsync can save the marks.
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ sled: {{ path: \"{}\", durability: fsync, flush_every: 1h }} }}\n{}",
        upstream.addr,
        dir.path().join("data").display(),
        json_route("")
    );
    std::fs::write(&path, text).unwrap();
    let mut proxy = Binary::start(&path);
    for event in 0..20 {
        assert_eq!(
            post_event(proxy.addr, &format!("evt_{event}"))
                .await
                .dedupe(),
            "forwarded"
        );
    }
    proxy.kill9();
    let restarted = Binary::start(&path);
    for event in 0..20 {
        assert_eq!(
            post_event(restarted.addr, &format!("evt_{event}"))
                .await
                .dedupe(),
            "duplicate",
            "evt_{event}"
        );
    }
    assert_eq!(upstream.total_executions(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_data_directory_fails_clearly() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), upstream.addr, &json_route(""));
    let first = Binary::start(&config);
    let second = std::process::Command::new(binary_path())
        .args(["run", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use by another process"), "{stderr}");
    // The first one is unharmed.
    assert_eq!(post_event(first.addr, "evt_ok").await.dedupe(), "forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_does_not_kill_the_proxy() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = Binary::start(&write_config(dir.path(), upstream.addr, &json_route("")));
    proxy.signal("HUP");
    eventually(Duration::from_secs(5), "the SIGHUP is logged", || async {
        proxy.log_text().contains("SIGHUP received")
    })
    .await;
    assert_eq!(
        post_event(proxy.addr, "evt_hup").await.dedupe(),
        "forwarded"
    );
    proxy.signal("TERM");
    assert_eq!(proxy.wait(Duration::from_secs(10)).code(), Some(0));
}

/// Under `on_ambiguous: hold`, a forward still running when the shutdown grace ends may
/// have done its work: its key is held (and logged), not released, and stays held across
/// the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hold_a_forward_cut_short_by_shutdown_stays_held_across_the_restart() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_secs(5))]);
    let dir = tempfile::tempdir().unwrap();
    let route = json_route("    on_ambiguous: hold\n    upstream_timeout: 10s\n");
    let config = write_config(
        dir.path(),
        upstream.addr,
        &format!("shutdown_grace: 300ms\n{route}"),
    );
    let mut proxy = Binary::start(&config);
    let _sender = tokio::spawn(post_event_fallible(proxy.addr, "evt_cut"));
    upstream.wait_for_requests(1).await;
    proxy.signal("TERM");
    assert!(proxy.wait(Duration::from_secs(5)).success());
    let logged = proxy
        .log_entry("delivery held: the application may have done the work; nothing runs it again until an operator resolves the key (POST /v1/keys/{route}/{key}/resolve)")
        .unwrap_or_else(|| panic!("no log line: {}", proxy.log_text()));
    assert_eq!(logged["fields"]["reason"], "shutdown", "{logged}");
    assert_eq!(logged["fields"]["route"], "hooks", "{logged}");
    assert_eq!(logged["fields"]["key"], "hooks:evt_cut", "{logged}");

    let restarted = Binary::start(&config);
    let retry = post_event(restarted.addr, "evt_cut").await;
    assert_eq!((retry.status, retry.dedupe()), (409, "held"));
    assert_eq!(upstream.requests(), 1);
}

/// Under `on_ambiguous: hold`, a forward cut short by the shutdown before its request went
/// out (the app never took the connection) cannot have done the work: released, not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hold_a_forward_still_connecting_at_shutdown_is_released() {
    let (app_addr, _guard) = unanswering_address().await;
    let data = tempfile::tempdir().unwrap();
    let route = json_route("    on_ambiguous: hold\n    upstream_timeout: 10s\n");
    let config = parse_config(&config_text(
        app_addr,
        &data.path().join("db"),
        &format!("shutdown_grace: 300ms\n{route}"),
    ));
    let StoreConfig::Sled(sled) = &config.store else {
        panic!("sled expected")
    };
    let store = Arc::new(SledStore::open(sled).unwrap());
    let app = dedupe_proxy::start_with_store(config, store.clone())
        .await
        .unwrap();
    let _sender = tokio::spawn(post_event_fallible(app.proxy_addr, "evt_connecting"));
    eventually(
        Duration::from_secs(5),
        "the delivery is claimed",
        || async {
            store
                .inspect("hooks:evt_connecting")
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    app.shutdown().await.unwrap();
    assert_eq!(
        store.inspect("hooks:evt_connecting").await.unwrap(),
        None,
        "released at shutdown, not held"
    );
}

/// A delivery in flight is settled at shutdown under the route it started with: a reload
/// during the drain that renames its route (and drops `hold`) does not turn its hold into
/// a release that would run the event again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_the_drain_leaves_a_deliverys_settings_as_they_were() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_secs(6))]);
    let dir = tempfile::tempdir().unwrap();
    let route = json_route("    on_ambiguous: hold\n    upstream_timeout: 10s\n");
    let config = write_config(
        dir.path(),
        upstream.addr,
        &format!("shutdown_grace: 2s\n{route}"),
    );
    let mut proxy = Binary::start(&config);
    let _sender = tokio::spawn(post_event_fallible(proxy.addr, "evt_renamed"));
    upstream.wait_for_requests(1).await;
    proxy.signal("TERM");
    let renamed = json_route("").replace("name: hooks", "name: renamed");
    write_config(
        dir.path(),
        upstream.addr,
        &format!("shutdown_grace: 2s\n{renamed}"),
    );
    proxy.signal("HUP");
    eventually(Duration::from_secs(2), "the reload", || async {
        proxy.log_text().contains("configuration reloaded")
    })
    .await;
    assert!(proxy.wait(Duration::from_secs(10)).success());
    let logged = proxy
        .log_entry("delivery held: the application may have done the work; nothing runs it again until an operator resolves the key (POST /v1/keys/{route}/{key}/resolve)")
        .unwrap_or_else(|| panic!("no hold logged: {}", proxy.log_text()));
    assert_eq!(logged["fields"]["route"], "hooks", "{logged}");

    // Back under the route's first name, whose scope holds the key.
    write_config(dir.path(), upstream.addr, &route);
    let restarted = Binary::start(&config);
    let retry = post_event(restarted.addr, "evt_renamed").await;
    assert_eq!((retry.status, retry.dedupe()), (409, "held"));
    assert_eq!(upstream.requests(), 1);
}
