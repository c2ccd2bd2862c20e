//! Test support: a real hyper upstream with scripted answers that counts the work it
//! does, the proxy started in-process or as the real binary on port 0, and a client.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dedupe_proxy::config::{Config, Overrides};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use async_trait::async_trait;
use dedupe_proxy::config::StoreConfig;
use dedupe_proxy::store::sled::SledStore;
use dedupe_proxy::store::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, EntityRecord, Fingerprint, Forgotten,
    KeyState, Page, Resolution, StateFilter, StoreError, Swept, Version,
};

// ---------------------------------------------------------------- the upstream

/// One scripted answer of the test upstream.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub delay: Duration,
    pub body: String,
    pub headers: Vec<(String, String)>,
    /// Drop the connection instead of answering.
    pub abort: bool,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            delay: Duration::ZERO,
            body: format!("upstream answered {status}"),
            headers: Vec::new(),
            abort: false,
        }
    }

    pub fn ok() -> Answer {
        Answer::status(200)
    }

    pub fn after(mut self, delay: Duration) -> Answer {
        self.delay = delay;
        self
    }

    pub fn body(mut self, body: &str) -> Answer {
        self.body = body.to_owned();
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Answer {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn abort() -> Answer {
        Answer {
            abort: true,
            ..Answer::ok()
        }
    }
}

/// A request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct UpstreamState {
    script: Mutex<VecDeque<Answer>>,
    received: Mutex<Vec<Received>>,
    /// Work done: 2xx answers completed, by `Dedupe-Key` (or `-` without one).
    executions: Mutex<HashMap<String, usize>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

/// A real HTTP upstream on port 0. Answers the scripted answers in order, then 200.
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
    stop: CancellationToken,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Upstream::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState::default());
        let stop = CancellationToken::new();
        let (loop_state, loop_stop) = (Arc::clone(&state), stop.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    accepted = listener.accept() => accepted.unwrap(),
                    () = loop_stop.cancelled() => return,
                };
                let state = Arc::clone(&loop_state);
                let service =
                    hyper::service::service_fn(move |request| answer(Arc::clone(&state), request));
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, state, stop }
    }

    /// Queues answers for the next requests.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state.script.lock().unwrap().extend(answers);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn requests(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }

    /// Waits (up to 5 s) until `count` requests have arrived.
    pub async fn wait_for_requests(&self, count: usize) {
        eventually(
            Duration::from_secs(5),
            &format!("{count} request(s) at the upstream"),
            || async { self.requests() >= count },
        )
        .await;
    }

    /// 2xx answers completed for requests carrying this `Dedupe-Key`.
    pub fn executions(&self, key: &str) -> usize {
        self.state
            .executions
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn total_executions(&self) -> usize {
        self.state.executions.lock().unwrap().values().sum()
    }

    /// The most requests the upstream was working on at the same moment.
    pub fn most_running(&self) -> usize {
        self.state.most_running.load(Ordering::SeqCst)
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(
    state: Arc<UpstreamState>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (head, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let key = head
        .headers
        .get("dedupe-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    state.received.lock().unwrap().push(Received {
        method: head.method.clone(),
        uri: head.uri.to_string(),
        headers: head.headers.clone(),
        body,
    });
    let scripted = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(Answer::ok);
    let running = state.running.fetch_add(1, Ordering::SeqCst) + 1;
    state.most_running.fetch_max(running, Ordering::SeqCst);
    tokio::time::sleep(scripted.delay).await;
    state.running.fetch_sub(1, Ordering::SeqCst);
    if scripted.abort {
        return Err(std::io::Error::other("scripted abort"));
    }
    if (200..300).contains(&scripted.status) {
        *state.executions.lock().unwrap().entry(key).or_default() += 1;
    }
    let mut response = Response::new(Full::new(Bytes::from(scripted.body)));
    *response.status_mut() = StatusCode::from_u16(scripted.status).unwrap();
    for (name, value) in scripted.headers {
        response.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    Ok(response)
}

/// An address where nothing listens.
pub async fn dead_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// An address where a connection is never made: a listener whose one-place backlog a
/// first connection fills, so that the kernel drops later handshakes. Keep the guard.
pub async fn unanswering_address() -> (SocketAddr, (TcpListener, tokio::net::TcpStream)) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let filler = tokio::net::TcpStream::connect(addr).await.unwrap();
    (addr, (listener, filler))
}

// ---------------------------------------------------------------- the proxy

/// The configuration text for a proxy on port 0 in front of `upstream`, storing in `data`.
/// `rest` may set its own `admin:`.
pub fn config_text(upstream: SocketAddr, data: &Path, rest: &str) -> String {
    let admin = if rest.contains("admin:") {
        ""
    } else {
        "admin: { listen: 127.0.0.1:0 }\n"
    };
    format!(
        "listen: 127.0.0.1:0\nupstream: http://{upstream}\n{admin}store: {{ sled: {{ path: \"{}\" }} }}\n{rest}",
        data.display()
    )
}

pub fn parse_config(text: &str) -> Config {
    Config::parse(text, Path::new("test.yaml"), &Overrides::default()).unwrap()
}

/// The proxy, started in-process on a temporary sled store.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub app: Option<dedupe_proxy::App>,
    pub data: TempDir,
}

impl Proxy {
    /// `rest` is YAML after `listen`, `upstream`, `admin` and `store`: defaults, routes...
    pub async fn start(upstream: SocketAddr, rest: &str) -> Proxy {
        let data = tempfile::tempdir().unwrap();
        let config = parse_config(&config_text(upstream, &data.path().join("db"), rest));
        let app = dedupe_proxy::start(config).await.unwrap();
        Proxy {
            addr: app.proxy_addr,
            admin: app.admin_addr,
            app: Some(app),
            data,
        }
    }

    pub async fn shutdown(&mut self) {
        if let Some(app) = self.app.take() {
            app.shutdown().await.unwrap();
        }
    }
}

/// One route named `hooks` on `POST /hooks` keyed by `{json:/id}`, plus `extra` lines
/// indented under the route.
pub fn json_route(extra: &str) -> String {
    format!(
        "routes:\n  - name: hooks\n    match: {{ method: POST, path: /hooks }}\n    key: \"{{json:/id}}\"\n{extra}"
    )
}

// ---------------------------------------------------------------- the client

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

// ---------------------------------------------------------------- the binary

/// The real `dedupe-proxy` binary, started on a configuration file.
pub struct Binary {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
}

pub fn binary_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dedupe-proxy"))
}

impl Binary {
    /// Starts `dedupe-proxy run -c config --log-format json` and waits until it is ready.
    pub fn start(config: &Path) -> Binary {
        Binary::start_with_env(config, &[])
    }

    pub fn start_with_env(config: &Path, env: &[(&str, &str)]) -> Binary {
        let args = [
            "run".into(),
            "-c".into(),
            config.display().to_string(),
            "--log-format".into(),
            "json".into(),
        ];
        Binary::spawn(&args, env)
    }

    /// Starts the binary with exactly these arguments (which must ask for JSON logs) and
    /// environment, and waits until it logs that it is ready.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> Binary {
        Binary::spawn_wrapped(&[], args, env)
    }

    /// Like [`Binary::spawn`], with the binary run by `wrapper` (a program and its
    /// arguments, the binary's path and `args` after them): `prlimit --nofile=...`, say.
    pub fn spawn_wrapped(wrapper: &[&str], args: &[String], env: &[(&str, &str)]) -> Binary {
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(binary_path());
                command
            }
            None => Command::new(binary_path()),
        };
        let mut child = command
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                env.iter()
                    .find(|(name, _)| *name == "RUST_LOG")
                    .map_or("info", |(_, value)| value),
            )
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let ready = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .filter(|entry| entry["fields"]["message"] == "dedupe-proxy ready");
                // Logged before it is announced, so that a caller reading the log once
                // the binary is ready finds the ready line in it.
                lines.lock().unwrap().push(line);
                if let Some(entry) = ready {
                    let proxy: SocketAddr =
                        entry["fields"]["proxy"].as_str().unwrap().parse().unwrap();
                    let admin: SocketAddr =
                        entry["fields"]["admin"].as_str().unwrap().parse().unwrap();
                    let _ = ready_tx.send((proxy, admin));
                }
            }
        });
        let (addr, admin) = match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addresses) => addresses,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the binary did not become ready; log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Binary {
            child,
            addr,
            admin,
            log,
        }
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "the binary did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The first JSON log line whose message is `message`.
    pub fn log_entry(&self, message: &str) -> Option<serde_json::Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|entry| entry["fields"]["message"] == message)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `request` on a fresh connection and reads until the proxy closes it (or 5 s).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// An upstream written byte by byte: `handle` gets each accepted connection, so a test
/// can misbehave in ways a well-made HTTP server cannot.
pub async fn raw_upstream<H, F>(handle: H) -> SocketAddr
where
    H: Fn(tokio::net::TcpStream) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handle(stream));
        }
    });
    addr
}

/// Reads a request head (through the blank line) from a raw connection.
pub async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Whether a server the tests need listens on 127.0.0.1:`port`. Locally a missing one
/// skips the test with a message; in CI (`CI=true`) it is a failure.
pub async fn service_available(name: &str, port: u16) -> bool {
    if tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
    {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |ci| ci != "true"),
        "{name} must be running in CI"
    );
    eprintln!("skipped: {name} is not reachable on port {port}");
    false
}

/// The Redis and PostgreSQL on this machine, which the shared-store tests use.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The statements that make a claims table `table` as a version before held keys did: two
/// states, no `hold_reason`, `response_headers` or held index, and one done record,
/// `t:old`, answered `201` `text/plain` `hi`.
pub fn table_from_before_held(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (
           key text PRIMARY KEY,
           state text NOT NULL CHECK (state IN ('in_flight', 'done')),
           owner text,
           claimed_at bigint NOT NULL,
           expires_at bigint NOT NULL,
           completed_at bigint,
           upstream_status integer,
           body_sha256 bytea NOT NULL,
           response_status integer,
           response_content_type text,
           response_body bytea
         );
         INSERT INTO {table} VALUES
           ('t:old', 'done', NULL, 1, 9999999999999, 2, 201, '\\x07', 201, 'text/plain', '\\x6869');"
    )
}

/// A PostgreSQL store's settings for `url` and `table`: a 5 s timeout, 8 connections,
/// no TLS, no pooler.
#[allow(dead_code)]
pub fn postgres_config(url: &str, table: &str) -> dedupe_proxy::config::PostgresConfig {
    use dedupe_proxy::config::{PostgresConfig, ServerUrl, SslMode};
    use dedupe_proxy::values::{HumanDuration, Secret, TableName};
    PostgresConfig {
        url: ServerUrl::Written(Secret::new(url.into())),
        direct_url: None,
        table: TableName(table.into()),
        timeout: HumanDuration(Duration::from_secs(5)),
        pool_size: 8,
        ssl_mode: SslMode::Disable,
        tls: None,
    }
}

/// Drops a proxy's PostgreSQL tables (`table` and `<table>_entities`), if they are there.
pub async fn drop_postgres_tables(table: &str) {
    let (client, connection) = tokio_postgres::connect(POSTGRES_URL, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_entities"
        ))
        .await
        .unwrap();
}

/// The servers `tests/servers` starts besides the plain Redis and PostgreSQL: a Redis that
/// speaks only TLS (and wants a client certificate), a PostgreSQL that takes only TLS
/// (its certificate names `localhost` only), a six-node Redis Cluster, and the
/// certificates made for them.
#[allow(dead_code)]
pub struct TestServers {
    pub tls_dir: PathBuf,
    pub redis_tls_port: u16,
    /// A TLS Redis whose certificate names `localhost` only, without client certificates.
    pub redis_tls_named_port: u16,
    pub postgres_tls_port: u16,
    pub cluster_ports: Vec<u16>,
    /// PgBouncer in transaction mode, two server connections, before the plain
    /// PostgreSQL's `test` database.
    pub pgbouncer_port: u16,
}

#[allow(dead_code)]
impl TestServers {
    /// The servers, if `tests/servers` has started them; locally their absence skips the
    /// test with a message, in CI (`CI=true`) it is a failure.
    pub fn get() -> Option<TestServers> {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-servers/env");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let setting = |name: &str| {
            text.lines()
                .rev()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let servers = (|| {
            Some(TestServers {
                tls_dir: setting("TLS_DIR")?.into(),
                redis_tls_port: setting("REDIS_TLS_PORT")?.parse().ok()?,
                redis_tls_named_port: setting("REDIS_TLS_NAMED_PORT")?.parse().ok()?,
                postgres_tls_port: setting("POSTGRES_TLS_PORT")?.parse().ok()?,
                cluster_ports: setting("REDIS_CLUSTER_PORTS")?
                    .split(',')
                    .map(|port| port.parse().ok())
                    .collect::<Option<_>>()?,
                pgbouncer_port: setting("PGBOUNCER_PORT")?.parse().ok()?,
            })
        })();
        if servers.is_none() {
            assert!(
                std::env::var("CI").map_or(true, |ci| ci != "true"),
                "tests/servers must have run in CI"
            );
            eprintln!("skipped: the TLS and cluster servers are not started (run tests/setup)");
        }
        servers
    }

    /// The plain PostgreSQL's `test` database through PgBouncer.
    pub fn pgbouncer_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.pgbouncer_port)
    }

    /// A PEM file made by `tests/servers`: `ca.pem`, `other-ca.pem`, `client.pem`, ...
    pub fn pem(&self, name: &str) -> dedupe_proxy::values::PemFile {
        self.tls_dir.join(name).to_str().unwrap().parse().unwrap()
    }

    /// `tls:` with the test CA and, if `client`, the client certificate.
    pub fn tls(&self, ca: &str, client: bool) -> dedupe_proxy::config::TlsConfig {
        dedupe_proxy::config::TlsConfig {
            ca_file: Some(self.pem(ca)),
            cert_file: client.then(|| self.pem("client.pem")),
            key_file: client.then(|| self.pem("client.key")),
        }
    }
}

// ---------------------------------------------------------------- a store to break

/// The real sled store, made to fail on demand, counting the claims made of it.
pub struct FailingStore {
    pub inner: SledStore,
    pub fail_claims: bool,
    /// Fails every claim after this many.
    pub fail_claims_after: Option<usize>,
    pub fail_finish: bool,
    /// Panics in `finish`, as a bug in the proxy's recording would.
    pub panic_finish: bool,
    pub fail_hold: bool,
    /// Fails reading and recording entities' versions (`order:`).
    pub fail_versions: bool,
    /// Answers the replay guard's body claims half a second late.
    pub slow_body_claims: bool,
    /// Fails every lease renewal while set.
    pub fail_renewals: Arc<std::sync::atomic::AtomicBool>,
    pub claims: Arc<AtomicUsize>,
}

impl FailingStore {
    pub fn new(inner: SledStore) -> FailingStore {
        FailingStore {
            inner,
            fail_claims: false,
            fail_claims_after: None,
            fail_finish: false,
            panic_finish: false,
            fail_hold: false,
            fail_versions: false,
            slow_body_claims: false,
            fail_renewals: Arc::default(),
            claims: Arc::default(),
        }
    }
}

#[async_trait]
impl ClaimStore for FailingStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let earlier = self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_claims || self.fail_claims_after.is_some_and(|after| earlier >= after) {
            return Err(StoreError::Backend("injected claim failure".into()));
        }
        if self.slow_body_claims && key.contains("#body:") {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.inner.claim(key, fingerprint, lease).await
    }
    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        if self.fail_finish {
            return Err(StoreError::Backend("injected finish failure".into()));
        }
        assert!(
            !self.panic_finish,
            "injected panic while recording the outcome"
        );
        self.inner.finish(claim, completion).await
    }
    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.inner.release(claim).await
    }
    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), StoreError> {
        if self.fail_renewals.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected renewal failure".into()));
        }
        self.inner.renew(claim, lease).await
    }
    async fn hold(
        &self,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if self.fail_hold {
            return Err(StoreError::Backend("injected hold failure".into()));
        }
        self.inner.hold(claim, reason, retention).await
    }
    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError> {
        self.inner.resolve(key, resolution).await
    }
    async fn list(
        &self,
        namespace: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.inner.list(namespace, state, after, limit).await
    }
    async fn count_held(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.count_held().await
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        self.inner.inspect(key).await
    }
    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        self.inner.forget(key).await
    }
    async fn newest_version(&self, entity: &str) -> Result<Option<EntityRecord>, StoreError> {
        if self.fail_versions {
            return Err(StoreError::Backend("injected version failure".into()));
        }
        self.inner.newest_version(entity).await
    }
    async fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        if self.fail_versions {
            return Err(StoreError::Backend("injected version failure".into()));
        }
        self.inner.record_version(entity, version, retention).await
    }
    async fn forget_entity(&self, entity: &str) -> Result<bool, StoreError> {
        self.inner.forget_entity(entity).await
    }
    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        self.inner.sweep(limit).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
    fn done_keys(&self) -> Option<u64> {
        self.inner.done_keys()
    }
}

pub async fn proxy_on_failing_store(
    upstream: &Upstream,
    extra: &str,
    fail_claims: bool,
    fail_finish: bool,
) -> (dedupe_proxy::App, tempfile::TempDir) {
    proxy_on_store(upstream, &json_route(extra), |inner| FailingStore {
        fail_claims,
        fail_finish,
        ..FailingStore::new(inner)
    })
    .await
}

pub async fn proxy_on_store(
    upstream: &Upstream,
    routes: &str,
    store: impl FnOnce(SledStore) -> FailingStore,
) -> (dedupe_proxy::App, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let config = parse_config(&config_text(upstream.addr, &data.path().join("db"), routes));
    let StoreConfig::Sled(sled) = &config.store else {
        panic!("sled expected")
    };
    let store = store(SledStore::open(sled).unwrap());
    (
        dedupe_proxy::start_with_store(config, Arc::new(store))
            .await
            .unwrap(),
        data,
    )
}
