//! A claim's lease never ends while this proxy still handles its delivery: with an app that
//! answers at once but sends its body slowly (so that `duplicate_response.replay` waits for
//! it long after the status), retries meanwhile are in flight, held, or wait, and never
//! reach the app a second time; on every store, and whatever the route does with
//! duplicates in flight (respond, wait, hold).

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::*;

/// The lease, and how long the app takes to send its answer's body: four leases.
const LEASE: Duration = Duration::from_millis(300);
const BODY: &[u8] = b"{\"charged\":true,\"n\":1}";
const BODY_TIME: Duration = Duration::from_millis(1200);

/// An app that answers 200 at once, then sends the body a byte at a time over
/// [`BODY_TIME`]; it counts the requests it gets.
async fn slow_body_app() -> (SocketAddr, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let addr = raw_upstream(move |mut stream| {
        let counted = Arc::clone(&counted);
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let Some(head) = read_head(&mut stream).await else {
                return;
            };
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            let mut body = vec![0; length];
            let _ = stream.read_exact(&mut body).await;
            counted.fetch_add(1, Ordering::SeqCst);
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                BODY.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let pause = BODY_TIME / BODY.len() as u32;
            for byte in BODY {
                tokio::time::sleep(pause).await;
                if stream.write_all(&[*byte]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, requests)
}

/// The ways a route treats duplicates in flight, each with the answer replayed.
const MODES: [(&str, &str); 3] = [
    ("respond", "    on_in_flight: respond\n"),
    ("wait", "    on_in_flight: wait\n    in_flight_wait: 5s\n"),
    ("hold", "    on_ambiguous: hold\n"),
];

/// Runs every mode on `store` (a `store:` line; none: sled in a temporary directory).
async fn retries_never_run_twice(store: Option<&str>) {
    for (mode, settings) in MODES {
        let (app, requests) = slow_body_app().await;
        let data = tempfile::tempdir().unwrap();
        let route = json_route(&format!(
            "    lease: {}ms\n    upstream_timeout: 5s\n    duplicate_response: {{ replay: true }}\n{settings}",
            LEASE.as_millis()
        ));
        let sled = format!(
            "store: {{ sled: {{ path: \"{}\" }} }}",
            data.path().join("db").display()
        );
        let text = config_text(app, &data.path().join("db"), &route)
            .replace(&sled, store.unwrap_or(&sled));
        let store = store.unwrap_or("sled");
        let proxy = dedupe_proxy::start(parse_config(&text)).await.unwrap();
        let id = format!("evt_{mode}_{:08x}", rand::random::<u32>());
        let first = tokio::spawn({
            let (addr, id) = (proxy.proxy_addr, id.clone());
            async move { post_event(addr, &id).await }
        });
        let started = Instant::now();
        while requests.load(Ordering::SeqCst) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{mode}: no request"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Retries while the body is on its way, each after the first lease would have ended.
        let mut retries = Vec::new();
        while started.elapsed() < BODY_TIME - LEASE {
            tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
            retries.push(post_event(proxy.proxy_addr, &id).await);
        }
        let first = first.await.unwrap();
        assert_eq!((first.status, first.body.as_bytes()), (200, BODY), "{mode}");
        assert!(
            !retries.is_empty(),
            "{mode}: a retry was sent while the body came"
        );
        for retry in &retries {
            let expected = if mode == "wait" {
                "duplicate"
            } else {
                "in-flight"
            };
            assert_eq!(retry.dedupe(), expected, "{store} {mode}: {}", retry.body);
        }
        let replayed = post_event(proxy.proxy_addr, &id).await;
        assert_eq!(
            (replayed.dedupe(), replayed.body.as_bytes()),
            ("duplicate", BODY),
            "{mode}"
        );
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "{store} {mode}: the app ran the event once"
        );
        proxy.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sled_a_slow_answer_keeps_its_claim() {
    retries_never_run_twice(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_slow_answer_keeps_its_claim() {
    if !service_available("Redis", 6379).await {
        return;
    }
    let prefix = format!("dedupe-lease-{:08x}:", rand::random::<u32>());
    let store = format!("store: {{ redis: {{ url: \"{REDIS_URL}\", prefix: \"{prefix}\" }} }}");
    retries_never_run_twice(Some(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_slow_answer_keeps_its_claim() {
    if !service_available("PostgreSQL", 5432).await {
        return;
    }
    let table = format!("dedupe_lease_{:08x}", rand::random::<u32>());
    let store = format!("store: {{ postgres: {{ url: \"{POSTGRES_URL}\", table: {table} }} }}");
    retries_never_run_twice(Some(&store)).await;
    drop_postgres_tables(&table).await;
}

/// A store that does not answer renewals lets a lease end while its delivery still runs:
/// each failed renewal is counted and tried again sooner; once another delivery has taken
/// the key over, the next renewal finds it lost, which is counted apart (the event may
/// run twice, and `DedupeLeaseLost` fires on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_the_store_refuses_are_counted_and_a_lost_lease_is_told() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1500))]);
    let failing = Arc::new(AtomicBool::new(true));
    let switch = Arc::clone(&failing);
    let (proxy, _data) = proxy_on_store(
        &upstream,
        &json_route("    lease: 300ms\n    upstream_timeout: 5s\n"),
        move |inner| FailingStore {
            fail_renewals: switch,
            ..FailingStore::new(inner)
        },
    )
    .await;
    let first = tokio::spawn(post_event(proxy.proxy_addr, "evt_lost"));
    upstream.wait_for_requests(1).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    let takeover = post_event(proxy.proxy_addr, "evt_lost").await;
    assert_eq!(takeover.dedupe(), "forwarded", "the lease ended unrenewed");
    failing.store(false, Ordering::SeqCst);
    assert_eq!(first.await.unwrap().status, 200);
    let metrics = send(proxy.admin_addr, "GET", "/metrics", &[], "")
        .await
        .body;
    let count = |result: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| {
                line.strip_prefix(&format!(
                    "dedupe_lease_renewals_total{{result=\"{result}\"}} "
                ))
            })
            .map_or(0.0, |value| value.parse().unwrap())
    };
    assert!(count("failed") >= 2.0, "{metrics}");
    assert_eq!(count("lost"), 1.0, "{metrics}");
    proxy.shutdown().await.unwrap();
}
