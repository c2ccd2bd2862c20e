//! Faithful replays (`duplicate_response.replay`): a duplicate gets the app's recorded
//! status, body and the headers `replay_headers` names, marked `Idempotent-Replayed: true`;
//! other headers (cookies included) are not recorded unless listed, and an answer whose
//! body and recorded headers exceed 64 KiB is not kept. A chunked answer is kept too; one
//! ended by closing the connection is not (a crash ends it the same way); past 64 KiB,
//! or when its body outlasts `upstream_timeout`, an answer is relayed whole and not kept,
//! and a body that breaks off reaches the sender broken, not as a whole empty answer.

use crate::support;

use support::*;

fn replaying_route(headers: &str) -> String {
    json_route(&format!(
        "    duplicate_response: {{ replay: true{headers} }}\n"
    ))
}

fn created() -> Answer {
    Answer::status(201)
        .body(r#"{"order":77}"#)
        .header("content-type", "application/vnd.app+json")
        .header("location", "/orders/77")
        .header("etag", "\"v1\"")
        .header("cache-control", "no-store")
        .header("x-request-id", "req-1")
        .header("set-cookie", "session=secret")
}

#[tokio::test]
async fn a_replay_repeats_the_default_headers_and_says_it_is_a_replay() {
    let upstream = Upstream::start().await;
    upstream.script([created()]);
    let proxy = Proxy::start(upstream.addr, &replaying_route("")).await;
    let first = post_event(proxy.addr, "evt_1").await;
    assert_eq!(first.status, 201);
    assert_eq!(
        first.header("idempotent-replayed"),
        None,
        "the first answer is no replay"
    );
    assert_eq!(first.header("set-cookie"), Some("session=secret"));

    let replay = post_event(proxy.addr, "evt_1").await;
    assert_eq!((replay.status, replay.dedupe()), (201, "duplicate"));
    assert_eq!(replay.body, r#"{"order":77}"#);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    for (name, value) in [
        ("content-type", "application/vnd.app+json"),
        ("location", "/orders/77"),
        ("etag", "\"v1\""),
        ("cache-control", "no-store"),
    ] {
        assert_eq!(replay.header(name), Some(value), "{name}");
    }
    assert_eq!(replay.header("x-request-id"), None, "not listed");
    assert_eq!(replay.header("set-cookie"), None, "a cookie only if listed");
    assert_eq!(upstream.requests(), 1);
}

#[tokio::test]
async fn replay_headers_names_exactly_what_is_replayed_every_value_of_it() {
    let upstream = Upstream::start().await;
    upstream.script([created().header("set-cookie", "theme=dark")]);
    let route = replaying_route(", replay_headers: [Set-Cookie, x-request-id]");
    let proxy = Proxy::start(upstream.addr, &route).await;
    post_event(proxy.addr, "evt_1").await;
    let replay = post_event(proxy.addr, "evt_1").await;
    let cookies: Vec<_> = replay
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|value| value.to_str().unwrap())
        .collect();
    assert_eq!(cookies, ["session=secret", "theme=dark"]);
    assert_eq!(replay.header("x-request-id"), Some("req-1"));
    assert_eq!(
        replay.header("location"),
        None,
        "the list replaces the default"
    );
    assert_eq!(replay.header("content-type"), None);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
}

#[tokio::test]
async fn without_replay_a_duplicate_is_the_configured_answer_and_no_replay() {
    let upstream = Upstream::start().await;
    upstream.script([created()]);
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    post_event(proxy.addr, "evt_1").await;
    let duplicate = post_event(proxy.addr, "evt_1").await;
    assert_eq!((duplicate.status, duplicate.dedupe()), (200, "duplicate"));
    assert_eq!(duplicate.header("idempotent-replayed"), None);
    assert_eq!(duplicate.header("location"), None);
}

#[tokio::test]
async fn an_answer_over_64_kib_with_its_recorded_headers_is_not_kept() {
    let upstream = Upstream::start().await;
    let body = "x".repeat(60 * 1024);
    let big_header = "y".repeat(8 * 1024);
    upstream.script([
        // 60 KiB of body alone fits; with an 8 KiB recorded header it does not.
        Answer::status(201).body(&body).header("etag", &big_header),
        Answer::status(201).body(&body).header("etag", "\"small\""),
    ]);
    let proxy = Proxy::start(upstream.addr, &replaying_route("")).await;
    assert_eq!(
        post_event(proxy.addr, "evt_big").await.body.len(),
        body.len()
    );
    let not_kept = post_event(proxy.addr, "evt_big").await;
    assert_eq!((not_kept.status, not_kept.dedupe()), (200, "duplicate"));
    assert_eq!(
        not_kept.header("idempotent-replayed"),
        None,
        "{}",
        &not_kept.body[..40]
    );

    post_event(proxy.addr, "evt_fits").await;
    let kept = post_event(proxy.addr, "evt_fits").await;
    assert_eq!((kept.status, kept.body.len()), (201, body.len()));
    assert_eq!(kept.header("etag"), Some("\"small\""));
    assert_eq!(kept.header("idempotent-replayed"), Some("true"));
}

#[tokio::test]
async fn a_compressed_answer_is_replayed_with_its_encoding_listed_or_not() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201)
        .body("compressed bytes")
        .header("content-encoding", "gzip")
        .header("content-type", "application/json")]);
    let route = replaying_route(", replay_headers: [content-type]");
    let proxy = Proxy::start(upstream.addr, &route).await;
    post_event(proxy.addr, "evt_1").await;
    let replay = post_event(proxy.addr, "evt_1").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        replay.header("content-encoding"),
        Some("gzip"),
        "the body's encoding"
    );
    assert_eq!(replay.body, "compressed bytes");
}

/// An upstream answering every request with `answer` (after reading the request whole),
/// written as raw bytes, then closing; with `pause` `(at, wait)`, it writes `answer[..at]`,
/// waits `wait`, then writes the rest.
async fn upstream_writing(
    answer: Vec<u8>,
    pause: Option<(usize, std::time::Duration)>,
) -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    let answer = std::sync::Arc::new(answer);
    raw_upstream(move |mut stream| {
        let answer = std::sync::Arc::clone(&answer);
        async move {
            if read_request(&mut stream).await.is_none() {
                return;
            }
            let (first, rest) = answer.split_at(pause.map_or(answer.len(), |(at, _)| at));
            let _ = stream.write_all(first).await;
            if let Some((_, wait)) = pause {
                tokio::time::sleep(wait).await;
            }
            let _ = stream.write_all(rest).await;
            let _ = stream.shutdown().await;
        }
    })
    .await
}

/// `text` as chunks of at most `size` bytes, the chunked encoding's way.
fn chunked(text: &str, size: usize) -> String {
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(size) {
        out.push_str(&format!(
            "{:x}\r\n{}\r\n",
            chunk.len(),
            std::str::from_utf8(chunk).unwrap()
        ));
    }
    out + "0\r\n\r\n"
}

#[tokio::test]
async fn a_chunked_answer_is_replayed_and_one_ended_by_closing_is_relayed_not_kept() {
    let body = r#"{"order":78,"state":"paid"}"#;
    let chunked_answer = format!(
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{}",
        chunked(body, 7)
    );
    let upstream = upstream_writing(chunked_answer.into_bytes(), None).await;
    let proxy = Proxy::start(upstream, &replaying_route("")).await;
    let first = post_event(proxy.addr, "evt_chunked").await;
    assert_eq!((first.status, first.body.as_str()), (201, body));
    let replay = post_event(proxy.addr, "evt_chunked").await;
    assert_eq!(
        (replay.status, replay.dedupe(), replay.body.as_str()),
        (201, "duplicate", body)
    );
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("content-type"), Some("application/json"));

    // Ended by closing: a crash mid-answer would end it the same way, so it is not kept.
    let closed = format!("HTTP/1.0 201 Created\r\ncontent-type: application/json\r\n\r\n{body}");
    let upstream = upstream_writing(closed.into_bytes(), None).await;
    let proxy = Proxy::start(upstream, &replaying_route("")).await;
    let first = post_event(proxy.addr, "evt_closed").await;
    assert_eq!((first.status, first.body.as_str()), (201, body));
    let duplicate = post_event(proxy.addr, "evt_closed").await;
    assert_eq!((duplicate.status, duplicate.dedupe()), (200, "duplicate"));
    assert_eq!(duplicate.header("idempotent-replayed"), None);
}

#[tokio::test]
async fn a_chunked_answer_that_breaks_off_reaches_the_sender_broken_and_is_not_kept() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Two chunks, then the connection closes without the last, empty chunk.
    let broken = "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n3\r\nsec";
    let upstream = upstream_writing(broken.as_bytes().to_vec(), None).await;
    let proxy = Proxy::start(upstream, &replaying_route("")).await;
    let event = r#"{"id":"evt_broken","type":"test"}"#;
    let request = format!(
        "POST /hooks HTTP/1.1\r\nhost: hooks\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{event}",
        event.len()
    );
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("the proxy ends the broken answer");
    // Cut off (hyper may close before it has written anything), never whole.
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty()
            || (answer.starts_with("HTTP/1.1 201")
                && !answer.ends_with("0\r\n\r\n")
                && !answer.contains("content-length: 0")),
        "a broken answer must not look whole: {answer}"
    );
    let duplicate = post_event(proxy.addr, "evt_broken").await;
    assert_eq!(duplicate.header("idempotent-replayed"), None);
}

#[tokio::test]
async fn an_unsized_answer_over_64_kib_is_relayed_whole_and_not_kept() {
    // 100 KiB in 1 000-byte chunks, each line numbered: a lost or repeated part would show.
    let body: String = (0..1600).map(|n| format!("{n:063}\n")).collect();
    let answer = format!(
        "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n{}",
        chunked(&body, 1000)
    );
    let upstream = upstream_writing(answer.into_bytes(), None).await;
    let proxy = Proxy::start(upstream, &replaying_route("")).await;
    let first = post_event(proxy.addr, "evt_long").await;
    assert_eq!(first.status, 201);
    assert!(first.body == body, "the answer arrived whole and in order");
    let duplicate = post_event(proxy.addr, "evt_long").await;
    assert_eq!((duplicate.status, duplicate.dedupe()), (200, "duplicate"));
    assert_eq!(duplicate.header("idempotent-replayed"), None);
}

#[tokio::test]
async fn an_answer_whose_body_outlasts_upstream_timeout_is_relayed_whole_and_not_kept() {
    let text = "first part, then after a pause the second";
    let answers = [
        format!(
            "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n{}",
            chunked(text, 11)
        ),
        format!(
            "HTTP/1.1 201 Created\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        ),
    ];
    let route = replaying_route("").replace(
        "    duplicate_response",
        "    upstream_timeout: 300ms\n    duplicate_response",
    );
    for answer in answers {
        // The head and a part of the body at once, the rest past the route's 300 ms.
        let split = answer.find("\r\n\r\n").unwrap() + 20;
        let pause = Some((split, std::time::Duration::from_millis(900)));
        let upstream = upstream_writing(answer.clone().into_bytes(), pause).await;
        let proxy = Proxy::start(upstream, &route).await;
        let first = post_event(proxy.addr, "evt_slow").await;
        assert_eq!(
            (first.status, first.dedupe(), first.body.as_str()),
            (201, "forwarded", text),
            "{answer}"
        );
        let duplicate = post_event(proxy.addr, "evt_slow").await;
        assert_eq!((duplicate.status, duplicate.dedupe()), (200, "duplicate"));
        assert_eq!(duplicate.header("idempotent-replayed"), None);
    }
}

#[tokio::test]
async fn a_no_content_answer_is_replayed() {
    let upstream = upstream_writing(
        b"HTTP/1.1 204 No Content\r\netag: \"v2\"\r\n\r\n".to_vec(),
        None,
    )
    .await;
    let proxy = Proxy::start(upstream, &replaying_route("")).await;
    assert_eq!(post_event(proxy.addr, "evt_204").await.status, 204);
    let replay = post_event(proxy.addr, "evt_204").await;
    assert_eq!((replay.status, replay.dedupe()), (204, "duplicate"));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("etag"), Some("\"v2\""));
}

/// An app dripping its answer a byte a chunk, each chunk's size padded with zeros (which
/// HTTP/1.1 parsers accept): the answer is kept whole, from its many frames, and replayed.
#[tokio::test]
async fn a_drip_fed_answer_of_many_padded_chunks_is_kept_whole() {
    let body: String = (0..4000u32)
        .map(|n| char::from(b'a' + (n % 26) as u8))
        .collect();
    let chunks: String = body
        .chars()
        .map(|c| format!("00000001\r\n{c}\r\n"))
        .collect();
    let answer =
        format!("HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n{chunks}0\r\n\r\n");
    let upstream = upstream_writing(answer.into_bytes(), None).await;
    let proxy = Proxy::start(upstream, &replaying_route("")).await;
    let first = post_event(proxy.addr, "evt_drip").await;
    assert_eq!(first.status, 201);
    assert!(first.body == body, "relayed whole and in order");
    let replay = post_event(proxy.addr, "evt_drip").await;
    assert_eq!((replay.status, replay.dedupe()), (201, "duplicate"));
    assert!(replay.body == body, "replayed whole and in order");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
}
