//! Upstreams that misbehave: answering before reading the body, closing pooled
//! connections, dropping a request after reading it, streaming large or slow answers,
//! informational and redirect statuses. The proxy stays correct: a success is relayed
//! only for a success, a failure releases, and a request is never silently sent twice.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|line| {
            line.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0)
}

fn dedupe_key(head: &str) -> String {
    head.lines()
        .find_map(|line| line.strip_prefix("dedupe-key: ").map(str::to_owned))
        .unwrap_or_default()
}

async fn read_body(stream: &mut TcpStream, head: &str) -> Vec<u8> {
    let mut body = vec![0; content_length(head)];
    stream.read_exact(&mut body).await.unwrap();
    body
}

#[tokio::test]
async fn an_upstream_that_answers_before_reading_the_body_is_handled_consistently() {
    let upstream = raw_upstream(|mut stream| async move {
        if read_head(&mut stream).await.is_some() {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nearly",
                )
                .await;
        }
    })
    .await;
    let proxy = Proxy::start(upstream, &json_route("    max_body: 4MiB\n")).await;
    let body = format!(r#"{{"id":"evt_early","pad":"{}"}}"#, "x".repeat(2 << 20));
    let first = post_json(proxy.addr, "/hooks", &body).await;
    let second = post_json(proxy.addr, "/hooks", &body).await;
    // Either the early answer counts (done, then a duplicate) or the cut-off write is a
    // failure (released, then forwarded again, where the same race may cut it off again);
    // never a success followed by a second run, never a failure followed by a duplicate.
    match (first.status, first.dedupe()) {
        (200, "forwarded") => assert_eq!(second.dedupe(), "duplicate"),
        (502, "released") => assert!(
            ["forwarded", "released"].contains(&second.dedupe()),
            "the retry of a failed delivery must reach the app again: {}",
            second.dedupe()
        ),
        other => panic!("unexpected first answer {other:?}"),
    }
}

#[tokio::test]
async fn an_upstream_that_closes_its_keep_alive_connections_never_gets_a_request_twice() {
    // Answers one request per connection, advertising keep-alive, then closes.
    let per_event: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let seen = Arc::clone(&per_event);
    let upstream = raw_upstream(move |mut stream| {
        let seen = Arc::clone(&seen);
        async move {
            if let Some(head) = read_head(&mut stream).await {
                read_body(&mut stream, &head).await;
                *seen.lock().unwrap().entry(dedupe_key(&head)).or_default() += 1;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    })
    .await;
    let proxy = Proxy::start(upstream, &json_route("")).await;
    let mut attempts: HashMap<String, usize> = HashMap::new();
    for event in 0..60 {
        let id = format!("evt_{event}");
        loop {
            let reply = post_event(proxy.addr, &id).await;
            *attempts.entry(id.clone()).or_default() += 1;
            if reply.status == 200 {
                assert_eq!(reply.dedupe(), "forwarded");
                break;
            }
            assert_eq!((reply.status, reply.dedupe()), (502, "released"));
        }
    }
    let per_event = per_event.lock().unwrap();
    for (id, tries) in &attempts {
        let received = per_event.get(id).copied().unwrap_or(0);
        assert!(
            received >= 1 && received <= *tries,
            "{id}: {received} received for {tries} attempts"
        );
    }
    assert_eq!(
        per_event.values().sum::<usize>(),
        60,
        "every event reached the app once: {per_event:?}"
    );
}

#[tokio::test]
async fn a_request_dropped_after_reaching_the_upstream_is_not_resent() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::abort()]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let reply = post_event(proxy.addr, "evt_drop").await;
    assert_eq!((reply.status, reply.dedupe()), (502, "released"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        upstream.requests(),
        1,
        "the pool must not re-send a request the upstream may have seen"
    );
}

#[tokio::test]
async fn a_slow_chunked_answer_streams_through_without_waiting_for_its_end() {
    let release = Arc::new(tokio::sync::Notify::new());
    let hold = Arc::clone(&release);
    let upstream = raw_upstream(move |mut stream| {
        let hold = Arc::clone(&hold);
        async move {
            let head = read_head(&mut stream).await.unwrap();
            read_body(&mut stream, &head).await;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                .await
                .unwrap();
            hold.notified().await;
            stream.write_all(b"4\r\nlast\r\n0\r\n\r\n").await.unwrap();
        }
    })
    .await;
    let proxy = Proxy::start(upstream, &json_route("")).await;
    let mut sender = TcpStream::connect(proxy.addr).await.unwrap();
    let body = r#"{"id":"evt_stream"}"#;
    sender
        .write_all(
            format!(
                "POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("first") {
        let read = tokio::time::timeout(Duration::from_secs(3), sender.read(&mut buffer))
            .await
            .expect("the first chunk must arrive while the upstream holds the rest")
            .unwrap();
        assert!(read > 0);
        seen.extend_from_slice(&buffer[..read]);
    }
    assert!(
        String::from_utf8_lossy(&seen)
            .to_ascii_lowercase()
            .contains("dedupe-status: forwarded")
    );
    release.notify_one();
    while !String::from_utf8_lossy(&seen).ends_with("0\r\n\r\n") {
        let read = sender.read(&mut buffer).await.unwrap();
        assert!(read > 0);
        seen.extend_from_slice(&buffer[..read]);
    }
    assert!(String::from_utf8_lossy(&seen).contains("last"));
}

#[tokio::test]
async fn a_large_answer_passes_through_whole() {
    const SIZE: usize = 32 << 20;
    let upstream = raw_upstream(|mut stream| async move {
        let head = read_head(&mut stream).await.unwrap();
        read_body(&mut stream, &head).await;
        let header = format!("HTTP/1.1 200 OK\r\ncontent-length: {SIZE}\r\n\r\n");
        stream.write_all(header.as_bytes()).await.unwrap();
        let block = vec![b'z'; 1 << 16];
        for _ in 0..SIZE / block.len() {
            if stream.write_all(&block).await.is_err() {
                return;
            }
        }
    })
    .await;
    let proxy = Proxy::start(upstream, &json_route("")).await;
    let reply = post_event(proxy.addr, "evt_large").await;
    assert_eq!((reply.status, reply.dedupe()), (200, "forwarded"));
    assert_eq!(reply.body.len(), SIZE);
}

#[tokio::test]
async fn informational_answers_are_skipped_and_redirects_release() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let upstream = raw_upstream(move |mut stream| {
        let counter = Arc::clone(&counter);
        async move {
            while let Some(head) = read_head(&mut stream).await {
                read_body(&mut stream, &head).await;
                let answer: &[u8] = if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                    b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n"
                } else {
                    b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone"
                };
                stream.write_all(answer).await.unwrap();
            }
        }
    })
    .await;
    let proxy = Proxy::start(upstream, &json_route("")).await;
    let redirected = post_event(proxy.addr, "evt_1xx").await;
    assert_eq!((redirected.status, redirected.dedupe()), (302, "released"));
    assert_eq!(redirected.header("location"), Some("/elsewhere"));
    let hinted = post_event(proxy.addr, "evt_1xx").await;
    assert_eq!(
        (hinted.status, hinted.dedupe(), hinted.body.as_str()),
        (200, "forwarded", "done")
    );
    assert_eq!(
        post_event(proxy.addr, "evt_1xx").await.dedupe(),
        "duplicate"
    );
}
