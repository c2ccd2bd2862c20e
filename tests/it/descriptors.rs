//! Open files: a proxy whose descriptor limit cannot carry its connection limits lowers
//! them at start (with a warning) instead of failing accepts with EMFILE under load, keeps
//! answering health probes under a flood of connections, and does not take the lowered
//! limits for a change of the file on reload.

use crate::support;

use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_descriptor_limit_lowers_the_connection_limits_and_probes_still_answer() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let rest = format!(
        "limits: {{ max_connections: 1024, max_requests: 1024 }}\n{}",
        json_route("")
    );
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), &rest),
    )
    .unwrap();
    let args = [
        "run".to_owned(),
        "-c".to_owned(),
        config.display().to_string(),
        "--log-format".to_owned(),
        "json".to_owned(),
    ];
    let proxy = Binary::spawn_wrapped(&["prlimit", "--nofile=512:512", "--"], &args, &[]);
    let lowered = proxy
        .log
        .lock()
        .unwrap()
        .iter()
        .find(|line| line.contains("open-file limit (512)"))
        .cloned()
        .unwrap_or_else(|| panic!("no warning: {}", proxy.log_text()));
    assert!(lowered.contains("lowered to 85 and 85"), "{lowered}");

    // Far more connections than the limit allows, each left open and idle.
    let mut held = Vec::new();
    for _ in 0..600 {
        match tokio::net::TcpStream::connect(proxy.addr).await {
            Ok(stream) => held.push(stream),
            Err(error) => panic!("connect: {error}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..5 {
        let probe = send(proxy.admin, "GET", "/healthz", &[], "").await;
        assert_eq!(probe.status, 200);
    }
    drop(held);
    assert_eq!(post_event(proxy.addr, "evt_fd").await.dedupe(), "forwarded");
    // The lowered limits serve; the file's stay the configuration, unchanged by a reload.
    let reloaded = admin_post(proxy.admin, "/v1/reload", "").await;
    assert_eq!(
        reloaded.json()["restart_needed"],
        serde_json::json!([]),
        "{}",
        reloaded.body
    );
    let log = proxy.log_text();
    assert!(!log.contains("Too many open files"), "EMFILE: {log}");
    assert!(!log.contains("accept failed"), "{log}");
}
