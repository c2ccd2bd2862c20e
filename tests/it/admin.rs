//! The admin listener: health, readiness through start-up and shutdown, inspection and
//! removal of keys, and the bearer token on `/v1/*`.

use crate::support;

use std::time::Duration;

use support::*;

#[tokio::test]
async fn health_and_readiness() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let health = send(proxy.admin, "GET", "/healthz", &[], "").await;
    assert_eq!(health.status, 200);
    let ready = send(proxy.admin, "GET", "/readyz", &[], "").await;
    assert_eq!(
        (ready.status, ready.json()["status"].as_str()),
        (200, Some("ready"))
    );
    assert_eq!(send(proxy.admin, "GET", "/nope", &[], "").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_503_as_soon_as_shutdown_starts() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(800))]);
    let mut proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let admin = proxy.admin;
    let sender = tokio::spawn(post_event(proxy.addr, "evt_1"));
    upstream.wait_for_requests(1).await;
    let app = proxy.app.take().unwrap();
    let stopping = tokio::spawn(app.shutdown());
    eventually(
        Duration::from_secs(2),
        "readiness reports shutting down",
        || async { send(admin, "GET", "/readyz", &[], "").await.status == 503 },
    )
    .await;
    // Health stays up while the in-flight forward drains.
    assert_eq!(send(admin, "GET", "/healthz", &[], "").await.status, 200);
    assert!(
        tokio::net::TcpStream::connect(proxy.addr).await.is_err(),
        "new connections are refused while draining"
    );
    assert_eq!(sender.await.unwrap().dedupe(), "forwarded");
    stopping.await.unwrap().unwrap();
}

fn instant(value: &serde_json::Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(value.as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn done_keys_can_be_inspected() {
    use sha2::Digest;
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201)]);
    let proxy = Proxy::start(upstream.addr, &json_route("    retention: 1h\n")).await;
    let body = r#"{"id":"evt/1"}"#;
    post_json(proxy.addr, "/hooks", body).await;
    let key = send(proxy.admin, "GET", "/v1/keys/hooks/evt%2F1", &[], "").await;
    assert_eq!(key.status, 200, "{}", key.body);
    let record = key.json();
    assert_eq!(record["route"], "hooks");
    assert_eq!(record["key"], "evt/1");
    assert_eq!(record["state"], "done");
    assert_eq!(record["upstream_status"], 201);
    assert_eq!(
        record["body_sha256"],
        hex::encode(sha2::Sha256::digest(body))
    );
    let (claimed, completed, expires) = (
        instant(&record["claimed_at"]),
        instant(&record["completed_at"]),
        instant(&record["expires_at"]),
    );
    assert!(claimed <= completed);
    assert_eq!(
        expires.duration_since(completed).unwrap(),
        Duration::from_secs(3600)
    );
}

#[tokio::test]
async fn in_flight_keys_can_be_inspected_but_not_forgotten() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::ok().after(Duration::from_millis(600))]);
    let proxy = Proxy::start(upstream.addr, &json_route("    lease: 2m\n")).await;
    let sender = tokio::spawn(post_event(proxy.addr, "evt_2"));
    upstream.wait_for_requests(1).await;
    let record = send(proxy.admin, "GET", "/v1/keys/hooks/evt_2", &[], "")
        .await
        .json();
    assert_eq!(record["state"], "in_flight");
    assert!(record["completed_at"].is_null());
    assert!(record["upstream_status"].is_null());
    let lease = instant(&record["expires_at"])
        .duration_since(instant(&record["claimed_at"]))
        .unwrap();
    assert_eq!(lease, Duration::from_secs(120));
    let refused = send(proxy.admin, "DELETE", "/v1/keys/hooks/evt_2", &[], "").await;
    assert_eq!(
        (refused.status, refused.json()["error"].as_str()),
        (409, Some("in_flight"))
    );
    sender.await.unwrap();
}

#[tokio::test]
async fn forgetting_a_key_lets_a_replay_run_the_work_again() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    post_event(proxy.addr, "evt_3").await;
    assert_eq!(post_event(proxy.addr, "evt_3").await.dedupe(), "duplicate");
    assert_eq!(
        send(proxy.admin, "DELETE", "/v1/keys/hooks/evt_3", &[], "")
            .await
            .status,
        204
    );
    assert_eq!(
        send(proxy.admin, "GET", "/v1/keys/hooks/evt_3", &[], "")
            .await
            .status,
        404
    );
    assert_eq!(
        send(proxy.admin, "DELETE", "/v1/keys/hooks/evt_3", &[], "")
            .await
            .status,
        404
    );
    assert_eq!(post_event(proxy.addr, "evt_3").await.dedupe(), "forwarded");
    assert_eq!(upstream.executions("evt_3"), 2);
}

#[tokio::test]
async fn unknown_routes_and_keys_are_404() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let absent = send(proxy.admin, "GET", "/v1/keys/hooks/never", &[], "").await;
    assert_eq!(
        (absent.status, absent.json()["error"].as_str()),
        (404, Some("absent"))
    );
    let no_route = send(proxy.admin, "GET", "/v1/keys/nope/k", &[], "").await;
    assert_eq!(
        (no_route.status, no_route.json()["error"].as_str()),
        (404, Some("no_such_route"))
    );
}

/// HEAD probes come through a load balancer's name as GET ones do, and a HEAD answer over
/// HTTP/2 (which hyper does not trim) has the GET answer's length and no body.
#[tokio::test]
async fn head_probes_pass_the_host_check_and_h2_head_answers_have_no_body() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let port = proxy.admin.port();
    let answer = raw(
        proxy.admin,
        format!("HEAD /healthz HTTP/1.1\r\nhost: dedupe.svc:{port}\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let client: Client<_, Full<Bytes>> = Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for path in ["/metrics", "/healthz"] {
        let head = http::Request::head(format!("http://{}{path}", proxy.admin))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = client.request(head).await.unwrap();
        assert_eq!(
            (response.version(), response.status()),
            (http::Version::HTTP_2, http::StatusCode::OK)
        );
        let length: usize = response.headers()["content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(length > 0, "{path}: the GET answer's length");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(body.is_empty(), "{path}: {} bytes of body", body.len());
    }
}

/// A known path asked with a method it does not take is a 405 that names the ones it
/// takes in `Allow`; HEAD goes wherever GET does, answered without a body.
#[tokio::test]
async fn a_wrong_method_is_405_with_allow_and_head_answers_as_get_without_a_body() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    post_event(proxy.addr, "evt_methods").await;
    let wrong = [
        ("POST", "/metrics", "GET HEAD"),
        ("DELETE", "/healthz", "GET HEAD"),
        ("PUT", "/readyz", "GET HEAD"),
        ("GET", "/v1/reload", "POST"),
        ("DELETE", "/v1/keys", "GET HEAD"),
        ("PUT", "/v1/keys/hooks/evt_methods", "DELETE GET HEAD PATCH"),
        ("GET", "/v1/keys/hooks/evt_methods/resolve", "POST"),
        ("POST", "/v1/entities/hooks/e", "DELETE GET HEAD"),
    ];
    // With a JSON content type, as a POST needs to pass the access rules.
    let json = [("content-type", "application/json")];
    for (method, path, allow) in wrong {
        let reply = send(proxy.admin, method, path, &json, "").await;
        assert_eq!(
            (reply.status, reply.json()["error"].as_str()),
            (405, Some("method_not_allowed")),
            "{method} {path}"
        );
        let mut allowed: Vec<&str> = reply.headers["allow"]
            .to_str()
            .unwrap()
            .split(',')
            .map(str::trim)
            .collect();
        allowed.sort_unstable();
        assert_eq!(allowed.join(" "), allow, "{method} {path}");
    }
    assert_eq!(
        send(proxy.admin, "GET", "/v1/nope", &[], "").await.status,
        404
    );
    let port = proxy.admin.port();
    for (path, status) in [
        ("/metrics", "200"),
        ("/healthz", "200"),
        ("/v1/keys/hooks/evt_methods", "200"),
        ("/v1/keys/hooks/never", "404"),
    ] {
        let answer = raw(
            proxy.admin,
            format!("HEAD {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "HEAD {path}: {head}"
        );
        assert_eq!(body, "", "HEAD {path} has no body");
    }
}

/// A key is one path segment, a `/` inside it escaped: no key reads as a sub-path, and no
/// sub-path as a key, whatever the key holds.
#[tokio::test]
async fn no_path_hides_a_key() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for id in ["evt/resolve", "resolve", "a b%"] {
        post_json(
            proxy.addr,
            "/hooks",
            &serde_json::json!({ "id": id }).to_string(),
        )
        .await;
    }
    for (path, key) in [
        ("/v1/keys/hooks/evt%2Fresolve", "evt/resolve"),
        ("/v1/keys/hooks/resolve", "resolve"),
        ("/v1/keys/hooks/a%20b%25", "a b%"),
    ] {
        let read = send(proxy.admin, "GET", path, &[], "").await;
        assert_eq!(
            (read.status, read.json()["key"].as_str()),
            (200, Some(key)),
            "{path}"
        );
    }
    // Unescaped, the same characters name the resolve endpoint of key `evt` (a POST), or
    // nothing at all.
    let json = [("content-type", "application/json")];
    let sub_path = send(proxy.admin, "GET", "/v1/keys/hooks/evt/resolve", &json, "").await;
    assert_eq!(sub_path.status, 405, "{}", sub_path.body);
    for (method, nothing) in [
        ("GET", "/v1/keys/hooks/evt/other"),
        ("POST", "/v1/keys/hooks//resolve"),
        ("GET", "/v1/keys/hooks/"),
        ("GET", "/v1/keys//evt"),
    ] {
        let read = send(proxy.admin, method, nothing, &json, "{}").await;
        assert_eq!(
            (read.status, read.json()["error"].as_str()),
            (404, Some("not_found")),
            "{nothing}"
        );
    }
    // A name that is no UTF-8 is refused as such, not read as another key.
    let broken = send(proxy.admin, "GET", "/v1/keys/hooks/%FF", &[], "").await;
    assert_eq!(
        (broken.status, broken.json()["error"].as_str()),
        (400, Some("bad_request"))
    );
}

#[tokio::test]
async fn scoped_routes_share_their_keys_in_the_admin_view() {
    let upstream = Upstream::start().await;
    let routes = "routes:\n  - name: a\n    match: { path: /a }\n    key: \"{json:/id}\"\n    scope: s\n  - name: b\n    match: { path: /b }\n    key: \"{json:/id}\"\n    scope: s\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    post_json(proxy.addr, "/a", r#"{"id":"e"}"#).await;
    assert_eq!(
        send(proxy.admin, "GET", "/v1/keys/b/e", &[], "")
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_v1_api_but_not_the_probes() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: DEDUPE_TEST_ADMIN_TOKEN }}\n{}",
        json_route("")
    );
    std::fs::write(
        &config,
        config_text(upstream.addr, &dir.path().join("data"), &rest),
    )
    .unwrap();
    let proxy = Binary::start_with_env(&config, &[("DEDUPE_TEST_ADMIN_TOKEN", "s3cret")]);
    post_event(proxy.addr, "evt_t").await;
    let path = "/v1/keys/hooks/evt_t";
    let anonymous = send(proxy.admin, "GET", path, &[], "").await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    assert_eq!(
        send(
            proxy.admin,
            "GET",
            path,
            &[("authorization", "Bearer wrong")],
            ""
        )
        .await
        .status,
        401
    );
    assert_eq!(
        send(
            proxy.admin,
            "DELETE",
            path,
            &[("authorization", "Bearer s3cre")],
            ""
        )
        .await
        .status,
        401
    );
    assert_eq!(
        send(
            proxy.admin,
            "GET",
            path,
            &[("authorization", "Bearer s3cret")],
            ""
        )
        .await
        .status,
        200
    );
    assert_eq!(
        send(proxy.admin, "GET", "/healthz", &[], "").await.status,
        200
    );
    assert_eq!(
        send(proxy.admin, "GET", "/readyz", &[], "").await.status,
        200
    );
}

/// An admin listener reachable from the network (a container's `0.0.0.0`) without a token
/// serves probes and metrics, but no one may forget keys or reload through it.
#[tokio::test]
async fn beyond_loopback_without_a_token_the_v1_api_is_closed() {
    let upstream = Upstream::start().await;
    let rest = format!("admin: {{ listen: 0.0.0.0:0 }}\n{}", json_route(""));
    let proxy = Proxy::start(upstream.addr, &rest).await;
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], proxy.admin.port()));
    post_event(proxy.addr, "evt_open").await;
    for (method, path) in [
        ("GET", "/v1/keys/hooks/evt_open"),
        ("DELETE", "/v1/keys/hooks/evt_open"),
        ("POST", "/v1/reload"),
        ("GET", "/v1/routes"),
    ] {
        let json = [("content-type", "application/json")];
        let reply = send(admin, method, path, &json, "").await;
        assert_eq!(reply.status, 403, "{method} {path}");
        assert_eq!(reply.json()["error"], "admin_api_closed");
    }
    assert_eq!(
        post_event(proxy.addr, "evt_open").await.dedupe(),
        "duplicate"
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            send(admin, "GET", path, &[], "").await.status,
            200,
            "{path}"
        );
    }
}

/// On a route that guards against replays by body, forgetting a key forgets the body it
/// recorded too: the redelivery runs the work again, as `DELETE` promises.
#[tokio::test]
async fn forgetting_a_key_of_a_guarded_route_lets_its_redelivery_run() {
    use hmac::{KeyInit, Mac};
    let upstream = Upstream::start().await;
    // PATH: a variable every process has, so that the test sets none.
    let routes = "routes:\n  - name: guarded\n    match: { path: /guarded }\n    key: \"{header:X-Delivery}\"\n    verify: { hmac: { secret_env: PATH, header: X-Signature } }\n";
    let proxy = Proxy::start(upstream.addr, routes).await;
    let body = r#"{"action":"opened","number":7}"#;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(std::env::var("PATH").unwrap().as_bytes())
            .unwrap();
    mac.update(body.as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    let deliver = |id: &'static str| {
        let signature = signature.clone();
        async move {
            let headers = [("x-delivery", id), ("x-signature", signature.as_str())];
            send(proxy.addr, "POST", "/guarded", &headers, body)
                .await
                .dedupe()
                .to_owned()
        }
    };
    assert_eq!(deliver("d1").await, "forwarded");
    assert_eq!(
        deliver("d2").await,
        "duplicate",
        "the guard: same body, fresh ID"
    );
    let forgotten = send(proxy.admin, "DELETE", "/v1/keys/guarded/d1", &[], "").await;
    assert_eq!(forgotten.status, 204);
    assert_eq!(
        deliver("d1").await,
        "forwarded",
        "runs again once forgotten"
    );
    assert_eq!(upstream.requests(), 2);
    // Its expiry moved, its body's moves with it: once both pass, the same body under a
    // fresh ID runs again.
    let json = [("content-type", "application/json")];
    let soon = r#"{"expires_in":"1s"}"#;
    let moved = send(proxy.admin, "PATCH", "/v1/keys/guarded/d1", &json, soon).await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(deliver("d3").await, "duplicate");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(deliver("d3").await, "forwarded");
    assert_eq!(upstream.requests(), 3);
}

/// A done key's expiry moves through the API, sooner or later; `GET` shows the answer it
/// recorded for duplicates whole; a body that asks for no expiry in the future, or in
/// another shape, is a 400 that changes nothing.
#[tokio::test]
async fn a_done_keys_expiry_moves_and_its_recorded_answer_shows() {
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(201)
        .body("made")
        .header("content-type", "text/plain")
        .header("location", "/orders/1")]);
    let route = json_route("    retention: 1h\n    duplicate_response: { replay: true }\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    assert_eq!(post_event(proxy.addr, "evt_1").await.status, 201);

    let key = send(proxy.admin, "GET", "/v1/keys/hooks/evt_1", &[], "").await;
    let record = key.json();
    assert_eq!(record["answer_status"], 201);
    assert_eq!(record["answer"]["status"], 201);
    assert_eq!(record["answer"]["body_bytes"], 4);
    let headers = record["answer"]["headers"].as_array().unwrap();
    assert!(
        headers.contains(&serde_json::json!(["location", "/orders/1"])),
        "{headers:?}"
    );

    let json = [("content-type", "application/json")];
    let path = "/v1/keys/hooks/evt_1";
    for bad in [
        "",
        "{}",
        "[1]",
        r#"{"expires_in":"soon"}"#,
        r#"{"expires_in":"-5m"}"#,
        r#"{"expires_at":"yesterday"}"#,
        r#"{"expires_at":"2001-01-01T00:00:00Z"}"#,
        r#"{"expires_in":"4000days"}"#,
        r#"{"expires_in":"1h","expires_at":"2099-01-01T00:00:00Z"}"#,
        r#"{"expires_in":"1h","also":1}"#,
    ] {
        let reply = send(proxy.admin, "PATCH", path, &json, bad).await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
        assert_eq!(reply.json()["error"], "bad_request", "{bad}");
    }
    // A valid body padded past the API's 1 KiB.
    let padded = format!(r#"{{"expires_in":"1h"{}}}"#, " ".repeat(2_000));
    let reply = send(proxy.admin, "PATCH", path, &json, padded).await;
    assert_eq!(reply.status, 400);
    assert!(
        reply.json()["detail"].as_str().unwrap().contains("1024"),
        "{}",
        reply.body
    );
    assert_eq!(
        send(proxy.admin, "GET", path, &[], "").await.json()["expires_at"],
        record["expires_at"],
        "nothing moved"
    );

    // Later (a year on), shown as the key now is.
    let year_on = std::time::SystemTime::now() + Duration::from_secs(365 * 86_400);
    let year_on = humantime::format_rfc3339_seconds(year_on).to_string();
    let body = format!(r#"{{"expires_at":"{year_on}"}}"#);
    let later = send(proxy.admin, "PATCH", path, &json, body).await;
    assert_eq!(later.status, 200, "{}", later.body);
    assert_eq!(later.json()["expires_at"], year_on.replace('Z', ".000Z"));
    assert_eq!(later.json()["answer"]["status"], 201);
    // Sooner: once it passes, the next delivery runs the work again.
    let sooner = send(proxy.admin, "PATCH", path, &json, r#"{"expires_in":"1s"}"#).await;
    assert_eq!(sooner.status, 200, "{}", sooner.body);
    assert_eq!(post_event(proxy.addr, "evt_1").await.dedupe(), "duplicate");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(post_event(proxy.addr, "evt_1").await.dedupe(), "forwarded");
    assert_eq!(upstream.requests(), 2);

    let absent = send(
        proxy.admin,
        "PATCH",
        "/v1/keys/hooks/evt_none",
        &json,
        r#"{"expires_in":"1h"}"#,
    )
    .await;
    assert_eq!(absent.status, 404);
    assert_eq!(absent.json()["error"], "absent");

    // Each change is in the delivery log: who, what (the request) and when; a refused
    // one is not.
    let mut changes = Vec::new();
    for _ in 0..250 {
        let listed = send(
            proxy.admin,
            "GET",
            "/v1/deliveries?outcome=changed",
            &[],
            "",
        )
        .await;
        changes = listed.json()["deliveries"].as_array().unwrap().clone();
        if changes.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(changes.len(), 2, "{changes:#?}");
    for change in &changes {
        assert_eq!(change["by"], "api:loopback");
        assert_eq!(change["method"], "PATCH");
        assert_eq!(change["path"], "/v1/keys/hooks/evt_1");
        assert_eq!(change["key"], "evt_1");
        assert_eq!(change["status"], 200);
        assert!(change["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    }
    let id = changes[0]["id"].as_str().unwrap();
    let whole = send(proxy.admin, "GET", &format!("/v1/deliveries/{id}"), &[], "").await;
    assert_eq!(
        whole.json()["body"],
        r#"{"expires_in":"1s"}"#,
        "the newest first"
    );
}

/// A web page the operator opens cannot drive the admin port: not by posting a form or a
/// `fetch` to it from its own origin (refused by `Origin`, `Sec-Fetch-Site`, or for want
/// of a JSON content type), nor by rebinding its own name to the port's address and
/// reading the answers (refused by `Host`). Nothing is reloaded or forgotten meanwhile;
/// probes answer whatever they name.
#[tokio::test]
async fn a_web_page_cannot_drive_the_admin_api() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    post_event(proxy.addr, "evt_kept").await;
    let port = proxy.admin.port();
    let own = format!("127.0.0.1:{port}");
    let rebound = format!("attacker.example:{port}");
    let form = ("content-type", "application/x-www-form-urlencoded");
    let rebound_origin = format!("http://{rebound}");
    // Method, path, headers, and the refusal's status and code.
    type Attempt<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, u16, &'a str);
    let attempts: Vec<Attempt> = vec![
        // A form on another site posted to the port (the browser adds the Origin).
        (
            "POST",
            "/v1/reload",
            vec![("host", &own), form, ("origin", "http://attacker.example")],
            403,
            "cross_origin",
        ),
        (
            "POST",
            "/v1/keys/hooks/evt_kept/resolve",
            vec![
                ("host", &own),
                ("content-type", "text/plain"),
                ("origin", "null"),
            ],
            403,
            "cross_origin",
        ),
        // The same from a browser that tells the site.
        (
            "POST",
            "/v1/reload",
            vec![
                ("host", &own),
                ("content-type", "application/json"),
                ("sec-fetch-site", "cross-site"),
            ],
            403,
            "cross_origin",
        ),
        (
            "DELETE",
            "/v1/keys/hooks/evt_kept",
            vec![("host", &own), ("sec-fetch-site", "same-site")],
            403,
            "cross_origin",
        ),
        // An old browser that sends no Origin: the form's content type gives it away.
        (
            "POST",
            "/v1/reload",
            vec![("host", &own), form],
            415,
            "json_required",
        ),
        (
            "POST",
            "/v1/reload",
            vec![("host", &own)],
            415,
            "json_required",
        ),
        // A rebound name: the page reads answers as if same-origin.
        (
            "GET",
            "/v1/routes",
            vec![("host", &rebound)],
            403,
            "host_not_allowed",
        ),
        (
            "GET",
            "/v1/keys?route=hooks",
            vec![("host", &rebound)],
            403,
            "host_not_allowed",
        ),
        (
            "GET",
            "/metrics",
            vec![("host", &rebound)],
            403,
            "host_not_allowed",
        ),
        (
            "DELETE",
            "/v1/keys/hooks/evt_kept",
            vec![("host", &rebound), ("origin", &rebound_origin)],
            403,
            "host_not_allowed",
        ),
        (
            "POST",
            "/v1/reload",
            vec![
                ("host", &rebound),
                ("content-type", "application/json"),
                ("sec-fetch-site", "same-origin"),
            ],
            403,
            "host_not_allowed",
        ),
    ];
    for (method, path, headers, status, code) in &attempts {
        let request = format!(
            "{method} {path} HTTP/1.1\r\n{}connection: close\r\ncontent-length: 0\r\n\r\n",
            headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}\r\n"))
                .collect::<String>()
        );
        let answer = raw(proxy.admin, request.as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")) && answer.contains(code),
            "{method} {path} {headers:?}: {answer}"
        );
    }
    let kept = send(proxy.admin, "GET", "/v1/keys/hooks/evt_kept", &[], "").await;
    assert_eq!(kept.json()["state"], "done", "nothing was forgotten");
    let metrics = scrape(proxy.admin).await;
    assert!(
        !metrics.contains(r#"dedupe_config_reloads_total{result="success"} 1"#),
        "nothing was reloaded"
    );
    for path in ["/healthz", "/readyz"] {
        let request =
            format!("GET {path} HTTP/1.1\r\nhost: {rebound}\r\nconnection: close\r\n\r\n");
        let answer = raw(proxy.admin, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    // The port's own page, or a client that is no page, is served.
    let own_origin = format!("http://{own}");
    let headers = [
        ("content-type", "application/json"),
        ("origin", own_origin.as_str()),
    ];
    let deleted = send(
        proxy.admin,
        "DELETE",
        "/v1/keys/hooks/evt_kept",
        &headers,
        "",
    )
    .await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
}

/// `admin.hosts` names the port may be reached by besides its address: a Service's name.
#[tokio::test]
async fn a_configured_name_reaches_the_admin_api() {
    let upstream = Upstream::start().await;
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, hosts: [dedupe-admin.tools.svc.cluster.local] }}\n{}",
        json_route("")
    );
    let proxy = Proxy::start(upstream.addr, &rest).await;
    for (host, status) in [
        ("dedupe-admin.tools.svc.cluster.local:9091", "200"),
        ("DEDUPE-ADMIN.tools.svc.cluster.local.", "200"),
        ("localhost:8080", "200"),
        (
            "dedupe-admin.tools.svc.cluster.local.attacker.example",
            "403",
        ),
    ] {
        let request =
            format!("GET /v1/routes HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
        let answer = raw(proxy.admin, request.as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{host}: {answer}"
        );
    }
}

/// A second `Host` line, or an absolute-form target naming another host, is refused on
/// the admin port as on the provider port: the first `Host` alone is not what it is for.
#[tokio::test]
async fn two_hosts_or_a_target_naming_another_are_refused() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for (what, head) in [
        (
            "two Host lines",
            "GET /v1/routes HTTP/1.1\r\nhost: 127.0.0.1\r\nhost: attacker.example\r\n",
        ),
        (
            "an absolute-form target",
            "GET http://attacker.example/v1/routes HTTP/1.1\r\nhost: 127.0.0.1\r\n",
        ),
    ] {
        let answer = raw(
            proxy.admin,
            format!("{head}connection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{what}: {answer}");
    }
    let plain = "GET /v1/routes HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
    let answer = raw(proxy.admin, plain.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A read whose sender holds its body back is answered at once: only a change's body is
/// waited for, so that such senders cannot hold the port's places and starve its probes.
#[tokio::test]
async fn a_read_is_answered_without_waiting_for_a_body_held_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for path in ["/healthz", "/v1/routes", "/v1/keys/hooks/evt_none"] {
        let mut stream = tokio::net::TcpStream::connect(proxy.admin).await.unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0; 512];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer while the body is held back"))
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 "), "{path}: {answer}");
        assert!(!answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
    }
}

/// A body that is JSON but not an object (an array, which serde reads as a struct's fields
/// in order, a string, a number), or an object with a key twice, is refused where the API
/// takes an object, and changes nothing: Schemathesis' stateful phase found `[]` clearing
/// a scope.
#[tokio::test]
async fn a_body_that_is_not_a_json_object_is_refused_and_changes_nothing() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("    on_ambiguous: hold\n")).await;
    assert_eq!(
        post_event(proxy.addr, "evt_obj").await.dedupe(),
        "forwarded"
    );
    let json = [("content-type", "application/json")];
    for body in ["[]", "[\"evt_\", true]", "\"x\"", "7", "null"] {
        for (method, path) in [
            ("POST", "/v1/scopes/hooks/clear"),
            ("PATCH", "/v1/keys/hooks/evt_obj"),
            ("POST", "/v1/keys/hooks/evt_obj/resolve"),
            ("POST", "/v1/try"),
        ] {
            let refused = send(proxy.admin, method, path, &json, body).await;
            assert_eq!(
                refused.status, 400,
                "{method} {path} {body}: {}",
                refused.body
            );
            assert_eq!(refused.json()["error"], "bad_request", "{}", refused.body);
        }
    }
    // A key given twice is refused, not read as its last value (which would clear all).
    let twice = r#"{"prefix":"nothing_","prefix":""}"#;
    let refused = send(proxy.admin, "POST", "/v1/scopes/hooks/clear", &json, twice).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(
        post_event(proxy.addr, "evt_obj").await.dedupe(),
        "duplicate"
    );
}
