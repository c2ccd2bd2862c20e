//! The delivery log on a real proxy: every request a route takes is logged with its
//! outcome, the app's status and the request's id, newest first; filters, cursors bound
//! to their filter, one entry whole, the live tail (Server-Sent Events), what a route
//! records of bodies and headers (nothing by default, never a signature), unmatched
//! requests only when asked, and bad filters refused with a clear 400.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

const ROUTES: &str = "routes:
  - name: hooks
    match: { method: POST, path: /hooks }
    key: \"{json:/id}\"
  - name: signed
    match: { method: POST, path: /signed }
    key: \"{json:/id}\"
    verify: { hmac: { secret_env: PATH, header: X-Sig } }
";

/// The log's entries as `GET /v1/deliveries?query` lists them, and the next cursor.
async fn listed(proxy: &Proxy, query: &str) -> (Vec<serde_json::Value>, Option<String>) {
    let reply = admin(proxy, "GET", &format!("/v1/deliveries?{query}"), "").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let json = reply.json();
    let next = json["next"].as_str().map(str::to_owned);
    (json["deliveries"].as_array().unwrap().clone(), next)
}

/// Waits until the log holds `count` entries that `query` lists.
async fn logged(proxy: &Proxy, query: &str, count: usize) -> Vec<serde_json::Value> {
    let started = std::time::Instant::now();
    loop {
        let found = listed(proxy, &format!("{query}&limit=500")).await.0;
        if found.len() >= count || started.elapsed() > Duration::from_secs(5) {
            assert_eq!(found.len(), count, "{found:#?}");
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn outcomes(entries: &[serde_json::Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|entry| entry["outcome"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn every_request_a_route_takes_is_logged_newest_first_with_its_fate() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201), Answer::status(500)]);
    let proxy = Proxy::start(upstream.addr, ROUTES).await;

    let headers = [
        ("content-type", "application/json"),
        ("x-request-id", "req-7"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ];
    let first = send(proxy.addr, "POST", "/hooks", &headers, r#"{"id":"evt_1"}"#).await;
    assert_eq!(first.status, 201);
    assert_eq!(post_event(proxy.addr, "evt_1").await.dedupe(), "duplicate");
    assert_eq!(post_event(proxy.addr, "evt_2").await.status, 500);
    assert_eq!(
        post_json(proxy.addr, "/hooks", r#"{"no":"id"}"#)
            .await
            .status,
        400
    );
    assert_eq!(
        post_json(proxy.addr, "/signed", r#"{"id":"x"}"#)
            .await
            .status,
        401
    );
    assert_eq!(post_json(proxy.addr, "/elsewhere", "{}").await.status, 200);

    let entries = logged(&proxy, "", 5).await;
    assert_eq!(
        outcomes(&entries),
        [
            "signature_refused",
            "bad_request",
            "upstream_error",
            "duplicate",
            "forwarded"
        ],
        "newest first; the unmatched request is not logged by default"
    );
    let forwarded = &entries[4];
    assert_eq!(forwarded["route"], "hooks");
    assert_eq!(forwarded["scope"], "hooks");
    assert_eq!(forwarded["key"], "evt_1");
    assert_eq!(forwarded["status"], 201);
    assert_eq!(forwarded["upstream_status"], 201);
    assert!(forwarded["upstream_ms"].is_u64());
    assert_eq!(forwarded["size"], 14);
    assert_eq!(forwarded["method"], "POST");
    assert_eq!(forwarded["path"], "/hooks");
    assert_eq!(forwarded["request_id"], "req-7");
    assert_eq!(forwarded["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert!(
        forwarded["client"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(forwarded["body_recorded"], false);
    assert_eq!(entries[3]["upstream_status"], serde_json::Value::Null);
    assert_eq!(entries[2]["upstream_status"], 500);
    assert_eq!(entries[2]["status"], 500);
    assert_eq!(entries[1]["refusal"], "missing_key");
    assert_eq!(entries[0]["refusal"], "missing_signature");
    assert_eq!(entries[0]["route"], "signed");

    // Filters: outcome (several), key, prefix, route, status and class, time.
    let only = |query: &'static str| {
        let proxy = &proxy;
        async move { outcomes(&listed(proxy, query).await.0).join(",") }
    };
    assert_eq!(
        only("outcome=duplicate,forwarded").await,
        "duplicate,forwarded"
    );
    assert_eq!(only("key=evt_1").await, "duplicate,forwarded");
    assert_eq!(
        only("key_prefix=evt_").await,
        "upstream_error,duplicate,forwarded"
    );
    assert_eq!(only("route=signed").await, "signature_refused");
    assert_eq!(only("status=5xx").await, "upstream_error");
    assert_eq!(only("upstream_status=201").await, "forwarded");
    assert_eq!(only("status=4xx&route=hooks").await, "bad_request");
    assert_eq!(only("until=2000-01-01T00:00:00Z").await, "");
    assert_eq!(
        only("since=2000-01-01T00:00:00Z&outcome=forwarded").await,
        "forwarded"
    );

    // One entry whole.
    let id = forwarded["id"].as_str().unwrap();
    let one = admin(&proxy, "GET", &format!("/v1/deliveries/{id}"), "").await;
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(one.json()["key"], "evt_1");
    assert_eq!(one.json()["headers"], serde_json::json!([]));
    assert_eq!(one.json()["body"], serde_json::Value::Null);
    for missing in ["999999999-0", "tail-x", "1-2-3"] {
        let reply = admin(&proxy, "GET", &format!("/v1/deliveries/{missing}"), "").await;
        assert_eq!(reply.status, 404, "{missing}: {}", reply.body);
        assert_eq!(reply.json()["error"], "no_such_delivery");
    }
}

#[tokio::test]
async fn pages_follow_their_cursor_and_a_cursor_is_refused_with_another_filter() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, ROUTES).await;
    for n in 0..7 {
        post_event(proxy.addr, &format!("evt_{n}")).await;
    }
    logged(&proxy, "", 7).await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(cursor) => format!("route=hooks&limit=3&cursor={}", percent(cursor)),
            None => "route=hooks&limit=3".to_owned(),
        };
        let (entries, next) = listed(&proxy, &query).await;
        seen.extend(
            entries
                .iter()
                .map(|entry| entry["key"].as_str().unwrap().to_owned()),
        );
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(seen.len() <= 7, "pages never end: {seen:?}");
    }
    let expected: Vec<_> = (0..7).rev().map(|n| format!("evt_{n}")).collect();
    assert_eq!(seen, expected);

    let (_, next) = listed(&proxy, "route=hooks&limit=2").await;
    let next = next.unwrap();
    let other = admin(
        &proxy,
        "GET",
        &format!(
            "/v1/deliveries?route=signed&limit=2&cursor={}",
            percent(&next)
        ),
        "",
    )
    .await;
    assert_eq!(other.status, 400);
    assert!(
        other.json()["detail"]
            .as_str()
            .unwrap()
            .contains("another filter")
    );

    for (query, says) in [
        ("cursor=garbage", "cursor"),
        ("cursor=1-2.0000000000000000", "another filter"),
        ("outcome=nope", "outcome `nope`"),
        ("status=2x", "status `2x`"),
        ("upstream_status=600", "upstream_status `600`"),
        ("since=soon", "since `soon`"),
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("colour=blue", "unknown query parameter"),
    ] {
        let reply = admin(&proxy, "GET", &format!("/v1/deliveries?{query}"), "").await;
        assert_eq!(reply.status, 400, "{query}: {}", reply.body);
        assert_eq!(reply.json()["error"], "bad_request");
        let detail = reply.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(says), "{query}: {detail}");
    }
}

#[tokio::test]
async fn a_route_records_bodies_and_named_headers_only_when_told() {
    let upstream = Upstream::start().await;
    let routes = json_route(
        "    log: { bodies: true, max_body_bytes: 16, headers: [x-github-event, x-request-id, x-forwarded-for] }\n",
    );
    let proxy = Proxy::start(upstream.addr, &routes).await;
    let headers = [
        ("content-type", "application/json"),
        ("x-github-event", "push"),
        ("authorization", "Bearer secret-token"),
        ("x-request-id", "r1"),
        ("x-forwarded-for", "203.0.113.9"),
    ];
    let body = r#"{"id":"evt_b","padding":"0123456789"}"#;
    send(proxy.addr, "POST", "/hooks", &headers, body).await;
    let entries = logged(&proxy, "", 1).await;
    let id = entries[0]["id"].as_str().unwrap();
    let whole = admin(&proxy, "GET", &format!("/v1/deliveries/{id}"), "")
        .await
        .json();
    assert_eq!(whole["body"], &body[..16]);
    assert_eq!(whole["body_encoding"], "utf-8");
    assert_eq!(whole["body_truncated"], true);
    // As the sender sent them: the app is told the sender's address too.
    assert_eq!(
        whole["headers"],
        serde_json::json!([
            ["x-github-event", "push"],
            ["x-request-id", "r1"],
            ["x-forwarded-for", "203.0.113.9"]
        ])
    );
    assert_eq!(
        upstream.received()[0].headers["x-forwarded-for"],
        "203.0.113.9, 127.0.0.1"
    );
    assert!(!whole.to_string().contains("secret-token"));
}

#[test]
fn a_log_never_names_a_signature_or_credential_header() {
    for header in [
        "stripe-signature",
        "Authorization",
        "cookie",
        "x-shopify-hmac-sha256",
        "x-api-key",
    ] {
        let text = format!(
            "upstream: http://127.0.0.1:1\n{}",
            json_route(&format!("    log: {{ headers: [{header}] }}\n"))
        );
        let error = dedupe_proxy::config::Config::parse(
            &text,
            std::path::Path::new("test.yaml"),
            &Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("never are"), "{header}: {error}");
        assert!(error.contains("test.yaml:"), "{error}");
    }
    let text = "upstream: http://127.0.0.1:1\nroutes:\n  - name: h\n    match: { path: /h }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Acme } }\n    log: { headers: [x-acme, x-other] }\n";
    let config = parse_config(text);
    let names: Vec<_> = config.routes[0]
        .policy
        .log
        .headers
        .iter()
        .map(|h| h.as_str())
        .collect();
    assert_eq!(
        names,
        ["x-other"],
        "the route's own signature header is left out"
    );
}

#[tokio::test]
async fn unmatched_requests_are_logged_only_when_asked() {
    let upstream = Upstream::start().await;
    let rest = format!("delivery_log: {{ unmatched: true }}\n{ROUTES}");
    let proxy = Proxy::start(upstream.addr, &rest).await;
    post_json(proxy.addr, "/elsewhere", "{}").await;
    let entries = logged(&proxy, "outcome=unmatched", 1).await;
    assert_eq!(entries[0]["route"], serde_json::Value::Null);
    assert_eq!(entries[0]["path"], "/elsewhere");
    assert_eq!(entries[0]["upstream_status"], 200);
}

#[tokio::test]
async fn a_log_that_is_off_answers_so() {
    let upstream = Upstream::start().await;
    let rest = format!("delivery_log: {{ enabled: false }}\n{ROUTES}");
    let proxy = Proxy::start(upstream.addr, &rest).await;
    post_event(proxy.addr, "evt_1").await;
    for path in [
        "/v1/deliveries",
        "/v1/deliveries/1-0",
        "/v1/deliveries/tail",
    ] {
        let reply = admin(&proxy, "GET", path, "").await;
        assert_eq!(reply.status, 404, "{path}");
        assert_eq!(reply.json()["error"], "no_delivery_log");
    }
}

/// A live tail's stream, read as it comes.
struct Tail {
    body: hyper::body::Incoming,
    text: String,
}

impl Tail {
    async fn open(proxy: &Proxy, query: &str) -> Result<Tail, u16> {
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let uri = format!("http://{}/v1/deliveries/tail?{query}", proxy.admin);
        let response = client.get(uri.parse().unwrap()).await.unwrap();
        if response.status() != 200 {
            return Err(response.status().as_u16());
        }
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Ok(Tail {
            body: response.into_body(),
            text: String::new(),
        })
    }

    /// Reads until the stream holds `count` delivery events; returns their data.
    async fn events(&mut self, count: usize) -> Vec<serde_json::Value> {
        let read = async {
            loop {
                let events: Vec<serde_json::Value> = self
                    .text
                    .split("\n\n")
                    .filter(|event| event.contains("event: delivery"))
                    .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
                    .map(|data| serde_json::from_str(data).unwrap())
                    .collect();
                if events.len() >= count {
                    return events;
                }
                let frame = self.body.frame().await.expect("the stream ended").unwrap();
                if let Ok(data) = frame.into_data() {
                    self.text.push_str(&String::from_utf8_lossy(&data));
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("tail events in time")
    }
}

#[tokio::test]
async fn a_live_tail_streams_what_its_filter_admits_and_tails_are_bounded() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, ROUTES).await;
    let mut duplicates = Tail::open(&proxy, "outcome=duplicate").await.unwrap();
    let mut everything = Tail::open(&proxy, "").await.unwrap();
    post_event(proxy.addr, "evt_t").await;
    post_event(proxy.addr, "evt_t").await;
    let all = everything.events(2).await;
    assert_eq!(outcomes(&all), ["forwarded", "duplicate"]);
    let only = duplicates.events(1).await;
    assert_eq!(outcomes(&only), ["duplicate"]);
    assert!(
        everything.text.contains("id: "),
        "each event carries its entry's id"
    );

    let bad = Tail::open(&proxy, "outcome=perhaps").await;
    assert_eq!(bad.err(), Some(400));
    let mut more = Vec::new();
    for _ in 0..2 {
        more.push(Tail::open(&proxy, "").await.unwrap());
    }
    assert_eq!(
        Tail::open(&proxy, "").await.err(),
        Some(429),
        "four tails per credential (here loopback), of eight in all"
    );
    drop(more);
    eventually(
        Duration::from_secs(20),
        "a place freed by a client gone",
        || async {
            post_event(proxy.addr, "evt_nudge").await;
            Tail::open(&proxy, "").await.is_ok()
        },
    )
    .await;
}

#[tokio::test]
async fn a_queued_event_is_logged_when_accepted_and_at_each_attempt() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(503), Answer::ok()]);
    let routes =
        json_route("    delivery: queued\n    queue: { backoff_base: 50ms, backoff_cap: 50ms }\n");
    let proxy = Proxy::start(upstream.addr, &routes).await;
    assert_eq!(post_event(proxy.addr, "evt_q").await.status, 202);
    let entries = logged(&proxy, "key=evt_q", 3).await;
    assert_eq!(outcomes(&entries), ["delivered", "retrying", "queued"]);
    assert_eq!(entries[2]["status"], 202);
    assert_eq!(entries[1]["attempt"], 1);
    assert_eq!(entries[1]["upstream_status"], 503);
    assert_eq!(
        entries[1]["status"],
        serde_json::Value::Null,
        "no sender waits on an attempt"
    );
    assert_eq!(entries[0]["attempt"], 2);
    assert_eq!(entries[0]["upstream_status"], 200);
    assert_eq!(entries[0]["path"], "/hooks");
}

/// What the proxy answered just before it shut down is in the log once it has stopped:
/// the writer stores what waits before the store is flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_answered_before_a_shutdown_are_stored() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for id in ["evt_a", "evt_b", "evt_c"] {
        assert_eq!(post_event(proxy.addr, id).await.status, 200);
    }
    proxy.shutdown().await;
    let clock = dedupe_proxy::store::ManualClock::new(0);
    let store = open_sled(&proxy.data.path().join("db"), &clock);
    let log = dedupe_proxy::store::ClaimStore::delivery_log(&store).unwrap();
    let entries = log.read(None, 10).await.unwrap().entries;
    let keys: Vec<_> = entries
        .iter()
        .map(|(_, entry)| entry.key.as_deref().unwrap())
        .collect();
    assert_eq!(keys, ["evt_c", "evt_b", "evt_a"]);
}
