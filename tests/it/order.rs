//! The stale-event guard (`order:`), through the proxy in front of a real app: an event
//! older than the newest version done for its entity is forwarded marked with
//! `Dedupe-Stale` (`on_stale: mark`) or answered `200` unforwarded (`skip`); only a done
//! event moves the entity's version on; an event without a usable version is forwarded
//! unguarded; a sender cannot forge `Dedupe-Stale`; the admin API shows and forgets an
//! entity's version; and the store failing follows `on_store_error`.

use crate::support;

use support::*;

fn ordered_route(on_stale: &str, extra: &str) -> String {
    json_route(&format!(
        "    order: {{ entity: \"{{json:/data/object/id}}\", version: \"{{json:/created}}\", on_stale: {on_stale} }}\n{extra}"
    ))
}

/// An event `id` about `entity` at `version` (written as JSON: a number or a string).
async fn post_versioned(proxy: &Proxy, id: &str, entity: &str, version: &str) -> Reply {
    let body =
        format!(r#"{{"id":"{id}","created":{version},"data":{{"object":{{"id":"{entity}"}}}}}}"#);
    post_json(proxy.addr, "/hooks", &body).await
}

/// The value of a metric series (its name and labels, as exposed).
async fn metric(proxy: &Proxy, series: &str) -> u64 {
    metric_at(proxy.admin, series).await as u64
}

/// The series of `dedupe_order_checks_total` for the route `hooks` and `result`.
fn checks(result: &str) -> String {
    format!(r#"dedupe_order_checks_total{{route="hooks",result="{result}"}}"#)
}

fn stale_header(received: &Received) -> Option<&str> {
    received
        .headers
        .get("dedupe-stale")
        .map(|value| value.to_str().unwrap())
}

#[tokio::test]
async fn a_stale_event_is_forwarded_marked_with_the_newest_done_version() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &ordered_route("mark", "")).await;
    let newer = post_versioned(&proxy, "evt_2", "ord_1", "1767225600").await;
    assert_eq!((newer.status, newer.dedupe()), (200, "forwarded"));
    let older = post_versioned(&proxy, "evt_1", "ord_1", "1767225500").await;
    assert_eq!((older.status, older.dedupe()), (200, "forwarded"));
    // The stale event, once done, does not move the version back.
    let entity = admin(&proxy, "GET", "/v1/entities/hooks/ord_1", "").await;
    assert_eq!(entity.status, 200, "{}", entity.body);
    assert_eq!(entity.json()["newest_version"], "1767225600");
    assert_eq!(entity.json()["entity"], "ord_1");
    // Another entity's events are not compared with this one's.
    post_versioned(&proxy, "evt_3", "ord_2", "5").await;
    let newest = post_versioned(&proxy, "evt_4", "ord_1", "1767225700").await;
    assert_eq!(newest.dedupe(), "forwarded");

    let received = upstream.received();
    let marks: Vec<Option<&str>> = received.iter().map(stale_header).collect();
    assert_eq!(marks, [None, Some("1767225600"), None, None]);
    let entity = admin(&proxy, "GET", "/v1/entities/hooks/ord_1", "").await;
    assert_eq!(entity.json()["newest_version"], "1767225700");
    assert_eq!(metric(&proxy, &checks("stale_marked")).await, 1);
    assert_eq!(metric(&proxy, &checks("in_order")).await, 3);
}

#[tokio::test]
async fn a_stale_event_is_skipped_answered_and_recorded_as_done() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &ordered_route("skip", "")).await;
    post_versioned(&proxy, "evt_2", "ord_1", "200").await;
    let skipped = post_versioned(&proxy, "evt_1", "ord_1", "100").await;
    assert_eq!((skipped.status, skipped.dedupe()), (200, "stale"));
    // The sender is not told the newest version (when the object last changed).
    assert_eq!(skipped.header("dedupe-stale"), None);
    assert_eq!(
        skipped.json(),
        serde_json::json!({"received": true, "stale": true})
    );
    assert_eq!(upstream.requests(), 1, "the stale event was not forwarded");
    // The same version is not stale: only an older one.
    let same = post_versioned(&proxy, "evt_2b", "ord_1", "200").await;
    assert_eq!(same.dedupe(), "forwarded");

    // Its redelivery is a duplicate of what was done with it.
    let again = post_versioned(&proxy, "evt_1", "ord_1", "100").await;
    assert_eq!((again.status, again.dedupe()), (200, "duplicate"));
    let key = admin(&proxy, "GET", "/v1/keys/hooks/evt_1", "")
        .await
        .json();
    assert_eq!(key["state"], "done");
    assert_eq!(key["done_because"], "stale_skipped");
    assert_eq!(key["upstream_status"], serde_json::Value::Null);
    let forwarded = admin(&proxy, "GET", "/v1/keys/hooks/evt_2", "")
        .await
        .json();
    assert_eq!(forwarded["done_because"], "upstream_success");
    assert_eq!(forwarded["upstream_status"], 200);
    assert_eq!(
        metric(
            &proxy,
            r#"dedupe_requests_total{route="hooks",outcome="stale"}"#
        )
        .await,
        1
    );
    assert_eq!(metric(&proxy, &checks("stale_skipped")).await, 1);

    // An operator who finds the newest version wrong forgets it: older events run again.
    let forgotten = admin(&proxy, "DELETE", "/v1/entities/hooks/ord_1", "").await;
    assert_eq!(forgotten.status, 204);
    assert_eq!(
        admin(&proxy, "DELETE", "/v1/entities/hooks/ord_1", "")
            .await
            .status,
        404
    );
    let absent = admin(&proxy, "GET", "/v1/entities/hooks/ord_1", "").await;
    assert_eq!(
        (absent.status, absent.json()["error"].as_str()),
        (404, Some("absent"))
    );
    let older = post_versioned(&proxy, "evt_0", "ord_1", "150").await;
    assert_eq!(older.dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 3);
}

#[tokio::test]
async fn only_a_done_event_moves_its_entity_on() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(500)]);
    let proxy = Proxy::start(upstream.addr, &ordered_route("skip", "")).await;
    let failed = post_versioned(&proxy, "evt_9", "ord_1", "900").await;
    assert_eq!((failed.status, failed.dedupe()), (500, "released"));
    let older = post_versioned(&proxy, "evt_1", "ord_1", "100").await;
    assert_eq!(older.dedupe(), "forwarded", "the failed event was not done");
    // The failed event's retry is done now, and then moves the entity on.
    assert_eq!(
        post_versioned(&proxy, "evt_9", "ord_1", "900")
            .await
            .dedupe(),
        "forwarded"
    );
    assert_eq!(
        post_versioned(&proxy, "evt_5", "ord_1", "500")
            .await
            .dedupe(),
        "stale"
    );
    assert_eq!(upstream.requests(), 3);
}

#[tokio::test]
async fn times_with_offsets_compare_as_instants() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &ordered_route("skip", "")).await;
    let first = post_versioned(&proxy, "a", "p", r#""2026-01-01T10:00:00+02:00""#).await;
    assert_eq!(first.dedupe(), "forwarded");
    // 08:30Z: after 08:00Z, though it reads earlier than 10:00.
    let later = post_versioned(&proxy, "b", "p", r#""2026-01-01T09:30:00+01:00""#).await;
    assert_eq!(later.dedupe(), "forwarded");
    let earlier = post_versioned(&proxy, "c", "p", r#""2026-01-01T08:15:00Z""#).await;
    assert_eq!(earlier.dedupe(), "stale");
    let entity = admin(&proxy, "GET", "/v1/entities/hooks/p", "")
        .await
        .json();
    assert_eq!(entity["newest_version"], "2026-01-01T09:30:00+01:00");
    // A Unix time in seconds is the same scale.
    let numeric = post_versioned(&proxy, "d", "p", "1767256200").await; // 08:30Z
    assert_eq!(numeric.dedupe(), "forwarded", "as new is not stale");
    let numeric_older = post_versioned(&proxy, "e", "p", "1767256199").await;
    assert_eq!(numeric_older.dedupe(), "stale");
}

#[tokio::test]
async fn an_event_without_a_usable_version_is_forwarded_unguarded() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &ordered_route("skip", "")).await;
    post_versioned(&proxy, "evt_new", "ord_1", "500").await;
    for (id, version) in [
        ("neg", "-1"),
        ("text", r#""yesterday""#),
        ("date", r#""2026-01-01""#),
        ("wide", "123456789012345678901"),
        ("huge", "1e400"),
        ("null", "null"),
    ] {
        let reply = post_versioned(&proxy, id, "ord_1", version).await;
        assert_eq!(reply.dedupe(), "forwarded", "{version}");
    }
    let unkeyed = post_json(proxy.addr, "/hooks", r#"{"id":"no-entity","created":1}"#).await;
    assert_eq!(unkeyed.dedupe(), "forwarded");
    // Entities the key's limits refuse: over 512 bytes, or with a control character.
    let long = "o".repeat(600);
    for (id, entity) in [("long", long.as_str()), ("control", "ord\\u0007")] {
        let reply = post_versioned(&proxy, id, entity, "1").await;
        assert_eq!(reply.dedupe(), "forwarded", "{id}");
    }
    assert_eq!(upstream.requests(), 10);
    assert!(
        upstream
            .received()
            .iter()
            .all(|r| stale_header(r).is_none())
    );
    assert_eq!(metric(&proxy, &checks("unversioned")).await, 9);
    // None of them moved the entity on.
    let entity = admin(&proxy, "GET", "/v1/entities/hooks/ord_1", "")
        .await
        .json();
    assert_eq!(entity["newest_version"], "500");
}

#[tokio::test]
async fn a_sender_cannot_mark_an_event_stale() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &ordered_route("mark", "")).await;
    let addr = proxy.addr;
    let send_with = |id: &'static str, version: u32, name: &'static str| async move {
        let body =
            format!(r#"{{"id":"{id}","created":{version},"data":{{"object":{{"id":"o"}}}}}}"#);
        let headers = [("content-type", "application/json"), (name, "999")];
        send(addr, "POST", "/hooks", &headers, body).await
    };
    send_with("evt_5", 5, "Dedupe-Stale").await;
    send_with("evt_6", 6, "dedupe_stale").await;
    // Stale: the proxy's value alone reaches the app, not the forged one.
    send_with("evt_1", 1, "Dedupe_Stale").await;
    let received = upstream.received();
    assert_eq!(received.len(), 3);
    for (request, expected) in received.iter().zip([&[][..], &[][..], &["6"][..]]) {
        let stale: Vec<&str> = request
            .headers
            .iter()
            .filter(|(name, _)| name.as_str().replace('_', "-") == "dedupe-stale")
            .map(|(_, value)| value.to_str().unwrap())
            .collect();
        assert_eq!(stale, expected, "{:?}", request.headers);
    }
}

#[tokio::test]
async fn the_admin_api_shows_versions_only_for_routes_with_order() {
    let upstream = Upstream::start().await;
    let routes = format!(
        "{}  - name: plain\n    match: {{ path: /plain }}\n    key: \"{{json:/id}}\"\n",
        ordered_route("mark", "")
    );
    let proxy = Proxy::start(upstream.addr, &routes).await;
    for method in ["GET", "DELETE"] {
        let plain = admin(&proxy, method, "/v1/entities/plain/x", "").await;
        let error = plain.json()["error"].as_str().map(str::to_owned);
        assert_eq!((plain.status, error.as_deref()), (404, Some("no_order")));
    }
    let missing = admin(&proxy, "GET", "/v1/entities/nope/x", "").await;
    assert_eq!(missing.json()["error"], "no_such_route");
    let wrong = admin(&proxy, "PUT", "/v1/entities/hooks/x", "").await;
    assert_eq!(wrong.status, 405);
    // An entity whose ID needs escaping in a path.
    post_versioned(&proxy, "evt_1", "a/b c", "3").await;
    let escaped = admin(
        &proxy,
        "GET",
        &format!("/v1/entities/hooks/{}", percent("a/b c")),
        "",
    )
    .await;
    assert_eq!(escaped.json()["newest_version"], "3", "{}", escaped.body);
}

#[tokio::test]
async fn the_store_failing_to_read_a_version_follows_on_store_error() {
    let upstream = Upstream::start().await;
    let route = ordered_route("skip", "");
    let (app, _data) = proxy_on_store(&upstream, &route, |inner| FailingStore {
        fail_versions: true,
        ..FailingStore::new(inner)
    })
    .await;
    let body = r#"{"id":"evt_1","created":5,"data":{"object":{"id":"o"}}}"#;
    let refused = post_json(app.proxy_addr, "/hooks", body).await;
    assert_eq!((refused.status, refused.dedupe()), (503, "unavailable"));
    assert!(refused.header("retry-after").is_some());
    assert_eq!(upstream.requests(), 0);
    // The claim was released: the key is not left in flight.
    let key = send(app.admin_addr, "GET", "/v1/keys/hooks/evt_1", &[], "").await;
    assert_eq!(key.status, 404, "{}", key.body);
    let released = r#"dedupe_claims_released_total{route="hooks",reason="store_error"}"#;
    assert_eq!(metric_at(app.admin_addr, released).await, 1.0);
    assert_eq!(metric_at(app.admin_addr, &checks("store_error")).await, 1.0);
    assert_eq!(
        metric_at(app.admin_addr, "dedupe_store_errors_total").await,
        1.0
    );
    app.shutdown().await.unwrap();

    let route = ordered_route("skip", "    on_store_error: forward\n");
    let (app, _data) = proxy_on_store(&upstream, &route, |inner| FailingStore {
        fail_versions: true,
        ..FailingStore::new(inner)
    })
    .await;
    let forwarded = post_json(app.proxy_addr, "/hooks", body).await;
    assert_eq!((forwarded.status, forwarded.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.requests(), 1);
    // Still deduplicated: the claim stands.
    let again = post_json(app.proxy_addr, "/hooks", body).await;
    assert_eq!(again.dedupe(), "duplicate");
    app.shutdown().await.unwrap();
}

/// With `replay_guard: body`, a skipped stale event's body is done too: resent under a
/// fresh ID, it is that event's duplicate, not a new stale event, and not forwarded.
#[tokio::test]
async fn a_skipped_event_is_done_for_the_replay_guard_too() {
    let upstream = Upstream::start().await;
    let route = "routes:\n  - name: hooks\n    match: { method: POST, path: /hooks }\n    key: \"{header:X-Id}\"\n    replay_guard: body\n    order: { entity: \"{json:/o}\", version: \"{json:/v}\", on_stale: skip }\n";
    let proxy = Proxy::start(upstream.addr, route).await;
    let addr = proxy.addr;
    let deliver = |id: &'static str, body: &'static str| async move {
        let headers = [("content-type", "application/json"), ("x-id", id)];
        send(addr, "POST", "/hooks", &headers, body).await
    };
    assert_eq!(
        deliver("a", r#"{"o":"x","v":9}"#).await.dedupe(),
        "forwarded"
    );
    assert_eq!(deliver("b", r#"{"o":"x","v":3}"#).await.dedupe(), "stale");
    assert_eq!(
        deliver("c", r#"{"o":"x","v":3}"#).await.dedupe(),
        "duplicate"
    );
    assert_eq!(upstream.requests(), 1);
}
