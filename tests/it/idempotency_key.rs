//! The `idempotency_key` preset in front of an API, driven by a real client library
//! (Python `requests`, `tests/clients/idempotency_key.py`): the same POST twice gets the
//! first answer replayed, the same key with another body or path is `422`, a missing or
//! unquoted key `400`, two at once `409`, every refusal an RFC 9457 problem.

use crate::support;

use std::time::Duration;

use support::*;

/// Whether Python's `requests` is there (`tests/setup` installs it); CI must have it.
const ROUTE: &str = "routes:\n  - name: orders\n    match: { method: POST, path_prefix: /orders }\n    preset: idempotency_key\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_the_same_request_twice_gets_one_order() {
    let upstream = Upstream::start().await;
    upstream.script([
        Answer::status(201)
            .body(r#"{"order":1}"#)
            .header("content-type", "application/json")
            .header("location", "/orders/1"),
        Answer::status(201)
            .body(r#"{"order":"mallory"}"#)
            .header("content-type", "application/json"),
        Answer::status(201)
            .body(r#"{"order":2}"#)
            .header("content-type", "application/json")
            .after(Duration::from_millis(500)),
    ]);
    if !python_module_installed("requests") {
        return;
    }
    let proxy = Proxy::start(upstream.addr, ROUTE).await;
    let base = format!("http://{}", proxy.addr);
    let seen = python_client("idempotency_key.py", vec![base], Vec::new()).await;
    let status = |name: &str| seen[name]["status"].as_u64().unwrap();

    assert_eq!(status("first"), 201);
    assert_eq!(seen["first"]["replayed"], serde_json::Value::Null);
    assert_eq!(
        (status("again"), &seen["again"]["replayed"]),
        (201, &"true".into())
    );
    assert_eq!(
        seen["again"]["json"]["order"], 1,
        "the first answer, replayed"
    );
    assert_eq!(seen["again"]["location"], "/orders/1");

    for (name, expected, code) in [
        ("other_body", 422, "payload_mismatch"),
        ("other_path", 422, "payload_mismatch"),
        ("other_query", 422, "payload_mismatch"),
        ("no_key", 400, "missing_key"),
        ("unquoted", 400, "missing_key"),
    ] {
        assert_eq!(status(name), expected, "{name}: {}", seen[name]);
        assert_eq!(
            seen[name]["content_type"], "application/problem+json",
            "{name}"
        );
        let problem = &seen[name]["json"];
        assert_eq!(problem["status"], expected, "{name}");
        assert_eq!(problem["code"], code, "{name}");
        assert_eq!(problem["type"], "about:blank", "{name}");
        assert!(
            problem["title"].is_string() && problem["detail"].is_string(),
            "{name}"
        );
    }

    // Keys are the client's own: another client's request under the same key runs.
    assert_eq!(status("other_client"), 201);
    assert_eq!(seen["other_client"]["json"]["order"], "mallory");
    assert_eq!(seen["other_client"]["replayed"], serde_json::Value::Null);

    // Two at once: one runs, the other is told it is in progress.
    assert_eq!((status("together_0"), status("together_1")), (201, 409));
    assert_eq!(
        seen["together_1"]["content_type"],
        "application/problem+json"
    );
    assert_eq!(seen["together_1"]["json"]["code"], "in_flight");
    assert_eq!(upstream.requests(), 3, "one order per client's key");
}

#[tokio::test]
async fn the_routes_endpoint_states_how_long_a_key_is_kept() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, ROUTE).await;
    let routes = send(proxy.admin, "GET", "/v1/routes", &[], "").await.json();
    let policy = &routes["routes"][0];
    assert_eq!(
        policy["key"], "{header-hash:Authorization}:{sf-string:Idempotency-Key}",
        "{routes}"
    );
    // The draft asks a server to publish how long it keeps a key.
    assert_eq!(policy["retention"], "7d", "{routes}");
    assert_eq!(policy["fingerprint"], "request");
    assert_eq!(policy["on_payload_mismatch"], "reject");
    assert_eq!(policy["duplicate_response"]["replay"], true);
}
