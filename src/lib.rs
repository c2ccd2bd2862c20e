//! dedupe-proxy: a reverse proxy that makes each webhook event reach an application's
//! success path once, although providers deliver at least once.
//!
//! # Architecture
//!
//! ```text
//! provider ──HTTP──▶ server ──▶ proxy ──▶ upstream ──HTTP──▶ application
//!                                 │
//!                                 └──▶ store (ClaimStore: sled | Redis | PostgreSQL)
//! admin port ──▶ admin (health, readiness, metrics, routes, reload, keys)
//! ```
//!
//! - [`config`] reads the YAML file and resolves every route's settings ([`values`] are
//!   their typed values); [`route`] is a route as it runs and the table that finds it;
//!   [`target`] checks a request's Host and gives the path's normal form routes match on;
//!   [`key`] extracts keys; [`verify`] checks signatures; [`preset`] knows the major
//!   providers; [`order`] reads an event's entity and version for the stale-event guard.
//! - [`proxy`] is the lifecycle of one delivery: match, check (read, verify, key), claim,
//!   compare with the entity's newest version (`order:`), forward, finish.
//! - [`store`] holds claims: absent → in_flight → done (or held, for an operator),
//!   atomically, owner-checked, on sled (embedded) or shared by replicas on Redis or
//!   PostgreSQL, and each entity's newest done version; [`waiting`] keeps the duplicates
//!   that wait for an outcome.
//! - [`upstream`] holds the pooled clients, one per worker; [`response`] writes every
//!   answer the proxy makes.
//! - [`server`] accepts connections within [`config::Limits`] and hands each to one of
//!   the [`workers`] (a single-threaded runtime per core); [`admin`] serves the admin
//!   port; [`metrics`] names every metric; [`reload`] applies a changed configuration;
//!   [`shutdown`] waits for signals.
//!
//! # A delivery's life
//!
//! A delivery on a matched route has its body read (bounded), its signature checked, its
//! key extracted and claimed. Only an unclaimed key is forwarded, in a task that outlives
//! the sender's connection. An upstream success marks the key done before the sender
//! hears of it; any failure releases the claim so the provider's retry runs the work
//! (with `on_ambiguous: hold`, a failure after which the app may have done the work holds
//! the key for an operator instead). A done key's duplicate is answered at once; an
//! in-flight or held key's gets 409 and `Retry-After`. On a route with `order:`, an event
//! older than one already done about the same entity is forwarded marked `Dedupe-Stale`,
//! or skipped. The background tasks sweep expired records and count held keys.
//!
//! [`start`] brings the proxy up and returns an [`App`]; [`App::shutdown`] drains it.
//! [`run`] does both around a shutdown signal, for the binary.

#![forbid(unsafe_code)]

pub mod admin;
pub mod body;
pub mod cli;
pub mod config;
pub mod demo;
pub mod descriptors;
pub mod dsn;
pub mod key;
pub mod metrics;
pub mod order;
pub mod preset;
pub mod proxy;
pub mod redact;
pub mod reload;
pub mod response;
pub mod route;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod target;
pub mod telemetry;
pub mod upstream;
pub mod values;
pub mod verify;
pub mod waiting;
pub mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{Admin, Serving};
use crate::config::{Config, Limits};
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::reload::Reloader;
use crate::store::{ClaimStore, StoreError};
use crate::workers::Workers;

/// How often the sweeper looks for expired records, and how many one sweep call reads
/// before yielding.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const SWEEP_BATCH: usize = 1000;

/// The admin listener's own grace at shutdown, after the proxy has drained.
const ADMIN_GRACE: Duration = Duration::from_secs(1);

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} for the {what}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("cannot start the worker threads: {0}")]
    Workers(std::io::Error),
    #[error("{0}")]
    Descriptors(String),
}

/// A running proxy.
pub struct App {
    /// Where providers connect (the bound address, useful with port 0).
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    admin: Arc<Admin>,
    proxy: Arc<Proxy>,
    store: Arc<dyn ClaimStore>,
    shutdown_grace: Duration,
    proxy_server: Running,
    admin_server: Running,
    sweeper: JoinHandle<()>,
    held_counter: JoinHandle<()>,
    /// Reloads on SIGHUP until shutdown.
    hangups: JoinHandle<()>,
    /// Reloads when the configuration file changes, while it lives.
    _watcher: Option<notify::RecommendedWatcher>,
    /// Run every connection and forward; dropped last, when the proxy is drained.
    _workers: Arc<Workers>,
    /// Runs the admin port's connections.
    _admin_thread: Arc<Workers>,
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// Opens the configured store, binds both listeners and starts serving.
pub async fn start(config: Config) -> Result<App, StartError> {
    start_with(config, None).await
}

/// Like [`start`], with a store the caller opened (an embedding, or a test that wraps
/// the store to inject faults) instead of the configured one.
pub async fn start_with_store(
    config: Config,
    store: Arc<dyn ClaimStore>,
) -> Result<App, StartError> {
    start_with(config, Some(store)).await
}

async fn start_with(
    config: Config,
    given_store: Option<Arc<dyn ClaimStore>>,
) -> Result<App, StartError> {
    redact::remember(config.secrets());
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let metrics = Arc::new(Metrics::new());
    let workers = Arc::new(start_workers(&config)?);
    let store_connections = match &given_store {
        Some(_) => 0,
        None => config.store.connections(workers.count()),
    };
    let (limits, lowered) =
        descriptors::fit(&config.limits, store_connections).map_err(StartError::Descriptors)?;
    if let Some(warning) = lowered {
        tracing::warn!("{warning}");
    }
    // What the limit can carry serves; the file's own limits stay the configuration's, so
    // that a reload does not take them for a change.
    let serving = Config {
        limits,
        ..config.clone()
    };
    // The admin port comes first, so that probes see "starting" while the store opens. It
    // has a thread of its own: a probe never waits behind the proxy's deliveries.
    let admin_thread = Arc::new(Workers::start_apart("dedupe-admin").map_err(StartError::Workers)?);
    let admin = Arc::new(Admin::new(&config.admin, Arc::clone(&metrics)));
    let admin_server = Running::serve(
        bind("admin API", config.admin.listen).await?,
        admin::listener_limits(),
        ADMIN_GRACE,
        &admin_thread,
        {
            let admin = Arc::clone(&admin);
            move |request, ends, permit| Arc::clone(&admin).handle(request, ends, permit)
        },
    );
    let (store, proxy_listener) = match open_store_and_bind(&config, given_store, &workers).await {
        Ok(opened) => opened,
        Err(error) => {
            admin_server.stop().await;
            return Err(error);
        }
    };
    let proxy = Arc::new(Proxy::new(
        &serving,
        Arc::clone(&store),
        Arc::clone(&metrics),
        workers.count(),
    ));
    let proxy_server = Running::serve(
        proxy_listener,
        serving.limits,
        config.shutdown_grace.0,
        &workers,
        {
            let proxy = Arc::clone(&proxy);
            move |request, ends: server::Ends, permit| {
                Arc::clone(&proxy).handle(request, ends.peer, permit)
            }
        },
    );
    let sweeper = tokio::spawn(sweep_forever(Arc::clone(&store), Arc::clone(&metrics)));
    let held_counter = tokio::spawn(count_held_forever(Arc::clone(&proxy), Arc::clone(&metrics)));
    let (routes, source) = (config.routes.len(), config.source.clone());
    let shutdown_grace = config.shutdown_grace.0;
    let reloader = Arc::new(Reloader::new(config, Arc::clone(&proxy), metrics));
    let hangups = reload::reload_on_hangup(Arc::clone(&reloader));
    let watcher = watch_file(&reloader, &source);
    admin.ready(Serving {
        proxy: Arc::clone(&proxy),
        reloader,
    });
    tracing::info!(
        proxy = %proxy_server.addr,
        admin = %admin_server.addr,
        routes,
        workers = workers.count(),
        config = %source.display(),
        "dedupe-proxy ready"
    );
    Ok(App {
        proxy_addr: proxy_server.addr,
        admin_addr: admin_server.addr,
        admin,
        proxy,
        store,
        shutdown_grace,
        proxy_server,
        admin_server,
        sweeper,
        held_counter,
        hangups,
        _watcher: watcher,
        _workers: workers,
        _admin_thread: admin_thread,
    })
}

/// The worker threads: `--workers`, else one per core.
fn start_workers(config: &Config) -> Result<Workers, StartError> {
    let count = config
        .overrides
        .workers
        .map_or_else(workers::default_count, usize::from);
    Workers::start(count).map_err(StartError::Workers)
}

/// The claim store (the given one, or the configured one opened), and the proxy's
/// listener.
async fn open_store_and_bind(
    config: &Config,
    given_store: Option<Arc<dyn ClaimStore>>,
    workers: &Workers,
) -> Result<(Arc<dyn ClaimStore>, TcpListener), StartError> {
    let store = match given_store {
        Some(store) => store,
        None => store::open(&config.store, workers).await?,
    };
    let listener = bind("proxy", config.listen).await?;
    Ok((store, listener))
}

/// Reloads when the configuration file changes. A configuration given as text (an
/// embedding, a test) has no file to watch.
fn watch_file(reloader: &Arc<Reloader>, source: &Path) -> Option<notify::RecommendedWatcher> {
    if !source.is_file() {
        return None;
    }
    reload::reload_on_change(Arc::clone(reloader))
        .inspect_err(|error| {
            tracing::warn!(%error, "cannot watch the configuration file; reload with SIGHUP or POST /v1/reload");
        })
        .ok()
}

/// A listener being served in a task of its own.
struct Running {
    addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Serves `handler` on `listener`; [`Running::stop`] stops it within `grace`.
    fn serve<H: server::Handler>(
        listener: TcpListener,
        limits: Limits,
        grace: Duration,
        workers: &Arc<Workers>,
        handler: H,
    ) -> Running {
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let stop = CancellationToken::new();
        let task = tokio::spawn(server::serve(
            listener,
            handler,
            limits,
            stop.clone(),
            grace,
            Arc::clone(workers),
        ));
        Running { addr, stop, task }
    }

    /// Stops accepting and waits for the open connections, within the grace.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

impl App {
    /// Stops accepting and reports not ready, lets in-flight forwards finish within the
    /// shutdown grace, releases the claims still open, flushes the store, and returns.
    pub async fn shutdown(self) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.shutdown_grace;
        self.admin.shutting_down();
        self.proxy.stop_waiting();
        self.proxy_server.stop().await;
        self.proxy
            .drain(deadline.saturating_duration_since(Instant::now()))
            .await;
        self.sweeper.abort();
        self.held_counter.abort();
        self.hangups.abort();
        let flushed = self.store.flush().await;
        self.admin_server.stop().await;
        match &flushed {
            Ok(()) => tracing::info!("dedupe-proxy stopped"),
            Err(error) => tracing::error!(%error, "the store could not be flushed at shutdown"),
        }
        flushed
    }
}

/// Removes expired records in the background, a batch at a time.
async fn sweep_forever(store: Arc<dyn ClaimStore>, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(SWEEP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        loop {
            let started = Instant::now();
            match store.sweep(SWEEP_BATCH).await {
                Ok(swept) => {
                    if swept.removed > 0 {
                        metrics.swept(swept.removed);
                        tracing::debug!(removed = swept.removed, "swept expired keys");
                    }
                    if swept.examined < SWEEP_BATCH {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default();
                        metrics.sweep_succeeded(now.as_secs());
                        break;
                    }
                }
                Err(error) => {
                    metrics.store_error();
                    tracing::warn!(%error, "sweep failed");
                    break;
                }
            }
            // A large backlog (a million keys expiring together) is swept at half of one
            // core at most, so that deliveries keep their latency meanwhile.
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

/// How often `dedupe_keys_held` is counted again.
const COUNT_HELD_EVERY: Duration = Duration::from_secs(5);

/// Keeps `dedupe_keys_held` current: counts the store's held keys every
/// [`COUNT_HELD_EVERY`], for each route by its namespace.
async fn count_held_forever(proxy: Arc<Proxy>, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(COUNT_HELD_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match proxy.store().count_held().await {
            Ok(counts) => {
                let counts: std::collections::HashMap<String, u64> = counts.into_iter().collect();
                for route in proxy.routing().table.routes() {
                    let held = counts.get(&route.namespace).copied().unwrap_or(0);
                    metrics.keys_held(&route.name, held);
                }
            }
            Err(error) => {
                metrics.store_error();
                tracing::warn!(%error, "counting the held keys failed");
            }
        }
    }
}

/// Errors that end [`run`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("shutdown: {0}")]
    Shutdown(#[from] StoreError),
}

/// Serves `config` until `shutdown` resolves, then drains and stops.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let app = start(config).await?;
    shutdown.await;
    app.shutdown().await?;
    Ok(())
}
