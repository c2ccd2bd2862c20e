//! Requests that try to get past a route's signature check and claim, or to mislead the
//! application behind the proxy: path spellings the application's framework folds into the
//! route's path, headers the application reads under another spelling, header lines that
//! should be one list, and keys that a store could not hold. Each was an attack that worked.

use crate::support;

use support::*;

/// The routes' secret variable: one every process has, so that no test sets one (setting
/// a variable races with the threads that run the other tests).
const SECRET_VARIABLE: &str = "PATH";

/// A route that checks an HMAC of the body before it claims, and a prefix route.
fn signed_routes() -> String {
    "routes:\n  - name: sig\n    match: { method: POST, path: /hooks/sig }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n  - name: tree\n    match: { path_prefix: /tree/ }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n".to_owned()
}

fn signature(body: &str) -> String {
    use hmac::{KeyInit, Mac};
    let secret = std::env::var(SECRET_VARIABLE).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

async fn signed_proxy(upstream: &Upstream) -> Proxy {
    Proxy::start(upstream.addr, &signed_routes()).await
}

/// Sends `body` to `path` as written on the wire (no client normalizes it first).
async fn post_raw(proxy: &Proxy, path: &str, body: &str, signature: Option<&str>) -> String {
    let signature = signature.map_or(String::new(), |s| format!("x-signature: {s}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: hooks.example\r\nconnection: close\r\ncontent-type: application/json\r\n{signature}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(proxy.addr, request.as_bytes()).await
}

/// Every spelling of the route's path that a framework routes to the same handler is the
/// route: unsigned, it is refused; signed, it is claimed and deduplicated, and the
/// application receives the path as it was sent.
#[tokio::test]
async fn path_spellings_are_the_route_they_spell() {
    let upstream = Upstream::start().await;
    let proxy = signed_proxy(&upstream).await;
    let variants = [
        "/hooks/sig/",
        "//hooks/sig",
        "/hooks/./sig",
        "/hooks//sig",
        "/hooks/%73ig",
        "/hooks%2Fsig",
        "/Hooks/SIG",
        "/hooks/sig;jsessionid=1",
        "/hooks/sig?x=1",
    ];
    for path in variants {
        let answer = post_raw(&proxy, path, r#"{"id":"evt_forged"}"#, None).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("dedupe-status: rejected"),
            "{path}"
        );
    }
    assert_eq!(upstream.requests(), 0, "no variant skipped the check");
    for (n, path) in variants.iter().enumerate() {
        let body = format!(r#"{{"id":"evt_{n}"}}"#);
        let answer = post_raw(&proxy, path, &body, Some(&signature(&body))).await;
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("dedupe-status: forwarded"),
            "{path}: {answer}"
        );
        let again = post_raw(&proxy, "/hooks/sig", &body, Some(&signature(&body))).await;
        assert!(
            again
                .to_ascii_lowercase()
                .contains("dedupe-status: duplicate"),
            "{path}: {again}"
        );
    }
    let received: Vec<String> = upstream.received().into_iter().map(|r| r.uri).collect();
    assert_eq!(received, variants, "forwarded with the path as sent");
}

/// A `..` segment, written or escaped, is refused before routing: a framework that mounts
/// its handler on a prefix would run `/hooks/sig/..` as `/hooks/sig`, and the path's
/// normal form (`/hooks`) would take it past the route; it could also climb out of the
/// upstream's base path.
#[tokio::test]
async fn a_parent_segment_is_400_and_reaches_nobody() {
    let upstream = Upstream::start().await;
    let proxy = signed_proxy(&upstream).await;
    let body = r#"{"id":"evt_climb"}"#;
    for path in [
        "/hooks/sig/..",
        "/hooks/sig/%2e%2e",
        "/hooks/sig/.%2E",
        "/hooks/x/../sig",
        "/../hooks/sig",
        "/elsewhere/..",
        "/tree/a/%2E%2E%2F..",
    ] {
        let answer = post_raw(&proxy, path, body, Some(&signature(body))).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(
            answer.contains(r#""error":"bad_request""#),
            "{path}: {answer}"
        );
    }
    assert_eq!(upstream.requests(), 0);
}

/// A prefix takes its own path and everything below it, segment by segment, however it
/// is spelled; a path that merely starts with the same letters is another path.
#[tokio::test]
async fn prefixes_take_their_subtree_in_any_spelling() {
    let upstream = Upstream::start().await;
    let proxy = signed_proxy(&upstream).await;
    for path in [
        "/tree",
        "/tree/",
        "/tree/a/b",
        "/TREE/a",
        "//tree//a",
        "/%74ree/a",
    ] {
        let answer = post_raw(&proxy, path, r#"{"id":"evt"}"#, None).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
    }
    let answer = post_raw(&proxy, "/treehouse", r#"{"id":"evt"}"#, None).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "another path: {answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("dedupe-status"),
        "{answer}"
    );
    assert_eq!(upstream.requests(), 1);
}

/// A route's host matches the same host with a trailing dot, as resolvers and frameworks
/// read it.
#[tokio::test]
async fn a_trailing_dot_on_the_host_is_the_same_host() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: hosted\n    match: { host: hooks.example.com, path: /h }\n    key: \"{json:/id}\"\nunmatched: reject\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    for host in [
        "hooks.example.com",
        "hooks.example.com.",
        "HOOKS.example.com.:8081",
    ] {
        let body = r#"{"id":"evt_host"}"#;
        let request = format!(
            "POST /h HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(proxy.addr, request.as_bytes()).await;
        assert!(
            answer.to_ascii_lowercase().contains("dedupe-status"),
            "{host}: {answer}"
        );
    }
}

/// Several `X-Forwarded-For` lines are one list: the application gets every value in order,
/// then the sender's address, so a front proxy's own line is never dropped.
#[tokio::test]
async fn every_forwarded_for_line_reaches_the_application() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for path in ["/hooks", "/elsewhere"] {
        let body = r#"{"id":"evt_xff"}"#;
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nx-forwarded-for: 1.1.1.1\r\nx-forwarded-for: 2.2.2.2, 3.3.3.3\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        raw(proxy.addr, request.as_bytes()).await;
    }
    for received in upstream.received() {
        let lines: Vec<_> = received.headers.get_all("x-forwarded-for").iter().collect();
        assert_eq!(
            lines,
            ["1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"],
            "{}",
            received.uri
        );
    }
}

/// `Dedupe_Key` is `HTTP_DEDUPE_KEY` to a CGI-style server, the same as `Dedupe-Key`: the
/// application never receives it from a sender, on a keyed, unkeyed or unmatched request.
#[tokio::test]
async fn a_key_header_spelled_with_underscores_never_reaches_the_application() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: hooks\n    match: { path: /hooks }\n    key: \"{json:/id}\"\n  - name: loose\n    match: { path: /loose }\n    key: \"{json:/id}\"\n    on_missing_key: forward\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    for (path, body) in [
        ("/hooks", r#"{"id":"evt_real"}"#),
        ("/loose", "{}"),
        ("/elsewhere", "{}"),
    ] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nDedupe_Key: forged\r\ndedupe_key: forged\r\nDedupe-Key: forged\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    let received = upstream.received();
    assert_eq!(received.len(), 3);
    assert_eq!(received[0].headers["dedupe-key"], "evt_real");
    for request in &received {
        let forged: Vec<_> = request
            .headers
            .iter()
            .filter(|(name, _)| name.as_str().replace('_', "-") == "dedupe-key")
            .map(|(_, value)| value.clone())
            .filter(|value| value == "forged")
            .collect();
        assert!(forged.is_empty(), "{}: {:?}", request.uri, request.headers);
    }
}

/// A key the PostgreSQL store could not hold (a NUL in it) is no key: 400, or forwarded
/// unkeyed where the route says so, never a 503 on every retry until the provider gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_no_store_can_hold_is_refused_at_once_not_failed_for_ever() {
    if !service_available("PostgreSQL", 5432).await {
        return;
    }
    let upstream = Upstream::start().await;
    let table = format!("dedupe_nul_{:08x}", rand::random::<u32>());
    let data = tempfile::tempdir().unwrap();
    let text = config_text(
        upstream.addr,
        &data.path().join("unused"),
        "routes:\n  - name: strict\n    match: { path: /strict }\n    key: \"{json:/id}\"\n  - name: loose\n    match: { path: /loose }\n    key: \"{json:/id}\"\n    on_missing_key: forward\n",
    )
    .replace(
        &format!("store: {{ sled: {{ path: \"{}\" }} }}", data.path().join("unused").display()),
        &format!("store: {{ postgres: {{ url: \"{POSTGRES_URL}\", table: {table} }} }}"),
    );
    let app = dedupe_proxy::start(parse_config(&text)).await.unwrap();
    let body = r#"{"id":"nul\u0000key"}"#;
    for _ in 0..2 {
        let reply = post_json(app.proxy_addr, "/strict", body).await;
        assert_eq!(
            (reply.status, reply.json()["error"].as_str()),
            (400, Some("missing_key"))
        );
    }
    let reply = post_json(app.proxy_addr, "/loose", body).await;
    assert_eq!((reply.status, reply.dedupe()), (200, "unkeyed"));
    assert_eq!(upstream.requests(), 1);
    app.shutdown().await.unwrap();
    drop_postgres_tables(&table).await;
}

/// A signed route keyed on a header its signature does not cover guards by body by
/// default: a captured delivery resent with a fresh ID is the first one's duplicate, and
/// the fresh ID is given back for a genuine event.
#[tokio::test]
async fn a_signed_body_resent_with_a_fresh_id_is_a_duplicate() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: guarded\n    match: { path: /guarded }\n    key: \"{header:X-Delivery}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let deliver = |id: &'static str, body: &'static str| {
        let signature = signature(body);
        async move {
            let headers = [("x-delivery", id), ("x-signature", signature.as_str())];
            send(proxy.addr, "POST", "/guarded", &headers, body).await
        }
    };
    let captured = r#"{"action":"opened","number":1}"#;
    assert_eq!(deliver("d1", captured).await.dedupe(), "forwarded");
    for fresh in ["d2", "d3"] {
        let reply = deliver(fresh, captured).await;
        assert_eq!(
            (reply.status, reply.dedupe()),
            (200, "duplicate"),
            "{fresh}"
        );
    }
    let genuine = r#"{"action":"opened","number":2}"#;
    assert_eq!(deliver("d2", genuine).await.dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 2);
}

/// Whatever the store, a key with a NUL is no key: 400 with the reason, nothing claimed.
#[tokio::test]
async fn a_key_with_a_nul_is_refused_on_the_embedded_store_too() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let reply = post_json(proxy.addr, "/hooks", r#"{"id":"nul\u0000key"}"#).await;
    assert_eq!((reply.status, reply.dedupe()), (400, "rejected"));
    assert!(
        reply.json()["detail"].as_str().unwrap().contains("control"),
        "{}",
        reply.body
    );
    assert_eq!(upstream.requests(), 0);
}

/// A `CONNECT` (a target without a path) and an HTTP/2 request whose `host` header names
/// another host than its `:authority` are refused before routing.
#[tokio::test]
async fn targets_without_a_path_and_two_hosts_in_http2_are_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let answer = raw(
        proxy.addr,
        b"CONNECT hooks.example:443 HTTP/1.1\r\nhost: hooks.example:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post("http://hooks.example/hooks")
        .header("host", "other.example")
        .body(())
        .unwrap();
    let (response, mut stream) = client.send_request(request, false).unwrap();
    stream
        .send_data(bytes::Bytes::from_static(br#"{"id":"evt_h2_hosts"}"#), true)
        .unwrap();
    assert_eq!(response.await.unwrap().status(), 400);
    assert_eq!(upstream.requests(), 0);
}

/// Sends `request_line` with `headers` (each `name: value`) and an unsigned JSON body,
/// as written on the wire.
async fn unsigned_raw(proxy: &Proxy, request_line: &str, headers: &[&str]) -> String {
    let body = r#"{"id":"evt_forged"}"#;
    let extra: String = headers.iter().map(|line| format!("{line}\r\n")).collect();
    let request = format!(
        "{request_line}\r\n{extra}connection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(proxy.addr, request.as_bytes()).await
}

/// Every way a request can ask for the route's handler in another spelling (the method's
/// case, a format suffix, a Windows trailing dot or space, a double escape, a method
/// override, a rewritten URL, an absolute-form target) is taken by the route and refused
/// unsigned (401); the ones no reading can make sound are refused outright (400). None
/// reaches the application.
#[tokio::test]
async fn every_reading_of_the_routes_request_is_checked() {
    let upstream = Upstream::start().await;
    let proxy = signed_proxy(&upstream).await;
    let host = "host: hooks.example";
    let taken: &[(&str, &[&str])] = &[
        ("post /hooks/sig HTTP/1.1", &[host]),
        ("Post /hooks/sig HTTP/1.1", &[host]),
        ("POST /hooks/sig.json HTTP/1.1", &[host]),
        ("POST /hooks/SIG.xml HTTP/1.1", &[host]),
        ("POST /hooks/sig. HTTP/1.1", &[host]),
        ("POST /hooks/sig%20 HTTP/1.1", &[host]),
        ("POST /hooks/sig.%20 HTTP/1.1", &[host]),
        ("POST /hooks/%2573ig HTTP/1.1", &[host]),
        ("POST /hooks/sig%3Bx HTTP/1.1", &[host]),
        (
            "PUT /hooks/sig HTTP/1.1",
            &[host, "x-http-method-override: POST"],
        ),
        ("PATCH /hooks/sig HTTP/1.1", &[host, "x-http-method: post"]),
        ("GET /hooks/sig?_method=POST HTTP/1.1", &[host]),
        (
            "POST /elsewhere HTTP/1.1",
            &[host, "x-original-url: /hooks/sig"],
        ),
        (
            "POST /elsewhere HTTP/1.1",
            &[host, "x-rewrite-url: /Hooks/Sig.json?a=1"],
        ),
        ("POST http://hooks.example/hooks/sig HTTP/1.1", &[host]),
        ("POST http://hooks.example:80/hooks/sig HTTP/1.1", &[host]),
    ];
    for (line, headers) in taken {
        let answer = unsigned_raw(&proxy, line, headers).await;
        assert!(
            answer.starts_with("HTTP/1.1 401"),
            "{line} {headers:?}: {answer}"
        );
    }
    let refused: &[(&str, &[&str])] = &[
        ("POST /hooks/sig%00.png HTTP/1.1", &[host]),
        ("POST /hooks/sig%0a HTTP/1.1", &[host]),
        ("POST /hooks/%252e%252e/sig HTTP/1.1", &[host]),
        ("POST /hooks/sig/... HTTP/1.1", &[host]),
        ("POST http://elsewhere.example/hooks/sig HTTP/1.1", &[host]),
        (
            "POST /elsewhere HTTP/1.1",
            &[host, "x-original-url: /hooks/../sig"],
        ),
    ];
    for (line, headers) in refused {
        let answer = unsigned_raw(&proxy, line, headers).await;
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{line} {headers:?}: {answer}"
        );
        assert!(
            answer.contains(r#""error":"bad_request""#),
            "{line}: {answer}"
        );
    }
    assert_eq!(upstream.requests(), 0, "{:?}", upstream.received());
}

/// A script's route takes the paths below it, which Apache, IIS and PHP run as the
/// script with a PATH_INFO.
#[tokio::test]
async fn a_scripts_path_info_is_the_scripts_route() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: php\n    match: { method: POST, path: /webhook.php }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    for path in [
        "/webhook.php/x",
        "/WEBHOOK.PHP/a/b",
        "/webhook.php;s=1/x",
        "/webhook",
    ] {
        let line = format!("POST {path} HTTP/1.1");
        let answer = unsigned_raw(&proxy, &line, &["host: h"]).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
    }
    assert_eq!(upstream.requests(), 0);
}

/// A route limited to a host takes the request that names it only in `X-Forwarded-Host`
/// or `Forwarded` (an app behind an ingress reads those); one that names no host at all
/// is refused, since the app could serve it as any host.
#[tokio::test]
async fn a_forwarded_host_is_the_routes_host_and_no_host_is_refused() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: hosted\n    match: { method: POST, host: hooks.example.com, path: /h }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let attempts: &[(&str, &[&str], &str)] = &[
        (
            "POST /h HTTP/1.1",
            &["host: internal", "x-forwarded-host: hooks.example.com"],
            "401",
        ),
        (
            "POST /h HTTP/1.1",
            &[
                "host: internal",
                "x-forwarded-host: a.example, HOOKS.example.com.",
            ],
            "401",
        ),
        (
            "POST /h HTTP/1.1",
            &[
                "host: internal",
                "forwarded: for=1.2.3.4;host=\"hooks.example.com\"",
            ],
            "401",
        ),
        ("POST /h HTTP/1.0", &[], "400"),
    ];
    for (line, headers, status) in attempts {
        let answer = unsigned_raw(&proxy, line, headers).await;
        assert!(
            answer.contains(&format!(" {status} ")),
            "{line} {headers:?}: {answer}"
        );
    }
    assert_eq!(upstream.requests(), 0);
    let answer = unsigned_raw(&proxy, "POST /h HTTP/1.1", &["host: other.example"]).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "another host: {answer}");
    assert_eq!(upstream.requests(), 1);
}

/// A reading that points at a weaker route listed first (one without a check) cannot take
/// a request whose own reading is a signed route's: the two readings lead to two routes,
/// and the request is refused, whether the reading is a rewritten URL, a method override
/// or a forwarded host, and whether or not `Connection` would strip its header before the
/// app sees it. Nothing reaches the app.
#[tokio::test]
async fn a_reading_cannot_move_a_request_to_a_weaker_route() {
    let upstream = Upstream::start().await;
    let routes = "unmatched: reject\nroutes:\n  - name: open\n    match: { method: [POST, GET], path_prefix: /v1/payments }\n    key: \"{header:X-Id}\"\n  - name: open-host\n    match: { method: POST, host: api.example.com }\n    key: \"{header:X-Id}\"\n  - name: signed\n    match: { method: POST, path: /webhooks/stripe, host: hooks.example.com }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let host = "host: hooks.example.com";
    let attempts: &[(&str, &[&str], &str)] = &[
        (
            "POST /webhooks/stripe HTTP/1.1",
            &[host, "x-id: k1", "x-original-url: /v1/payments"],
            "400",
        ),
        (
            "POST /webhooks/stripe HTTP/1.1",
            &[host, "x-id: k2", "x-rewrite-url: /v1/payments/x"],
            "400",
        ),
        (
            "POST /webhooks/stripe HTTP/1.1",
            &[
                host,
                "x-id: k3",
                "x-original-url: /v1/payments",
                "connection: keep-alive, x-original-url",
            ],
            "401",
        ),
        (
            "POST /webhooks/stripe HTTP/1.1",
            &[host, "x-id: k4", "x-forwarded-host: api.example.com"],
            "400",
        ),
        (
            "POST /webhooks/stripe HTTP/1.1",
            &[host, "x-id: k5", "forwarded: host=api.example.com"],
            "400",
        ),
        (
            "POST /webhooks/stripe HTTP/1.1",
            &[
                host,
                "x-id: k6",
                "x-forwarded-host: api.example.com",
                "connection: x-forwarded-host",
            ],
            "401",
        ),
        ("POST /webhooks/stripe HTTP/1.0", &["x-id: k7"], "400"),
        (
            "GET /v1/payments?_method=POST HTTP/1.1",
            &[host, "x-id: k8", "x-original-url: /webhooks/stripe"],
            "400",
        ),
    ];
    for (line, headers, status) in attempts {
        let answer = unsigned_raw(&proxy, line, headers).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} "))
                || answer.starts_with(&format!("HTTP/1.0 {status} ")),
            "{line} {headers:?}: {answer}"
        );
    }
    assert_eq!(upstream.requests(), 0, "{:?}", upstream.received());
}

/// A `_method` in the query is read however its name is spelled for the frameworks that
/// read it (escaped, PHP's `.` or space for `_`, an array), and an override header's list
/// item by item.
#[tokio::test]
async fn every_spelling_of_a_method_override_is_read() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: put\n    match: { method: [PUT, DELETE], path: /hooks/put }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    for (line, headers) in [
        ("POST /hooks/put?%5Fmethod=PUT HTTP/1.1", &[] as &[&str]),
        ("POST /hooks/put?.method=PUT HTTP/1.1", &[]),
        ("POST /hooks/put?+method=put HTTP/1.1", &[]),
        ("POST /hooks/put?_method[]=PUT HTTP/1.1", &[]),
        ("POST /hooks/put?_method%5B%5D=DELETE HTTP/1.1", &[]),
        ("POST /hooks/put?_METHOD=PUT HTTP/1.1", &[]),
        (
            "POST /hooks/put HTTP/1.1",
            &["x-http-method-override: PUT, POST"],
        ),
    ] {
        let mut all = vec!["host: h"];
        all.extend_from_slice(headers);
        let answer = unsigned_raw(&proxy, line, &all).await;
        assert!(
            answer.starts_with("HTTP/1.1 401"),
            "{line} {headers:?}: {answer}"
        );
    }
    assert_eq!(upstream.requests(), 0);
}

/// A POST's body can name the method the application runs it as (`_method` in a form,
/// a multipart part or a JSON object, as Rails, Symfony and Laravel read it): a body that
/// names the method of a route other than the one the request went to (or of a route,
/// where none took it) is refused, whatever the field's spelling; bodies that name none
/// (a `payment_method`, a nested `_method`) go on as before.
#[tokio::test]
async fn a_method_named_in_the_body_is_read() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: open\n    match: { method: POST, path: /hooks/open }\n    key: \"{json:/id}\"\n  - name: signed\n    match: { method: [PUT, DELETE], path_prefix: /hooks }\n    key: \"{json:/id}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let post = |path: &str, content_type: Option<&str>, body: &str| {
        let content_type = content_type.map_or(String::new(), |t| format!("content-type: {t}\r\n"));
        format!(
            "POST {path} HTTP/1.1\r\nhost: hooks.example\r\nconnection: close\r\n{content_type}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let form = Some("application/x-www-form-urlencoded");
    let json = Some("application/json");
    let multipart =
        "--b1\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--b1--\r\n";
    let refused = [
        // No route takes a POST to /hooks/put: unread, the app would run it as PUT.
        post("/hooks/put", form, "id=1&_method=PUT"),
        post("/hooks/put", form, "id=1&_%6Dethod=delete"),
        post("/hooks/put", form, "id=1&.method[]=PUT"),
        post("/hooks/put", None, "_method=PUT"),
        post("/hooks/put", json, r#"{"id":"evt_1","_method":"PUT"}"#),
        post(
            "/hooks/put",
            json,
            r#"{"id":"evt_1","\u005fmethod":"DELETE"}"#,
        ),
        post(
            "/hooks/put",
            Some("multipart/form-data; boundary=b1"),
            multipart,
        ),
        // Gzip-encoded: what it names cannot be read, so it is refused too.
        "POST /hooks/put HTTP/1.1\r\nhost: hooks.example\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: 2\r\n\r\nxx".to_owned(),
        // The open route takes the POST; the app would run it as the signed route's PUT.
        post("/hooks/open", json, r#"{"id":"evt_2","_method":"PUT"}"#),
    ];
    for request in &refused {
        let answer = raw(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{request}: {answer}");
        assert!(
            answer.contains("two different routes") || answer.contains("does not read"),
            "{answer}"
        );
    }
    assert_eq!(upstream.requests(), 0, "{:?}", upstream.received());

    let passed = [
        post(
            "/hooks/open",
            json,
            r#"{"id":"evt_3","payment_method":"PUT"}"#,
        ),
        post(
            "/hooks/open",
            json,
            r#"{"id":"evt_4","data":{"_method":"PUT"}}"#,
        ),
        post("/hooks/open", json, r#"{"id":"evt_5","_method":"POST"}"#),
        post("/elsewhere", form, "_method=PUT"),
        post("/hooks/other", Some("text/plain"), "_method=PUT"),
    ];
    for request in &passed {
        let answer = raw(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{request}: {answer}");
    }
    assert_eq!(upstream.requests(), passed.len());
}
