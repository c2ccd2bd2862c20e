//! Hostile or broken senders: each gets a clear 4xx or a closed connection, never a panic
//! or an unbounded buffer, and nothing of theirs is claimed or forwarded.

use crate::support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMITS: &str = "limits: { header_read_timeout: 500ms, body_read_timeout: 500ms, max_header_bytes: 16KiB, max_connections: 3 }\n";

async fn proxy(upstream: &Upstream) -> Proxy {
    Proxy::start(upstream.addr, &format!("{LIMITS}{}", json_route(""))).await
}

/// Reads what the proxy sends until it closes the connection; panics if it keeps it open
/// longer than `limit`.
async fn assert_closed_within(stream: &mut TcpStream, limit: Duration) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut answer))
        .await
        .expect("the proxy should close the connection")
        .unwrap_or_default();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_sender_that_never_finishes_its_headers_is_cut_off() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"POST /hooks HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .unwrap();
    let started = Instant::now();
    assert_closed_within(&mut stream, Duration::from_secs(3)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    assert_closed_within(&mut stream, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: 13\r\n\r\n{\"id\":\"evt\"}\n",
        )
        .await
        .unwrap();
    let answer = assert_closed_within(&mut stream, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_body_that_trickles_in_too_slowly_is_408_and_not_claimed() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: 40\r\n\r\n{\"id\":\"evt_slow\"",
        )
        .await
        .unwrap();
    let answer = assert_closed_within(&mut stream, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"error\":\"body_timeout\""), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("dedupe-status: rejected"),
        "{answer}"
    );
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn a_body_that_ends_early_is_neither_claimed_nor_forwarded() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"id\":\"evt_cut\"}",
        )
        .await
        .unwrap();
    stream.shutdown().await.unwrap();
    assert_closed_within(&mut stream, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(upstream.requests(), 0);
    assert_eq!(
        send(proxy.admin, "GET", "/v1/keys/hooks/evt_cut", &[], "")
            .await
            .status,
        404
    );
    // The whole event, sent properly, is forwarded.
    assert_eq!(
        post_event(proxy.addr, "evt_cut").await.dedupe(),
        "forwarded"
    );
}

#[tokio::test]
async fn oversize_headers_get_431() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let big = "a".repeat(20 * 1024);
    let answer = raw(
        proxy.addr,
        format!("POST /hooks HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\ncontent-length: 2\r\n\r\n{{}}")
            .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert_eq!(upstream.requests(), 0);
}

/// With every slot taken by a connection that has nothing in progress, the one idle
/// longest is closed to make room: keeping connections open costs a sender requests.
#[tokio::test]
async fn when_every_slot_is_taken_the_idlest_connection_makes_room() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(proxy.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reply = post_event(proxy.addr, "evt_room").await;
    assert_eq!(reply.dedupe(), "forwarded");
    // The first, idle longest, was closed; the others are still open.
    assert_closed_within(&mut held[0], Duration::from_millis(300)).await;
    let mut byte = [0u8; 1];
    let still_open =
        tokio::time::timeout(Duration::from_millis(100), held[2].read(&mut byte)).await;
    assert!(still_open.is_err(), "the newest stays open");
}

/// A connection that never sent a request makes room before one that did, however long
/// each has idled: a provider's kept-alive connection outlasts an attacker's silent ones.
#[tokio::test]
async fn connections_that_never_sent_a_request_make_room_first() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut served = TcpStream::connect(proxy.addr).await.unwrap();
    let body = r#"{"id":"evt_kept"}"#;
    let request = format!(
        "POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    served.write_all(request.as_bytes()).await.unwrap();
    let mut answer = [0u8; 512];
    let read = served.read(&mut answer).await.unwrap();
    assert!(answer[..read].starts_with(b"HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(proxy.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        post_event(proxy.addr, "evt_new").await.dedupe(),
        "forwarded"
    );
    assert_closed_within(&mut silent[0], Duration::from_millis(300)).await;
    let still_open =
        tokio::time::timeout(Duration::from_millis(100), served.read(&mut answer)).await;
    assert!(
        still_open.is_err(),
        "the connection that sent a request stays open"
    );
}

/// An evicted HTTP/2 connection with nothing in progress is dropped at once: a peer that
/// never acknowledges a GOAWAY cannot make the newcomer wait.
#[tokio::test]
async fn an_evicted_idle_http2_connection_does_not_wait_for_its_peer() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!("limits: {{ max_connections: 1 }}\n{}", json_route("")),
    )
    .await;
    let mut deaf = TcpStream::connect(proxy.addr).await.unwrap();
    deaf.write_all(&[PREFACE, EMPTY_SETTINGS].concat())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert_eq!(
        post_event(proxy.addr, "evt_past_h2").await.dedupe(),
        "forwarded"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert_closed_within(&mut deaf, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn malformed_http_gets_400() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"POST /hooks HTTP/1.1\r\nhost x\r\n\r\n",
        b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n",
    ] {
        let answer = raw(proxy.addr, garbage).await;
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    assert_eq!(upstream.requests(), 0);
    assert_eq!(
        post_event(proxy.addr, "evt_ok").await.dedupe(),
        "forwarded",
        "the proxy is unharmed"
    );
}

#[tokio::test]
async fn a_key_header_that_is_not_ascii_is_a_missing_key() {
    let upstream = Upstream::start().await;
    let routes = format!(
        "{LIMITS}routes:\n  - name: gh\n    match: {{ path: /gh }}\n    key: \"{{header:X-Delivery}}\"\n"
    );
    let proxy = Proxy::start(upstream.addr, &routes).await;
    let mut request = b"POST /gh HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-delivery: caf\xc3\xa9-\xff\r\ncontent-length: 2\r\n\r\n{}".to_vec();
    let answer = raw(proxy.addr, &request).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("missing_key"), "{answer}");
    request.clear();
    assert_eq!(upstream.requests(), 0);
}

/// 100 000 levels of nesting: skipped without recursion where the key is not, and a key
/// that is such a value is no key; the proxy's stack survives both.
#[tokio::test]
async fn deeply_nested_json_neither_overflows_the_stack_nor_hides_the_key() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let depth = 100_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let json = [("content-type", "application/json")];
    let beside = format!(r#"{{"x":{nested},"id":"evt_deep"}}"#);
    let reply = send(proxy.addr, "POST", "/hooks", &json, beside).await;
    assert_eq!((reply.status, reply.dedupe()), (200, "forwarded"));
    assert_eq!(upstream.requests(), 1);

    let as_the_key = format!(r#"{{"id":{nested}}}"#);
    let reply = send(proxy.addr, "POST", "/hooks", &json, as_the_key).await;
    assert_eq!((reply.status, reply.dedupe()), (400, "rejected"));
    assert_eq!(reply.json()["error"], "missing_key");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn a_body_of_the_wrong_type_has_no_key() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let reply = send(proxy.addr, "POST", "/hooks", &form, "id=evt_form").await;
    assert_eq!(
        (reply.status, reply.json()["error"].as_str()),
        (400, Some("missing_key"))
    );
    // The content type is not what decides: a JSON body labelled text/plain still has its key.
    let text = [("content-type", "text/plain")];
    let reply = send(proxy.addr, "POST", "/hooks", &text, r#"{"id":"evt_text"}"#).await;
    assert_eq!(reply.dedupe(), "forwarded");
}

#[tokio::test]
async fn garbage_instead_of_an_http2_preface_is_dropped() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let answer = raw(
        proxy.addr,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x09garbage-frame-data",
    )
    .await;
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer:?}");
    assert_eq!(post_event(proxy.addr, "evt_ok").await.dedupe(), "forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_limit_are_shed_with_503() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::ok().after(Duration::from_millis(600)),
        Answer::ok().after(Duration::from_millis(600)),
    ]);
    let proxy = Proxy::start(
        upstream.addr,
        &format!("limits: {{ max_requests: 2 }}\n{}", json_route("")),
    )
    .await;
    let first = tokio::spawn(post_event(proxy.addr, "evt_1"));
    let second = tokio::spawn(post_event(proxy.addr, "evt_2"));
    upstream.wait_for_requests(2).await;
    let shed = post_event(proxy.addr, "evt_3").await;
    assert_eq!(shed.status, 503);
    assert_eq!(shed.json()["error"], "overloaded");
    assert_eq!(shed.header("retry-after"), Some("1"));
    assert_eq!(first.await.unwrap().dedupe(), "forwarded");
    assert_eq!(second.await.unwrap().dedupe(), "forwarded");
    assert_eq!(
        post_event(proxy.addr, "evt_3").await.dedupe(),
        "forwarded",
        "a slot is free again"
    );
}

/// A proxy with `max_requests: 4` in front of an upstream whose first `slow` answers take
/// `delay`.
async fn four_places_before_a_slow_upstream(slow: usize, delay: Duration) -> (Upstream, Proxy) {
    let upstream = Upstream::start().await;
    upstream.script((0..slow).map(|_| Answer::ok().after(delay)));
    let limits = format!("limits: {{ max_requests: 4 }}\n{}", json_route(""));
    let proxy = Proxy::start(upstream.addr, &limits).await;
    (upstream, proxy)
}

/// Connections that start a protocol and stop (one byte of a request line, part of a
/// head, the HTTP/2 preface with or without SETTINGS) are closed after
/// `header_read_timeout` (and a second's grace to close): none can hold its slot for ever.
#[tokio::test]
async fn half_opened_connections_lose_their_slots() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!(
            "limits: {{ max_connections: 4, header_read_timeout: 1s }}\n{}",
            json_route("")
        ),
    )
    .await;
    let preface_and_settings = [PREFACE, EMPTY_SETTINGS].concat();
    let mut hostile = Vec::new();
    for opening in [&b"P"[..], b"POST /hooks HT", PREFACE, &preface_and_settings] {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        stream.write_all(opening).await.unwrap();
        hostile.push(stream);
    }
    let started = Instant::now();
    for stream in &mut hostile {
        assert_closed_within(stream, Duration::from_secs(4)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        post_event(proxy.addr, "evt_after").await.dedupe(),
        "forwarded"
    );
}

/// An HTTP/2 connection that served a request and then idles is closed (GOAWAY, then the
/// socket) once it has idled for `header_read_timeout`.
#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!("limits: {{ header_read_timeout: 1s }}\n{}", json_route("")),
    )
    .await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://{}/hooks", proxy.addr))
        .body(())
        .unwrap();
    let (response, mut stream) = client.send_request(request, false).unwrap();
    stream
        .send_data(bytes::Bytes::from_static(br#"{"id":"evt_h2_idle"}"#), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.headers()["dedupe-status"], "forwarded");
    let idled = Instant::now();
    tokio::time::timeout(Duration::from_secs(4), connection)
        .await
        .expect("the proxy closes an idle HTTP/2 connection")
        .unwrap()
        .ok();
    assert!(
        idled.elapsed() >= Duration::from_millis(800),
        "{:?}",
        idled.elapsed()
    );
}

/// The admin listener keeps the same deadlines (its own defaults: 10 s to send a head),
/// even for a first byte that could start an HTTP/2 preface.
#[tokio::test]
async fn the_admin_listener_does_not_wait_for_ever_either() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut stream = TcpStream::connect(proxy.admin).await.unwrap();
    stream.write_all(b"P").await.unwrap();
    assert_closed_within(&mut stream, Duration::from_secs(14)).await;
}

/// An absolute target with an empty path and a query (`http://x?a=1`) has the path `/`:
/// on a catch-all route it is claimed, forwarded as `/?a=1` and recorded, never a panic
/// that would leave its key in flight.
#[tokio::test]
async fn an_absolute_target_without_a_path_is_forwarded_not_a_panic() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: all\n    match: {}\n    key: \"{json:/id}\"\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let body = r#"{"id":"evt_abs"}"#;
    let request = format!(
        "POST http://x?a=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = raw(proxy.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("dedupe-status: forwarded"),
        "{answer}"
    );
    assert_eq!(upstream.received()[0].uri, "/?a=1");
    assert_eq!(post_json(proxy.addr, "/", body).await.dedupe(), "duplicate");

    // HTTP/2 with `:path` `?a=1`.
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://{}?a=1", proxy.addr))
        .body(())
        .unwrap();
    let (response, mut stream) = client.send_request(request, false).unwrap();
    stream
        .send_data(bytes::Bytes::from_static(br#"{"id":"evt_h2_abs"}"#), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["dedupe-status"], "forwarded");
    assert_eq!(upstream.received()[1].uri, "/?a=1");
}

/// RFC 9112 section 3.2: two Host lines, no Host in HTTP/1.1, or a Host that is no host
/// is 400, whether or not a route would take the request; nothing is claimed or forwarded.
#[tokio::test]
async fn a_request_with_two_hosts_or_none_is_400() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let body = r#"{"id":"evt_hosts"}"#;
    for (path, hosts) in [
        ("/hooks", "host: a.example\r\nhost: b.example\r\n"),
        ("/hooks", "host: a.example\r\nHost: a.example\r\n"),
        ("/elsewhere", "host: a.example\r\nhost: b.example\r\n"),
        ("/hooks", ""),
        ("/hooks", "host: user@a.example\r\n"),
    ] {
        let request = format!(
            "POST {path} HTTP/1.1\r\n{hosts}connection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{hosts:?}: {answer}");
        assert!(answer.contains(r#""error":"bad_request""#), "{answer}");
    }
    assert_eq!(upstream.requests(), 0);
    assert_eq!(
        post_event(proxy.addr, "evt_hosts").await.dedupe(),
        "forwarded"
    );
}

/// With every slot busy (each connection has a request in progress), a new connection is
/// answered 503 in a well-formed HTTP response that a real client reads whole, its length
/// the body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reads_the_too_many_connections_answer_whole() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    let upstream = Upstream::start().await;
    upstream.script((0..3).map(|_| Answer::ok().after(Duration::from_millis(800))));
    let proxy = proxy(&upstream).await;
    let busy: Vec<_> = (0..3)
        .map(|n| {
            let addr = proxy.addr;
            tokio::spawn(async move { post_event(addr, &format!("evt_busy_{n}")).await })
        })
        .collect();
    upstream.wait_for_requests(3).await;
    let client: Client<_, Full<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("http://{}/hooks", proxy.addr))
        .body(Full::new(bytes::Bytes::from_static(
            br#"{"id":"evt_full"}"#,
        )))
        .unwrap();
    let response = client.request(request).await.expect("a whole answer");
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body is as long as declared")
        .to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "too_many_connections");
    for sender in busy {
        assert_eq!(sender.await.unwrap().dedupe(), "forwarded");
    }
    assert_eq!(upstream.requests(), 3);
}

/// An HTTP/2 sender that holds a stream's window at zero stalls its response for good;
/// the connection is closed once that stream has stalled for `body_read_timeout`, however
/// busy the connection keeps its other streams, and its upstream connection comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_its_sender_will_not_read_closes_the_connection() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().body(&"x".repeat(100_000))]);
    let proxy = Proxy::start(
        upstream.addr,
        &format!(
            "limits: {{ body_read_timeout: 1s, max_requests: 2 }}\n{}",
            json_route("")
        ),
    )
    .await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::get(format!("http://{}/large", proxy.addr))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200, "the head arrives; the body cannot");
    let stalled = Instant::now();
    // Meanwhile the connection is kept busy with other requests.
    let keep_busy = tokio::spawn(async move {
        for n in 0.. {
            let Ok(mut ready) = client.clone().ready().await else {
                return;
            };
            let request = http::Request::get(format!("http://127.0.0.1/ping/{n}"))
                .body(())
                .unwrap();
            if ready.send_request(request, true).is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("the stalled connection is closed")
        .unwrap()
        .ok();
    assert!(
        stalled.elapsed() >= Duration::from_millis(900),
        "{:?}",
        stalled.elapsed()
    );
    keep_busy.abort();
    // Its places and its upstream connection came back.
    for n in 0..3 {
        assert_eq!(
            post_event(proxy.addr, &format!("evt_after_{n}"))
                .await
                .dedupe(),
            "forwarded"
        );
    }
}

/// Requests no route takes may hold at most half of `max_requests`: a slow page of the
/// application, however many ask for it, leaves room for deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_requests_leave_half_the_places_to_deliveries() {
    let (upstream, proxy) =
        four_places_before_a_slow_upstream(2, Duration::from_millis(1500)).await;
    let slow: Vec<_> = (0..2)
        .map(|n| {
            let addr = proxy.addr;
            tokio::spawn(async move { send(addr, "GET", &format!("/slow/{n}"), &[], "").await })
        })
        .collect();
    upstream.wait_for_requests(2).await;
    let refused = send(proxy.addr, "GET", "/slow/2", &[], "").await;
    assert_eq!(
        (refused.status, refused.json()["error"].as_str()),
        (503, Some("overloaded"))
    );
    assert_eq!(
        post_event(proxy.addr, "evt_beside").await.dedupe(),
        "forwarded"
    );
    for request in slow {
        assert_eq!(request.await.unwrap().status, 200);
    }
}

/// An HTTP/2 sender that sends whole requests and resets each stream cannot drive more
/// forwards than `max_requests`: a forward keeps its place until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_streams_do_not_free_the_places_of_their_forwards() {
    let (upstream, proxy) = four_places_before_a_slow_upstream(40, Duration::from_secs(3)).await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    for round in 0..5 {
        let mut streams = Vec::new();
        for n in 0..4 {
            let request = http::Request::post(format!("http://{}/hooks", proxy.addr))
                .body(())
                .unwrap();
            client = client.ready().await.unwrap();
            let (_, mut stream) = client.send_request(request, false).unwrap();
            let body = format!(r#"{{"id":"evt_rst_{round}_{n}"}}"#);
            stream.send_data(body.into(), true).unwrap();
            streams.push(stream);
        }
        // Long enough for the proxy to read the requests and claim what it may.
        tokio::time::sleep(Duration::from_millis(150)).await;
        for mut stream in streams {
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        upstream.requests(),
        4,
        "forwards beyond max_requests were refused"
    );
    // The forwards that got in run to their end, and their places come back.
    eventually(
        Duration::from_secs(6),
        "the four forwards finish",
        || async { upstream.total_executions() == 4 },
    )
    .await;
    assert_eq!(
        post_event(proxy.addr, "evt_after_resets").await.dedupe(),
        "forwarded"
    );
}

/// Senders that hang up once their unmatched request reached the application do not free
/// its place: no more such requests reach the application at once than their half of
/// `max_requests`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_requests_keep_their_places_until_the_application_answers() {
    let (upstream, proxy) = four_places_before_a_slow_upstream(20, Duration::from_secs(3)).await;
    for _ in 0..12 {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        stream
            .write_all(b"POST /elsewhere HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(stream);
    }
    assert_eq!(upstream.requests(), 2, "half of max_requests: 4");
}

/// A 502 names no upstream address: the detail goes to the log.
#[tokio::test]
async fn a_502_does_not_tell_the_sender_where_the_application_is() {
    let dead = dead_address().await;
    let proxy = Proxy::start(dead, &json_route("")).await;
    for reply in [
        post_event(proxy.addr, "evt_502").await,
        post_json(proxy.addr, "/elsewhere", "{}").await,
    ] {
        assert_eq!(reply.status, 502);
        assert_eq!(reply.json()["error"], "upstream_unreachable");
        let everything = format!("{:?} {}", reply.headers, reply.body);
        assert!(
            !everything.contains(&dead.port().to_string()),
            "{everything}"
        );
        assert!(!everything.contains("127.0.0.1"), "{everything}");
    }
}

/// One hostile connection of the soak, kept up (reconnecting when the proxy closes it)
/// until `stop`.
async fn hostile(
    kind: usize,
    addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut sink = [0u8; 1024];
    while !stop.is_cancelled() {
        // A pause between connections, so that a thousand of them do not spin the machine.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            continue;
        };
        let attack = async {
            match kind {
                // Connects and sends nothing.
                0 => {}
                // One byte of a request line.
                1 => stream.write_all(b"P").await?,
                // A head, a byte at a time.
                2 => {
                    stream
                        .write_all(b"POST /hooks HTTP/1.1\r\nhost: x\r\n")
                        .await?;
                    loop {
                        stream.write_all(b"x").await?;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
                // A body, a byte at a time.
                3 => {
                    stream
                        .write_all(
                            b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{",
                        )
                        .await?;
                    loop {
                        stream.write_all(b" ").await?;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
                // HTTP/2 requests, each reset as soon as it is sent.
                _ => {
                    let (client, connection) = h2::client::handshake(stream)
                        .await
                        .map_err(std::io::Error::other)?;
                    tokio::spawn(connection);
                    let mut n = 0u64;
                    loop {
                        let mut client = client
                            .clone()
                            .ready()
                            .await
                            .map_err(std::io::Error::other)?;
                        let request = http::Request::post(format!("http://{addr}/hooks"))
                            .body(())
                            .unwrap();
                        let (_, mut send) = client
                            .send_request(request, false)
                            .map_err(std::io::Error::other)?;
                        let body =
                            format!(r#"{{"id":"reset_{kind}_{n}_{}"}}"#, rand::random::<u64>());
                        send.send_data(body.into(), true)
                            .map_err(std::io::Error::other)?;
                        send.send_reset(h2::Reason::CANCEL);
                        n += 1;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            // Then waits for the proxy to close it.
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        };
        tokio::select! {
            _ = attack => {}
            () = stop.cancelled() => return,
        }
    }
}

/// A provider sending `count` deliveries one after the other, each retried (after 100 ms)
/// until it is acknowledged, as providers retry a 503; how long each took to be acknowledged.
async fn provider(addr: std::net::SocketAddr, tag: &str, count: usize) -> Vec<Duration> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    // A connection per delivery, as a provider's new deliveries come.
    let client: Client<_, Full<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
    let mut took = Vec::new();
    for n in 0..count {
        let started = Instant::now();
        let id = format!("evt_{tag}_{n}");
        loop {
            let request = http::Request::post(format!("http://{addr}/hooks"))
                .body(Full::new(format!(r#"{{"id":"{id}"}}"#).into()))
                .unwrap();
            // A refused, closed or silent connection is retried, as a provider retries it.
            let sent = tokio::time::timeout(Duration::from_secs(5), client.request(request)).await;
            if let Ok(Ok(response)) = sent {
                let (head, body) = response.into_parts();
                let _ = body.collect().await;
                if head.status == 200 {
                    assert_eq!(head.headers["dedupe-status"], "forwarded", "{id}");
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{id} was not acknowledged"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        took.push(started.elapsed());
    }
    took
}

fn p99(mut took: Vec<Duration>) -> Duration {
    took.sort();
    took[(took.len() * 99).div_ceil(100) - 1]
}

/// The attack soak: while a thousand hostile connections run against a proxy with room for
/// 300 (idle, one byte, slow heads, slow bodies, HTTP/2 streams reset in a loop), a
/// provider's deliveries all get through, each forwarded once. Prints the provider's p99
/// with and without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_get_through_a_thousand_hostile_connections() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(
        upstream.addr,
        &format!(
            "limits: {{ max_connections: 300, header_read_timeout: 2s, body_read_timeout: 2s }}\n{}",
            json_route("")
        ),
    )
    .await;
    let quiet = p99(provider(proxy.addr, "quiet", 100).await);
    let stop = tokio_util::sync::CancellationToken::new();
    let attackers: Vec<_> = (0..1000)
        .map(|n| tokio::spawn(hostile(n % 5, proxy.addr, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attacked = p99(provider(proxy.addr, "attacked", 100).await);
    stop.cancel();
    for attacker in attackers {
        attacker.await.unwrap();
    }
    for n in 0..100 {
        assert_eq!(upstream.executions(&format!("evt_attacked_{n}")), 1);
    }
    eprintln!("provider p99: {quiet:?} without the attack, {attacked:?} under it");
}

/// A connection told to close (the server stopping, here) takes no new request, even from
/// an HTTP/2 peer that ignores the GOAWAY and never acknowledges its PING: the stream it
/// opens meanwhile is answered, and nothing of it is claimed or forwarded once the drain
/// began, while the request already in progress finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_connection_takes_no_new_request() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(1000))]);
    let mut proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let mut peer = TcpStream::connect(proxy.addr).await.unwrap();
    let opening = [PREFACE, EMPTY_SETTINGS, &raw_h2_post(1, "evt_before")].concat();
    peer.write_all(&opening).await.unwrap();
    upstream.wait_for_requests(1).await;
    let app = proxy.app.take().unwrap();
    let stopping = tokio::spawn(app.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    peer.write_all(&raw_h2_post(3, "evt_during")).await.unwrap();
    // Frames until stream 3 is answered (HEADERS) or reset.
    let mut answered = false;
    let deadline = Instant::now() + Duration::from_secs(3);
    while !answered && Instant::now() < deadline {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout(Duration::from_secs(3), peer.read_exact(&mut head)).await;
        let Ok(Ok(_)) = read else { break };
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; length];
        peer.read_exact(&mut payload).await.unwrap();
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        answered = stream == 3 && (head[3] == 1 || head[3] == 3);
    }
    assert!(answered, "the stream opened after the GOAWAY is answered");
    stopping.await.unwrap().unwrap();
    assert_eq!(
        upstream.requests(),
        1,
        "nothing of it was claimed or forwarded"
    );
}
