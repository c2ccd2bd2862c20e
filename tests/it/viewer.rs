//! Every door for the viewer's token (`admin.viewer_token_env`): each changing endpoint
//! of the route table (as the OpenAPI document lists them), tried through the API, `/mcp` (configured `read_write`)
//! and every changing CLI command, is refused, and nothing changed. (The console's own
//! buttons are tried in `console.rs`.)

use crate::support;

use std::process::Command;

use serde_json::json;
use support::*;

const OPERATOR: &str = "operator-token";
const VIEWER: &str = "viewer-token";

/// Every `METHOD /path` that is not a `GET`, as the admin API's OpenAPI document (made
/// from the route table) lists them, and whether the operator's token alone may ask it.
fn changes() -> Vec<(String, String, bool)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    let document: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut found = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            if method != "get" {
                let operator_only = operation["security"] == json!([{ "operator": [] }]);
                found.push((method.to_uppercase(), path.clone(), operator_only));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewers_token_changes_nothing_through_any_door() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: OP_TOKEN, viewer_token_env: VIEW_TOKEN, mcp: read_write }}\n{}  - name: jobs\n    match: {{ method: POST, path: /jobs }}\n    key: \"{{json:/id}}\"\n    delivery: queued\n",
        json_route("")
    );
    let config = write_config(dir.path(), upstream.addr, &rest);
    let env = [("OP_TOKEN", OPERATOR), ("VIEW_TOKEN", VIEWER)];
    let proxy = Binary::start_with_env(&config, &env);
    assert_eq!(post_event(proxy.addr, "evt_v").await.status, 200);
    let viewer = format!("Bearer {VIEWER}");
    let headers = [
        ("authorization", viewer.as_str()),
        ("content-type", "application/json"),
    ];

    // The API: every changing endpoint of the route table.
    let changes = changes();
    assert!(changes.len() >= 12, "{changes:?}");
    for (method, path, operator_only) in &changes {
        let path = path
            .replace("{route}", "hooks")
            .replace("{scope}", "hooks")
            .replace("{key}", "evt_v")
            .replace("{entity}", "e1")
            .replace("{id}", "1");
        if !operator_only {
            // A dry run and `/mcp` change nothing by themselves: the viewer may send them.
            assert!(
                ["/v1/try", "/mcp"].contains(&path.as_str()),
                "{method} {path}"
            );
            continue;
        }
        let answer = send(proxy.admin, method, &path, &headers, "{}").await;
        assert_eq!(
            (answer.status, answer.json()["error"].clone()),
            (403, json!("read_only")),
            "{method} {path}: {}",
            answer.body
        );
    }
    let dry_run = send(proxy.admin, "POST", "/v1/try", &headers, "{}").await;
    assert_ne!(dry_run.status, 403, "{}", dry_run.body);

    // `/mcp`, configured read_write: the viewer is offered no changing tool, and calling
    // one by name does nothing.
    let mcp_headers = [
        ("authorization", viewer.as_str()),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-06-18"),
    ];
    let listed = send(
        proxy.admin,
        "POST",
        "/mcp",
        &mcp_headers,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let tools = listed.json()["result"]["tools"].clone();
    for tool in tools.as_array().unwrap() {
        assert_eq!(tool["annotations"]["readOnlyHint"], true, "{tool}");
    }
    for (name, arguments) in [
        ("forget_key", json!({"route": "hooks", "key": "evt_v"})),
        ("clear_keys", json!({"scope": "hooks", "force": true})),
        (
            "set_key_expiry",
            json!({"route": "hooks", "key": "evt_v", "expires_in": "1s"}),
        ),
        (
            "resolve_key",
            json!({"route": "hooks", "key": "evt_v", "outcome": "release"}),
        ),
    ] {
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
        let answer = send(proxy.admin, "POST", "/mcp", &mcp_headers, call.to_string()).await;
        let body = answer.json();
        assert!(
            body["error"].is_object() || body["result"]["isError"] == true,
            "{name}: {body}"
        );
    }

    // The CLI, with the viewer's token where it looks for one.
    let admin = format!("http://{}", proxy.admin);
    for args in [
        vec!["reload"],
        vec!["keys", "forget", "hooks", "evt_v"],
        vec!["keys", "expire", "hooks", "evt_v", "--in", "1s"],
        vec!["keys", "clear", "hooks", "--force"],
        vec!["keys", "resolve", "hooks", "evt_v", "--outcome", "release"],
        vec!["entities", "forget", "hooks", "e1"],
        vec!["queue", "pause", "jobs"],
        vec!["queue", "resume", "jobs"],
        vec!["queue", "replay", "jobs", "k1"],
        vec!["queue", "replay-all", "jobs"],
        vec!["queue", "discard", "jobs", "k1"],
        vec!["queue", "replays", "1", "--cancel"],
    ] {
        let output = Command::new(binary_path())
            .args(&args)
            .args(["--admin", &admin])
            .env_clear()
            .env("DEDUPE_ADMIN_TOKEN", VIEWER)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("read_only"), "{args:?}: {stderr}");
    }

    // Nothing changed: the key is done, the queued route is not paused.
    assert_eq!(post_event(proxy.addr, "evt_v").await.dedupe(), "duplicate");
    let operator = format!("Bearer {OPERATOR}");
    let queue = send(
        proxy.admin,
        "GET",
        "/v1/queue",
        &[("authorization", operator.as_str())],
        "",
    )
    .await;
    assert_eq!(queue.json()["routes"][0]["paused"], false, "{}", queue.body);
}
