//! Hostile or broken senders: each gets a clear 4xx or a closed connection, never a panic
//! or an unbounded buffer, and nothing of theirs is claimed or forwarded.

mod support;

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
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> String {
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
    read_until_closed(&mut stream, Duration::from_secs(3)).await;
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
    read_until_closed(&mut stream, Duration::from_secs(3)).await;
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
    let answer = read_until_closed(&mut stream, Duration::from_secs(3)).await;
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
    let answer = read_until_closed(&mut stream, Duration::from_secs(3)).await;
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
    read_until_closed(&mut stream, Duration::from_secs(3)).await;
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

#[tokio::test]
async fn connections_over_the_limit_are_refused_with_503() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(proxy.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut extra = TcpStream::connect(proxy.addr).await.unwrap();
    let answer = read_until_closed(&mut extra, Duration::from_secs(2)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"], "too_many_connections");
    // A slot frees when a connection closes.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        post_event(proxy.addr, "evt_after").await.dedupe(),
        "forwarded"
    );
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
