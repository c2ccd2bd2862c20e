//! Queued delivery's promise under `kill -9` of the real binary: every event the proxy
//! acknowledged reaches the app at least once (or is in dead letters), whenever the proxy
//! dies: while accepting, while delivering, and between the app's success and the
//! job's completion, which is the one window in which the app sees an event twice, marked
//! as a retry by `Dedupe-Attempt`.

use crate::support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

/// A queued route whose attempts time out after 1 s: a job taken by a killed process is
/// due again 7 s later on a shared store (twice the timeout and 5 s); sled takes it back
/// at once when it reopens.
fn queued_route() -> String {
    json_route(
        "    delivery: queued\n    upstream_timeout: 1s\n    queue:\n      backoff_base: 50ms\n      backoff_cap: 200ms\n",
    )
}

/// The configuration file in `dir`: sled writes nothing to disk by itself for 30 s, so
/// that only what the proxy flushes on purpose survives a kill.
fn write_queued_config(dir: &std::path::Path, upstream: SocketAddr) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{upstream}\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ sled: {{ path: \"{}\", flush_every: 30s }} }}\n{}",
        dir.join("data").display(),
        queued_route()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Posts `{"id": id}` and says whether the proxy acknowledged it (202, or a duplicate of
/// an acknowledged one); a connection cut by a kill is no acknowledgment.
async fn try_post(addr: SocketAddr, id: &str) -> bool {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    let client: Client<_, Full<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("http://{addr}/hooks"))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(format!(r#"{{"id":"{id}"}}"#))))
        .unwrap();
    let Ok(Ok(response)) =
        tokio::time::timeout(Duration::from_secs(5), client.request(request)).await
    else {
        return false;
    };
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status == 202 || status == 200
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_the_apps_success_and_the_completion_delivers_again_as_a_retry() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(400))]);
    let dir = tempfile::tempdir().unwrap();
    let config = write_queued_config(dir.path(), upstream.addr);
    let mut proxy = Binary::start(&config);
    assert!(try_post(proxy.addr, "evt_window").await);
    upstream.wait_for_requests(1).await;
    // Frozen while the app works: its success goes into a socket nobody reads, and the
    // proxy dies without recording it.
    proxy.signal("STOP");
    eventually(Duration::from_secs(5), "the app did the work", || async {
        upstream.executions("evt_window") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.kill9();

    let restarted = Binary::start(&config);
    eventually(
        Duration::from_secs(10),
        "the event delivered again",
        || async { upstream.executions("evt_window") == 2 },
    )
    .await;
    let attempts: Vec<String> = upstream
        .received()
        .iter()
        .map(|r| r.headers["dedupe-attempt"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(attempts, ["1", "2"], "the app can tell the retry");
    // Completed now: nothing more arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(upstream.requests(), 2);
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_delivery_delivers_it_at_the_restart() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_secs(30))]);
    let dir = tempfile::tempdir().unwrap();
    let config = write_queued_config(dir.path(), upstream.addr);
    let mut proxy = Binary::start(&config);
    assert!(try_post(proxy.addr, "evt_cut").await);
    upstream.wait_for_requests(1).await;
    proxy.kill9();
    let _restarted = Binary::start(&config);
    eventually(
        Duration::from_secs(5),
        "delivered after the restart",
        || async { upstream.executions("evt_cut") == 1 },
    )
    .await;
    assert_eq!(upstream.received()[1].headers["dedupe-attempt"], "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_right_after_the_acknowledgments_loses_none_of_them() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_queued_config(dir.path(), upstream.addr);
    let mut proxy = Binary::start(&config);
    // Nothing is taken (and so nothing flushed by a take) while the route is paused.
    let paused = admin_post(proxy.admin, "/v1/queue/hooks/pause", "").await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    let ids: Vec<String> = (0..20).map(|n| format!("evt_{n}")).collect();
    for id in &ids {
        assert!(try_post(proxy.addr, id).await);
    }
    proxy.kill9();
    let restarted = Binary::start(&config);
    assert_eq!(upstream.requests(), 0, "still paused after the restart");
    let resumed = admin_post(restarted.admin, "/v1/queue/hooks/resume", "").await;
    assert_eq!(resumed.status, 200);
    eventually(Duration::from_secs(10), "all 20 delivered", || async {
        ids.iter().all(|id| upstream.executions(id) == 1)
    })
    .await;
}

/// What the senders saw: the events acknowledged.
#[derive(Default)]
struct Acknowledged(Mutex<HashSet<String>>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_event_is_lost_when_the_proxy_is_killed_again_and_again() {
    let upstream = Arc::new(Upstream::start().await);
    // A flaky app: errors, dropped connections and slow answers among the successes.
    let flaky = (0..400).map(|n| match n % 10 {
        0 => Answer::status(500),
        3 => Answer::abort(),
        6 => Answer::ok().after(Duration::from_millis(300)),
        _ => Answer::ok(),
    });
    upstream.script(flaky);
    let dir = tempfile::tempdir().unwrap();
    let config = write_queued_config(dir.path(), upstream.addr);
    let addr = Arc::new(Mutex::new(Binary::start(&config)));
    let acknowledged = Arc::new(Acknowledged::default());
    let events = 200;
    let mut senders = Vec::new();
    for sender in 0..8 {
        let (addr, acknowledged) = (Arc::clone(&addr), Arc::clone(&acknowledged));
        senders.push(tokio::spawn(async move {
            for n in (sender..events).step_by(8) {
                let id = format!("evt_{n}");
                // Like GitHub: one try. An unacknowledged event is the sender's to lose.
                let target = addr.lock().unwrap().addr;
                if try_post(target, &id).await {
                    acknowledged.0.lock().unwrap().insert(id);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let mut proxy = addr.lock().unwrap();
        proxy.kill9();
        *proxy = Binary::start(&config);
    }
    for sender in senders {
        sender.await.unwrap();
    }
    let acknowledged = acknowledged.0.lock().unwrap().clone();
    assert!(
        acknowledged.len() > events / 2,
        "most were acknowledged: {}",
        acknowledged.len()
    );
    eventually(
        Duration::from_secs(30),
        "every acknowledged event delivered",
        || async { acknowledged.iter().all(|id| upstream.executions(id) >= 1) },
    )
    .await;
    let extra: usize = acknowledged
        .iter()
        .map(|id| upstream.executions(id).saturating_sub(1))
        .sum();
    eprintln!(
        "queued storm: {} acknowledged of {events}, lost 0, delivered twice {extra}",
        acknowledged.len()
    );
    drop(addr);
}
