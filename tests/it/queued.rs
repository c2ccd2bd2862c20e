//! Queued delivery (`delivery: queued`) on the embedded store, through a real proxy and a
//! real upstream: acknowledged once stored, delivered in the background with retries,
//! dead letters listed, inspected, replayed and discarded, pause and resume, the limits
//! on concurrency and rate, and jobs taken ahead of a place.

use crate::support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::*;

/// A queued route on `POST /hooks` keyed by `{json:/id}`, with fast retries and `extra`
/// lines under `queue:`.
fn queued(extra: &str) -> String {
    json_route(&format!(
        "    delivery: queued\n    upstream_timeout: 2s\n    queue:\n      backoff_base: 50ms\n      backoff_cap: 200ms\n{extra}"
    ))
}

async fn dead_letters(proxy: &Proxy, query: &str) -> serde_json::Value {
    let reply = admin(proxy, "GET", &format!("/v1/queue/hooks/dead{query}"), "").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

async fn wait_for_dead(proxy: &Proxy, count: usize) {
    eventually(Duration::from_secs(10), "dead letters", || async {
        dead_letters(proxy, "").await["jobs"]
            .as_array()
            .unwrap()
            .len()
            >= count
    })
    .await;
}

async fn wait_for_no_dead(proxy: &Proxy, within: Duration) {
    eventually(within, "no dead letters", || async {
        dead_letters(proxy, "").await["jobs"]
            .as_array()
            .unwrap()
            .is_empty()
    })
    .await;
}

#[tokio::test]
async fn an_accepted_event_is_acknowledged_then_delivered_once() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;

    let reply = post_event(proxy.addr, "evt_1").await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    assert_eq!(reply.dedupe(), "queued");
    assert_eq!(reply.json()["queued"], true);
    upstream.wait_for_requests(1).await;
    let received = &upstream.received()[0];
    assert_eq!(received.headers["dedupe-attempt"], "1");
    assert_eq!(received.headers["dedupe-key"], "evt_1");
    let received_at = received.headers["dedupe-received-at"].to_str().unwrap();
    assert!(
        humantime::parse_rfc3339(received_at).is_ok(),
        "{received_at}"
    );
    assert_eq!(received.body.as_ref(), br#"{"id":"evt_1","type":"test"}"#);

    // A duplicate, before and after the delivery, is answered as one.
    let again = post_event(proxy.addr, "evt_1").await;
    assert_eq!((again.status, again.dedupe()), (200, "duplicate"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream.requests(), 1);
    // Delivered: no job is left.
    let job = admin(&proxy, "GET", "/v1/queue/hooks/jobs/evt_1", "").await;
    assert_eq!(job.status, 404, "{}", job.body);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_sender_cannot_set_the_attempt_headers() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;
    let reply = send(
        proxy.addr,
        "POST",
        "/hooks",
        &[
            ("content-type", "application/json"),
            ("dedupe-attempt", "7"),
            ("dedupe_received_at", "1999-01-01T00:00:00Z"),
        ],
        r#"{"id":"evt_spoof"}"#,
    )
    .await;
    assert_eq!(reply.status, 202);
    upstream.wait_for_requests(1).await;
    let headers = &upstream.received()[0].headers;
    assert_eq!(headers.get_all("dedupe-attempt").iter().count(), 1);
    assert_eq!(headers["dedupe-attempt"], "1");
    assert!(headers.get("dedupe_received_at").is_none());
    assert!(
        !headers["dedupe-received-at"]
            .to_str()
            .unwrap()
            .starts_with("1999")
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn failures_are_retried_until_the_app_succeeds() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(503),
        Answer::abort(),
        Answer::status(500),
        Answer::status(429),
    ]);
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;
    assert_eq!(post_event(proxy.addr, "evt_r").await.status, 202);
    eventually(Duration::from_secs(5), "evt_r run", || async {
        upstream.executions("evt_r") == 1
    })
    .await;
    let attempts: Vec<String> = upstream
        .received()
        .iter()
        .map(|r| r.headers["dedupe-attempt"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(attempts, ["1", "2", "3", "4", "5"]);
    assert_eq!(upstream.executions("evt_r"), 1);
    eventually(Duration::from_secs(5), "the job completed", || async {
        admin(&proxy, "GET", "/v1/queue/hooks/jobs/evt_r", "")
            .await
            .status
            == 404
    })
    .await;
    let metrics = scrape(proxy.admin).await;
    assert_eq!(
        series_value(
            &metrics,
            r#"dedupe_queue_attempts_total{route="hooks",result="retried"}"#
        ),
        4.0
    );
    assert_eq!(
        series_value(
            &metrics,
            r#"dedupe_queue_attempts_total{route="hooks",result="delivered"}"#
        ),
        1.0
    );
    assert_eq!(
        series_value(
            &metrics,
            r#"dedupe_queue_delivery_seconds_count{route="hooks"}"#
        ),
        1.0
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn retry_after_holds_the_next_attempt_back() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(429).header("retry-after", "1")]);
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;
    assert_eq!(post_event(proxy.addr, "evt_ra").await.status, 202);
    upstream.wait_for_requests(1).await;
    let first = Instant::now();
    // Without Retry-After the backoff (at most 50 ms) would have retried already.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(upstream.requests(), 1);
    upstream.wait_for_requests(2).await;
    assert!(first.elapsed() >= Duration::from_millis(900));
    proxy.shutdown().await;
}

/// Dead letters are discarded once past `queue.dead_retention`, and counted so: a sender
/// whose events the app refuses cannot fill the queue for good.
#[tokio::test]
async fn dead_letters_past_their_retention_are_discarded() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(422), Answer::status(422)]);
    let mut proxy = Proxy::start(upstream.addr, &queued("      dead_retention: 3s\n")).await;
    assert_eq!(post_event(proxy.addr, "evt_old").await.status, 202);
    wait_for_dead(&proxy, 1).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(post_event(proxy.addr, "evt_new").await.status, 202);
    eventually(
        Duration::from_secs(10),
        "the new one dead, the old one discarded",
        || async {
            let jobs = dead_letters(&proxy, "").await["jobs"].clone();
            jobs.as_array().unwrap().len() == 1 && jobs[0]["key"] == "evt_new"
        },
    )
    .await;
    let metrics = admin(&proxy, "GET", "/metrics", "").await.body;
    assert!(
        metrics.contains(r#"dedupe_queue_dead_expired_total{route="hooks"} 1"#),
        "{metrics}"
    );
    wait_for_no_dead(&proxy, Duration::from_secs(10)).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_refusal_goes_to_dead_letters_which_are_inspected_replayed_and_discarded() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(422).body(r#"{"error":"unknown customer"}"#),
        Answer::status(410),
    ]);
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;
    assert_eq!(post_event(proxy.addr, "evt_a").await.status, 202);
    wait_for_dead(&proxy, 1).await;
    assert_eq!(post_event(proxy.addr, "evt_b").await.status, 202);
    wait_for_dead(&proxy, 2).await;
    // Refused at once: one attempt each.
    assert_eq!(upstream.requests(), 2);

    let listed = dead_letters(&proxy, "?status=422").await;
    let jobs = listed["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{listed}");
    assert_eq!(jobs[0]["key"], "evt_a");
    assert_eq!(jobs[0]["dead_because"], "refused");
    assert_eq!(jobs[0]["last_status"], 422);
    assert_eq!(
        dead_letters(&proxy, "?key_prefix=evt_b").await["jobs"][0]["last_status"],
        410
    );

    let job = admin(&proxy, "GET", "/v1/queue/hooks/jobs/evt_a", "").await;
    assert_eq!(job.status, 200);
    let job = job.json();
    assert_eq!(job["state"], "dead");
    assert_eq!(job["history"][0]["status"], 422);
    assert_eq!(
        job["history"][0]["answer"],
        r#"{"error":"unknown customer"}"#
    );
    assert_eq!(job["request"]["method"], "POST");
    assert_eq!(job["request"]["target"], "/hooks");

    // The duplicate of a dead event is still a duplicate: dead letters are replayed by
    // an operator, not by whoever resends.
    let again = post_event(proxy.addr, "evt_a").await;
    assert_eq!(again.dedupe(), "duplicate");

    let replayed = admin(&proxy, "POST", "/v1/queue/hooks/jobs/evt_a/replay", "").await;
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    eventually(Duration::from_secs(5), "evt_a run", || async {
        upstream.executions("evt_a") == 1
    })
    .await;
    let received = upstream.received();
    assert_eq!(received[2].headers["dedupe-attempt"], "2");

    let discarded = admin(&proxy, "DELETE", "/v1/queue/hooks/jobs/evt_b", "").await;
    assert_eq!(discarded.status, 204, "{}", discarded.body);
    assert_eq!(
        admin(&proxy, "DELETE", "/v1/queue/hooks/jobs/evt_b", "")
            .await
            .status,
        404
    );
    wait_for_no_dead(&proxy, Duration::from_secs(5)).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn max_attempts_ends_in_dead_letters_and_a_bulk_replay_brings_them_back() {
    let upstream = Upstream::start().await;
    upstream.script(std::iter::repeat_n(Answer::status(500), 6));
    let mut proxy = Proxy::start(upstream.addr, &queued("      max_attempts: 2\n")).await;
    for id in ["evt_1", "evt_2", "evt_3"] {
        assert_eq!(post_event(proxy.addr, id).await.status, 202);
    }
    wait_for_dead(&proxy, 3).await;
    assert_eq!(upstream.requests(), 6);
    let listed = dead_letters(&proxy, "?reason=max_attempts&limit=2").await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2);
    let next = listed["next"].as_str().unwrap().to_owned();
    let rest = dead_letters(
        &proxy,
        &format!("?reason=max_attempts&after={}", percent(&next)),
    )
    .await;
    assert_eq!(rest["jobs"].as_array().unwrap().len(), 1);
    assert!(rest["next"].is_null());

    let started = admin(
        &proxy,
        "POST",
        "/v1/queue/hooks/replays?key_prefix=evt_",
        "",
    )
    .await;
    assert_eq!(started.status, 202, "{}", started.body);
    let id = started.json()["id"].as_u64().unwrap();
    eventually(Duration::from_secs(5), "the replay ended", || async {
        let replay = admin(&proxy, "GET", &format!("/v1/replays/{id}"), "")
            .await
            .json();
        replay["state"] == "done" && replay["replayed"] == 3
    })
    .await;
    eventually(Duration::from_secs(5), "each event run once", || async {
        ["evt_1", "evt_2", "evt_3"]
            .iter()
            .all(|id| upstream.executions(id) == 1)
    })
    .await;
    assert_eq!(upstream.requests(), 9);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_paused_route_keeps_accepting_and_delivers_on_resume() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;
    let paused = admin(&proxy, "POST", "/v1/queue/hooks/pause", "").await;
    assert_eq!(
        (paused.status, paused.json()["paused"].clone()),
        (200, true.into())
    );
    for id in 0..5 {
        assert_eq!(
            post_event(proxy.addr, &format!("evt_{id}")).await.status,
            202
        );
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(upstream.requests(), 0);
    let overview = admin(&proxy, "GET", "/v1/queue", "").await.json();
    assert_eq!(overview["routes"][0]["paused"], true);
    assert_eq!(overview["routes"][0]["waiting"], 5);
    assert!(overview["routes"][0]["oldest_received_at"].is_string());

    assert_eq!(
        admin(&proxy, "POST", "/v1/queue/hooks/resume", "")
            .await
            .status,
        200
    );
    upstream.wait_for_requests(5).await;
    eventually(Duration::from_secs(5), "an empty queue", || async {
        let overview = admin(&proxy, "GET", "/v1/queue", "").await.json();
        overview["routes"][0]["waiting"] == 0
            && overview["routes"][0]["oldest_received_at"].is_null()
    })
    .await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn max_concurrency_bounds_the_deliveries_in_flight() {
    let upstream = Upstream::start().await;
    upstream.script(std::iter::repeat_n(
        Answer::ok().after(Duration::from_millis(200)),
        12,
    ));
    let mut proxy = Proxy::start(upstream.addr, &queued("      max_concurrency: 3\n")).await;
    for id in 0..12 {
        assert_eq!(
            post_event(proxy.addr, &format!("evt_{id}")).await.status,
            202
        );
    }
    upstream.wait_for_requests(12).await;
    eventually(Duration::from_secs(5), "every delivery done", || async {
        upstream.total_executions() == 12
    })
    .await;
    assert_eq!(upstream.most_running(), 3);
    proxy.shutdown().await;
}

/// The `Dedupe-Attempt` of each request the app got, by event ID.
fn attempts_by_key(upstream: &Upstream) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut attempts = std::collections::BTreeMap::<String, Vec<String>>::new();
    for received in upstream.received() {
        let key = received.headers["dedupe-key"].to_str().unwrap().to_owned();
        let attempt = received.headers["dedupe-attempt"].to_str().unwrap();
        attempts.entry(key).or_default().push(attempt.to_owned());
    }
    attempts
}

#[tokio::test]
async fn jobs_taken_ahead_of_a_place_are_put_back_unsent_by_a_pause() {
    let upstream = Upstream::start().await;
    let gate = tokio_util::sync::CancellationToken::new();
    upstream.script([Answer::ok().until(&gate), Answer::ok().until(&gate)]);
    let dir = tempfile::tempdir().unwrap();
    // A timeout no slow machine reaches while the two attempts are held.
    let routes = json_route(
        "    delivery: queued\n    upstream_timeout: 30s\n    queue:\n      max_concurrency: 2\n",
    );
    let (app, queue) = start_counting(&upstream, &dir.path().join("db"), &routes, 0).await;
    for id in 0..6 {
        assert_eq!(
            post_event(app.proxy_addr, &format!("evt_{id}"))
                .await
                .status,
            202
        );
    }
    // Two attempts held by the app, two more jobs taken ahead, waiting for their places.
    upstream.wait_for_requests(2).await;
    eventually(Duration::from_secs(5), "two jobs taken ahead", || async {
        queue.taken.load(Ordering::SeqCst) == 4
    })
    .await;
    let paused = admin_post(app.admin_addr, "/v1/queue/hooks/pause", "").await;
    assert_eq!(paused.status, 200);
    gate.cancel();
    eventually(Duration::from_secs(5), "both put back", || async {
        queue.released.load(Ordering::SeqCst) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream.requests(), 2, "nothing sent after the pause");

    let resumed = admin_post(app.admin_addr, "/v1/queue/hooks/resume", "").await;
    assert_eq!(resumed.status, 200);
    upstream.wait_for_requests(6).await;
    let attempts = attempts_by_key(&upstream);
    assert_eq!(attempts.len(), 6, "{attempts:?}");
    // A take put back unsent does not count.
    assert!(attempts.values().all(|a| a == &["1"]), "{attempts:?}");
    app.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_job_without_a_place_within_2_s_of_its_take_is_put_back_unsent() {
    let upstream = Upstream::start().await;
    // Far longer than a job taken ahead waits for its place, within the timeout.
    upstream.script([
        Answer::ok().after(Duration::from_millis(6000)),
        Answer::ok().after(Duration::from_millis(4000)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (app, queue) = running_one_and_one_ahead(&upstream, &dir, "10s").await;
    eventually(Duration::from_secs(10), "evt_a answered", || async {
        upstream.total_executions() == 1
    })
    .await;
    upstream.wait_for_requests(2).await;
    let attempts = attempts_by_key(&upstream);
    assert_eq!((attempts["evt_a"].len(), attempts["evt_b"].len()), (1, 1));
    assert_eq!(
        queue.released.load(Ordering::SeqCst),
        1,
        "evt_b put back once"
    );
    // Put back when its 2 s ran out, then taken for the free place, not ahead again.
    assert_eq!(queue.taken.load(Ordering::SeqCst), 3);
    // After attempts that slow, nothing is taken ahead while evt_b's runs.
    assert_eq!(post_event(app.proxy_addr, "evt_c").await.status, 202);
    // (The app counts evt_b done before it answers, so before evt_c can be taken.)
    while upstream.total_executions() < 2 {
        assert_eq!(queue.taken.load(Ordering::SeqCst), 3, "evt_c taken ahead");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    upstream.wait_for_requests(3).await;
    assert_eq!(attempts_by_key(&upstream)["evt_c"], ["1"]);
    assert_eq!(queue.released.load(Ordering::SeqCst), 1);
    assert_eq!(upstream.most_running(), 1);
    app.shutdown().await.unwrap();
}

/// A shutdown gives back the jobs taken ahead at once (unsent, their takes uncounted),
/// rather than leaving them hidden until their visibility ends.
#[tokio::test]
async fn a_shutdown_gives_back_the_jobs_taken_ahead() {
    let upstream = Upstream::start().await;
    let gate = tokio_util::sync::CancellationToken::new();
    upstream.script([Answer::ok().until(&gate)]);
    let dir = tempfile::tempdir().unwrap();
    let (app, queue) = running_one_and_one_ahead(&upstream, &dir, "30s").await;
    let stopping = tokio::spawn(app.shutdown());
    // evt_a's attempt is still held by the app: evt_b went back without waiting for it.
    eventually(Duration::from_secs(5), "evt_b given back", || async {
        queue.released.load(Ordering::SeqCst) == 1
    })
    .await;
    gate.cancel();
    stopping.await.unwrap().unwrap();
    assert_eq!(upstream.requests(), 1, "evt_b was never sent");
}

#[tokio::test]
async fn rate_spaces_the_deliveries_out() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(upstream.addr, &queued("      rate: 10\n      burst: 1\n")).await;
    let pause = admin(&proxy, "POST", "/v1/queue/hooks/pause", "").await;
    assert_eq!(pause.status, 200);
    for id in 0..11 {
        assert_eq!(
            post_event(proxy.addr, &format!("evt_{id}")).await.status,
            202
        );
    }
    let started = Instant::now();
    assert_eq!(
        admin(&proxy, "POST", "/v1/queue/hooks/resume", "")
            .await
            .status,
        200
    );
    upstream.wait_for_requests(11).await;
    // Ten intervals of 100 ms at least; a burst of 11 would take a few milliseconds.
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_before_anything_is_stored() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(
        upstream.addr,
        &json_route("    delivery: queued\n    max_body: 64\n"),
    )
    .await;
    let big = format!(r#"{{"id":"evt_big","pad":"{}"}}"#, "x".repeat(100));
    let reply = post_json(proxy.addr, "/hooks", &big).await;
    assert_eq!(reply.status, 413);
    let job = admin(&proxy, "GET", "/v1/queue/hooks/jobs/evt_big", "").await;
    assert_eq!(job.status, 404);
    let key = admin(&proxy, "GET", "/v1/keys/hooks/evt_big", "").await;
    assert_eq!(key.status, 404);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream.requests(), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_refuses_malformed_filters_and_direct_routes() {
    let upstream = Upstream::start().await;
    let rest = format!(
        "{}  - name: direct\n    match: {{ method: POST, path: /direct }}\n    key: \"{{json:/id}}\"\n",
        queued("")
    );
    let mut proxy = Proxy::start(upstream.addr, &rest).await;
    for query in [
        "?status=abc",
        "?status=700",
        "?reason=bored",
        "?since=yesterday",
        "?limit=0",
        "?limit=100000",
        "?after=nonsense",
        "?after=0000000000000001",
        "?colour=red",
    ] {
        let reply = admin(&proxy, "GET", &format!("/v1/queue/hooks/dead{query}"), "").await;
        assert_eq!(reply.status, 400, "{query}: {}", reply.body);
        assert_eq!(reply.json()["error"], "bad_request", "{query}");
    }
    let direct = admin(&proxy, "POST", "/v1/queue/direct/pause", "").await;
    assert_eq!(
        (direct.status, direct.json()["error"].clone()),
        (404, "not_queued".into())
    );
    let unknown = admin(&proxy, "GET", "/v1/queue/nowhere/dead", "").await;
    assert_eq!(unknown.status, 404);
    // Only a dead letter is replayed or discarded.
    let pause = admin(&proxy, "POST", "/v1/queue/hooks/pause", "").await;
    assert_eq!(pause.status, 200);
    assert_eq!(post_event(proxy.addr, "evt_q").await.status, 202);
    let replay = admin(&proxy, "POST", "/v1/queue/hooks/jobs/evt_q/replay", "").await;
    assert_eq!(
        (replay.status, replay.json()["error"].clone()),
        (409, "not_dead".into())
    );
    let discard = admin(&proxy, "DELETE", "/v1/queue/hooks/jobs/evt_q", "").await;
    assert_eq!(discard.status, 409);
    let get = admin(&proxy, "GET", "/v1/queue/hooks/jobs/evt_q", "").await;
    assert_eq!(get.json()["state"], "waiting");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_jobs_view_masks_secrets_and_query_values() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(400).body("bad token tok_live_123")]);
    let mut proxy = Proxy::start(upstream.addr, &queued("")).await;
    let reply = send(
        proxy.addr,
        "POST",
        "/hooks?token=tok_live_123&mode",
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer tok_live_123"),
            ("x-webhook-key", "tok_live_123"),
        ],
        r#"{"id":"evt_secret"}"#,
    )
    .await;
    assert_eq!(reply.status, 202);
    wait_for_dead(&proxy, 1).await;
    let job = admin(&proxy, "GET", "/v1/queue/hooks/jobs/evt_secret", "").await;
    let view = job.json();
    assert_eq!(view["request"]["target"], "/hooks?token=(masked)&mode");
    let headers = view["request"]["headers"].as_array().unwrap();
    let shown = |name: &str| {
        headers
            .iter()
            .find(|pair| pair[0] == name)
            .map(|pair| pair[1].as_str().unwrap().to_owned())
    };
    assert_eq!(shown("authorization").as_deref(), Some("(masked)"));
    assert_eq!(shown("x-webhook-key").as_deref(), Some("(masked)"));
    assert_eq!(shown("content-type").as_deref(), Some("application/json"));
    // The token shows nowhere but in the answer the app itself wrote.
    let outside_answers = view["request"].to_string();
    assert!(
        !outside_answers.contains("tok_live_123"),
        "{outside_answers}"
    );
    proxy.shutdown().await;
}

/// `max_queued` holds exactly on one replica, for a burst of concurrent senders too (the
/// bound once read counts taken every 2 s, and a burst ran past it); a full route leaves
/// another accepting, stores nothing of what it refuses, and takes the sender's retry once
/// there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_with_503_and_stores_nothing() {
    let upstream = Upstream::start().await;
    let other = "  - name: other\n    match: { method: POST, path: /other }\n    key: \"{json:/id}\"\n    delivery: queued\n    queue: { max_queued: 3 }\n";
    let mut proxy = Proxy::start(
        upstream.addr,
        &format!("{}{other}", queued("      max_queued: 3\n")),
    )
    .await;
    for route in ["hooks", "other"] {
        let paused = admin(&proxy, "POST", &format!("/v1/queue/{route}/pause"), "").await;
        assert_eq!(paused.status, 200);
    }
    let burst: Vec<_> = (0..20)
        .map(|n| {
            let addr = proxy.addr;
            tokio::spawn(async move { (n, post_event(addr, &format!("evt_{n}")).await) })
        })
        .collect();
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for sent in burst {
        let (n, reply) = sent.await.unwrap();
        match reply.status {
            202 => accepted.push(n),
            503 => {
                assert_eq!(reply.json()["error"], "queue_full");
                refused.push(format!("evt_{n}"));
            }
            status => panic!("{status}: {}", reply.body),
        }
    }
    assert_eq!(accepted.len(), 3, "accepted {accepted:?}");
    // Later ones too, whatever time passes.
    for n in 20..30 {
        let reply = post_event(proxy.addr, &format!("evt_{n}")).await;
        assert_eq!(reply.status, 503, "{}", reply.body);
        refused.push(format!("evt_{n}"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The other route fills on its own.
    for n in 0..4 {
        let reply = post_json(proxy.addr, "/other", &format!(r#"{{"id":"o_{n}"}}"#)).await;
        assert_eq!(
            reply.status,
            if n < 3 { 202 } else { 503 },
            "{}",
            reply.body
        );
    }
    // Paused all along: a pause is never undone by a read of the store begun before it.
    assert_eq!(upstream.requests(), 0, "a paused route delivered");
    let refused = &refused[0];
    let job = admin(
        &proxy,
        "GET",
        &format!("/v1/queue/hooks/jobs/{refused}"),
        "",
    )
    .await;
    assert_eq!(job.status, 404, "nothing stored");
    let key = admin(&proxy, "GET", &format!("/v1/keys/hooks/{refused}"), "").await;
    assert_eq!(key.status, 404, "the refused event's key is not claimed");
    // The sender's retry is taken once there is room.
    let resumed = admin(&proxy, "POST", "/v1/queue/hooks/resume", "").await;
    assert_eq!(resumed.status, 200);
    upstream.wait_for_requests(3).await;
    eventually(Duration::from_secs(10), "room again", || async {
        post_event(proxy.addr, refused).await.status == 202
    })
    .await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn order_by_delivers_one_event_per_entity_at_a_time_in_arrival_order() {
    let upstream = Upstream::start().await;
    // The first attempt (of a1 or b1) fails: its entity's later events wait for its retry.
    let slow = Answer::ok().after(Duration::from_millis(100));
    upstream.script(
        std::iter::once(Answer::status(503).after(Duration::from_millis(100)))
            .chain(std::iter::repeat_n(slow, 20)),
    );
    let route = queued("      max_concurrency: 10\n      order_by: \"{json:/entity}\"\n");
    let mut proxy = Proxy::start(upstream.addr, &route).await;
    let send_event = |id: &'static str, entity: Option<String>| {
        let addr = proxy.addr;
        async move {
            let body = match entity {
                Some(entity) => format!(r#"{{"id":"{id}","entity":"{entity}"}}"#),
                None => format!(r#"{{"id":"{id}"}}"#),
            };
            let headers = [("content-type", "application/json")];
            let reply = send(addr, "POST", "/hooks", &headers, body).await;
            assert_eq!(reply.status, 202, "{}", reply.body);
        }
    };
    let laned = ["a1", "b1", "a2", "b2", "a3"];
    for id in laned {
        let entity = if id.starts_with('a') { "A" } else { "B" };
        send_event(id, Some(entity.to_owned())).await;
    }
    let job = admin(&proxy, "GET", "/v1/queue/hooks/jobs/a3", "").await;
    assert_eq!(job.json()["lane"], "A", "{}", job.body);
    eventually(Duration::from_secs(10), "every event delivered", || async {
        laned.iter().all(|id| upstream.executions(id) == 1)
    })
    .await;
    let received: Vec<String> = upstream
        .received()
        .iter()
        .map(|r| r.headers["dedupe-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(received.len(), 6, "five events and one retry: {received:?}");
    for (entity, expected) in [("a", vec!["a1", "a2", "a3"]), ("b", vec!["b1", "b2"])] {
        let mut own: Vec<&str> = received
            .iter()
            .map(String::as_str)
            .filter(|key| key.starts_with(entity))
            .collect();
        own.dedup();
        assert_eq!(own, expected, "{received:?}");
    }
    // One at a time per entity: two lanes, never more than two at once (without lanes,
    // all five would run together).
    assert_eq!(upstream.most_running(), 2);

    // Events the template cannot read (no such field, or a value longer than a key may
    // be) go without a lane, at once: accepted, never refused.
    send_event("n1", None).await;
    send_event("n2", None).await;
    send_event("n3", Some("e".repeat(600))).await;
    let job = admin(&proxy, "GET", "/v1/queue/hooks/jobs/n3", "").await;
    assert!(
        job.status == 404 || job.json()["lane"].is_null(),
        "{}",
        job.body
    );
    eventually(Duration::from_secs(5), "n1 to n3 delivered", || async {
        ["n1", "n2", "n3"]
            .iter()
            .all(|id| upstream.executions(id) == 1)
    })
    .await;
    proxy.shutdown().await;
}

/// A queued route with one place (`upstream_timeout` as given), started counting in
/// `dir`: evt_a's attempt running in the app, evt_b taken ahead of a place for it.
async fn running_one_and_one_ahead(
    upstream: &Upstream,
    dir: &tempfile::TempDir,
    upstream_timeout: &str,
) -> (dedupe_proxy::App, std::sync::Arc<FailingQueue>) {
    let routes = json_route(&format!(
        "    delivery: queued\n    upstream_timeout: {upstream_timeout}\n    queue:\n      max_concurrency: 1\n"
    ));
    let (app, queue) = start_counting(upstream, &dir.path().join("db"), &routes, 0).await;
    assert_eq!(post_event(app.proxy_addr, "evt_a").await.status, 202);
    upstream.wait_for_requests(1).await;
    assert_eq!(post_event(app.proxy_addr, "evt_b").await.status, 202);
    eventually(Duration::from_secs(2), "evt_b taken ahead", || async {
        queue.taken.load(Ordering::SeqCst) == 2
    })
    .await;
    (app, queue)
}

/// The proxy in process on the sled store in `data` with `routes`, whose first `failing`
/// reads of the paused routes fail, and its queue, which counts takes and releases.
async fn start_counting(
    upstream: &Upstream,
    data: &std::path::Path,
    routes: &str,
    failing: usize,
) -> (dedupe_proxy::App, std::sync::Arc<FailingQueue>) {
    let config = parse_config(&config_text(upstream.addr, data, routes));
    let dedupe_proxy::config::StoreConfig::Sled(sled) = &config.store else {
        panic!("sled expected")
    };
    let inner = once_unlocked(|| dedupe_proxy::store::sled::SledStore::open(sled)).await;
    let queue = std::sync::Arc::new(FailingQueue {
        inner: dedupe_proxy::store::ClaimStore::queue(&inner).unwrap(),
        fail_paused_reads: failing.into(),
        taken: 0.into(),
        released: 0.into(),
    });
    let store = FailingStore {
        queue: Some(queue.clone()),
        ..FailingStore::new(inner)
    };
    let app = dedupe_proxy::start_with_store(config, std::sync::Arc::new(store))
        .await
        .unwrap();
    (app, queue)
}

/// A restart whose first reads of the paused routes fail delivers nothing for a route
/// paused before it: the read is made again until it succeeds, before any job is taken
/// (a failed read once counted as read, with no route paused).
#[tokio::test]
async fn a_paused_route_stays_paused_across_a_restart_whose_first_reads_fail() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let (app, _) = start_counting(&upstream, &data, &queued(""), 0).await;
    let paused = admin_post(app.admin_addr, "/v1/queue/hooks/pause", "").await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert_eq!(post_event(app.proxy_addr, "evt_1").await.status, 202);
    app.shutdown().await.unwrap();

    let (app, _) = start_counting(&upstream, &data, &queued(""), 2).await;
    // Two failed reads, a second apart, then one that finds the route paused.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        upstream.requests(),
        0,
        "a paused route delivered after a restart"
    );
    let resumed = admin_post(app.admin_addr, "/v1/queue/hooks/resume", "").await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    upstream.wait_for_requests(1).await;
    app.shutdown().await.unwrap();
}
