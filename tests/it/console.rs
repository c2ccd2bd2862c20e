//! The console in real headless Chromium (Debian's `chromium` and `chromium-driver`, which
//! tests/setup installs), driven over WebDriver as an operator would use it: sign in, watch
//! events arrive in the deliveries table, open one, forget its key and see the next
//! delivery forwarded, clear a scope by typing its name, reload the routes, read it at a
//! phone's width. A viewer's token shows no buttons and its forged change is refused; a
//! page on another site cannot act as the operator. Screenshots of each page go to
//! `target/console-screenshots/`.

use crate::support;

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OPERATOR: &str = "console-operator-s3cret";
const VIEWER: &str = "console-viewer-s3cret";
const WAIT: Duration = Duration::from_secs(10);

/// Chromium driven through chromedriver, both ended on drop.
struct Browser {
    client: Client,
    driver: Child,
}

impl Drop for Browser {
    /// Ends chromedriver and every Chromium process it started: they share its process
    /// group. Left running, each holds inotify instances (128 per user), and later tests
    /// that watch a file fail.
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}

/// Headless Chromium at 1280 px, or `None` (the test skipped) where chromedriver is not
/// installed; under `CI=true` a missing browser fails the test.
async fn browser() -> Option<Browser> {
    if !installed(
        "chromium and chromium-driver",
        "chromedriver",
        &["--version"],
    ) {
        return None;
    }
    let port = free_port();
    let driver = Command::new("chromedriver")
        .process_group(0)
        .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let options = json!({
        "binary": "/usr/bin/chromium",
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--lang=en-US"],
    });
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    let mut last_error = None;
    for _ in 0..100 {
        match ClientBuilder::new(connector.clone())
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => return Some(Browser { client, driver }),
            Err(error) => last_error = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver never started a session: {last_error:?}");
}

impl Browser {
    async fn open(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// The first element `css` picks, once there is one.
    async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        (self.client.wait().at_most(WAIT))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|error| panic!("no `{css}` on the page: {error}"))
    }

    /// Waits until the text of the first element `css` picks contains `text`.
    async fn wait_for_text(&self, css: &str, text: &str) {
        self.wait_for_text_where(css, &format!("said `{text}`"), |seen| seen.contains(text))
            .await;
    }

    /// Waits until the text of the first element `css` picks passes `test`: `what` says
    /// what was awaited, for the failure.
    async fn wait_for_text_where(&self, css: &str, what: &str, test: impl Fn(&str) -> bool) {
        let start = std::time::Instant::now();
        loop {
            if let Ok(found) = self.client.find(Locator::Css(css)).await
                && found.text().await.is_ok_and(|seen| test(&seen))
            {
                return;
            }
            assert!(start.elapsed() < WAIT, "`{css}` never {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Opens `page` from the navigation and waits until it is in place (the console sets
    /// `body[data-page]` once a page is shown), so that text the page before also held
    /// (the overview's table names the routes too) cannot pass for the new page's.
    async fn go(&self, page: &str) {
        self.script("delete document.body.dataset.page; return null")
            .await;
        self.click(&format!("nav a[data-page={page}]")).await;
        self.wait_for(&format!("body[data-page={page}]")).await;
    }

    /// Asserts that nothing runs off the side of the window (a phone's, in the tests).
    async fn fits_its_width(&self) {
        let overflow = self
            .script("return document.documentElement.scrollWidth - window.innerWidth")
            .await;
        assert!(
            overflow.as_i64().unwrap() <= 0,
            "the page is wider than the window: {overflow}"
        );
    }

    async fn click(&self, css: &str) {
        self.wait_for(css).await.click().await.unwrap();
    }

    async fn type_into(&self, css: &str, text: &str) {
        self.wait_for(css).await.send_keys(text).await.unwrap();
    }

    async fn script(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, Vec::new()).await.unwrap()
    }

    /// Saves the page as `target/console-screenshots/<name>.png`, once it shows no value
    /// the script failed to find.
    async fn screenshot(&self, name: &str) {
        let page = self
            .script("return document.querySelector('main').textContent")
            .await;
        for gap in ["undefined", "NaN", "[object"] {
            assert!(
                !page.as_str().unwrap().contains(gap),
                "`{gap}` on {name}: {page}"
            );
        }
        let png = self.client.screenshot().await.unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Waits until the page shows the time `at` (an RFC 3339 string) in a `<time>`.
    async fn shows_time(&self, at: &serde_json::Value) {
        let script = "return [...document.querySelectorAll('main time')]
            .some((t) => Date.parse(t.dateTime) === Date.parse(arguments[0]))";
        eventually(WAIT, &format!("{at} on the page"), || async {
            let found = self.client.execute(script, vec![at.clone()]).await;
            found.is_ok_and(|found| found == json!(true))
        })
        .await;
    }

    /// The text of every button in the page's main part.
    async fn buttons(&self) -> Vec<String> {
        let found = self
            .script(
                "return [...document.querySelectorAll('main button')].map((b) => b.textContent)",
            )
            .await;
        serde_json::from_value(found).unwrap()
    }

    /// Sends one key to the focused element.
    async fn press(&self, key: Key) {
        let focused = self.client.active_element().await.unwrap();
        focused.send_keys(&key.to_string()).await.unwrap();
    }

    /// The id of the focused element.
    async fn focused_id(&self) -> String {
        let focused = self.client.active_element().await.unwrap();
        focused.attr("id").await.unwrap().unwrap_or_default()
    }

    async fn sign_in(&self, admin: SocketAddr, token: &str) {
        self.open(&format!("http://{admin}/")).await;
        self.type_into("#token", token).await;
        self.click("#sign-in").await;
        self.wait_for_text("main h1", "Overview").await;
    }
}

fn tokens_config(dir: &std::path::Path, upstream: SocketAddr) -> PathBuf {
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: CONSOLE_TOKEN, viewer_token_env: CONSOLE_VIEWER }}\n{}",
        json_route("")
    );
    write_config(dir, upstream, &rest)
}

fn start_with_tokens(dir: &std::path::Path, upstream: SocketAddr) -> Binary {
    let config = tokens_config(dir, upstream);
    Binary::start_with_env(
        &config,
        &[("CONSOLE_TOKEN", OPERATOR), ("CONSOLE_VIEWER", VIEWER)],
    )
}

async fn key_state(admin: SocketAddr, key: &str) -> u16 {
    key_reply(admin, key).await.status
}

async fn key_json(admin: SocketAddr, key: &str) -> serde_json::Value {
    key_reply(admin, key).await.json()
}

async fn key_reply(admin: SocketAddr, key: &str) -> Reply {
    let bearer = format!("Bearer {OPERATOR}");
    let path = format!("/v1/keys/hooks/{key}");
    send(admin, "GET", &path, &[("authorization", &bearer)], "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_watches_deliveries_forgets_a_key_and_its_next_delivery_runs_again() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_with_tokens(dir.path(), upstream.addr);
    assert_eq!(post_event(proxy.addr, "evt_1").await.status, 200);
    assert_eq!(post_event(proxy.addr, "evt_1").await.dedupe(), "duplicate");

    // Without a token the page asks for one; with it, the overview counts the route.
    browser.sign_in(proxy.admin, OPERATOR).await;
    browser.wait_for_text("main table", "hooks").await;
    browser.wait_for_text("#who", "operator").await;
    let cells = browser
        .script("return [...document.querySelectorAll('main table tbody tr td')].map((td) => td.textContent)")
        .await;
    // Route, scope, delivery, forwarded, duplicates, refused, store unavailable, released,
    // answered in flight, held keys, queued, dead.
    let expected = json!([
        "hooks", "hooks", "direct", "1", "1", "0", "0", "0", "0", "0", "–", "–"
    ]);
    assert_eq!(cells, expected);
    browser.wait_for_text("main .cards", "1 done key ·").await;
    browser
        .wait_for_text("main", "This page shows this process")
        .await;
    browser.screenshot("overview").await;

    // The log as a table, newest first; a new event appears without reloading.
    browser.go("deliveries").await;
    browser.wait_for_text("#deliveries tbody", "evt_1").await;
    let rows = browser
        .script("return document.querySelectorAll('#deliveries tbody tr').length")
        .await;
    assert_eq!(rows, 2, "both deliveries of evt_1");
    browser
        .wait_for_text("#deliveries tbody tr:first-child", "duplicate")
        .await;
    assert_eq!(post_event(proxy.addr, "evt_2").await.status, 200);
    browser
        .wait_for_text("#deliveries tbody tr.fresh", "evt_2")
        .await;
    let first = browser
        .wait_for("#deliveries tbody tr:first-child time")
        .await;
    let utc = first.attr("title").await.unwrap().unwrap();
    assert!(utc.ends_with("Z (UTC)"), "the time's UTC on hover: {utc}");
    browser.screenshot("deliveries").await;

    // A delivery: what was decided and why, and the key as it is now.
    let evt_1 = "#deliveries tbody tr:last-child a";
    browser.click(evt_1).await;
    browser.wait_for_text("main h2", "What was decided").await;
    browser
        .wait_for_text("main", "First delivery of this key")
        .await;
    browser.wait_for_text("#key-state", "done").await;
    let page = browser
        .script("return document.querySelector('main').textContent")
        .await;
    assert!(!page.as_str().unwrap().contains("null"), "{page}");
    browser.screenshot("delivery").await;

    // Moving the expiry asks first, then the key shows the new one.
    // The built-in retention is 7d: an hour from now is sooner.
    let before = key_json(proxy.admin, "evt_1").await["expires_at"].clone();
    browser.type_into("#expires-in", "1h").await;
    browser.click("#set-expiry").await;
    browser
        .wait_for_text("#confirm-text", "Expire this key 1h from now?")
        .await;
    browser.wait_for_text("#confirm-subject", "evt_1").await;
    browser.click("#confirm-ok").await;
    browser
        .wait_for_text("#alert", "Expiry of evt_1 moved to")
        .await;
    let after = key_json(proxy.admin, "evt_1").await["expires_at"].clone();
    assert!(
        after.as_str().unwrap() < before.as_str().unwrap(),
        "{before} then {after}"
    );
    browser.shows_time(&after).await;

    // Forgetting asks first; then the key is absent and its next delivery is forwarded.
    browser.click("#forget").await;
    browser
        .wait_for_text("#confirm-title", "Forget this key")
        .await;
    browser.click("#confirm-ok").await;
    browser.wait_for_text("#key-state", "Absent").await;
    browser.wait_for_text("#alert", "Forgot evt_1").await;
    assert_eq!(key_state(proxy.admin, "evt_1").await, 404);
    let again = post_event(proxy.addr, "evt_1").await;
    assert_eq!((again.status, again.dedupe()), (200, "forwarded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_a_scope_asks_for_its_name_and_the_routes_reload_from_the_page() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_with_tokens(dir.path(), upstream.addr);
    for id in ["evt_a1", "evt_a2", "evt_b1"] {
        assert_eq!(post_event(proxy.addr, id).await.status, 200);
    }
    browser.sign_in(proxy.admin, OPERATOR).await;

    // The scopes, counted; a scope's keys by prefix.
    browser.go("keys").await;
    browser.wait_for_text("main table", "hooks").await;
    browser.click("main table a").await;
    browser.type_into("input[name=prefix]", "evt_a").await;
    browser.click("form.filters button[type=submit]").await;
    // The table before the filter holds evt_a2 too: wait for the filtered one.
    browser
        .wait_for_text_where("main table", "listed evt_a2 without evt_b1", |seen| {
            seen.contains("evt_a2") && !seen.contains("evt_b1")
        })
        .await;
    browser.screenshot("keys").await;

    // Forgetting by prefix names the prefix; clearing the scope needs its name typed.
    browser.click("#forget-prefix").await;
    browser.type_into("#confirm-typed", "evt_a").await;
    browser.click("#confirm-ok").await;
    browser
        .wait_for_text("#change-result", "Removed 2 keys")
        .await;
    assert_eq!(key_state(proxy.admin, "evt_a1").await, 404);
    assert_eq!(key_state(proxy.admin, "evt_b1").await, 200);
    browser.click("#clear-scope").await;
    let ok = browser.wait_for("#confirm-ok").await;
    assert!(
        !ok.is_enabled().await.unwrap(),
        "confirm waits for the name"
    );
    browser.type_into("#confirm-typed", "hook").await;
    assert!(!ok.is_enabled().await.unwrap());
    browser.type_into("#confirm-typed", "s").await;
    ok.click().await.unwrap();
    browser
        .wait_for_text("#change-result", "Removed 1 key;")
        .await;
    assert_eq!(key_state(proxy.admin, "evt_b1").await, 404);
    let again = post_event(proxy.addr, "evt_b1").await;
    assert_eq!(again.dedupe(), "forwarded");

    // Held keys and dead letters: empty states that say what to do.
    browser.go("held").await;
    browser.wait_for_text("main", "No held keys").await;
    browser.wait_for_text("main", "No queued routes").await;
    browser.screenshot("held").await;

    // The resolved routes, and a reload with its result: the page shows the routes now
    // running.
    browser.go("routes").await;
    browser.wait_for_text("main h2", "hooks").await;
    let config = dir.path().join("config.yaml");
    let more = "  - name: more\n    match: { path: /more }\n    key: \"{json:/id}\"\n";
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}{more}")).unwrap();
    browser.click("#reload").await;
    browser.wait_for_text("#alert", "Reloaded: 2 routes").await;
    browser
        .wait_for_text("main section:last-of-type h2", "more")
        .await;
    browser.screenshot("routes").await;
    browser.go("overview").await;
    browser.wait_for_text("main .cards", "succeeded").await;
    browser.wait_for_text("main .cards", "(2 routes)").await;

    // At a phone's width nothing runs off the side.
    browser.client.set_window_size(390, 844).await.unwrap();
    browser.go("deliveries").await;
    browser.wait_for_text("#deliveries tbody", "evt_b1").await;
    browser.fits_its_width().await;
    browser.screenshot("deliveries-phone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_no_buttons_and_a_forged_change_with_its_token_is_refused() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Something on every page that an operator could change: a done key, a held key and a
    // dead letter.
    let routes = json_route(
        "    on_ambiguous: hold\n    upstream_timeout: 300ms\n  - name: jobs\n    match: { method: POST, path: /jobs }\n    key: \"{json:/id}\"\n    delivery: queued\n",
    );
    let rest = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: CONSOLE_TOKEN, viewer_token_env: CONSOLE_VIEWER }}\n{routes}"
    );
    let config = write_config(dir.path(), upstream.addr, &rest);
    let proxy = Binary::start_with_env(
        &config,
        &[("CONSOLE_TOKEN", OPERATOR), ("CONSOLE_VIEWER", VIEWER)],
    );
    assert_eq!(post_event(proxy.addr, "evt_v").await.status, 200);
    upstream.script([Answer::status(201).after(Duration::from_millis(800))]);
    assert_eq!(post_event(proxy.addr, "evt_h").await.dedupe(), "held");
    upstream.script([Answer::status(422)]);
    let job = post_json(proxy.addr, "/jobs", r#"{"id":"evt_q"}"#).await;
    assert_eq!(job.status, 202);
    let bearer = format!("Bearer {OPERATOR}");
    eventually(WAIT, "a dead letter", || async {
        let auth = [("authorization", bearer.as_str())];
        let dead = send(proxy.admin, "GET", "/v1/queue/jobs/dead", &auth, "").await;
        dead.json()["jobs"]
            .as_array()
            .is_some_and(|jobs| jobs.len() == 1)
    })
    .await;

    browser.sign_in(proxy.admin, VIEWER).await;
    browser.wait_for_text("#who", "viewer").await;
    // Each page once it shows what an operator could change, and the buttons it has: only
    // those that read.
    let console = format!("http://{}/console/", proxy.admin);
    for (page, css, shown) in [
        ("#/", "main table", "jobs"),
        ("#/deliveries", "#deliveries tbody", "evt_q"),
        ("#/key/hooks/evt_v", "#key-state", "done"),
        ("#/key/hooks/evt_h", "#key-state", "held"),
        ("#/keys", "main table", "hooks"),
        ("#/keys?route=hooks", "main table", "evt_h"),
        ("#/held", "#dead-jobs", "evt_q"),
        ("#/routes", "main h2", "hooks"),
        ("#/try", "#try-run", "Try it"),
    ] {
        browser.open(&format!("{console}{page}")).await;
        browser.wait_for_text(css, shown).await;
        if page == "#/held" {
            browser.wait_for_text("main table", "evt_h").await;
        }
        for button in browser.buttons().await {
            assert!(
                [
                    "Filter",
                    "Show",
                    "Older entries",
                    "Try it",
                    "Last hour",
                    "Last day"
                ]
                .contains(&button.as_str()),
                "`{button}` shown to a viewer on {page}"
            );
        }
    }
    browser
        .open(&format!("{console}#/deliveries?key=evt_v"))
        .await;
    browser.click("#deliveries tbody a").await;
    browser.wait_for_text("#key-state", "done").await;
    assert_eq!(browser.buttons().await, Vec::<String>::new(), "a delivery");
    // The same changes sent by hand with the viewer's token, from the page and from outside.
    let from_page = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/v1/keys/hooks/evt_v', { method: 'DELETE', headers: { Authorization: 'Bearer ' + sessionStorage.getItem('dedupe-proxy.token') } })
               .then(async (r) => done([r.status, await r.json()]))",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(from_page[0], 403);
    assert_eq!(from_page[1]["error"], "read_only");
    let bearer = format!("Bearer {VIEWER}");
    let auth = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    for (method, path) in [
        ("DELETE", "/v1/keys/hooks/evt_v"),
        ("POST", "/v1/scopes/hooks/clear"),
        ("POST", "/v1/reload"),
        ("PATCH", "/v1/keys/hooks/evt_v"),
        ("POST", "/v1/keys/hooks/evt_h/resolve"),
        ("POST", "/v1/queue/jobs/jobs/evt_q/replay"),
        ("POST", "/v1/queue/jobs/replays"),
    ] {
        let refused = send(proxy.admin, method, path, &auth, "{}").await;
        assert_eq!(
            (refused.status, refused.json()["error"].clone()),
            (403, json!("read_only")),
            "{method} {path}"
        );
    }
    assert_eq!(key_state(proxy.admin, "evt_v").await, 200);
    assert_eq!(post_event(proxy.addr, "evt_v").await.dedupe(), "duplicate");
    assert_eq!(key_json(proxy.admin, "evt_h").await["state"], "held");
}

/// Serves `page` as HTML to every request on a port of its own: another site.
async fn serve_page(page: String) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_site_cannot_act_as_the_operator() {
    let Some(browser) = browser().await else {
        return;
    };
    // The riskiest setting: loopback without a token, where any local caller is the operator.
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    assert_eq!(post_event(proxy.addr, "evt_x").await.status, 200);
    let admin = proxy.admin;
    let attack = format!(
        "<!doctype html><form id=f method=POST enctype=text/plain action='http://{admin}/v1/scopes/hooks/clear?force=true'>\
         <input name='{{\"force\":true,\"x\":\"' value='\"}}'></form>\
         <script>
           fetch('http://{admin}/v1/keys/hooks/evt_x', {{method: 'DELETE', mode: 'no-cors'}}).catch(() => {{}});
           fetch('http://{admin}/v1/reload', {{method: 'POST', mode: 'no-cors', body: '{{}}'}}).catch(() => {{}});
           setTimeout(() => document.getElementById('f').submit(), 300);
         </script>"
    );
    let site = serve_page(attack).await;
    browser.open(&format!("http://{site}/")).await;
    // The form's post lands on the admin port's refusal.
    browser.wait_for_text("body", "cross_origin").await;
    assert_eq!(admin_get(&proxy, "/v1/keys/hooks/evt_x").await.status, 200);
    let log = admin_get(&proxy, "/v1/deliveries?outcome=changed").await;
    assert_eq!(log.json()["deliveries"], json!([]), "nothing was changed");
    let overview = admin_get(&proxy, "/v1/overview").await;
    assert_eq!(overview.json()["reload"], json!(null), "no reload ran");
    assert_eq!(
        overview.json()["store"]["outcomes_announced"],
        json!(null),
        "sled shares nothing"
    );

    // Nor can another site frame the console.
    let page = send(admin, "GET", "/console/", &[], "").await;
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let policy = page.header("content-security-policy").unwrap();
    assert!(policy.contains("frame-ancestors 'none'") && policy.contains("script-src 'self'"));
}

async fn admin_get(proxy: &Proxy, path: &str) -> Reply {
    send(proxy.admin, "GET", path, &[], "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_keys_are_resolved_from_the_page_with_progress() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let slow = || Answer::status(201).after(Duration::from_millis(800));
    upstream.script([slow(), slow(), slow()]);
    let route = json_route("    on_ambiguous: hold\n    upstream_timeout: 300ms\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    for id in ["evt_h1", "evt_h2", "evt_h3"] {
        assert_eq!(post_event(proxy.addr, id).await.dedupe(), "held");
    }
    let console = format!("http://{}/console/", proxy.admin);

    // One, from its page: it ran, so its next delivery is a duplicate.
    browser.open(&format!("{console}#/key/hooks/evt_h3")).await;
    browser.wait_for_text("#key-state", "held").await;
    browser.click("#resolve-done").await;
    browser
        .wait_for_text("#confirm-text", "Resolve it as done")
        .await;
    browser.wait_for_text("#confirm-subject", "evt_h3").await;
    browser.click("#confirm-ok").await;
    browser.wait_for_text("#key-state", "done").await;
    browser
        .wait_for_text("#alert", "Resolved evt_h3 as done")
        .await;
    assert_eq!(post_event(proxy.addr, "evt_h3").await.dedupe(), "duplicate");

    // The others, all at once: run again.
    browser.go("held").await;
    browser.wait_for_text("main table", "evt_h2").await;
    let listed = browser
        .script("return document.querySelector('main table').textContent")
        .await;
    assert!(!listed.as_str().unwrap().contains("evt_h3"), "{listed}");
    browser
        .wait_for_text("main table", "upstream_timeout")
        .await;
    browser.screenshot("held-keys").await;
    browser.click("#resolve-all-release").await;
    browser.wait_for_text("#confirm-text", "2 held keys").await;
    browser.click("#confirm-ok").await;
    browser
        .wait_for_text("#held-progress", "Resolved 2 of 2")
        .await;
    browser
        .wait_for_text("#alert", "Resolved 2 held keys as release")
        .await;
    for id in ["evt_h1", "evt_h2"] {
        let again = post_event(proxy.addr, id).await;
        assert_eq!((again.status, again.dedupe()), (200, "forwarded"), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_picked_by_a_prefix_are_replayed_from_the_page_with_progress() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    upstream.script([Answer::status(422), Answer::status(422)]);
    let route = json_route("    delivery: queued\n    queue:\n      backoff_base: 50ms\n");
    let proxy = Proxy::start(upstream.addr, &route).await;
    for id in ["evt_d1", "evt_d2"] {
        assert_eq!(post_event(proxy.addr, id).await.status, 202);
    }
    eventually(WAIT, "two dead letters", || async {
        let dead = send(proxy.admin, "GET", "/v1/queue/hooks/dead", &[], "").await;
        dead.json()["jobs"]
            .as_array()
            .is_some_and(|jobs| jobs.len() == 2)
    })
    .await;
    browser
        .open(&format!("http://{}/console/#/held", proxy.admin))
        .await;
    browser.wait_for_text("#dead-hooks", "evt_d1").await;
    // On loopback without a token, no sign-in and nothing to sign out of.
    let who = browser.wait_for("#who").await.text().await.unwrap();
    assert_eq!(who, "operator · loopback");
    browser.wait_for_text("#dead-hooks", "refused").await;
    browser.type_into("#dead-prefix-hooks", "evt_d2").await;
    browser.click("#dead-show-hooks").await;
    eventually(WAIT, "only evt_d2 listed", || async {
        let shown = browser
            .script("return document.querySelector('#dead-hooks').textContent")
            .await;
        let shown = shown.as_str().unwrap_or_default().to_owned();
        shown.contains("evt_d2") && !shown.contains("evt_d1")
    })
    .await;
    browser.screenshot("dead-letters").await;
    browser.click("#replay-all-hooks").await;
    browser
        .wait_for_text("#confirm-text", "starting with “evt_d2”")
        .await;
    browser.click("#confirm-ok").await;
    browser
        .wait_for_text("#replay-progress-hooks", "1 of 1 replayed")
        .await;
    // The app refused both at first; now it takes the one replayed, only.
    eventually(WAIT, "evt_d2 delivered again", || async {
        upstream.executions("evt_d2") == 1
    })
    .await;
    assert_eq!(upstream.executions("evt_d1"), 0, "evt_d1 was not picked");

    // The other one by its row's button, which names it.
    browser
        .wait_for_text("#dead-hooks", "No dead letters match")
        .await;
    browser
        .script("document.getElementById('dead-prefix-hooks').value = ''")
        .await;
    browser.click("#dead-show-hooks").await;
    browser
        .click("#dead-hooks button[aria-label='Replay evt_d1']")
        .await;
    browser.wait_for_text("#confirm-subject", "evt_d1").await;
    browser.click("#confirm-ok").await;
    browser.wait_for_text("#alert", "Replaying evt_d1").await;
    eventually(WAIT, "evt_d1 delivered again", || async {
        upstream.executions("evt_d1") == 1
    })
    .await;
    browser
        .wait_for_text("#dead-hooks", "No dead letters match")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_shown_in_the_page_and_its_controls_are_reached_by_keyboard() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    let console = format!("http://{}/console/", proxy.admin);

    // A malformed filter and an unknown route: the API's refusal, in the page.
    browser
        .open(&format!("{console}#/deliveries?status=abc"))
        .await;
    browser.wait_for_text("#alert", "bad_request (400)").await;
    browser.open(&format!("{console}#/keys?route=nope")).await;
    browser.wait_for_text("#alert", "no_such_route (404)").await;
    browser.open(&format!("{console}#/deliveries")).await;
    browser.wait_for_text("#deliveries", "Time").await;
    browser.wait_for_text("main", "No entries match").await;

    // Tab walks the skip link and every page's link in order, then the filters.
    let body = browser.wait_for("body").await;
    body.send_keys(&Key::Tab.to_string()).await.unwrap();
    let mut reached = Vec::new();
    for _ in 0..8 {
        let focused = browser
            .script("const e = document.activeElement; return e.name || e.textContent.trim()")
            .await;
        reached.push(focused.as_str().unwrap().to_owned());
        browser.press(Key::Tab).await;
    }
    let pages = [
        "Skip to content",
        "Overview",
        "Deliveries",
        "Keys",
        "Held & dead",
        "Routes",
        "Try",
        "route",
    ];
    assert_eq!(reached, pages, "the route filter follows the pages' links");

    // The dialog from the keyboard: Escape keeps the key, Enter confirms.
    assert_eq!(post_event(proxy.addr, "evt_k").await.status, 200);
    browser.open(&format!("{console}#/key/hooks/evt_k")).await;
    browser.wait_for_text("#key-state", "done").await;
    for (key, escape, state) in [(Key::Escape, true, 200), (Key::Enter, false, 404)] {
        browser
            .script("document.getElementById('forget').focus()")
            .await;
        browser.press(Key::Enter).await;
        browser
            .wait_for_text("#confirm-title", "Forget this key")
            .await;
        assert_eq!(browser.focused_id().await, "confirm-ok");
        browser.press(key).await;
        if escape {
            // Time for a change the key would have set off.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        eventually(WAIT, "the dialog closed", || async {
            browser
                .script("return document.getElementById('confirm').open")
                .await
                == json!(false)
        })
        .await;
        eventually(WAIT, "the key's state", || async {
            key_state_local(&proxy, "evt_k").await == state
        })
        .await;
    }
    browser.wait_for_text("#key-state", "Absent").await;

    // A scope's name typed and Enter: nothing before the name is whole.
    assert_eq!(post_event(proxy.addr, "evt_k").await.status, 200);
    browser.open(&format!("{console}#/keys?route=hooks")).await;
    browser.wait_for_text("main table", "evt_k").await;
    browser
        .script("document.getElementById('clear-scope').focus()")
        .await;
    browser.press(Key::Enter).await;
    browser
        .wait_for_text("#confirm-title", "Clear a scope")
        .await;
    assert_eq!(browser.focused_id().await, "confirm-typed");
    browser.press(Key::Enter).await;
    let still_open = browser
        .script("return document.getElementById('confirm').open")
        .await;
    assert_eq!(still_open, json!(true), "Enter before the name closed it");
    let typed = browser.client.active_element().await.unwrap();
    typed
        .send_keys(&format!("hooks{}", Key::Enter))
        .await
        .unwrap();
    browser
        .wait_for_text("#change-result", "Removed 1 key")
        .await;
    assert_eq!(key_state_local(&proxy, "evt_k").await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_are_shown_as_text_and_quick_navigation_leaves_no_tail_behind() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    // A key with a direction mark never gets this far: the proxy refuses it.
    let reversed = json!({ "id": "evt_\u{202e}gpj.exe" }).to_string();
    assert_eq!(post_json(proxy.addr, "/hooks", &reversed).await.status, 400);
    let hostile = "<img src=x onerror=\"window.owned=1\">";
    let body = json!({ "id": hostile }).to_string();
    assert_eq!(post_json(proxy.addr, "/hooks", &body).await.status, 200);
    let console = format!("http://{}/console/", proxy.admin);
    browser.open(&format!("{console}#/deliveries")).await;
    browser
        .wait_for_text("#deliveries tbody", "<img src=x")
        .await;
    browser.click("#deliveries tbody a").await;
    browser.click("#forget").await;
    browser
        .wait_for_text("#confirm-subject", "<img src=x")
        .await;
    // The key stands apart from the question: it cannot reword it.
    let question = browser
        .script("return document.getElementById('confirm-text').textContent")
        .await;
    assert_eq!(question, json!("Its next delivery runs the work again."));
    browser.click("#confirm-cancel").await;
    let owned = browser.script("return window.owned === undefined").await;
    assert_eq!(owned, json!(true), "a key's markup ran");
    assert_eq!(
        key_state_local(&proxy, hostile).await,
        200,
        "cancelled: kept"
    );

    // Pages asked for faster than they load: every tail they started is ended, so the
    // port's 8 places stay free.
    for round in 0..10 {
        let script = format!(
            "location.hash = '#/deliveries?route=hooks&n={round}'; location.hash = '#/deliveries?n={round}';"
        );
        browser.script(&script).await;
    }
    browser
        .wait_for_text("#deliveries tbody", "<img src=x")
        .await;
    // The port learns that a tail's client went away when it next writes (every 2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let tail = tokio::time::timeout(
        Duration::from_millis(500),
        send(proxy.admin, "GET", "/v1/deliveries/tail", &[], ""),
    )
    .await;
    // A tail answers its head and keeps streaming: no answer within the wait is a tail
    // that started; a full answer is a refusal.
    if let Ok(refused) = tail {
        panic!("a tail was refused: {} {}", refused.status, refused.body);
    }
}

/// A recorded header or body holding bidi overrides and terminal escapes is shown with each
/// of them as an escape: a `User-Agent` cannot reverse what follows it on the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_headers_and_bodies_show_direction_marks_as_escapes() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    // Keyed on a header: the body is not JSON (a raw escape in a JSON string is invalid).
    let route = "routes:\n  - name: hooks\n    match: { method: POST, path: /hooks }\n    \
                 key: \"{header:X-Event-Id}\"\n    log: { bodies: true, headers: [user-agent] }\n";
    let proxy = Proxy::start(upstream.addr, route).await;
    let body = "pay \u{202e}01$ \u{1b}[2Jdone";
    let request = format!(
        "POST /hooks HTTP/1.1\r\nHost: {}\r\nUser-Agent: agent \u{202e}gpj.exe\r\n\
         X-Event-Id: evt_marks\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        proxy.addr,
        body.len()
    );
    let answer = raw(proxy.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The log stores its entries a moment after the answer.
    let logged = || async {
        let listed = send(proxy.admin, "GET", "/v1/deliveries?limit=1", &[], "").await;
        listed.json()["deliveries"][0]["id"]
            .as_str()
            .map(str::to_owned)
    };
    eventually(Duration::from_secs(5), "the delivery logged", || async {
        logged().await.is_some()
    })
    .await;
    let id = logged().await.unwrap();
    browser
        .open(&format!("http://{}/console/#/delivery/{id}", proxy.admin))
        .await;
    browser.wait_for_text("main", "gpj.exe").await;
    browser.screenshot("delivery-marks").await;
    let shown = browser
        .script("return document.querySelector('main').innerText")
        .await;
    let shown = shown.as_str().unwrap();
    assert!(
        !shown.contains('\u{202e}'),
        "a direction mark reached the page: {shown}"
    );
    assert!(
        !shown.contains('\u{1b}'),
        "an escape reached the page: {shown}"
    );
    assert!(shown.contains("agent \\u{202e}gpj.exe"), "{shown}");
    assert!(shown.contains("pay \\u{202e}01$ \\u{1b}[2Jdone"), "{shown}");
}

async fn key_state_local(proxy: &Proxy, key: &str) -> u16 {
    let path = format!("/v1/keys/hooks/{}", percent(key));
    send(proxy.admin, "GET", &path, &[], "").await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_tries_requests_on_the_page_and_nothing_is_stored() {
    let Some(browser) = browser().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_with_tokens(dir.path(), upstream.addr);
    browser.sign_in(proxy.admin, VIEWER).await;
    browser.go("try").await;
    // The page starts from an example on the first route's path, once it is built.
    browser.wait_for("#try-request").await;
    let example = browser
        .script("return document.getElementById('try-request').value")
        .await;
    assert!(
        example
            .as_str()
            .unwrap()
            .starts_with("POST /hooks HTTP/1.1"),
        "{example}"
    );
    let set = |text: &str| {
        format!(
            "document.getElementById('try-request').value = {}",
            json!(text)
        )
    };
    browser
        .script(&set(
            "POST /hooks HTTP/1.1\nHost: localhost\nContent-Type: application/json\n\n{\"id\":\"evt_tried\"}",
        ))
        .await;
    browser.click("#try-run").await;
    browser.wait_for_text("#try-verdict", "Taken").await;
    browser.wait_for_text("#try-key", "evt_tried").await;
    browser.wait_for_text("#try-result", "{json:/id}").await;
    browser
        .wait_for_text("#try-result", "hooks:evt_tried")
        .await;
    browser.screenshot("try").await;

    // Without its key: refused, and the part says why.
    browser
        .script(&set(
            "POST /hooks HTTP/1.1\nHost: localhost\nContent-Type: application/json\n\n{\"type\":\"x\"}",
        ))
        .await;
    browser.click("#try-run").await;
    browser.wait_for_text("#try-verdict", "Refused").await;
    browser
        .wait_for_text("#try-refusal", "400 missing_key")
        .await;
    browser
        .wait_for_text("#try-result", "nothing: JSON value absent")
        .await;
    // No route: each route says why not.
    browser
        .script(&set("GET /elsewhere HTTP/1.1\nHost: localhost\n\n"))
        .await;
    browser.click("#try-run").await;
    browser
        .wait_for_text("#try-verdict", "No route takes it")
        .await;
    browser
        .wait_for_text("#try-result", "by hooks: it takes POST, not GET")
        .await;
    // A message that cannot be read: the API's refusal, in the page.
    browser.script(&set("POST")).await;
    browser.click("#try-run").await;
    browser.wait_for_text("#alert", "bad_request (400)").await;

    assert_eq!(
        key_state(proxy.admin, "evt_tried").await,
        404,
        "nothing stored"
    );
    assert_eq!(upstream.total_executions(), 0, "nothing sent");
}

/// On a shared store the overview lists every replica sharing it, this one marked, and
/// their totals: two replicas on Redis, each having forwarded one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_lists_every_replica_of_a_shared_store() {
    let Some(browser) = browser().await else {
        return;
    };
    if !service_available("Redis", 6379).await {
        return;
    }
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("console-{:x}:", rand::random::<u64>());
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let path = dir.path().join(format!("{name}.yaml"));
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0, token_env: CONSOLE_TOKEN }}\nstore: {{ redis: {{ url: \"{REDIS_URL}\", prefix: \"{prefix}\" }} }}\n{}",
            upstream.addr,
            json_route("")
        );
        std::fs::write(&path, text).unwrap();
        let replica = Binary::start_with_env(&path, &[("CONSOLE_TOKEN", OPERATOR)]);
        let event = format!("evt_{name}");
        assert_eq!(post_event(replica.addr, &event).await.dedupe(), "forwarded");
        replicas.push(replica);
    }
    // The first report of each came at its start, before its delivery: the next (every
    // 5 s) counts it.
    let bearer = format!("Bearer {OPERATOR}");
    eventually(
        Duration::from_secs(25),
        "both deliveries reported",
        || async {
            let overview = send(
                replicas[0].admin,
                "GET",
                "/v1/overview",
                &[("authorization", &bearer)],
                "",
            )
            .await;
            overview.json()["replicas"]["totals"]["forwarded"] == 2
        },
    )
    .await;
    // Mid-way through a rolling upgrade: a replica of an older version reports too.
    let store = dedupe_proxy::store::redis::RedisStore::connect(
        &dedupe_proxy::config::RedisConfig {
            prefix: prefix.clone(),
            ..plain_redis_config()
        },
        None,
    )
    .await
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let older = dedupe_proxy::store::replicas::ReplicaReport {
        id: "old-pod:1:0000beef".into(),
        version: "0.0.9".into(),
        started_at: now - 3_600_000,
        seen_at: now,
        requests: [("forwarded".to_owned(), 5)].into(),
    };
    dedupe_proxy::store::ClaimStore::report_replica(&store, &older)
        .await
        .unwrap();
    browser.sign_in(replicas[0].admin, OPERATOR).await;
    browser.wait_for_text("main", "(this one)").await;
    let text = browser
        .script("return [...document.querySelectorAll('main table')].pop().innerText")
        .await;
    let text = text.as_str().unwrap();
    for replica in &replicas {
        let id = format!(":{}:", replica.child.id());
        assert!(text.contains(&id), "{id}: {text}");
    }
    let old = text
        .lines()
        .find(|line| line.starts_with("old-pod"))
        .unwrap();
    assert!(old.contains("0.0.9"), "{text}");
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
    let all = text.lines().find(|line| line.starts_with("All")).unwrap();
    assert_eq!(all.split_whitespace().nth(1), Some("7"), "{text}");
    browser.screenshot("replicas").await;
}

/// A loopback port nothing listens on now, for a server the test starts.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A Redis server of the test's own on a free loopback port, to stop while the proxy
/// runs; ended on drop.
struct OwnRedis {
    server: Child,
    port: u16,
}

impl OwnRedis {
    async fn start() -> Option<OwnRedis> {
        if !installed("Redis", "redis-server", &["--version"]) {
            return None;
        }
        let port = free_port();
        let server = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let address = format!("127.0.0.1:{port}");
        eventually(WAIT, "the test's Redis answers", || async {
            tokio::net::TcpStream::connect(&address).await.is_ok()
        })
        .await;
        Some(OwnRedis { server, port })
    }

    fn stop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The overview and a route's page draw the last hour minute by minute (deliveries by
/// outcome, the app's latency), each chart with a caption in words; an empty hour says
/// so; the last day comes in place; nothing runs off a phone's width; and when the store
/// stops answering, the page says so above the charts, which keep this replica's figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_draw_each_minute_and_say_it_in_words() {
    let Some(browser) = browser().await else {
        return;
    };
    let Some(mut redis) = OwnRedis::start().await else {
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n\
         admin: {{ listen: 127.0.0.1:0, token_env: CONSOLE_TOKEN }}\n\
         store: {{ redis: {{ url: \"redis://127.0.0.1:{}\", timeout: 1s }} }}\n{}\
         \x20 - name: jobs\n    match: {{ path: /jobs }}\n    key: \"{{json:/id}}\"\n    delivery: queued\n",
        upstream.addr,
        redis.port,
        json_route("")
    );
    std::fs::write(&config, text).unwrap();
    let proxy = Binary::start_with_env(&config, &[("CONSOLE_TOKEN", OPERATOR)]);
    browser.sign_in(proxy.admin, OPERATOR).await;

    let deliveries = "#chart-deliveries figcaption";
    browser
        .wait_for_text(deliveries, "No deliveries in the last hour.")
        .await;
    browser
        .wait_for_text(
            "#chart-latency figcaption",
            "No answers from the app in the last hour.",
        )
        .await;
    browser.screenshot("charts-empty").await;

    for id in ["evt_g1", "evt_g2", "evt_g3"] {
        assert_eq!(post_event(proxy.addr, id).await.dedupe(), "forwarded");
    }
    assert_eq!(post_event(proxy.addr, "evt_g1").await.dedupe(), "duplicate");
    upstream.script([Answer::status(503)]);
    assert_eq!(post_event(proxy.addr, "evt_g4").await.dedupe(), "released");

    // The route's page, from the routes.
    browser.go("routes").await;
    browser.click("main h2 a").await;
    browser.wait_for("body[data-page=route]").await;
    browser
        .wait_for_text(
            deliveries,
            "forwarded 3, duplicates 1, refused 0, released 1, held 0, queued 0",
        )
        .await;
    browser
        .wait_for_text("#chart-latency figcaption", "over 4 answers")
        .await;
    let stacked = browser
        .script("return document.querySelectorAll('#chart-deliveries path').length")
        .await;
    assert_eq!(
        stacked,
        json!(3),
        "forwarded, duplicates and released drawn"
    );
    browser.screenshot("charts").await;
    browser.click("#range-day").await;
    browser.wait_for("#charts[data-range=day]").await;
    browser.wait_for_text(deliveries, "in the last day").await;

    // At a phone's width nothing runs off the side.
    browser.client.set_window_size(390, 844).await.unwrap();
    browser.fits_its_width().await;
    browser.screenshot("charts-phone").await;
    browser.client.set_window_size(1280, 900).await.unwrap();

    // A queued route's page charts its jobs waiting (paused here) and the oldest's age.
    let bearer = format!("Bearer {OPERATOR}");
    let auth = [("authorization", bearer.as_str())];
    let paused = send(proxy.admin, "POST", "/v1/queue/jobs/pause", &auth, "").await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    for id in ["evt_j1", "evt_j2"] {
        let queued = post_json(proxy.addr, "/jobs", &format!(r#"{{"id":"{id}"}}"#)).await;
        assert_eq!(queued.dedupe(), "queued");
    }
    // The queue's counts are taken every few seconds: the page is opened once they are.
    eventually(WAIT, "the jobs counted", || async {
        let charts = send(proxy.admin, "GET", "/v1/charts?route=jobs", &auth, "").await;
        charts.json()["minutes"][59]["queue_waiting"] == 2
    })
    .await;
    browser
        .script("location.hash = '#/route/jobs'; return null")
        .await;
    browser
        .wait_for_text(
            "#chart-waiting figcaption",
            "Jobs waiting in the last hour: 2 now",
        )
        .await;
    browser
        .wait_for_text(
            "#chart-oldest figcaption",
            "The oldest job's age in the last hour",
        )
        .await;
    browser.screenshot("charts-queued").await;

    // The store stops answering: the overview says so, and still charts this replica.
    redis.stop();
    browser.go("overview").await;
    browser
        .wait_for_text("#charts p.warning", "The store did not give the figures")
        .await;
    browser.wait_for_text(deliveries, "forwarded 3").await;
    browser.screenshot("charts-outage").await;
}
