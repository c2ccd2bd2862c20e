//! Log lines that a sender cannot forge: keys, paths and header values holding spaces,
//! `=`, quotes, backslashes, line breaks, terminal escapes and bidi controls go through
//! every outcome (forwarded, released, duplicate, held, in flight, resolved, expired,
//! forgotten, stale, queued, dead, replayed, discarded, refused), on the real binary with
//! text logs and with JSON logs; every line that results is parsed, and none holds a
//! field the sender wrote or a character a terminal would act on.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::*;

/// A key a sender may choose (it passes the key's checks): a forged field in every
/// quoting a reader might fall for.
const KEY: &str = r#"k1 forged=key "forged"="q" \"forged=bs\" a\b"#;
/// Keys a sender may try, which the route refuses (400): each would break a line.
const REFUSED_KEYS: [&str; 4] = [
    "k2\nforged=newline",
    "k3\r\nforged=crlf",
    "k4\u{1b}[31m forged=ansi",
    "k5\u{202e}forged=bidi",
];

fn config(upstream: std::net::SocketAddr, dir: &Path) -> std::path::PathBuf {
    let routes = "defaults: { upstream_timeout: 300ms }\n\
        routes:\n\
        \x20 - name: hooks\n\
        \x20   match: { method: POST, path: /hooks }\n\
        \x20   key: \"{json:/id}\"\n\
        \x20   on_ambiguous: hold\n\
        \x20   retry_after: 1s\n\
        \x20 - name: ordered\n\
        \x20   match: { method: POST, path: /ordered }\n\
        \x20   key: \"{json:/id}\"\n\
        \x20   order: { entity: \"{json:/entity}\", version: \"{json:/v}\", on_stale: skip }\n\
        \x20 - name: queued\n\
        \x20   match: { method: POST, path: /queued }\n\
        \x20   key: \"{json:/id}\"\n\
        \x20   delivery: queued\n\
        \x20   queue: { max_attempts: 1, backoff_base: 50ms, backoff_cap: 100ms }\n";
    write_config(dir, upstream, routes)
}

fn event(id: &str) -> String {
    serde_json::json!({ "id": id }).to_string()
}

/// Headers a sender chose, carried by every request.
const SENDER_HEADERS: [(&str, &str); 3] = [
    ("content-type", "application/json"),
    ("user-agent", "agent\" forged=ua \u{202e}x"),
    ("x-request-id", "rid forged=rid"),
];

async fn post(proxy: std::net::SocketAddr, path: &str, body: &str) -> u16 {
    let reply = send(proxy, "POST", path, &SENDER_HEADERS, body.to_owned()).await;
    println!(
        "POST {path}: {} {:?} {}",
        reply.status,
        reply.header("dedupe"),
        reply.body
    );
    reply.status
}

/// An admin request's status; its body is printed, for a failing assertion.
async fn admin_call(binary: &Binary, method: &str, path: &str, body: &str) -> u16 {
    let json = [("content-type", "application/json")];
    let reply = send(binary.admin, method, path, &json, body.to_owned()).await;
    println!("{method} {path}: {} {}", reply.status, reply.body);
    reply.status
}

/// Queues `key` on a route whose one attempt fails, and returns its job's admin path once
/// it is a dead letter.
async fn dead_letter(binary: &Binary, key: &str) -> String {
    assert_eq!(post(binary.addr, "/queued", &event(key)).await, 202);
    let job = format!("/v1/queue/queued/jobs/{}", percent(key));
    eventually(Duration::from_secs(10), "a dead letter", || async {
        let reply = send(binary.admin, "GET", &job, &[], "").await;
        reply.status == 200 && reply.json()["dead_at"].is_string()
    })
    .await;
    job
}

/// Every outcome, each with sender text in it.
async fn every_outcome(binary: &Binary, upstream: &Upstream) {
    let proxy = binary.addr;
    let key = percent(KEY);
    // Released (the app failed), forwarded, then a duplicate.
    upstream.script([Answer::status(500), Answer::ok()]);
    assert_eq!(post(proxy, "/hooks", &event(KEY)).await, 500);
    assert_eq!(post(proxy, "/hooks", &event(KEY)).await, 200);
    assert_eq!(post(proxy, "/hooks", &event(KEY)).await, 200);
    // Held (the app's answer never came), answered 409 while held, then resolved.
    let held = format!("{KEY} held");
    upstream.script([Answer::ok().after(Duration::from_secs(2))]);
    assert_eq!(post(proxy, "/hooks", &event(&held)).await, 504);
    assert_eq!(post(proxy, "/hooks", &event(&held)).await, 409);
    let resolve = format!("/v1/keys/hooks/{}/resolve", percent(&held));
    let resolved = admin_call(binary, "POST", &resolve, r#"{"outcome":"release"}"#).await;
    assert_eq!(resolved, 200);
    // The operator's changes to a done key.
    let expire = format!("/v1/keys/hooks/{key}");
    assert_eq!(
        admin_call(binary, "PATCH", &expire, r#"{"expires_in":"1h"}"#).await,
        200
    );
    assert_eq!(admin_call(binary, "DELETE", &expire, "").await, 204);
    // A stale event: the entity is sender text too.
    let entity = r#"ent forged=entity "x""#;
    let ordered = |id: &str, v: u64| serde_json::json!({ "id": id, "entity": entity, "v": v });
    upstream.script([Answer::ok()]);
    let newer = ordered(&format!("{KEY} v2"), 2).to_string();
    assert_eq!(post(proxy, "/ordered", &newer).await, 200);
    let older = ordered(&format!("{KEY} v1"), 1).to_string();
    assert_eq!(post(proxy, "/ordered", &older).await, 200);
    // Queued: a dead letter, replayed and delivered; another discarded.
    upstream.script([Answer::status(500), Answer::ok(), Answer::status(500)]);
    let dead = dead_letter(binary, &format!("{KEY} queued")).await;
    assert!(admin_call(binary, "POST", &format!("{dead}/replay"), "").await < 300);
    eventually(Duration::from_secs(10), "the replay delivered", || async {
        send(binary.admin, "GET", &dead, &[], "").await.status == 404
    })
    .await;
    let discard = dead_letter(binary, &format!("{KEY} discarded")).await;
    assert!(admin_call(binary, "DELETE", &discard, "").await < 300);
    // Refused: keys that would break a line, and a path and header that try the same.
    for refused in REFUSED_KEYS {
        assert_eq!(
            post(proxy, "/hooks", &event(refused)).await,
            400,
            "{refused:?}"
        );
    }
    let path = "/hooks%20forged=path%22%E2%80%AE/x";
    assert!(post(proxy, path, &event("k6")).await >= 400);
    // An unmatched path with text in it, passed through.
    upstream.script([Answer::ok()]);
    post(proxy, "/other%20forged=unmatched%0a", &event("k7")).await;
}

/// Runs every outcome on the binary with `format` logs, at `debug` for the proxy's own
/// lines, and returns them once it has stopped.
async fn lines_of(format: &str) -> Vec<String> {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(upstream.addr, dir.path());
    let args = [
        "run".to_owned(),
        "-c".to_owned(),
        config.display().to_string(),
        "--log-format".to_owned(),
        format.to_owned(),
    ];
    let mut binary = Binary::spawn(&args, &[("RUST_LOG", "info,dedupe_proxy=debug")]);
    every_outcome(&binary, &upstream).await;
    binary.signal("TERM");
    binary.wait(Duration::from_secs(10));
    // The reader thread may still hold the last lines: wait for the stop's own line.
    tokio::time::sleep(Duration::from_millis(200)).await;
    binary.log.lock().unwrap().clone()
}

/// The names of a text line's fields: each `name=` outside a quoted string. Panics on a
/// quoted string that does not end or a character a terminal would act on.
fn text_fields(line: &str) -> Vec<String> {
    assert!(
        !line.chars().any(dedupe_proxy::testing::is_misleading),
        "a raw control or formatting character: {line:?}"
    );
    let mut names = Vec::new();
    let mut word = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                loop {
                    match chars.next() {
                        Some('\\') => assert!(chars.next().is_some(), "{line}"),
                        Some('"') => break,
                        Some(_) => {}
                        None => panic!("a quoted value does not end: {line}"),
                    }
                }
                word.clear();
            }
            '=' => {
                names.push(std::mem::take(&mut word));
            }
            c if c.is_alphanumeric() || c == '_' || c == '.' => word.push(c),
            _ => word.clear(),
        }
    }
    names
}

/// Whether the sender's text made it into the log at all (else the test proves nothing).
fn carries_sender_text(text: &str) -> bool {
    text.contains("k1 forged=key") || text.contains(r#"k1 forged=key \"forged"#)
}

#[tokio::test]
async fn text_log_lines_keep_sender_text_in_one_quoted_field() {
    let lines = lines_of("text").await;
    let all = lines.join("\n");
    assert!(carries_sender_text(&all), "{all}");
    for message in [
        "key forgotten through the admin API",
        "held key resolved through the admin API",
        "stale event",
        "queued event put in dead letters",
        "dead letter replayed through the admin API",
        "dead letter discarded through the admin API",
    ] {
        assert!(all.contains(message), "no line says {message:?}:\n{all}");
    }
    for line in &lines {
        let names = text_fields(line);
        assert!(
            !names.iter().any(|name| name.contains("forged")),
            "a forged field in {line}"
        );
    }
}

#[tokio::test]
async fn json_log_lines_keep_sender_text_in_one_string() {
    let lines = lines_of("json").await;
    let all = lines.join("\n");
    assert!(carries_sender_text(&all), "{all}");
    let mut keys_seen = 0;
    for line in &lines {
        let entry: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not one JSON line ({error}): {line}"));
        let fields = entry["fields"].as_object().unwrap();
        assert!(
            !fields.keys().any(|name| name.contains("forged")),
            "a forged field in {line}"
        );
        let key = fields.get("key").and_then(|key| key.as_str());
        if let Some(key) = key.filter(|key| key.contains("k1 forged=key")) {
            keys_seen += 1;
            assert!(key.contains(KEY), "{key}");
        }
    }
    assert!(keys_seen >= 3, "the key in {keys_seen} lines:\n{all}");
}
