//! A client: requests to the proxy and its admin port, and waiting for a condition.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::*;

/// An answer as a sender saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn dedupe(&self) -> &str {
        self.headers
            .get("dedupe-status")
            .map_or("<none>", |v| v.to_str().unwrap())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = client
        .request(builder.body(Full::new(body.into())).unwrap())
        .await
        .unwrap();
    let (head, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: head.status.as_u16(),
        headers: head.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A `POST` to the admin port, as its clients send one: with a JSON content type, which
/// no web page can send there unasked.
pub async fn admin_post(admin: SocketAddr, path: &str, body: &str) -> Reply {
    send(
        admin,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_owned(),
    )
    .await
}

/// Posts a JSON event `{"id": id}` to `/hooks`.
pub async fn post_event(addr: SocketAddr, id: &str) -> Reply {
    post_json(addr, "/hooks", &format!(r#"{{"id":"{id}","type":"test"}}"#)).await
}

pub async fn post_json(addr: SocketAddr, path: &str, body: &str) -> Reply {
    send(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_owned(),
    )
    .await
}

/// `text` percent-encoded for a URL's query or path.
pub fn percent(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Polls `check` every 20 ms until it holds, or panics after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A request to `proxy`'s admin port, its body (if any) JSON.
pub async fn admin(proxy: &Proxy, method: &str, path: &str, body: &str) -> Reply {
    let json = [("content-type", "application/json")];
    send(proxy.admin, method, path, &json, body.to_owned()).await
}

/// Whether Python can import `module` (a real client library the tests drive, installed by
/// tests/setup). Without it a test is skipped with a message, or fails under `CI=true`.
pub fn python_module_installed(module: &str) -> bool {
    let import = format!("import {module}");
    installed(&format!("Python's {module}"), "python3", &["-c", &import])
}

/// Whether `program` runs with `args` (a tool tests/setup installs, asked its version):
/// without it a test is skipped with a message naming `what`, or fails under `CI=true`.
pub fn installed(what: &str, program: &str, args: &[&str]) -> bool {
    let found = std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|output| output.status.success());
    if !found {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "CI must install {what} (tests/setup)"
        );
        eprintln!("skipped: {what} is not installed (run tests/setup)");
    }
    found
}

/// What the Python client `tests/clients/<script>` printed as JSON, run with `args` and
/// `env`; the test fails with its stderr if it failed.
pub async fn python_client(
    script: &str,
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> serde_json::Value {
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(path)
            .args(args)
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}
