//! The admin API's OpenAPI document (`docs/openapi.json`, `dedupe-proxy openapi`,
//! `GET /v1/openapi.json`), generated from the route table: the committed one is the one
//! the table makes and the port serves; and Schemathesis, a property-based API tester
//! driven by it, finds no server error and no answer outside the document on a live proxy.

use crate::support;

use std::process::Command;

use support::*;

const OPERATOR: &str = "operator-secret-token";

fn committed() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_committed_document_is_the_one_the_route_table_makes() {
    let printed = Command::new(binary_path()).arg("openapi").output().unwrap();
    assert!(printed.status.success());
    let generated: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert!(
        generated == committed(),
        "docs/openapi.json is out of date: run `cargo run -- openapi > docs/openapi.json`"
    );
    // Each request body is the schema of the type its handler reads.
    let resolve = &generated["paths"]["/v1/keys/{route}/{key}/resolve"]["post"];
    assert_eq!(
        resolve["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/HeldResolution"
    );
    let fields = &generated["components"]["schemas"]["HeldResolution"]["properties"];
    assert!(
        fields["outcome"].is_object() && fields["held_at"].is_object(),
        "{fields}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_property_based_tester_finds_no_server_error_and_no_answer_outside_the_document() {
    if !installed("Schemathesis", "st", &["--version"]) {
        return;
    }
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: OP_TOKEN, mcp: read_write }}\n{}  - name: jobs\n    match: {{ method: POST, path: /jobs }}\n    key: \"{{json:/id}}\"\n    delivery: queued\n",
        json_route("")
    );
    let config = write_config(dir.path(), upstream.addr, &rest);
    let proxy = Binary::start_with_env(&config, &[("OP_TOKEN", OPERATOR)]);
    assert_eq!(post_event(proxy.addr, "evt_openapi").await.status, 200);
    let bearer = [("authorization", format!("Bearer {OPERATOR}"))];
    let headers: Vec<(&str, &str)> = bearer.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let served = send(proxy.admin, "GET", "/v1/openapi.json", &headers, "").await;
    assert_eq!(served.status, 200);
    assert!(
        served.json() == committed(),
        "the port serves the committed document"
    );

    // Without the token every endpoint of the API is `401`, and so are the paths and
    // methods it does not have: no one learns what it has without one. A form's `POST`
    // (no JSON type) is `401` too, before its type is looked at.
    let json_type = [("content-type", "application/json")];
    let mut asked = Vec::new();
    for (path, operations) in committed()["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            if operation["security"] != serde_json::json!([]) {
                asked.push((method.to_uppercase(), path.replace(['{', '}'], "")));
            }
        }
    }
    assert!(asked.len() > 25, "{asked:?}");
    for (method, path) in [
        ("GET", "/v1/nope"),
        ("PUT", "/v1/keys"),
        ("GET", "/v1/reload"),
        ("GET", "/mcp"),
        ("GET", "/v1"),
        ("DELETE", "/v1/keys/a/b/c"),
    ] {
        asked.push((method.to_owned(), path.to_owned()));
    }
    for (method, path) in &asked {
        let answer = send(proxy.admin, method, path, &json_type, "{}").await;
        assert_eq!(
            (answer.status, answer.json()["error"].as_str()),
            (401, Some("unauthorized")),
            "{method} {path}"
        );
    }
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let posted = send(proxy.admin, "POST", "/v1/reload", &form, "a=b").await;
    assert_eq!(posted.status, 401, "{}", posted.body);

    // Every check of the document's promises: no 5xx, statuses, media types, headers and
    // bodies as documented, 401 without the token, 405 with `Allow` for other methods.
    // The live tail is left out: an event stream ends only with its client. One worker:
    // Schemathesis 4.32's coverage phase fails inside itself (a KeyError) with two.
    let checks = "not_a_server_error,status_code_conformance,content_type_conformance,\
        response_headers_conformance,response_schema_conformance,missing_required_header,\
        unsupported_method,allow_header_conformance,ignored_auth,negative_data_rejection";
    let url = format!("http://{}/v1/openapi.json", proxy.admin);
    let workdir = dir.path().to_owned();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("st")
            .args([
                "run",
                &url,
                "--checks",
                checks,
                "--exclude-path",
                "/v1/deliveries/tail",
            ])
            .args(["--header", &format!("Authorization: Bearer {OPERATOR}")])
            .args(["--max-examples", "30", "--seed", "7", "--workers", "1"])
            .args(["--request-timeout", "10", "--max-time", "120"])
            .current_dir(&workdir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "Schemathesis found failures:\n{said}");
    assert!(said.contains("Tested: "), "{said}");
    // The proxy lived through it, and still deduplicates.
    assert_eq!(
        post_event(proxy.addr, "evt_after").await.dedupe(),
        "forwarded"
    );
    assert_eq!(
        post_event(proxy.addr, "evt_after").await.dedupe(),
        "duplicate"
    );
}
