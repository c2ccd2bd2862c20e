//! `on_ambiguous: hold`: a forward whose outcome is unknown (the app timed out, or closed
//! the connection after the request went out) holds its key, so nothing runs the event
//! again until an operator resolves it through the admin API; a refused connection or any
//! answer from the app keeps the release. Listing keys by state, the `dedupe_keys_held`
//! gauge and the log line an alert can fire on.

use crate::support;

use std::time::Duration;

use support::*;

fn holding_route(extra: &str) -> String {
    json_route(&format!(
        "    on_ambiguous: hold\n    upstream_timeout: 300ms\n    retry_after: 9s\n{extra}"
    ))
}

/// `POST /v1/keys/hooks/{key}/resolve` with `{"outcome": outcome}`.
async fn resolve(proxy: &Proxy, key: &str, outcome: &str) -> Reply {
    let path = format!("/v1/keys/hooks/{key}/resolve");
    let body = format!(r#"{{"outcome":"{outcome}"}}"#);
    admin(proxy, "POST", &path, &body).await
}

async fn held_gauge(proxy: &Proxy) -> Option<u64> {
    let text = scrape(proxy.admin).await;
    text.lines()
        .find_map(|line| line.strip_prefix(r#"dedupe_keys_held{route="hooks"} "#))
        .map(|value| value.parse().unwrap())
}

#[tokio::test]
async fn a_timed_out_forward_is_held_until_an_operator_says_it_was_done() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201).after(Duration::from_millis(800))]);
    let proxy = Proxy::start(upstream.addr, &holding_route("")).await;

    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (first.status, first.dedupe()),
        (504, "held"),
        "{}",
        first.body
    );
    assert_eq!(upstream.requests(), 1, "the app got the request");

    // The provider's retries are not forwarded while the key is held.
    for _ in 0..3 {
        let retry = post_event(proxy.addr, "evt_1").await;
        assert_eq!((retry.status, retry.dedupe()), (409, "held"));
        assert_eq!(retry.header("retry-after"), Some("9"));
        assert_eq!(retry.json()["error"], "held");
    }
    assert_eq!(upstream.requests(), 1);

    let key = admin(&proxy, "GET", "/v1/keys/hooks/evt_1", "").await;
    assert_eq!(key.json()["state"], "held", "{}", key.body);
    assert_eq!(key.json()["held_because"], "upstream_timeout");
    let listed = admin(&proxy, "GET", "/v1/keys?route=hooks&state=held", "").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.json()["keys"][0]["key"], "evt_1");
    assert_eq!(listed.json()["keys"].as_array().unwrap().len(), 1);
    assert_eq!(listed.json()["next"], serde_json::Value::Null);
    eventually(
        Duration::from_secs(5),
        "the gauge counts the held key",
        || async { held_gauge(&proxy).await == Some(1) },
    )
    .await;
    let forget = admin(&proxy, "DELETE", "/v1/keys/hooks/evt_1", "").await;
    assert_eq!(
        (forget.status, forget.json()["error"].as_str()),
        (409, Some("held"))
    );

    let resolved = resolve(&proxy, "evt_1", "done").await;
    assert_eq!(resolved.status, 200, "{}", resolved.body);
    assert_eq!(resolved.json()["state"], "done");
    assert_eq!(resolved.json()["upstream_status"], serde_json::Value::Null);
    let retry = post_event(proxy.addr, "evt_1").await;
    assert_eq!((retry.status, retry.dedupe()), (200, "duplicate"));
    assert_eq!(upstream.requests(), 1, "run once, never again");
    eventually(
        Duration::from_secs(5),
        "the gauge drops to zero",
        || async { held_gauge(&proxy).await == Some(0) },
    )
    .await;
    let again = resolve(&proxy, "evt_1", "release").await;
    assert_eq!(
        (again.status, again.json()["error"].as_str()),
        (409, Some("not_held"))
    );
}

#[tokio::test]
async fn a_connection_the_app_drops_after_the_request_is_held_and_released_by_hand() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::abort(), Answer::status(201)]);
    let proxy = Proxy::start(upstream.addr, &holding_route("")).await;
    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (first.status, first.dedupe()),
        (502, "held"),
        "{}",
        first.body
    );
    let key = admin(&proxy, "GET", "/v1/keys/hooks/evt_1", "").await;
    assert_eq!(
        key.json()["held_because"],
        "upstream_dropped",
        "{}",
        key.body
    );
    assert_eq!(post_event(proxy.addr, "evt_1").await.dedupe(), "held");

    // A resolution that names the hold it is about is refused once another took its place.
    let held_at = key.json()["held_at"].as_str().unwrap().to_owned();
    let stale = admin(
        &proxy,
        "POST",
        "/v1/keys/hooks/evt_1/resolve",
        r#"{"outcome":"release","held_at":"2001-01-01T00:00:00.000Z"}"#,
    )
    .await;
    assert_eq!(
        (stale.status, stale.json()["error"].as_str()),
        (409, Some("held_again"))
    );
    let body = format!(r#"{{"outcome":"release","held_at":"{held_at}"}}"#);
    let released = admin(&proxy, "POST", "/v1/keys/hooks/evt_1/resolve", &body).await;
    assert_eq!(
        released.json(),
        serde_json::json!({ "route": "hooks", "key": "evt_1", "state": "absent" }),
        "{}",
        released.body
    );
    assert_eq!(released.status, 200);
    let retry = post_event(proxy.addr, "evt_1").await;
    assert_eq!((retry.status, retry.dedupe()), (201, "forwarded"));
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn a_refused_connection_or_an_app_answer_is_never_held() {
    // Nothing listens: the request cannot have reached the app.
    let dead = dead_address().await;
    let proxy = Proxy::start(dead, &holding_route("")).await;
    let refused = post_event(proxy.addr, "evt_1").await;
    assert_eq!((refused.status, refused.dedupe()), (502, "released"));
    let upstream = Upstream::start_on(dead).await;
    upstream.script([Answer::status(500), Answer::status(201)]);
    let failed = post_event(proxy.addr, "evt_1").await;
    assert_eq!((failed.status, failed.dedupe()), (500, "released"));
    let retry = post_event(proxy.addr, "evt_1").await;
    assert_eq!((retry.status, retry.dedupe()), (201, "forwarded"));
}

#[tokio::test]
async fn without_hold_an_ambiguous_forward_is_released_as_before() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201).after(Duration::from_millis(800))]);
    let route = json_route("    upstream_timeout: 300ms\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!((first.status, first.dedupe()), (504, "released"));
    let retry = post_event(proxy.addr, "evt_1").await;
    assert_eq!(retry.dedupe(), "forwarded");
}

#[tokio::test]
async fn a_duplicate_waiting_on_a_key_that_becomes_held_gets_the_held_answer_at_once() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201).after(Duration::from_millis(800))]);
    let route = holding_route("    on_in_flight: wait\n    in_flight_wait: 10s\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let started = std::time::Instant::now();
    let second = post_event(proxy.addr, "evt_1").await;
    assert_eq!((second.status, second.dedupe()), (409, "held"));
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(first.await.unwrap().dedupe(), "held");
}

#[tokio::test]
async fn with_the_replay_guard_the_body_is_held_and_resolved_with_its_key() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201).after(Duration::from_millis(800))]);
    // Keyed on a header, so that the same body can come under another key.
    let route = "routes:\n  - name: hooks\n    match: { method: POST, path: /hooks }\n    key: \"{header:x-event-id}\"\n    replay_guard: body\n    on_ambiguous: hold\n    upstream_timeout: 300ms\n";
    let proxy = Proxy::start(upstream.addr, route).await;
    let deliver = |id: &'static str, body: &'static str| {
        let addr = proxy.addr;
        async move { send(addr, "POST", "/hooks", &[("x-event-id", id)], body).await }
    };
    let body = r#"{"type":"charge"}"#;
    assert_eq!(deliver("evt_1", body).await.dedupe(), "held");
    // The same body under a new key is held too: it may be the same event replayed.
    let replayed = deliver("evt_2", body).await;
    assert_eq!((replayed.status, replayed.dedupe()), (409, "held"));
    assert_eq!(
        deliver("evt_3", r#"{"type":"refund"}"#).await.dedupe(),
        "forwarded"
    );
    let resolved = resolve(&proxy, "evt_1", "done").await;
    assert_eq!(resolved.status, 200, "{}", resolved.body);
    // Resolved with its key: the body is done too, so a new key for it is its duplicate.
    assert_eq!(deliver("evt_4", body).await.dedupe(), "duplicate");
    assert_eq!(deliver("evt_1", body).await.dedupe(), "duplicate");
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn the_admin_api_refuses_malformed_listings_and_resolutions() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &holding_route("")).await;
    for (path, error) in [
        ("/v1/keys", "bad_request"),
        ("/v1/keys?route=hooks&state=gone", "bad_request"),
        ("/v1/keys?route=hooks&limit=0", "bad_request"),
        ("/v1/keys?route=hooks&limit=1001", "bad_request"),
        ("/v1/keys?route=hooks&limit=-1", "bad_request"),
        ("/v1/keys?route=hooks&colour=red", "bad_request"),
        ("/v1/keys?route=nope", "no_such_route"),
        ("/v1/keys?route=hooks&after=o.", "bad_request"),
    ] {
        let reply = admin(&proxy, "GET", path, "").await;
        assert_eq!(reply.json()["error"], error, "{path}: {}", reply.body);
    }
    let done = post_event(proxy.addr, "evt_1").await;
    assert_eq!(done.dedupe(), "forwarded");
    for body in [
        "",
        "{}",
        r#"{"outcome":"maybe"}"#,
        r#"{"outcome":"done","x":1}"#,
        "[1]",
    ] {
        let reply = admin(&proxy, "POST", "/v1/keys/hooks/evt_1/resolve", body).await;
        assert_eq!(
            (reply.status, reply.json()["error"].as_str()),
            (400, Some("bad_request")),
            "{body}"
        );
    }
    let huge = "x".repeat(10_000);
    let reply = admin(&proxy, "POST", "/v1/keys/hooks/evt_1/resolve", &huge).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let reply = resolve(&proxy, "evt_1", "done").await;
    assert_eq!(reply.json()["error"], "not_held", "a done key is not held");
    let reply = admin(
        &proxy,
        "POST",
        "/v1/keys/nope/evt_1/resolve",
        r#"{"outcome":"done"}"#,
    )
    .await;
    assert_eq!(reply.json()["error"], "no_such_route");
}

#[tokio::test]
async fn keys_are_listed_a_page_at_a_time() {
    let upstream = Upstream::start().await;
    let release = tokio_util::sync::CancellationToken::new();
    upstream.script(vec![Answer::ok().until(&release); 3]);
    let route = json_route("    upstream_timeout: 5s\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    let mut deliveries = Vec::new();
    for id in ["evt_c", "evt_a", "evt_b"] {
        deliveries.push(tokio::spawn(post_event(proxy.addr, id)));
    }
    upstream.wait_for_requests(3).await;
    let first = admin(
        &proxy,
        "GET",
        "/v1/keys?route=hooks&state=in_flight&limit=2",
        "",
    )
    .await;
    let keys: Vec<_> = first.json()["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["evt_a", "evt_b"], "{}", first.body);
    let next = first.json()["next"].as_str().unwrap().to_owned();
    let path = format!(
        "/v1/keys?route=hooks&state=in_flight&limit=2&after={}",
        percent(&next)
    );
    let second = admin(&proxy, "GET", &path, "").await;
    assert_eq!(second.json()["keys"][0]["key"], "evt_c", "{}", second.body);
    assert_eq!(second.json()["keys"][0]["state"], "in_flight");
    assert_eq!(second.json()["next"], serde_json::Value::Null);
    release.cancel();
    for delivery in deliveries {
        delivery.await.unwrap();
    }
}

#[tokio::test]
async fn a_timeout_spent_connecting_is_released_not_held() {
    // The app never accepts the connection: the request cannot have reached it.
    let (app, _guard) = unanswering_address().await;
    let proxy = Proxy::start(app, &holding_route("")).await;
    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (first.status, first.dedupe()),
        (502, "released"),
        "{}",
        first.body
    );
    let key = admin(&proxy, "GET", "/v1/keys/hooks/evt_1", "").await;
    assert_eq!(key.status, 404, "{}", key.body);
}

#[tokio::test]
async fn a_hold_the_store_cannot_write_is_not_reported_as_held() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201).after(Duration::from_millis(800))]);
    let routes = "routes:\n  - name: hooks\n    match: { method: POST, path: /hooks }\n    key: \"{header:x-event-id}\"\n    replay_guard: body\n    on_ambiguous: hold\n    upstream_timeout: 300ms\n";
    let (app, _data) = proxy_on_store(&upstream, routes, |inner| FailingStore {
        fail_hold: true,
        ..FailingStore::new(inner)
    })
    .await;
    let deliver = |id: &'static str| {
        let addr = app.proxy_addr;
        async move { send(addr, "POST", "/hooks", &[("x-event-id", id)], "same body").await }
    };
    let first = deliver("evt_1").await;
    assert_eq!(
        (first.status, first.dedupe()),
        (504, "released"),
        "{}",
        first.body
    );
    // The key stays in flight until its lease ends...
    assert_eq!(deliver("evt_1").await.dedupe(), "in-flight");
    let key = send(app.admin_addr, "GET", "/v1/keys/hooks/evt_1", &[], "").await;
    assert_eq!(key.json()["state"], "in_flight", "{}", key.body);
    // ...and its body was released, not held alone where no operator could reach it.
    assert_eq!(deliver("evt_2").await.dedupe(), "forwarded");
    app.shutdown().await.unwrap();
}

/// A forward whose task fails (a panic) after the request went out may have done the
/// work: on a route that holds, its key is held (`forward_failed`) rather than released
/// for the redelivery to run it again; on a route that does not, it is released as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_that_panics_after_the_request_went_out_is_held() {
    for (holds, extra) in [(true, "    on_ambiguous: hold\n"), (false, "")] {
        let upstream = Upstream::start().await;
        let (app, _data) = proxy_on_store(&upstream, &json_route(extra), |inner| FailingStore {
            panic_finish: true,
            ..FailingStore::new(inner)
        })
        .await;
        let first = post_event(app.proxy_addr, "evt_panic").await;
        assert_eq!(upstream.executions("evt_panic"), 1);
        let key = eventually_json(app.admin_addr, "/v1/keys/hooks/evt_panic", |key| {
            key["state"] != "in_flight"
        })
        .await;
        if holds {
            assert_eq!(
                (first.status, first.dedupe()),
                (500, "held"),
                "{}",
                first.body
            );
            assert_eq!(
                (key["state"].as_str(), key["held_because"].as_str()),
                (Some("held"), Some("forward_failed")),
                "{key}"
            );
            let again = post_event(app.proxy_addr, "evt_panic").await;
            assert_eq!(again.dedupe(), "held", "{}", again.body);
            assert_eq!(upstream.executions("evt_panic"), 1, "not run again");
        } else {
            assert_eq!(
                (first.status, first.dedupe()),
                (500, "released"),
                "{}",
                first.body
            );
            assert!(key.is_null(), "released: {key}");
        }
        app.shutdown().await.unwrap();
    }
    // A hold the store cannot write is not reported as one: the key stays in flight.
    let upstream = Upstream::start().await;
    let route = json_route("    on_ambiguous: hold\n");
    let (app, _data) = proxy_on_store(&upstream, &route, |inner| FailingStore {
        panic_finish: true,
        fail_hold: true,
        ..FailingStore::new(inner)
    })
    .await;
    let first = post_event(app.proxy_addr, "evt_panic").await;
    assert_eq!(
        (first.status, first.dedupe()),
        (500, "released"),
        "{}",
        first.body
    );
    app.shutdown().await.unwrap();
}

/// The admin API's record of a key once `settled` says so (`null` while it is absent),
/// waiting up to 5 s: a dropped forward settles its claim in a task of its own.
async fn eventually_json(
    admin: std::net::SocketAddr,
    path: &str,
    settled: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let reply = send(admin, "GET", path, &[], "").await;
        let record = if reply.status == 404 {
            serde_json::Value::Null
        } else {
            reply.json()
        };
        if settled(&record) || std::time::Instant::now() > deadline {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
