//! `on_in_flight: wait`: a delivery whose key another delivery holds waits for that
//! delivery's outcome and answers with it: the duplicate answer when it is done, its own
//! forward when it was released, the in-flight answer when the wait runs out, when too
//! many already wait, or at shutdown. A waiter whose sender hangs up is dropped.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::*;

fn waiting_route(extra: &str) -> String {
    json_route(&format!("    on_in_flight: wait\n{extra}"))
}

/// How many deliveries wait now, from the admin metrics.
async fn waiting(proxy: &Proxy) -> u64 {
    let text = send(proxy.admin, "GET", "/metrics", &[], "").await.body;
    text.lines()
        .find_map(|line| line.strip_prefix("dedupe_waiting_deliveries "))
        .expect("the metric is exposed")
        .parse()
        .unwrap()
}

async fn until_waiting(proxy: &Proxy, count: u64) {
    for _ in 0..500 {
        if waiting(proxy).await == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} deliveries never waited");
}

#[tokio::test]
async fn a_duplicate_in_flight_gets_the_duplicate_answer_as_soon_as_the_first_is_done() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201)
        .body("created")
        .after(Duration::from_millis(600))]);
    let proxy = Proxy::start(upstream.addr, &waiting_route("")).await;
    let first = tokio::spawn(async move {
        let reply = post_event(proxy.addr, "evt_1").await;
        (reply, Instant::now())
    });
    upstream.wait_for_requests(1).await;
    let second = post_event(proxy.addr, "evt_1").await;
    let answered = Instant::now();
    let (first, first_done) = first.await.unwrap();
    assert_eq!((first.status, first.dedupe()), (201, "forwarded"));
    assert_eq!(
        (second.status, second.dedupe()),
        (200, "duplicate"),
        "{}",
        second.body
    );
    assert_eq!(upstream.requests(), 1, "the work ran once");
    // Woken by the outcome, not by the store being looked at again every 250 ms.
    let late = answered.saturating_duration_since(first_done);
    assert!(
        late < Duration::from_millis(100),
        "answered {late:?} after the first"
    );
}

#[tokio::test]
async fn a_waiting_duplicate_of_a_released_delivery_forwards_itself() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(500)
            .body("boom")
            .after(Duration::from_millis(400)),
        Answer::status(201).body("second try"),
    ]);
    let proxy = Proxy::start(upstream.addr, &waiting_route("")).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let second = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (first.await.unwrap().status, second.status),
        (500, 201),
        "the first is relayed and released, the second runs the work"
    );
    assert_eq!(
        (second.dedupe(), second.body.as_str()),
        ("forwarded", "second try")
    );
    assert_eq!(upstream.requests(), 2);
    assert_eq!(post_event(proxy.addr, "evt_1").await.dedupe(), "duplicate");
}

#[tokio::test]
async fn a_wait_that_runs_out_gets_the_in_flight_answer() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1500))]);
    let route = waiting_route("    in_flight_wait: 300ms\n    retry_after: 7s\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let began = Instant::now();
    let second = post_event(proxy.addr, "evt_1").await;
    let waited = began.elapsed();
    assert_eq!((second.status, second.dedupe()), (409, "in-flight"));
    assert_eq!(second.header("retry-after"), Some("7"));
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1200),
        "waited {waited:?}"
    );
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 1);
}

/// A quarter of `max_requests` may wait, half of them on one route's scope: with 16, a
/// route takes 2 waiting places.
#[tokio::test]
async fn beyond_a_routes_share_of_the_waiting_places_duplicates_get_the_in_flight_answer_at_once() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1500))]);
    let route = format!(
        "limits: {{ max_requests: 16 }}\n{}",
        waiting_route("    in_flight_wait: 5s\n")
    );
    let proxy = Proxy::start(upstream.addr, &route).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let waiters: Vec<_> = (0..2)
        .map(|_| tokio::spawn(post_event(proxy.addr, "evt_1")))
        .collect();
    until_waiting(&proxy, 2).await;
    let began = Instant::now();
    let third = post_event(proxy.addr, "evt_1").await;
    assert_eq!((third.status, third.dedupe()), (409, "in-flight"));
    assert!(
        began.elapsed() < Duration::from_millis(500),
        "not kept waiting"
    );
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().dedupe(), "duplicate");
    }
    first.await.unwrap();
    assert_eq!(waiting(&proxy).await, 0);
}

/// A sender flooding one route with duplicates of an event in flight takes at most half
/// the waiting places: another route's duplicates still wait for their outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_duplicates_on_one_route_leaves_other_routes_room_to_wait() {
    let upstream = Upstream::start().await;
    let slow = || Answer::ok().after(Duration::from_millis(1500));
    upstream.script([slow(), slow()]);
    let routes = "limits: { max_requests: 16 }\nroutes:\n  - name: flooded\n    match: { path: /hooks }\n    key: \"{json:/id}\"\n    on_in_flight: wait\n    in_flight_wait: 5s\n  - name: other\n    match: { path: /other }\n    key: \"{json:/id}\"\n    on_in_flight: wait\n    in_flight_wait: 5s\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_flood"));
    upstream.wait_for_requests(1).await;
    let flood: Vec<_> = (0..6)
        .map(|_| tokio::spawn(post_event(proxy.addr, "evt_flood")))
        .collect();
    until_waiting(&proxy, 2).await;
    let addr = proxy.addr;
    let other = || post_json(addr, "/other", r#"{"id":"evt_other"}"#);
    let other_first = tokio::spawn(other());
    upstream.wait_for_requests(2).await;
    let other_duplicate = other().await;
    assert_eq!(
        (other_duplicate.status, other_duplicate.dedupe()),
        (200, "duplicate"),
        "waited for its own outcome: {}",
        other_duplicate.body
    );
    assert_eq!(other_first.await.unwrap().dedupe(), "forwarded");
    let mut outcomes = Vec::new();
    for duplicate in flood {
        outcomes.push(duplicate.await.unwrap().dedupe().to_owned());
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            "duplicate",
            "duplicate",
            "in-flight",
            "in-flight",
            "in-flight",
            "in-flight"
        ]
    );
    first.await.unwrap();
}

#[tokio::test]
async fn a_waiter_whose_sender_hangs_up_is_dropped() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1500))]);
    let proxy = Proxy::start(upstream.addr, &waiting_route("    in_flight_wait: 10s\n")).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let gone = tokio::spawn(post_event(proxy.addr, "evt_1"));
    until_waiting(&proxy, 1).await;
    gone.abort();
    until_waiting(&proxy, 0).await;
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn shutdown_answers_the_waiters_at_once() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1500))]);
    let mut proxy = Proxy::start(upstream.addr, &waiting_route("    in_flight_wait: 30s\n")).await;
    let addr = proxy.addr;
    let first = tokio::spawn(post_event(addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let waiter = tokio::spawn(async move {
        let reply = post_event(addr, "evt_1").await;
        (reply, Instant::now())
    });
    until_waiting(&proxy, 1).await;
    let began = Instant::now();
    proxy.shutdown().await;
    let (reply, answered) = waiter.await.unwrap();
    assert_eq!((reply.status, reply.dedupe()), (409, "in-flight"));
    assert!(
        answered.saturating_duration_since(began) < Duration::from_millis(500),
        "answered {:?} into the shutdown",
        answered.saturating_duration_since(began)
    );
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
}

/// With the replay guard, a new ID for a body whose delivery is in flight waits for that
/// delivery too, and looks at the store only when woken: the claim it gives back while
/// the body is in flight must not wake it again (a loop of claims until the wait ran out).
#[tokio::test]
async fn a_new_id_for_a_body_in_flight_waits_for_it_without_looping() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(800))]);
    let routes = "routes:\n  - name: hooks\n    match: { method: POST, path: /hooks }\n    key: \"{header:X-Event-Id}\"\n    replay_guard: body\n    on_in_flight: wait\n";
    let claims = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&claims);
    let (app, _data) = proxy_on_store(&upstream, routes, move |inner| FailingStore {
        claims: counted,
        ..FailingStore::new(inner)
    })
    .await;
    let addr = app.proxy_addr;
    let body = r#"{"id":"evt_1","amount":5}"#;
    let first = tokio::spawn(send(addr, "POST", "/hooks", &[("x-event-id", "a")], body));
    upstream.wait_for_requests(1).await;
    let before = claims.load(Ordering::SeqCst);
    let second = send(addr, "POST", "/hooks", &[("x-event-id", "b")], body).await;
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
    assert_eq!(
        (second.status, second.dedupe()),
        (200, "duplicate"),
        "{}",
        second.body
    );
    assert_eq!(upstream.requests(), 1);
    // Two claims per look (the event key, then the body); a look at once, about three
    // rechecks in 800 ms, one on the outcome.
    let looks = (claims.load(Ordering::SeqCst) - before) / 2;
    assert!(looks <= 8, "{looks} looks at the store while waiting");
    app.shutdown().await.unwrap();
}

/// A store failing while a delivery waits must not forward it (`on_store_error: forward`
/// would run the work a second time beside the first): it waits on, and gets the in-flight
/// answer when the wait ends.
#[tokio::test]
async fn a_store_failing_during_the_wait_forwards_no_duplicate() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1500))]);
    let routes = json_route(
        "    on_in_flight: wait\n    in_flight_wait: 600ms\n    on_store_error: forward\n",
    );
    // The first delivery's claim and the second's first claim succeed; the rest fail.
    let (app, _data) = proxy_on_store(&upstream, &routes, |inner| FailingStore {
        fail_claims_after: Some(2),
        ..FailingStore::new(inner)
    })
    .await;
    let addr = app.proxy_addr;
    let first = tokio::spawn(post_event(addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let second = post_event(addr, "evt_1").await;
    assert_eq!((second.status, second.dedupe()), (409, "in-flight"));
    assert_eq!(upstream.requests(), 1, "nothing forwarded beside the first");
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
    app.shutdown().await.unwrap();
}

/// When the first delivery is released, of several waiting duplicates exactly one claims
/// the key and forwards; the others wait on for its outcome and get the duplicate answer.
#[tokio::test]
async fn of_several_waiters_of_a_released_delivery_one_forwards_and_the_others_get_its_outcome() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(500).after(Duration::from_millis(400)),
        Answer::status(201)
            .body("second try")
            .after(Duration::from_millis(200)),
    ]);
    let proxy = Proxy::start(upstream.addr, &waiting_route("")).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let waiters: Vec<_> = (0..3)
        .map(|_| tokio::spawn(post_event(proxy.addr, "evt_1")))
        .collect();
    assert_eq!(first.await.unwrap().status, 500);
    let mut outcomes = Vec::new();
    for waiter in waiters {
        outcomes.push(waiter.await.unwrap().dedupe().to_owned());
    }
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "duplicate", "forwarded"]);
    assert_eq!(
        upstream.requests(),
        2,
        "the work ran once more, not three times"
    );
}
