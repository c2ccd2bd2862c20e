//! The fault suite: zero loss under crashes, upstream faults and shutdowns.
//!
//! A provider simulator delivers events from many senders at once, retries every
//! non-2xx or failed connection with backoff until acknowledged, sends some events from
//! two senders at the same moment, and replays some after their acknowledgement. A flaky
//! upstream answers 500s, drops connections, stalls past the proxy's timeout, and counts
//! the real work (2xx answers) per event. Meanwhile the real proxy binary is killed with
//! `kill -9` (and sometimes stopped with SIGTERM) at random instants, and restarted on the
//! same data directory each time.
//!
//! The same storm runs against the shared stores' own failures: a Redis Cluster primary
//! killed with `kill -9` (its replica takes over), and a TLS PostgreSQL restarted in
//! immediate mode (a crash and recovery), each several times while the proxy keeps
//! running.
//!
//! One run holds ambiguous forwards (`on_ambiguous: hold`) and stops the proxy with
//! SIGTERM only: the provider stops retrying an event once it is told `held`, the run
//! checks that every event is acknowledged or held and none ran twice, then resolves each
//! held key as an operator would (done if the app did the work, else release) and
//! delivers those events again.
//!
//! Two runs cut the power instead: the data directory is on a filesystem that forgets
//! what was not synced (`support/power_cut.rs`), and each kill also cuts the power, some
//! while the proxy is still starting up (recovering from the cut before). With
//! `durability: fsync` every acknowledged event is a duplicate afterwards; with queued
//! delivery every acknowledged (`202`) job is delivered. sled's own periodic sync is
//! pushed out of these runs (`flush_every: 1h`): only the syncs an acknowledgment waits
//! for keep anything.
//!
//! It prints one line per run and passes only if no event is lost (acknowledged without
//! its work done) and every event is acknowledged; with `durability: fsync`, extra
//! executions stay within what was in flight at the kills plus the stalls the proxy gave
//! up on; with no kills and no stalls there are none.
//!
//! CI runs it at a reduced size. The full size:
//! `FAULTS_EVENTS=20000 FAULTS_KILLS=50 FAULTS_POWER_CUTS=50 cargo test --release --test it faults:: -- --nocapture --test-threads 1`

use crate::support;
use crate::support::power_cut;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use power_cut::PowerCutMount;
use support::Binary;
use tokio::net::TcpListener;

/// The proxy's upstream timeout in these runs; a stall outlasts it.
const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(300);
const STALL: Duration = Duration::from_millis(500);

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a run injects.
#[derive(Clone, Copy)]
struct Faults {
    /// Chance per request that the upstream answers 500 without doing the work.
    error: f64,
    /// Chance that it drops the connection without doing the work.
    reset: f64,
    /// Chance that it stalls past the proxy's timeout, then does the work anyway.
    stall: f64,
    kills: usize,
    /// `on_ambiguous: hold`, and every stop a SIGTERM.
    hold: bool,
}

// ------------------------------------------------------------------ the flaky upstream

#[derive(Default)]
struct Upstream {
    executions: Mutex<HashMap<String, usize>>,
    /// Stalled requests that did the work after the proxy had given up on them, by event.
    late_completions: Mutex<HashMap<String, usize>>,
}

impl Upstream {
    async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
        faults: Faults,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let key = request
            .headers()
            .get("dedupe-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let _ = request.into_body().collect().await;
        let roll: f64 = rand::random();
        if roll < faults.reset {
            return Err(std::io::Error::other("injected reset"));
        }
        if roll < faults.reset + faults.error {
            return Ok(answer(StatusCode::INTERNAL_SERVER_ERROR));
        }
        let stalled = roll < faults.reset + faults.error + faults.stall;
        let delay = if stalled {
            STALL
        } else {
            Duration::from_millis(rand::random_range(0..15))
        };
        // The work runs to its end even if the proxy gives up and hangs up, as it does in
        // most applications.
        let worker = Arc::clone(&self);
        let work = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            *worker
                .executions
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default() += 1;
            if stalled {
                *worker
                    .late_completions
                    .lock()
                    .unwrap()
                    .entry(key)
                    .or_default() += 1;
            }
        });
        let _ = work.await;
        Ok(answer(StatusCode::OK))
    }
}

fn answer(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
    *response.status_mut() = status;
    response
}

async fn start_upstream(faults: Faults) -> (SocketAddr, Arc<Upstream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = Arc::new(Upstream::default());
    let state = Arc::clone(&upstream);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = Arc::clone(&state);
            let service = hyper::service::service_fn(move |request| {
                Arc::clone(&state).handle(request, faults)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, upstream)
}

// ------------------------------------------------------------------ the provider

#[derive(Default)]
struct Provider {
    /// Every tenth event carries a large body (`event_body`).
    large_bodies: bool,
    acknowledged: Mutex<HashSet<String>>,
    /// Events the proxy answered `held` (under `on_ambiguous: hold`): not retried.
    held: Mutex<HashSet<String>>,
    /// When each event was first acknowledged.
    acknowledged_at: Mutex<HashMap<String, Instant>>,
    /// Requests under way, by event.
    outstanding: Mutex<HashMap<String, usize>>,
    deliveries: AtomicUsize,
    next_event: AtomicUsize,
    started: AtomicUsize,
}

type Sender = Client<HttpConnector, Full<Bytes>>;

/// An event's body; with `large`, every tenth event pads it to 200 KiB, a value sled keeps
/// in a file of its own (a blob) rather than in its log.
fn event_body(id: &str, large: bool) -> Bytes {
    let number: usize = id.trim_start_matches("evt_").parse().unwrap_or(1);
    let pad = if large && number.is_multiple_of(10) {
        200 << 10
    } else {
        0
    };
    let pad = "x".repeat(pad);
    Bytes::from(format!(
        r#"{{"id":"{id}","type":"charge.succeeded","pad":"{pad}"}}"#
    ))
}

impl Provider {
    /// Delivers `id` until the proxy acknowledges it with a 2xx.
    async fn deliver(&self, client: &Sender, proxy: &RwLock<Option<SocketAddr>>, id: &str) {
        let body = event_body(id, self.large_bodies);
        loop {
            // Counted as under way before the address is read: the killer clears the
            // address, then takes its snapshot, so no request it misses can be sent.
            self.begin(id);
            let address = *proxy.read().unwrap();
            let mut acknowledged = false;
            if let Some(address) = address {
                self.deliveries.fetch_add(1, Ordering::Relaxed);
                let request = Request::post(format!("http://{address}/hooks"))
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let sent =
                    tokio::time::timeout(Duration::from_secs(10), client.request(request)).await;
                if let Ok(Ok(response)) = sent {
                    acknowledged = response.status().is_success();
                    let held = response
                        .headers()
                        .get("dedupe-status")
                        .is_some_and(|status| status == "held");
                    let _ = response.into_body().collect().await;
                    if held {
                        self.end(id);
                        self.held.lock().unwrap().insert(id.to_owned());
                        return;
                    }
                }
            }
            self.end(id);
            if acknowledged {
                self.acknowledged.lock().unwrap().insert(id.to_owned());
                self.acknowledged_at
                    .lock()
                    .unwrap()
                    .entry(id.to_owned())
                    .or_insert_with(Instant::now);
                return;
            }
            tokio::time::sleep(Duration::from_millis(rand::random_range(10..60))).await;
        }
    }

    fn begin(&self, id: &str) {
        *self
            .outstanding
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default() += 1;
    }

    fn end(&self, id: &str) {
        let mut outstanding = self.outstanding.lock().unwrap();
        let count = outstanding.get_mut(id).expect("begun");
        *count -= 1;
        if *count == 0 {
            outstanding.remove(id);
        }
    }

    /// One sender: takes the next event until `more` says stop; sometimes a second sender
    /// delivers the same event at the same moment, sometimes the event is replayed.
    async fn sender(
        self: Arc<Self>,
        client: Sender,
        proxy: Arc<RwLock<Option<SocketAddr>>>,
        more: Arc<dyn Fn(usize) -> bool + Send + Sync>,
    ) {
        loop {
            let number = self.next_event.fetch_add(1, Ordering::SeqCst);
            if !more(number) {
                return;
            }
            self.started.fetch_add(1, Ordering::SeqCst);
            let id = format!("evt_{number}");
            if rand::random_bool(0.1) {
                let twin = (
                    Arc::clone(&self),
                    client.clone(),
                    Arc::clone(&proxy),
                    id.clone(),
                );
                let concurrent =
                    tokio::spawn(async move { twin.0.deliver(&twin.1, &twin.2, &twin.3).await });
                self.deliver(&client, &proxy, &id).await;
                concurrent.await.unwrap();
            } else {
                self.deliver(&client, &proxy, &id).await;
            }
            if rand::random_bool(0.2) {
                self.deliver(&client, &proxy, &id).await;
            }
        }
    }
}

// ------------------------------------------------------------------ the run

struct Report {
    store: &'static str,
    events: usize,
    deliveries: usize,
    acknowledged: usize,
    kills: usize,
    sigterms: usize,
    lost: usize,
    unacknowledged: usize,
    extra: usize,
    in_flight_at_kills: usize,
    late_completions: usize,
    /// Extra executions of events that were neither in flight at a kill nor stalled.
    unexplained: usize,
    /// Events left held (resolved by hand and delivered again at the end of the run).
    held: usize,
    /// Events that ran more than once (checked under `hold`, where none may).
    run_twice: usize,
    /// Acknowledged events that were not a duplicate when sent again after the run
    /// (checked after power cuts with `durability: fsync`).
    forgotten: usize,
    seconds: f64,
}

impl Report {
    /// The extra executions the promises allow: one per event in flight at a kill, one
    /// per stall the proxy gave up on (the app finished the work after the 504).
    fn bound(&self) -> usize {
        self.in_flight_at_kills + self.late_completions
    }

    fn line(&self) -> String {
        format!(
            "faults: store={} events={} deliveries={} acknowledged={} kills={} (sigterm {}) lost={} unacknowledged={} extra_executions={} bound={} (in flight at kills {}, stalls given up {}) beyond_bound={} held={} run_twice={} forgotten={} in {:.1}s",
            self.store,
            self.events,
            self.deliveries,
            self.acknowledged,
            self.kills,
            self.sigterms,
            self.lost,
            self.unacknowledged,
            self.extra,
            self.bound(),
            self.in_flight_at_kills,
            self.late_completions,
            self.unexplained,
            self.held,
            self.run_twice,
            self.forgotten,
            self.seconds
        )
    }
}

/// The store a run uses: `batched` or `fsync` for sled (`queued`: sled, batched, a queued
/// route), `redis`, `redis-cluster` or `postgres-tls`; sled's in `data`, synced every
/// `flush_every` by sled itself.
fn store_section(data: &Path, store: &str, flush_every: &str) -> String {
    let run = rand::random::<u64>();
    let servers = || support::TestServers::get().expect("checked by the test");
    match store {
        "redis" => format!(
            "store: {{ redis: {{ url: \"{}\", prefix: \"faults-{run:x}:\" }} }}",
            support::REDIS_URL,
        ),
        "redis-cluster" => {
            let servers = servers();
            let seeds: Vec<String> = servers.cluster_ports[1..]
                .iter()
                .map(|port| format!("\"redis://127.0.0.1:{port}\""))
                .collect();
            format!(
                "store: {{ redis: {{ url: \"redis://127.0.0.1:{}\", nodes: [{}], cluster: true, prefix: \"faults-{run:x}:\" }} }}",
                servers.cluster_ports[0],
                seeds.join(", ")
            )
        }
        "postgres-tls" => {
            let servers = servers();
            format!(
                "store: {{ postgres: {{ url: \"postgres://postgres@localhost:{}/test?sslmode=verify-full\", table: faults_{run:x}, tls: {{ ca_file: \"{}\" }} }} }}",
                servers.postgres_tls_port,
                servers.tls_dir.join("ca.pem").display()
            )
        }
        "queued" => store_section(data, "batched", flush_every),
        durability => format!(
            "store: {{ sled: {{ path: \"{}\", durability: {durability}, flush_every: {flush_every} }} }}",
            data.display()
        ),
    }
}

/// Queued delivery that retries soon and never gives up within a run.
const QUEUED: &str = "    delivery: queued
    queue: { max_attempts: 1000, backoff_base: 20ms, backoff_cap: 200ms }
";

fn write_store_config(
    dir: &Path,
    data: &Path,
    upstream: SocketAddr,
    store: &str,
    hold: bool,
    flush_every: &str,
) -> PathBuf {
    let path = dir.join("config.yaml");
    // A shared store keeps a killed proxy's claims until their lease ends: keep it short.
    let lease = if store.starts_with("redis") || store.starts_with("postgres") {
        "2s"
    } else {
        "30s"
    };
    let text = format!(
        "listen: 127.0.0.1:0
upstream: http://{upstream}
admin: {{ listen: 127.0.0.1:0 }}
{}
shutdown_grace: 3s
routes:
  - name: hooks
    match: {{ method: POST, path: /hooks }}
    key: \"{{json:/id}}\"
    upstream_timeout: {}ms
    lease: {lease}
    retention: 10m
    on_ambiguous: {}
{}",
        store_section(data, store, flush_every),
        UPSTREAM_TIMEOUT.as_millis(),
        if hold { "hold" } else { "release" },
        if store == "queued" { QUEUED } else { "" }
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn start_binary(config: PathBuf) -> Binary {
    tokio::task::spawn_blocking(move || Binary::start(&config))
        .await
        .unwrap()
}

/// What a run kills `faults.kills` times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// The proxy, with `kill -9` or SIGTERM, restarted on the same data directory.
    Proxy,
    /// A primary of the Redis Cluster, with `kill -9`; started again (as a replica) once its
    /// replica has taken over.
    ClusterPrimary,
    /// The PostgreSQL server, restarted in immediate mode (no checkpoint: a crash).
    Postgres,
    /// The proxy with `kill -9`, and the power of its data directory's disk: what was not
    /// synced is gone when it starts again (sometimes cut again while it starts).
    Power,
}

/// How long before a primary dies a done mark may still be unreplicated: Redis replicates
/// asynchronously, within milliseconds on loopback; a second is a wide margin.
const REPLICATION_WINDOW: Duration = Duration::from_secs(1);

/// Kills a primary of the Redis Cluster; returns it and its node's directory.
fn kill_a_primary(servers: &support::TestServers) -> (u16, PathBuf) {
    // A primary with slots and a replica in sync, so that the replica can take over.
    let alive = servers
        .cluster_ports
        .iter()
        .find(|port| redis_cli(**port, &["ping"]).contains("PONG"))
        .expect("a node answers");
    let nodes = redis_cli(*alive, &["cluster", "nodes"]);
    let fields: Vec<Vec<&str>> = nodes
        .lines()
        .map(|line| line.split_whitespace().collect())
        .filter(|fields: &Vec<&str>| fields.len() >= 8 && !fields[2].contains("fail"))
        .collect();
    let primaries: Vec<u16> = fields
        .iter()
        .filter(|node| node[2].contains("master") && node.len() > 8)
        .filter(|node| {
            fields.iter().any(|replica| {
                replica[2].contains("slave") && replica[3] == node[0] && replica[7] == "connected"
            })
        })
        .filter_map(|node| node[1].split(['@', ':']).nth(1)?.parse().ok())
        .collect();
    assert!(!primaries.is_empty(), "no primary has a replica:\n{nodes}");
    let victim = primaries[rand::random_range(0..primaries.len())];
    let node_dir = servers
        .tls_dir
        .parent()
        .unwrap()
        .join("cluster")
        .join(victim.to_string());
    let pid = std::fs::read_to_string(node_dir.join("pid")).unwrap();
    let pid = pid.trim();
    // The pid file may be stale: kill only the node itself.
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let command = String::from_utf8_lossy(&command);
    assert!(
        command.contains("redis-server") && command.contains(&format!(":{victim}")),
        "pid {pid} is not the node on port {victim}: {command}"
    );
    run_command("kill", &["-9", pid]);
    (victim, node_dir)
}

/// Waits for a replica to take over from the killed primary `victim`, then starts it
/// again and waits for it to rejoin.
async fn recover_the_cluster(servers: &support::TestServers, victim: u16, node_dir: &Path) {
    let survivor = *servers
        .cluster_ports
        .iter()
        .find(|port| **port != victim)
        .unwrap();
    let taken_over = || {
        redis_cli(survivor, &["cluster", "info"]).contains("cluster_state:ok")
            && !redis_cli(survivor, &["cluster", "nodes"])
                .lines()
                .any(|line| {
                    line.contains(&format!(":{victim}@"))
                        && line.contains("master")
                        && !line.contains("fail")
                })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut took_over = taken_over();
    while !took_over && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        took_over = taken_over();
    }
    // Started again either way, so that a failed run leaves the cluster whole. Judged
    // before: the restarted node calls itself a primary until it learns its slots moved.
    run_command(node_dir.join("start").to_str().unwrap(), &[]);
    assert!(took_over, "no replica took over from {victim} within 30 s");
    // It rejoins (as a replica once it learns its slots moved); the next kill picks a
    // primary whose replica is in sync.
    wait_for(Duration::from_secs(30), "the old primary rejoins", || {
        redis_cli(victim, &["cluster", "info"]).contains("cluster_state:ok")
    })
    .await;
}

/// Stops (`stop`) or starts the TLS PostgreSQL; it stops in immediate mode, as a crash.
fn postgres_ctl(stop: bool) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-servers/env");
    let text = std::fs::read_to_string(file).unwrap();
    let setting = |name: &str| {
        text.lines()
            .rev()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
            .to_owned()
    };
    let pg_ctl = format!("{}/pg_ctl", setting("POSTGRES_BIN"));
    let data = setting("POSTGRES_TLS_DATA");
    // With a log file, so that the new server does not keep this process's pipes open.
    let log = format!("{data}/log");
    let action: &[&str] = if stop {
        &["stop", "-m", "immediate"]
    } else {
        &["start", "-w"]
    };
    let mut args = vec!["-u", "postgres", "--", &pg_ctl, "-D", &data, "-l", &log];
    args.extend_from_slice(action);
    run_command("runuser", &args);
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn run_command(program: &str, args: &[&str]) {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One run against `store` (`batched`, `fsync`, `redis`, `redis-cluster` or
/// `postgres-tls`), killing the proxy.
async fn run(store: &'static str, events: usize, senders: usize, faults: Faults) -> Report {
    run_killing(Victim::Proxy, store, events, senders, faults).await
}

/// One run against `store` that kills `victim` `faults.kills` times.
async fn run_killing(
    victim: Victim,
    store: &'static str,
    events: usize,
    senders: usize,
    faults: Faults,
) -> Report {
    let started = Instant::now();
    let (upstream_addr, upstream) = start_upstream(faults).await;
    let dir = tempfile::tempdir().unwrap();
    // Unmounted before `dir` goes, after the proxy has exited.
    let mut disk = (victim == Victim::Power).then(|| {
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).unwrap();
        PowerCutMount::new(&mount).unwrap()
    });
    // Power cuts keep only what a sync kept: sled's own is pushed out of the runs whose
    // acknowledgments promise the disk, and runs every 100 ms under `batched`.
    let (data, flush_every) = match disk {
        Some(_) if store != "batched" => (dir.path().join("disk").join("data"), "1h"),
        Some(_) => (dir.path().join("disk").join("data"), "100ms"),
        None => (dir.path().join("data"), "100ms"),
    };
    let config = write_store_config(
        dir.path(),
        &data,
        upstream_addr,
        store,
        faults.hold,
        flush_every,
    );
    let mut proxy = start_binary(config.clone()).await;
    let address = Arc::new(RwLock::new(Some(proxy.addr)));

    let provider = Arc::new(Provider {
        large_bodies: victim == Victim::Power,
        ..Provider::default()
    });
    let kills_done = Arc::new(AtomicUsize::new(0));
    // Keep starting events until both the minimum number and the kills are done.
    let more: Arc<dyn Fn(usize) -> bool + Send + Sync> = {
        let kills_done = Arc::clone(&kills_done);
        Arc::new(move |number| number < events || kills_done.load(Ordering::SeqCst) < faults.kills)
    };
    let client: Sender = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_millis(500))
        .build_http();
    let mut workers = Vec::new();
    for _ in 0..senders {
        workers.push(tokio::spawn(Arc::clone(&provider).sender(
            client.clone(),
            Arc::clone(&address),
            Arc::clone(&more),
        )));
    }

    let mut sigterms = 0;
    // Events with a request under way at each kill: what may be in the proxy's hands.
    let mut at_kills: HashMap<String, usize> = HashMap::new();
    let kills_the_proxy = matches!(victim, Victim::Proxy | Victim::Power);
    while kills_done.load(Ordering::SeqCst) < faults.kills && !kills_the_proxy {
        tokio::time::sleep(Duration::from_millis(rand::random_range(300..800))).await;
        // The events an outage can make run twice: those under way as it begins or just
        // after the server dies, and those acknowledged while it lasts (their done mark may
        // have failed); on Redis also those acknowledged so shortly before that their done
        // mark may not have reached the replica that takes over.
        let outstanding = || -> Vec<String> {
            provider
                .outstanding
                .lock()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        let began = Instant::now();
        let mut involved: HashSet<String> = outstanding().into_iter().collect();
        let since = match victim {
            Victim::ClusterPrimary => {
                let servers = support::TestServers::get().unwrap();
                let (port, node_dir) = kill_a_primary(&servers);
                involved.extend(outstanding());
                recover_the_cluster(&servers, port, &node_dir).await;
                began - REPLICATION_WINDOW
            }
            Victim::Postgres => {
                tokio::task::spawn_blocking(|| postgres_ctl(true))
                    .await
                    .unwrap();
                involved.extend(outstanding());
                tokio::task::spawn_blocking(|| postgres_ctl(false))
                    .await
                    .unwrap();
                began
            }
            Victim::Proxy | Victim::Power => unreachable!("the loop below kills the proxy"),
        };
        let ended = Instant::now();
        involved.extend(
            provider
                .acknowledged_at
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, at)| (since..=ended).contains(*at))
                .map(|(id, _)| id.clone()),
        );
        for id in involved {
            *at_kills.entry(id).or_default() += 1;
        }
        kills_done.fetch_add(1, Ordering::SeqCst);
    }
    while kills_done.load(Ordering::SeqCst) < faults.kills {
        tokio::time::sleep(Duration::from_millis(rand::random_range(50..350))).await;
        let graceful = victim == Victim::Proxy && (faults.hold || rand::random_bool(0.25));
        *address.write().unwrap() = None;
        for id in provider.outstanding.lock().unwrap().keys() {
            *at_kills.entry(id.clone()).or_default() += 1;
        }
        if graceful {
            sigterms += 1;
            proxy.signal("TERM");
            let status = tokio::task::spawn_blocking(move || {
                let status = proxy.wait(Duration::from_secs(20));
                (proxy, status)
            })
            .await
            .unwrap();
            proxy = status.0;
            assert_eq!(
                status.1.code(),
                Some(0),
                "SIGTERM must exit 0; log:\n{}",
                proxy.log_text()
            );
        } else {
            proxy.kill9();
        }
        if let Some(disk) = &mut disk {
            disk.cut_power();
            if rand::random_bool(0.3) {
                cut_while_starting(disk, &config).await;
            }
        }
        kills_done.fetch_add(1, Ordering::SeqCst);
        proxy = start_binary(config.clone()).await;
        *address.write().unwrap() = Some(proxy.addr);
    }
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(600), worker)
            .await
            .expect("every event is acknowledged (or held) in the end")
            .unwrap();
    }
    let held = provider.held.lock().unwrap().clone();
    let mut run_twice = 0;
    let mut to_resolve = held.clone();
    for round in 0.. {
        if !faults.hold || to_resolve.is_empty() {
            break;
        }
        assert!(round < 20, "events kept being held: {to_resolve:?}");
        // The work of a stalled forward lands after the proxy gave up on it.
        tokio::time::sleep(STALL * 2).await;
        let executions = upstream.executions.lock().unwrap().clone();
        if round == 0 {
            run_twice = executions.values().filter(|count| **count > 1).count();
        }
        resolve_held_keys(&proxy, &provider, &to_resolve, &executions).await;
        provider.held.lock().unwrap().clear();
        // Delivered again; a new ambiguous forward holds an event again.
        for id in &to_resolve {
            provider.deliver(&client, &address, id).await;
        }
        to_resolve = provider.held.lock().unwrap().clone();
    }
    if store == "queued" {
        // Every job acknowledged is delivered in the end.
        let delivered = || {
            let executions = upstream.executions.lock().unwrap();
            provider
                .acknowledged
                .lock()
                .unwrap()
                .iter()
                .all(|id| executions.contains_key(id))
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !delivered() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let forgotten = if victim == Victim::Power && store == "fsync" {
        not_duplicates(&client, proxy.addr, &provider).await
    } else {
        0
    };
    proxy.signal("TERM");
    let exit = tokio::task::spawn_blocking(move || proxy.wait(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));

    let started_events = provider.started.load(Ordering::SeqCst);
    let acknowledged = provider.acknowledged.lock().unwrap().clone();
    let executions = upstream.executions.lock().unwrap().clone();
    let lost = acknowledged
        .iter()
        .filter(|id| executions.get(*id).copied().unwrap_or(0) == 0)
        .count();
    let extra = executions
        .values()
        .map(|count| count.saturating_sub(1))
        .sum();
    let late = upstream.late_completions.lock().unwrap().clone();
    let allowed =
        |id: &String| at_kills.get(id).copied().unwrap_or(0) + late.get(id).copied().unwrap_or(0);
    let unexplained = executions
        .iter()
        .map(|(id, count)| count.saturating_sub(1).saturating_sub(allowed(id)))
        .sum();
    Report {
        store,
        events: started_events,
        deliveries: provider.deliveries.load(Ordering::SeqCst),
        acknowledged: acknowledged.len(),
        kills: faults.kills,
        sigterms,
        lost,
        unacknowledged: started_events - acknowledged.len(),
        extra,
        in_flight_at_kills: at_kills.values().sum(),
        late_completions: late.values().sum(),
        unexplained,
        held: held.len(),
        run_twice,
        forgotten,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Starts the proxy on what the last cut left, and cuts the power again before it is
/// ready: while it recovers, or just after.
async fn cut_while_starting(disk: &mut PowerCutMount, config: &Path) {
    let mut starting = std::process::Command::new(support::binary_path())
        .args(["run", "-c"])
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(rand::random_range(0..300))).await;
    starting.kill().unwrap();
    starting.wait().unwrap();
    disk.cut_power();
}

/// Sends every acknowledged event once more; returns how many were not answered as
/// duplicates (their done mark was lost).
async fn not_duplicates(client: &Sender, proxy: SocketAddr, provider: &Provider) -> usize {
    let acknowledged: Vec<String> = provider
        .acknowledged
        .lock()
        .unwrap()
        .iter()
        .cloned()
        .collect();
    let mut forgotten = Vec::new();
    for chunk in acknowledged.chunks(16) {
        let answers = chunk.iter().map(|id| async move {
            let request = Request::post(format!("http://{proxy}/hooks"))
                .header("content-type", "application/json")
                .body(Full::new(event_body(id, provider.large_bodies)))
                .unwrap();
            let response = client.request(request).await.unwrap();
            let status = response.headers().get("dedupe-status").cloned();
            let _ = response.into_body().collect().await;
            (id, status)
        });
        for (id, status) in futures_util::future::join_all(answers).await {
            if status.as_ref().is_none_or(|status| status != "duplicate") {
                forgotten.push(format!("{id}: {status:?}"));
            }
        }
    }
    if !forgotten.is_empty() {
        eprintln!("acknowledged, then not a duplicate: {forgotten:?}");
    }
    forgotten.len()
}

/// As an operator would: lists the held keys through the admin API (they must be the
/// events the provider was told `held`), and resolves each as done if the app did the
/// work, else releases it.
async fn resolve_held_keys(
    proxy: &Binary,
    provider: &Provider,
    held: &HashSet<String>,
    executions: &HashMap<String, usize>,
) {
    let mut listed = HashSet::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = "/v1/keys?route=hooks&state=held&limit=50".to_owned();
        if let Some(after) = &after {
            path.push_str(&format!("&after={}", support::percent(after)));
        }
        let page = support::send(proxy.admin, "GET", &path, &[], "")
            .await
            .json();
        for key in page["keys"].as_array().unwrap() {
            listed.insert(key["key"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        &listed, held,
        "the held keys listed are the events told `held`"
    );
    for id in held {
        assert!(
            !provider.acknowledged.lock().unwrap().contains(id),
            "{id} was acknowledged and held"
        );
        let done = executions.get(id).copied().unwrap_or(0) > 0;
        let outcome = if done { "done" } else { "release" };
        let path = format!("/v1/keys/hooks/{id}/resolve");
        let body = format!(r#"{{"outcome":"{outcome}"}}"#);
        let resolved = support::admin_post(proxy.admin, &path, &body).await;
        assert_eq!(resolved.status, 200, "{id}: {}", resolved.body);
    }
}

/// Prints the run's line past the test harness's capture, so that CI logs show it.
fn show(report: &Report) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{}", report.line());
}

fn sized_faults() -> (usize, usize, Faults) {
    let events = env_number("FAULTS_EVENTS", 300);
    let senders = env_number("FAULTS_SENDERS", 16);
    let faults = Faults {
        error: 0.05,
        reset: 0.03,
        stall: 0.02,
        kills: env_number("FAULTS_KILLS", 20),
        hold: false,
    };
    (events, senders, faults)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_event_is_lost_under_kills_and_faults_with_fsync() {
    let (events, senders, faults) = sized_faults();
    let report = run("fsync", events, senders, faults).await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
    assert_eq!(report.unexplained, 0, "{}", report.line());
    assert!(report.extra <= report.bound(), "{}", report.line());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_event_is_lost_under_kills_and_faults_with_batched_durability() {
    let (events, senders, faults) = sized_faults();
    let report = run("batched", events, senders, faults).await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_event_is_lost_under_kills_and_faults_with_a_shared_redis_store() {
    if !support::service_available("Redis", 6379).await {
        return;
    }
    let (events, senders, faults) = sized_faults();
    let report = run("redis", events, senders, faults).await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
    // Redis keeps every done mark across the proxy's kills.
    assert_eq!(report.unexplained, 0, "{}", report.line());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_kills_or_stalls_no_work_is_done_twice() {
    let (events, senders, _) = sized_faults();
    let faults = Faults {
        error: 0.1,
        reset: 0.05,
        stall: 0.0,
        kills: 0,
        hold: false,
    };
    let report = run("batched", events, senders, faults).await;
    show(&report);
    assert_eq!(
        (report.lost, report.unacknowledged, report.extra),
        (0, 0, 0),
        "{}",
        report.line()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hold_every_event_is_acknowledged_or_held_and_none_runs_twice() {
    let (events, senders, faults) = sized_faults();
    let faults = Faults {
        hold: true,
        kills: faults.kills / 4,
        ..faults
    };
    let report = run("fsync", events, senders, faults).await;
    show(&report);
    assert!(
        report.held > 0,
        "the faults held some events: {}",
        report.line()
    );
    assert_eq!(report.run_twice, 0, "{}", report.line());
    // Once resolved by hand and delivered again, every event is acknowledged, and ran once.
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
    assert_eq!(report.extra, 0, "{}", report.line());
}

/// The store's outages, against the TLS PostgreSQL and the Redis Cluster: `FAULTS_OUTAGES`
/// (3 by default) failovers or restarts while the storm runs.
fn outage_faults() -> (usize, usize, Faults) {
    let (events, senders, faults) = sized_faults();
    let faults = Faults {
        kills: env_number("FAULTS_OUTAGES", 3),
        ..faults
    };
    (events, senders, faults)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_event_is_lost_when_a_redis_cluster_primary_dies() {
    if support::TestServers::get().is_none() {
        return;
    }
    let (events, senders, faults) = outage_faults();
    let report = run_killing(
        Victim::ClusterPrimary,
        "redis-cluster",
        events,
        senders,
        faults,
    )
    .await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
    // Extra executions only of events in flight at a failover, or acknowledged within the
    // replication window before it (their done mark may not have been replicated).
    assert_eq!(report.unexplained, 0, "{}", report.line());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_event_is_lost_when_postgres_restarts() {
    if support::TestServers::get().is_none() {
        return;
    }
    let (events, senders, faults) = outage_faults();
    let report = run_killing(Victim::Postgres, "postgres-tls", events, senders, faults).await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
    // A committed done mark survives the restart: extra executions only of events in
    // flight at one.
    assert_eq!(report.unexplained, 0, "{}", report.line());
}

/// Power cuts under the storm: what is not synced is gone at each restart. Acknowledged
/// with `durability: fsync`, an event's done mark survives: sent again, it is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_power_cuts_every_acknowledged_event_is_a_duplicate_with_fsync() {
    if !PowerCutMount::usable() {
        return;
    }
    let (events, senders, faults) = sized_faults();
    let faults = Faults {
        kills: env_number("FAULTS_POWER_CUTS", 8),
        ..faults
    };
    let report = run_killing(Victim::Power, "fsync", events, senders, faults).await;
    show(&report);
    assert_eq!(report.forgotten, 0, "{}", report.line());
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
    // A lost done mark would also show as a replay run again.
    assert_eq!(report.unexplained, 0, "{}", report.line());
}

/// Power cuts under the storm on a queued route: every job acknowledged with `202` is
/// delivered in the end, whatever was lost of what was not synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_power_cuts_every_acknowledged_queued_job_is_delivered() {
    if !PowerCutMount::usable() {
        return;
    }
    let (events, senders, faults) = sized_faults();
    let faults = Faults {
        kills: env_number("FAULTS_POWER_CUTS", 8),
        ..faults
    };
    let report = run_killing(Victim::Power, "queued", events, senders, faults).await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
}

/// Power cuts under the storm with `durability: batched` and sled's own periodic sync:
/// done marks of the last moments may be lost (those events run again), but nothing
/// acknowledged is lost and the store opens after every cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_power_cuts_nothing_is_lost_with_batched_durability() {
    if !PowerCutMount::usable() {
        return;
    }
    let (events, senders, faults) = sized_faults();
    let faults = Faults {
        kills: env_number("FAULTS_POWER_CUTS", 8),
        ..faults
    };
    let report = run_killing(Victim::Power, "batched", events, senders, faults).await;
    show(&report);
    assert_eq!(report.lost, 0, "{}", report.line());
    assert_eq!(report.unacknowledged, 0, "{}", report.line());
}
