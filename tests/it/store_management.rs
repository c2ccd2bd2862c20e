//! Managing a store's keys through the admin API, on sled, Redis and PostgreSQL alike: the
//! scopes with their keys counted by state, a scope's keys listed by prefix with cursors
//! bound to their listing, and a scope cleared whole or by prefix: refused while its
//! deliveries are in flight unless forced, a held key released only when forced, never a
//! key of another scope (`a` beside `a-b`), and the clearing in the delivery log.

use crate::support;

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use support::*;

/// Route `a` (on `/a`, holding a key whose forward timed out), route `a2` on `/a2`
/// sharing its scope, and route `a-b` on `/ab`, a scope whose name starts like `a`'s.
const ROUTES: &str = r#"routes:
  - name: a
    match: { method: POST, path: /a }
    key: "{json:/id}"
    on_ambiguous: hold
    upstream_timeout: 300ms
  - name: a2
    match: { method: POST, path: /a2 }
    key: "{json:/id}"
    scope: a
  - name: a-b
    match: { method: POST, path: /ab }
    key: "{json:/id}"
"#;

/// A proxy in front of `upstream` on `store` (a `store:` line), with [`ROUTES`].
async fn start(upstream: &Upstream, store: &str) -> Proxy {
    let data = tempfile::tempdir().unwrap();
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\n{store}\n{ROUTES}",
        upstream.addr
    );
    let app = dedupe_proxy::start(parse_config(&text)).await.unwrap();
    Proxy {
        addr: app.proxy_addr,
        admin: app.admin_addr,
        app: Some(app),
        data,
    }
}

async fn event(proxy: &Proxy, path: &str, id: &str) -> Reply {
    post_json(proxy.addr, path, &format!(r#"{{"id":"{id}"}}"#)).await
}

/// Every key `GET /v1/keys` lists for `query`, a page of `limit` at a time.
async fn all_keys(proxy: &Proxy, query: &str, limit: usize) -> Vec<(String, String)> {
    let (mut keys, mut after) = (Vec::new(), None::<String>);
    for _ in 0..100 {
        let cursor = after
            .as_deref()
            .map(|next| format!("&after={}", percent(next)));
        let path = format!(
            "/v1/keys?{query}&limit={limit}{}",
            cursor.unwrap_or_default()
        );
        let page = admin(proxy, "GET", &path, "").await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        let page = page.json();
        for key in page["keys"].as_array().unwrap() {
            let name = key["key"].as_str().unwrap().to_owned();
            keys.push((name, key["state"].as_str().unwrap().to_owned()));
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => {
                keys.sort();
                return keys;
            }
        }
    }
    panic!("the listing of {query} never ends");
}

fn scope<'a>(scopes: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    scopes["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|scope| scope["scope"] == name)
        .unwrap_or_else(|| panic!("no scope {name} in {scopes}"))
}

fn pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut pairs: Vec<_> = pairs
        .iter()
        .map(|(key, state)| ((*key).to_owned(), (*state).to_owned()))
        .collect();
    pairs.sort();
    pairs
}

async fn keys_are_managed_by_scope(store: &str) {
    let upstream = Upstream::start().await;
    let proxy = start(&upstream, store).await;
    upstream.script([Answer::ok().after(Duration::from_millis(800))]);
    assert_eq!(event(&proxy, "/a", "evt_held").await.dedupe(), "held");
    for id in ["evt_1", "evt_2", "other_1"] {
        assert_eq!(event(&proxy, "/a", id).await.dedupe(), "forwarded");
    }
    assert_eq!(event(&proxy, "/ab", "evt_1").await.dedupe(), "forwarded");

    let scopes = admin(&proxy, "GET", "/v1/scopes", "").await;
    assert_eq!(scopes.status, 200, "{}", scopes.body);
    let scopes = scopes.json();
    let a = scope(&scopes, "a");
    assert_eq!(a["routes"], serde_json::json!(["a", "a2"]));
    assert_eq!(
        a["keys"],
        serde_json::json!({ "in_flight": 0, "done": 3, "held": 1 })
    );
    assert_eq!(a["counted_all"], true);
    assert_eq!(scope(&scopes, "a-b")["keys"]["done"], 1);

    // Listed by prefix, a page of one key at a time, on every store.
    assert_eq!(
        all_keys(&proxy, "route=a&prefix=evt_", 1).await,
        pairs(&[("evt_1", "done"), ("evt_2", "done"), ("evt_held", "held")])
    );
    assert_eq!(
        all_keys(&proxy, "route=a2&state=done", 2).await,
        pairs(&[("evt_1", "done"), ("evt_2", "done"), ("other_1", "done")])
    );
    // A cursor is good for its own listing only.
    let first = admin(&proxy, "GET", "/v1/keys?route=a&prefix=evt_&limit=1", "").await;
    let next = first.json()["next"].as_str().unwrap().to_owned();
    for other in [
        format!("route=a&prefix=other_&after={}", percent(&next)),
        format!("route=a&prefix=evt_&state=done&after={}", percent(&next)),
        format!("route=a-b&prefix=evt_&after={}", percent(&next)),
        format!("route=a&prefix=evt_&after={}x", percent(&next)),
        "route=a&prefix=evt_&after=junk".to_owned(),
    ] {
        let refused = admin(&proxy, "GET", &format!("/v1/keys?{other}"), "").await;
        assert_eq!(
            (refused.status, refused.json()["error"].as_str()),
            (400, Some("bad_request")),
            "{other}: {}",
            refused.body
        );
    }

    // A delivery in flight in the scope stops a clearing, unless forced.
    let answer_slow = CancellationToken::new();
    upstream.script([Answer::ok().until(&answer_slow)]);
    let slow = {
        let addr = proxy.addr;
        tokio::spawn(async move { post_json(addr, "/a2", r#"{"id":"evt_slow"}"#).await })
    };
    upstream.wait_for_requests(6).await;
    let clear = "/v1/scopes/a/clear";
    let refused = admin(&proxy, "POST", clear, r#"{"prefix":"evt_"}"#).await;
    assert_eq!(
        (refused.status, refused.json()["error"].as_str()),
        (409, Some("in_flight")),
        "{}",
        refused.body
    );
    assert_eq!(event(&proxy, "/a", "evt_1").await.dedupe(), "duplicate");

    let forced = admin(&proxy, "POST", clear, r#"{"prefix":"evt_","force":true}"#).await;
    assert_eq!(forced.status, 200, "{}", forced.body);
    assert_eq!(
        forced.json(),
        serde_json::json!({
            "scope": "a", "prefix": "evt_", "removed": 2, "released": 1,
            "held_left": 0, "in_flight_left": 1, "complete": true, "next": null,
        })
    );
    assert_eq!(
        all_keys(&proxy, "route=a", 1000).await,
        pairs(&[("evt_slow", "in_flight"), ("other_1", "done")])
    );
    answer_slow.cancel();
    assert_eq!(slow.await.unwrap().dedupe(), "forwarded");

    // The whole scope, without a body; `a-b` keeps its key.
    let whole = admin(&proxy, "POST", clear, "").await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    let whole = whole.json();
    assert_eq!(
        (&whole["removed"], &whole["complete"]),
        (&2.into(), &true.into())
    );
    assert_eq!(all_keys(&proxy, "route=a", 1000).await, pairs(&[]));
    assert_eq!(
        all_keys(&proxy, "route=a-b", 1000).await,
        pairs(&[("evt_1", "done")])
    );
    for (path, id, fate) in [
        ("/a", "evt_1", "forwarded"),
        ("/a", "evt_held", "forwarded"),
        ("/a2", "other_1", "forwarded"),
        ("/ab", "evt_1", "duplicate"),
    ] {
        assert_eq!(event(&proxy, path, id).await.dedupe(), fate, "{path} {id}");
    }
    assert_eq!(upstream.executions("evt_1"), 3);

    // Each clearing is in the delivery log, with what it asked.
    eventually(Duration::from_secs(5), "the clearings logged", || async {
        let logged = admin(&proxy, "GET", "/v1/deliveries?outcome=changed", "").await;
        let entries = logged.json()["deliveries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let clearings: Vec<_> = entries
            .iter()
            .filter(|entry| entry["path"] == clear && entry["scope"] == "a")
            .collect();
        // A clearing names no key; its recorded body says what it asked.
        clearings.len() == 2 && clearings.iter().all(|entry| entry["key"].is_null())
    })
    .await;
}

async fn clearings_refuse_what_they_cannot_read(store: &str) {
    let upstream = Upstream::start().await;
    let proxy = start(&upstream, store).await;
    for (path, body, status, error) in [
        ("/v1/scopes/nope/clear", "{}", 404, "no_such_scope"),
        ("/v1/scopes/a/clear", r#"{"prefix":5}"#, 400, "bad_request"),
        (
            "/v1/scopes/a/clear",
            r#"{"force":"yes"}"#,
            400,
            "bad_request",
        ),
        (
            "/v1/scopes/a/clear",
            r#"{"everything":true}"#,
            400,
            "bad_request",
        ),
        ("/v1/scopes/a/clear", "[", 400, "bad_request"),
        (
            "/v1/scopes/a/clear",
            r#"{"prefix":"a\u0000"}"#,
            400,
            "bad_request",
        ),
    ] {
        let refused = admin(&proxy, "POST", path, body).await;
        assert_eq!(
            (refused.status, refused.json()["error"].as_str()),
            (status, Some(error)),
            "{path} {body}: {}",
            refused.body
        );
    }
    let long = "p".repeat(600);
    for query in [
        format!("route=a&prefix={long}"),
        "route=a&prefix=%0A".to_owned(),
    ] {
        let refused = admin(&proxy, "GET", &format!("/v1/keys?{query}"), "").await;
        assert_eq!(refused.status, 400, "{}", refused.body);
    }
    let wrong = admin(&proxy, "GET", "/v1/scopes/a/clear", "").await;
    assert_eq!((wrong.status, wrong.header("allow")), (405, Some("POST")));
}

async fn redis_store(name: &str) -> Option<String> {
    if !service_available("Redis", 6379).await {
        return None;
    }
    let run = format!("{:x}", rand::random::<u64>());
    Some(format!(
        "store: {{ redis: {{ url: \"{REDIS_URL}\", prefix: \"{name}-{run}:\" }} }}"
    ))
}

async fn postgres_store(table: &str) -> Option<String> {
    if !service_available("PostgreSQL", 5432).await {
        return None;
    }
    drop_postgres_tables(table).await;
    Some(format!(
        "store: {{ postgres: {{ url: \"{POSTGRES_URL}\", table: {table} }} }}"
    ))
}

fn sled_store() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "store: {{ sled: {{ path: \"{}\" }} }}",
        dir.path().display()
    );
    (dir, store)
}

#[tokio::test]
async fn keys_are_managed_by_scope_on_sled() {
    let (_dir, store) = sled_store();
    keys_are_managed_by_scope(&store).await;
}

#[tokio::test]
async fn keys_are_managed_by_scope_on_redis() {
    if let Some(store) = redis_store("manage").await {
        keys_are_managed_by_scope(&store).await;
    }
}

#[tokio::test]
async fn keys_are_managed_by_scope_on_postgres() {
    if let Some(store) = postgres_store("manage_keys").await {
        keys_are_managed_by_scope(&store).await;
    }
}

#[tokio::test]
async fn clearings_refuse_what_they_cannot_read_on_every_store() {
    let (_dir, store) = sled_store();
    clearings_refuse_what_they_cannot_read(&store).await;
    if let Some(store) = redis_store("manage-bad").await {
        clearings_refuse_what_they_cannot_read(&store).await;
    }
    if let Some(store) = postgres_store("manage_bad").await {
        clearings_refuse_what_they_cannot_read(&store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clearing_the_store_breaks_off_is_logged_with_its_failure() {
    let upstream = Upstream::start().await;
    let (app, _data) = proxy_on_store(&upstream, &json_route(""), |inner| FailingStore {
        fail_forgets_after: Some(2),
        ..FailingStore::new(inner)
    })
    .await;
    for id in ["evt_1", "evt_2", "evt_3", "evt_4"] {
        let sent = post_event(app.proxy_addr, id).await;
        assert_eq!(sent.status, 200);
    }
    let clear = admin_post(app.admin_addr, "/v1/scopes/hooks/clear", "{}").await;
    assert_eq!(clear.status, 503, "{}", clear.body);
    let left = send(app.admin_addr, "GET", "/v1/keys?route=hooks", &[], "").await;
    assert_eq!(
        left.json()["keys"].as_array().unwrap().len(),
        2,
        "two were forgotten"
    );
    eventually(
        Duration::from_secs(5),
        "the broken-off clearing logged",
        || async {
            let path = "/v1/deliveries?outcome=changed";
            let logged = send(app.admin_addr, "GET", path, &[], "").await;
            let entries = logged.json()["deliveries"].clone();
            entries.as_array().is_some_and(|entries| {
                entries.len() == 1
                    && entries[0]["status"] == 503
                    && entries[0]["path"] == "/v1/scopes/hooks/clear"
                    && entries[0]["by"] == "api:loopback"
            })
        },
    )
    .await;
    app.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clearing_goes_on_from_where_an_answer_stopped() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for id in ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5"] {
        assert_eq!(post_event(proxy.addr, id).await.status, 200);
    }
    // A clearing's `next` is a listing's cursor of the scope: one taken after a first page
    // clears what follows it, and leaves that page.
    let first = admin(&proxy, "GET", "/v1/keys?route=hooks&limit=2", "").await;
    let first = first.json();
    let kept: Vec<String> = first["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["key"].as_str().unwrap().to_owned())
        .collect();
    let next = first["next"].as_str().expect("a next page");
    let body = json!({ "after": next }).to_string();
    let cleared = admin(&proxy, "POST", "/v1/scopes/hooks/clear", &body).await;
    assert_eq!(cleared.status, 200, "{}", cleared.body);
    let answer = cleared.json();
    assert_eq!(answer["removed"], json!(5 - kept.len()));
    assert_eq!(
        (answer["complete"].clone(), answer["next"].clone()),
        (json!(true), json!(null))
    );
    let left = all_keys(&proxy, "route=hooks", 100).await;
    let left: Vec<&str> = left.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(left.len(), kept.len(), "{left:?} against {kept:?}");
    assert!(kept.iter().all(|key| left.contains(&key.as_str())));

    // A cursor of another listing, or made up, is refused and clears nothing; so is one
    // marked as anyone could mark it, with a digest of the listing and the store's cursor
    // (the marks are keyed).
    let held = admin(&proxy, "GET", "/v1/keys?route=hooks&limit=1&state=done", "").await;
    let inner = next.split_once('.').expect("a marked cursor").1;
    let unkeyed = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("hooks\n\n\n{inner}").as_bytes());
        format!("{}.{inner}", hex::encode(&digest[..8]))
    };
    for after in [
        held.json()["next"].clone(),
        json!("made-up"),
        json!(unkeyed),
    ] {
        if after.is_null() {
            continue;
        }
        let body = json!({ "after": after }).to_string();
        let refused = admin(&proxy, "POST", "/v1/scopes/hooks/clear", &body).await;
        assert_eq!(refused.status, 400, "{after}: {}", refused.body);
    }
    assert_eq!(all_keys(&proxy, "route=hooks", 100).await.len(), kept.len());
}
