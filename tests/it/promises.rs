//! The promises 1 to 6 (`docs/contract.md`), each by a test that fails if the promise breaks:
//! nothing lost, one at a time, done only on success, release on failure, and
//! independence from the sender. (Crash safety, promise 5, is in `crash.rs`.)

use crate::support;

use std::time::Duration;

use support::*;
use tokio::task::JoinSet;

#[tokio::test]
async fn sequential_duplicates_run_the_work_once() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let outcomes: Vec<String> = {
        let mut outcomes = Vec::new();
        for _ in 0..5 {
            let reply = post_event(proxy.addr, "evt_seq").await;
            assert_eq!(reply.status, 200);
            outcomes.push(reply.dedupe().to_owned());
        }
        outcomes
    };
    assert_eq!(
        outcomes,
        [
            "forwarded",
            "duplicate",
            "duplicate",
            "duplicate",
            "duplicate"
        ]
    );
    assert_eq!(upstream.executions("evt_seq"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_50_identical_deliveries_runs_the_work_once() {
    let upstream = Upstream::start().await;
    // Slow enough that the storm arrives while the first delivery is in flight.
    upstream.script([Answer::ok().after(Duration::from_millis(300))]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let mut storm = JoinSet::new();
    for _ in 0..50 {
        storm.spawn(post_event(proxy.addr, "evt_storm"));
    }
    let mut outcomes = std::collections::HashMap::<String, usize>::new();
    while let Some(reply) = storm.join_next().await {
        *outcomes
            .entry(reply.unwrap().dedupe().to_owned())
            .or_default() += 1;
    }
    assert_eq!(outcomes.get("forwarded"), Some(&1), "{outcomes:?}");
    assert_eq!(
        outcomes.get("in-flight").unwrap_or(&0) + outcomes.get("duplicate").unwrap_or(&0),
        49,
        "{outcomes:?}"
    );
    assert_eq!(upstream.requests(), 1);
    assert_eq!(upstream.executions("evt_storm"), 1);
    assert_eq!(upstream.most_running(), 1, "one delivery at a time per key");
}

/// A failed attempt must reach the sender as a failure and leave the event retryable:
/// the provider's retry is forwarded and does the work exactly once.
async fn failure_then_retry(first: Answer, extra: &str) -> (Reply, Reply, Upstream) {
    let upstream = Upstream::start().await;
    upstream.script([first, Answer::ok()]);
    let proxy = Proxy::start(upstream.addr, &json_route(extra)).await;
    let failed = post_event(proxy.addr, "evt_r").await;
    let retried = post_event(proxy.addr, "evt_r").await;
    let again = post_event(proxy.addr, "evt_r").await;
    assert_eq!(again.dedupe(), "duplicate");
    (failed, retried, upstream)
}

#[tokio::test]
async fn a_500_releases_and_the_retry_runs_the_work() {
    let (failed, retried, upstream) = failure_then_retry(Answer::status(500), "").await;
    assert_eq!((failed.status, failed.dedupe()), (500, "released"));
    assert_eq!((retried.status, retried.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.executions("evt_r"), 1);
}

#[tokio::test]
async fn a_4xx_releases_and_the_retry_runs_the_work() {
    let (failed, retried, upstream) = failure_then_retry(Answer::status(422), "").await;
    assert_eq!((failed.status, failed.dedupe()), (422, "released"));
    assert_eq!((retried.status, retried.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.executions("evt_r"), 1);
}

#[tokio::test]
async fn a_dropped_connection_releases_and_the_retry_runs_the_work() {
    let (failed, retried, upstream) = failure_then_retry(Answer::abort(), "").await;
    assert_eq!((failed.status, failed.dedupe()), (502, "released"));
    assert_eq!((retried.status, retried.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.executions("evt_r"), 1);
}

#[tokio::test]
async fn a_timeout_releases_and_the_retry_is_forwarded() {
    let (failed, retried, upstream) = failure_then_retry(
        Answer::ok().after(Duration::from_millis(700)),
        "    upstream_timeout: 200ms\n",
    )
    .await;
    assert_eq!((failed.status, failed.dedupe()), (504, "released"));
    assert_eq!((retried.status, retried.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn a_refused_connection_releases_and_the_retry_runs_the_work() {
    let address = dead_address().await;
    let proxy = Proxy::start(address, &json_route("")).await;
    let failed = post_event(proxy.addr, "evt_r").await;
    assert_eq!((failed.status, failed.dedupe()), (502, "released"));
    // The application comes up on that address; the provider retries.
    let upstream = Upstream::start_on(address).await;
    let retried = post_event(proxy.addr, "evt_r").await;
    assert_eq!((retried.status, retried.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.executions("evt_r"), 1);
}

#[tokio::test]
async fn nothing_but_an_upstream_success_is_answered_with_success() {
    // Every failure kind, in turn, for distinct events: never a 2xx to the sender.
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(500),
        Answer::status(503),
        Answer::status(404),
        Answer::status(302),
        Answer::abort(),
        Answer::ok().after(Duration::from_millis(600)),
    ]);
    let proxy = Proxy::start(upstream.addr, &json_route("    upstream_timeout: 200ms\n")).await;
    for event in 0..6 {
        let reply = post_event(proxy.addr, &format!("evt_{event}")).await;
        assert!(
            !(200..300).contains(&reply.status),
            "event {event}: {reply:?}"
        );
        assert_eq!(reply.dedupe(), "released", "event {event}");
    }
    assert_eq!(
        upstream.total_executions(),
        0,
        "only the slow one completed, after its timeout"
    );
}

#[tokio::test]
async fn a_sender_that_hangs_up_cancels_nothing() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(500))]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let body = r#"{"id":"evt_hangup"}"#;
    {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let request = format!(
            "POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        upstream.wait_for_requests(1).await;
        // The sender hangs up while the upstream is still working.
    }
    eventually(
        Duration::from_secs(5),
        "the upstream finishes its work",
        || async { upstream.executions("evt_hangup") == 1 },
    )
    .await;
    // The outcome was recorded: the provider's retry is a duplicate, not a second run.
    eventually(Duration::from_secs(5), "the key is done", || async {
        post_json(proxy.addr, "/hooks", body).await.dedupe() == "duplicate"
    })
    .await;
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn done_keys_expire_after_their_retention() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("    retention: 1s\n")).await;
    assert_eq!(
        post_event(proxy.addr, "evt_ttl").await.dedupe(),
        "forwarded"
    );
    assert_eq!(
        post_event(proxy.addr, "evt_ttl").await.dedupe(),
        "duplicate"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        post_event(proxy.addr, "evt_ttl").await.dedupe(),
        "forwarded"
    );
    assert_eq!(upstream.executions("evt_ttl"), 2);
}

/// A claim's lease is renewed while its delivery runs: a retry that comes long after the
/// lease would have ended, while the app is still at work, is in flight, not run again.
#[tokio::test]
async fn a_lease_is_renewed_while_its_delivery_runs() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(200).after(Duration::from_millis(1500))]);
    let proxy = Proxy::start(
        upstream.addr,
        &json_route("    lease: 300ms\n    upstream_timeout: 5s\n"),
    )
    .await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_lease"));
    upstream.wait_for_requests(1).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            post_event(proxy.addr, "evt_lease").await.dedupe(),
            "in-flight",
            "the lease was renewed"
        );
    }
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(upstream.most_running(), 1);
    assert_eq!(
        post_event(proxy.addr, "evt_lease").await.dedupe(),
        "duplicate"
    );
    assert_eq!(upstream.executions("evt_lease"), 1);
}
