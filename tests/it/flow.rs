//! Every row of the request-flow table (`docs/contract.md`): the status, `Dedupe-Status` and body the
//! sender gets, and what reaches the upstream.

use crate::support;

use std::time::Duration;

use support::*;

#[tokio::test]
async fn unmatched_requests_pass_through_untouched_and_undeduplicated() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(201).body("made").header("x-app", "1"),
        Answer::status(201),
    ]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for _ in 0..2 {
        let reply = send(
            proxy.addr,
            "PUT",
            "/other?x=1",
            &[("x-custom", "v")],
            r#"{"id":"same"}"#,
        )
        .await;
        assert_eq!(reply.status, 201);
        assert_eq!(reply.dedupe(), "<none>");
    }
    let received = upstream.received();
    assert_eq!(
        received.len(),
        2,
        "unmatched requests are never deduplicated"
    );
    assert_eq!(received[0].method, "PUT");
    assert_eq!(received[0].uri, "/other?x=1");
    assert_eq!(received[0].headers["x-custom"], "v");
    assert_eq!(received[0].body, r#"{"id":"same"}"#);
    assert!(!received[0].headers.contains_key("dedupe-key"));
}

#[tokio::test]
async fn unmatched_reject_answers_404_json() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!("unmatched: reject\n{}", json_route("")),
    )
    .await;
    let reply = send(proxy.addr, "GET", "/other", &[], "").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["error"], "no_route");
    assert_eq!(reply.dedupe(), "<none>");
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn body_over_max_body_is_413_by_length_and_when_chunked() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("    max_body: 32\n")).await;
    let big = format!(r#"{{"id":"evt_big","pad":"{}"}}"#, "x".repeat(40));
    let reply = post_json(proxy.addr, "/hooks", &big).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.dedupe(), "rejected");
    assert_eq!(reply.json()["error"], "body_too_large");

    let chunk = format!("{:x}\r\n{big}\r\n0\r\n\r\n", big.len());
    let answer = raw(
        proxy.addr,
        format!("POST /hooks HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{chunk}").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("dedupe-status: rejected"),
        "{answer}"
    );

    // A body at the limit is fine, and nothing was stored for the refused ones.
    let reply = post_json(proxy.addr, "/hooks", r#"{"id":"evt_big"}"#).await;
    assert_eq!(reply.dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn unusable_key_values_are_400_and_reach_nobody() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for body in [
        r#"{"id":null}"#,
        r#"{"id":""}"#,
        r#"{"id":{"a":1}}"#,
        r#"{"id":[1]}"#,
        r#"{"other":"x"}"#,
        "not json",
    ] {
        let reply = post_json(proxy.addr, "/hooks", body).await;
        assert_eq!(reply.status, 400, "{body}");
        assert_eq!(reply.dedupe(), "rejected", "{body}");
        assert_eq!(reply.json()["error"], "missing_key", "{body}");
        assert!(
            reply.json()["detail"]
                .as_str()
                .unwrap()
                .contains("{json:/id}"),
            "{body}"
        );
    }
    assert_eq!(upstream.requests(), 0);
}

/// A number's key is its exact value in one form: `42`, `42.0` and `4.2e1` are one event;
/// numbers beyond what `u64` or `f64` hold keep every digit, so two such IDs that differ
/// in the last digit are two events.
#[tokio::test]
async fn numbers_are_keys_by_their_exact_value() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let post = |body: &'static str| post_json(proxy.addr, "/hooks", body);
    assert_eq!(post(r#"{"id":42}"#).await.dedupe(), "forwarded");
    assert_eq!(upstream.received()[0].headers["dedupe-key"], "42");
    for same in [r#"{"id":42.0}"#, r#"{"id":4.2e1}"#, r#"{"id":420E-1}"#] {
        assert_eq!(post(same).await.dedupe(), "duplicate", "{same}");
    }
    for big in [
        r#"{"id":12345678901234567890123}"#,
        r#"{"id":12345678901234567890124}"#,
    ] {
        assert_eq!(post(big).await.dedupe(), "forwarded", "{big}");
    }
    let keys: Vec<_> = upstream
        .received()
        .iter()
        .map(|request| request.headers["dedupe-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        keys,
        ["42", "12345678901234567890123", "12345678901234567890124"]
    );
}

#[tokio::test]
async fn missing_key_is_forwarded_unkeyed_when_configured() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(202), Answer::status(202)]);
    let proxy = Proxy::start(upstream.addr, &json_route("    on_missing_key: forward\n")).await;
    for _ in 0..2 {
        let reply = post_json(proxy.addr, "/hooks", r#"{"no_id":true}"#).await;
        assert_eq!(reply.status, 202);
        assert_eq!(reply.dedupe(), "unkeyed");
    }
    assert_eq!(
        upstream.requests(),
        2,
        "unkeyed deliveries are not deduplicated"
    );
    assert!(!upstream.received()[0].headers.contains_key("dedupe-key"));
}

#[tokio::test]
async fn key_over_512_bytes_is_400_even_when_missing_keys_forward() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("    on_missing_key: forward\n")).await;
    let reply = post_json(
        proxy.addr,
        "/hooks",
        &format!(r#"{{"id":"{}"}}"#, "k".repeat(513)),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.dedupe(), "rejected");
    assert_eq!(reply.json()["error"], "key_too_long");
    let reply = post_json(
        proxy.addr,
        "/hooks",
        &format!(r#"{{"id":"{}"}}"#, "k".repeat(512)),
    )
    .await;
    assert_eq!(reply.dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn done_key_gets_the_duplicate_response_without_forwarding() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201).body("created")]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (first.status, first.dedupe(), first.body.as_str()),
        (201, "forwarded", "created")
    );
    let second = post_event(proxy.addr, "evt_1").await;
    assert_eq!(second.status, 200);
    assert_eq!(second.dedupe(), "duplicate");
    assert_eq!(second.body, r#"{"received":true,"duplicate":true}"#);
    assert_eq!(second.header("content-type"), Some("application/json"));
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn in_flight_key_gets_409_with_retry_after() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(800))]);
    let proxy = Proxy::start(upstream.addr, &json_route("    retry_after: 7s\n")).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let second = post_event(proxy.addr, "evt_1").await;
    assert_eq!(second.status, 409);
    assert_eq!(second.dedupe(), "in-flight");
    assert_eq!(second.header("retry-after"), Some("7"));
    assert_eq!(second.json()["error"], "in_flight");
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn in_flight_status_is_configurable() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(500))]);
    let proxy = Proxy::start(upstream.addr, &json_route("    in_flight_status: 429\n")).await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    assert_eq!(post_event(proxy.addr, "evt_1").await.status, 429);
    first.await.unwrap();
}

#[tokio::test]
async fn upstream_error_status_is_relayed_and_released() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(500).body("boom").header("x-trace", "t1")]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let reply = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (reply.status, reply.dedupe(), reply.body.as_str()),
        (500, "released", "boom")
    );
    assert_eq!(reply.header("x-trace"), Some("t1"));
}

#[tokio::test]
async fn unreachable_upstream_is_502_released() {
    let dead = dead_address().await;
    let proxy = Proxy::start(dead, &json_route("")).await;
    let reply = post_event(proxy.addr, "evt_1").await;
    assert_eq!((reply.status, reply.dedupe()), (502, "released"));
    assert_eq!(reply.json()["error"], "upstream_unreachable");
}

#[tokio::test]
async fn slow_upstream_is_504_released() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_secs(2))]);
    let proxy = Proxy::start(upstream.addr, &json_route("    upstream_timeout: 200ms\n")).await;
    let reply = post_event(proxy.addr, "evt_1").await;
    assert_eq!((reply.status, reply.dedupe()), (504, "released"));
    assert_eq!(reply.json()["error"], "upstream_timeout");
}

#[tokio::test]
async fn forwarding_keeps_the_request_and_sets_proxy_headers() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let body = r#"{"id":"evt_h","data":{"amount":100}}"#;
    let answer = raw(
        proxy.addr,
        format!(
            "POST /hooks?source=test HTTP/1.1\r\nhost: hooks.example.com\r\ncontent-type: application/json\r\nx-custom: kept\r\nconnection: close, x-hop\r\nx-hop: dropped\r\nkeep-alive: timeout=5\r\ndedupe-key: forged\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let received = &upstream.received()[0];
    assert_eq!(received.method, "POST");
    assert_eq!(received.uri, "/hooks?source=test");
    assert_eq!(received.body, body);
    let headers = &received.headers;
    assert_eq!(headers["host"], "hooks.example.com");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-custom"], "kept");
    assert_eq!(headers["dedupe-key"], "evt_h");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-forwarded-host"], "hooks.example.com");
    assert!(!headers.contains_key("x-hop"));
    assert!(!headers.contains_key("keep-alive"));
}

#[tokio::test]
async fn key_header_can_be_turned_off() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &json_route("    forward_key_header: false\n"),
    )
    .await;
    post_event(proxy.addr, "evt_1").await;
    assert!(!upstream.received()[0].headers.contains_key("dedupe-key"));
}

#[tokio::test]
async fn duplicate_response_is_configurable() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!(
            "defaults:\n  duplicate_response: {{ status: 202, body: \"seen\", content_type: text/plain }}\n{}",
            json_route("")
        ),
    )
    .await;
    post_event(proxy.addr, "evt_1").await;
    let duplicate = post_event(proxy.addr, "evt_1").await;
    assert_eq!((duplicate.status, duplicate.body.as_str()), (202, "seen"));
    assert_eq!(duplicate.header("content-type"), Some("text/plain"));
}

#[tokio::test]
async fn replay_answers_duplicates_with_the_recorded_upstream_answer() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201)
        .body(r#"{"order":77}"#)
        .header("content-type", "application/vnd.app+json")]);
    let proxy = Proxy::start(
        upstream.addr,
        &json_route("    duplicate_response: { replay: true }\n"),
    )
    .await;
    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (201, r#"{"order":77}"#)
    );
    let duplicate = post_event(proxy.addr, "evt_1").await;
    assert_eq!(duplicate.dedupe(), "duplicate");
    assert_eq!(
        (duplicate.status, duplicate.body.as_str()),
        (201, r#"{"order":77}"#)
    );
    assert_eq!(
        duplicate.header("content-type"),
        Some("application/vnd.app+json")
    );
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn success_status_decides_what_counts_as_done() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(409), Answer::status(201)]);
    let proxy = Proxy::start(
        upstream.addr,
        &json_route("    success_status: [200, 409]\n"),
    )
    .await;
    assert_eq!(post_event(proxy.addr, "evt_a").await.dedupe(), "forwarded");
    assert_eq!(post_event(proxy.addr, "evt_a").await.dedupe(), "duplicate");
    assert_eq!(
        post_event(proxy.addr, "evt_b").await.dedupe(),
        "released",
        "201 is not listed"
    );
    assert_eq!(post_event(proxy.addr, "evt_b").await.dedupe(), "forwarded");
}

#[tokio::test]
async fn changed_body_under_a_done_key_is_a_duplicate_by_default() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    post_json(proxy.addr, "/hooks", r#"{"id":"evt_1","amount":1}"#).await;
    let changed = post_json(proxy.addr, "/hooks", r#"{"id":"evt_1","amount":2}"#).await;
    assert_eq!((changed.status, changed.dedupe()), (200, "duplicate"));
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn changed_body_under_a_done_key_is_422_when_rejected() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &json_route("    on_payload_mismatch: reject\n"),
    )
    .await;
    post_json(proxy.addr, "/hooks", r#"{"id":"evt_1","amount":1}"#).await;
    let same = post_json(proxy.addr, "/hooks", r#"{"id":"evt_1","amount":1}"#).await;
    assert_eq!((same.status, same.dedupe()), (200, "duplicate"));
    let changed = post_json(proxy.addr, "/hooks", r#"{"id":"evt_1","amount":2}"#).await;
    assert_eq!((changed.status, changed.dedupe()), (422, "rejected"));
    assert_eq!(changed.json()["error"], "payload_mismatch");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn header_query_form_and_composite_keys() {
    let upstream = Upstream::start().await;
    let routes = r#"routes:
  - name: shop
    match: { path_prefix: /shop/ }
    key: "{header:X-Shop}:{header:X-Event-Id}"
  - name: legacy
    match: { method: [POST, PUT], path: /legacy }
    key: "{query:event_id}"
  - name: sms
    match: { method: POST, path: /sms }
    key: "{form:MessageSid}"
"#;
    let proxy = Proxy::start(upstream.addr, routes).await;
    let shop = |event: &'static str| async move {
        send(
            proxy.addr,
            "POST",
            "/shop/orders",
            &[("x-shop", "a.example"), ("x-event-id", event)],
            "{}",
        )
        .await
    };
    assert_eq!(shop("1").await.dedupe(), "forwarded");
    assert_eq!(shop("1").await.dedupe(), "duplicate");
    assert_eq!(shop("2").await.dedupe(), "forwarded");
    assert_eq!(upstream.received()[0].headers["dedupe-key"], "a.example:1");

    assert_eq!(
        send(proxy.addr, "PUT", "/legacy?event_id=e%2F1", &[], "")
            .await
            .dedupe(),
        "forwarded"
    );
    assert_eq!(
        send(proxy.addr, "POST", "/legacy?event_id=e%2F1", &[], "x")
            .await
            .dedupe(),
        "duplicate"
    );

    let form = [("content-type", "application/x-www-form-urlencoded")];
    assert_eq!(
        send(
            proxy.addr,
            "POST",
            "/sms",
            &form,
            "To=%2B1555&MessageSid=SM1"
        )
        .await
        .dedupe(),
        "forwarded"
    );
    assert_eq!(
        send(
            proxy.addr,
            "POST",
            "/sms",
            &form,
            "MessageSid=SM1&To=%2B1555"
        )
        .await
        .dedupe(),
        "duplicate"
    );
    assert_eq!(upstream.requests(), 4);
}

#[tokio::test]
async fn routes_with_one_scope_share_keys_and_others_do_not() {
    let upstream = Upstream::start().await;
    let routes = r#"routes:
  - name: a
    match: { path: /a }
    key: "{json:/id}"
    scope: shared
  - name: b
    match: { path: /b }
    key: "{json:/id}"
    scope: shared
  - name: c
    match: { path: /c }
    key: "{json:/id}"
"#;
    let proxy = Proxy::start(upstream.addr, routes).await;
    let event = r#"{"id":"evt_1"}"#;
    assert_eq!(
        post_json(proxy.addr, "/a", event).await.dedupe(),
        "forwarded"
    );
    assert_eq!(
        post_json(proxy.addr, "/b", event).await.dedupe(),
        "duplicate"
    );
    assert_eq!(
        post_json(proxy.addr, "/c", event).await.dedupe(),
        "forwarded"
    );
}

#[tokio::test]
async fn store_failure_is_503_with_retry_after_and_forwards_nothing() {
    let upstream = Upstream::start().await;
    let (app, _data) =
        proxy_on_failing_store(&upstream, "    retry_after: 3s\n", true, false).await;
    let reply = post_event(app.proxy_addr, "evt_1").await;
    assert_eq!((reply.status, reply.dedupe()), (503, "unavailable"));
    assert_eq!(reply.header("retry-after"), Some("3"));
    assert_eq!(reply.json()["error"], "store_unavailable");
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn store_failure_forwards_unkeyed_when_configured() {
    let upstream = Upstream::start().await;
    let (app, _data) =
        proxy_on_failing_store(&upstream, "    on_store_error: forward\n", true, false).await;
    let reply = post_event(app.proxy_addr, "evt_1").await;
    assert_eq!((reply.status, reply.dedupe()), (200, "unkeyed"));
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn failed_done_mark_still_relays_the_upstream_success() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(200).body("worked")]);
    let (app, _data) = proxy_on_failing_store(&upstream, "", false, true).await;
    let reply = post_event(app.proxy_addr, "evt_1").await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "worked"));
    assert_eq!(upstream.total_executions(), 1);
}

#[tokio::test]
async fn an_http_1_0_upstream_is_relayed_in_the_senders_version() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A legacy handler that speaks HTTP/1.0 and ends its body by closing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let legacy = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buffer = vec![0; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream
                    .write_all(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nold but fine")
                    .await;
            });
        }
    });
    let proxy = Proxy::start(legacy, &json_route("")).await;
    let body = r#"{"id":"evt_old"}"#;
    let answer = raw(
        proxy.addr,
        format!("POST /hooks HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len()).as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("\r\nold but fine\r\n"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("dedupe-status: forwarded"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_chunked_delivery_reaches_the_upstream_whole() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let (part1, part2) = (r#"{"id":"evt_"#, r#"chunked","n":1}"#);
    let request = format!(
        "POST /hooks HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{part1}\r\n{:x}\r\n{part2}\r\n0\r\n\r\n",
        part1.len(),
        part2.len()
    );
    let answer = raw(proxy.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let received = &upstream.received()[0];
    assert_eq!(received.body, format!("{part1}{part2}"));
    assert_eq!(received.headers["dedupe-key"], "evt_chunked");
    // The body is buffered, so it goes out with its length.
    assert_eq!(
        received.headers["content-length"],
        (part1.len() + part2.len()).to_string().as_str()
    );
}

#[tokio::test]
async fn an_h2c_sender_is_served_and_forwarded_over_http_1_1() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let client: Client<_, Full<Bytes>> = Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for expected in ["forwarded", "duplicate"] {
        let request = http::Request::post(format!("http://{}/hooks", proxy.addr))
            .body(Full::new(Bytes::from_static(br#"{"id":"evt_h2"}"#)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        assert_eq!(response.headers()["dedupe-status"], expected);
        let _ = response.into_body().collect().await.unwrap();
    }
    let received = &upstream.received()[0];
    assert_eq!(received.headers["dedupe-key"], "evt_h2");
    // HTTP/2 has no Host header: the request's authority becomes one.
    assert_eq!(received.headers["host"], proxy.addr.to_string().as_str());
    assert_eq!(upstream.requests(), 1);
}

/// A sender that hangs up after its key was claimed but before the forward began (here,
/// while the replay guard's body claim is answered) leaves nothing claimed: its retry is
/// forwarded at once, not told 409 until the lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_gone_between_claim_and_forward_leaves_no_claim_behind() {
    use tokio::io::AsyncWriteExt;
    let upstream = Upstream::start().await;
    let routes = json_route("    replay_guard: body\n");
    let (app, _data) = proxy_on_store(&upstream, &routes, |inner| FailingStore {
        slow_body_claims: true,
        ..FailingStore::new(inner)
    })
    .await;
    let body = r#"{"id":"evt_gone"}"#;
    let mut stream = tokio::net::TcpStream::connect(app.proxy_addr)
        .await
        .unwrap();
    let request = format!(
        "POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(upstream.requests(), 0, "nothing was forwarded");
    let retry = post_json(app.proxy_addr, "/hooks", body).await;
    assert_eq!(retry.dedupe(), "forwarded", "{}", retry.body);
    app.shutdown().await.unwrap();
}
