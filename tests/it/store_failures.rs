//! Real store failures: a data directory on a small tmpfs that fills up, and a read-only
//! one. They need root (to mount); elsewhere they are skipped with a message.
//! The same rows are also tested with an injected failure in `flow.rs`.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::*;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(options: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .output()
            .is_ok_and(|output| output.status.success());
        if !mounted {
            eprintln!("skipped: mounting a tmpfs needs root (this test fills a real disk)");
            return None;
        }
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the file system to the last byte.
    fn fill(&self) -> PathBuf {
        let filler = self.path().join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display()))
            .output();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// How many new events a full-disk test sends at most before the store must have failed.
const MOST_EVENTS: usize = 20_000;

async fn proxy_on(upstream: &Upstream, data: &Path, extra: &str) -> dedupe_proxy::App {
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ sled: {{ path: \"{}\", durability: fsync }} }}\n{}",
        upstream.addr,
        data.join("db").display(),
        json_route(extra)
    );
    dedupe_proxy::start(parse_config(&text)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_gets_503s_and_the_store_recovers_when_space_returns() {
    let Some(disk) = Tmpfs::mount("size=4m") else {
        return;
    };
    let upstream = Upstream::start().await;
    let app = proxy_on(&upstream, disk.path(), "    retry_after: 2s\n").await;
    assert_eq!(
        post_event(app.proxy_addr, "evt_before").await.dedupe(),
        "forwarded"
    );

    let filler = disk.fill();
    // sled writes into log segments it has already allocated until it needs a new one,
    // so a full disk shows only after some records: send until it does.
    let (mut refused, mut sent) = (0, 0);
    while refused < 10 && sent < MOST_EVENTS {
        let event = sent;
        sent += 1;
        let before = upstream.requests();
        let reply = post_event(app.proxy_addr, &format!("evt_full_{event}")).await;
        match (reply.status, reply.dedupe()) {
            (503, "unavailable") => {
                refused += 1;
                assert_eq!(reply.header("retry-after"), Some("2"));
                assert_eq!(upstream.requests(), before, "a 503 forwards nothing");
            }
            // The claim went through before sled noticed; the app's success is relayed
            // even if the done mark could not be written.
            (200, "forwarded") => assert_eq!(upstream.requests(), before + 1),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(
        refused >= 10,
        "the full disk must show: {refused} of {sent} refused"
    );

    std::fs::remove_file(filler).unwrap();
    eventually(
        Duration::from_secs(15),
        "the store recovers once there is room",
        || async { post_event(app.proxy_addr, "evt_after").await.dedupe() == "forwarded" },
    )
    .await;
    assert_eq!(
        post_event(app.proxy_addr, "evt_after").await.dedupe(),
        "duplicate"
    );
    assert_eq!(
        post_event(app.proxy_addr, "evt_before").await.dedupe(),
        "duplicate",
        "earlier keys survive"
    );
    app.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_forwards_unkeyed_when_the_route_prefers_availability() {
    let Some(disk) = Tmpfs::mount("size=4m") else {
        return;
    };
    let upstream = Upstream::start().await;
    let app = proxy_on(&upstream, disk.path(), "    on_store_error: forward\n").await;
    disk.fill();
    let (mut unkeyed, mut sent) = (0, 0);
    while unkeyed < 10 && sent < MOST_EVENTS {
        let reply = post_event(app.proxy_addr, &format!("evt_{sent}")).await;
        sent += 1;
        assert_eq!(reply.status, 200);
        unkeyed += usize::from(reply.dedupe() == "unkeyed");
    }
    assert!(unkeyed >= 10, "{unkeyed} of {sent} forwarded unkeyed");
    assert_eq!(upstream.requests(), sent);
}

#[tokio::test]
async fn a_read_only_data_directory_stops_the_start_with_a_clear_message() {
    let Some(disk) = Tmpfs::mount("size=1m,ro") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:9\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ sled: {{ path: \"{}\" }} }}\n",
        disk.path().join("db").display()
    );
    std::fs::write(&config, text).unwrap();
    let output = Command::new(binary_path())
        .args(["run", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot open data directory"), "{stderr}");
    assert!(stderr.contains("Read-only file system"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_queued_events_and_loses_none_it_acknowledged() {
    let Some(disk) = Tmpfs::mount("size=4m") else {
        return;
    };
    let upstream = Upstream::start().await;
    let app = proxy_on(&upstream, disk.path(), "    delivery: queued\n").await;
    // Paused: the jobs stay on the full disk until it has room again.
    let admin = app.admin_addr;
    assert_eq!(
        admin_post(admin, "/v1/queue/hooks/pause", "").await.status,
        200
    );
    let body = "x".repeat(2000);
    let (mut acknowledged, mut refused, mut sent) = (Vec::new(), 0, 0);
    let mut filler = None;
    while refused < 10 && sent < MOST_EVENTS {
        if sent == 20 {
            filler = Some(disk.fill());
        }
        let id = format!("evt_q_{sent}");
        sent += 1;
        let reply = post_json(
            app.proxy_addr,
            "/hooks",
            &format!(r#"{{"id":"{id}","pad":"{body}"}}"#),
        )
        .await;
        match (reply.status, reply.dedupe()) {
            (202, "queued") => acknowledged.push(id),
            (503, "unavailable") => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(
        refused >= 10,
        "the full disk must show: {refused} of {sent} refused"
    );
    assert!(acknowledged.len() >= 20);
    assert_eq!(upstream.requests(), 0);

    std::fs::remove_file(filler.unwrap()).unwrap();
    eventually(Duration::from_secs(15), "the store recovers", || async {
        admin_post(admin, "/v1/queue/hooks/resume", "").await.status == 200
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "every acknowledged event delivered",
        || async { acknowledged.iter().all(|id| upstream.executions(id) == 1) },
    )
    .await;
    // The counts were read again from the reopened database: nothing waits.
    eventually(Duration::from_secs(5), "the counts at zero", || async {
        let queue = send(admin, "GET", "/v1/queue", &[], "").await.json();
        let route = &queue["routes"][0];
        route["waiting"] == 0 && route["retrying"] == 0 && route["oldest_received_at"].is_null()
    })
    .await;
    eprintln!(
        "full disk: {} acknowledged, {refused} refused, all delivered",
        acknowledged.len()
    );
    app.shutdown().await.unwrap();
}
