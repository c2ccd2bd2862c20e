//! The running proxy: its start in order (the admin port first, so that probes see
//! "starting"; the store; the proxy's listener; the background tasks and reloads), its
//! shutdown (drain, release, flush), and [`run`], which starts it and shuts it down when
//! a signal comes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Admin, Serving};
use crate::background::{
    count_held_forever, record_last_minute, record_minutes_forever, report_forever, sweep_forever,
};
use crate::config::{Config, Limits};
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::reload::Reloader;
use crate::store::postgres::PostgresStore;
use crate::store::redis::RedisStore;
use crate::store::sled::SledStore;
use crate::store::{ClaimStore, StoreError};
use crate::workers::{self, Workers};
use crate::{config::StoreConfig, descriptors, redact, reload, server};

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
    reporter: JoinHandle<()>,
    minute_recorder: JoinHandle<()>,
    metrics: Arc<Metrics>,
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
    let serving = fitted_to_open_files(&config, given_store.is_some(), &workers)?;
    let (admin, admin_server, admin_thread) = serve_admin(&config, &metrics).await?;
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
    let proxy_server = serve_proxy(proxy_listener, &serving, &proxy, &workers);
    let sweeper = tokio::spawn(sweep_forever(Arc::clone(&store), Arc::clone(&metrics)));
    let held_counter = tokio::spawn(count_held_forever(Arc::clone(&proxy), Arc::clone(&metrics)));
    let reporter = tokio::spawn(report_forever(Arc::clone(&proxy), Arc::clone(&metrics)));
    let minute_recorder = tokio::spawn(record_minutes_forever(
        Arc::clone(&proxy),
        Arc::clone(&metrics),
    ));
    let (routes, source) = (config.routes.len(), config.source.clone());
    let shutdown_grace = config.shutdown_grace.0;
    let reloader = Arc::new(Reloader::new(
        config,
        Arc::clone(&proxy),
        Arc::clone(&metrics),
    ));
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
        reporter,
        minute_recorder,
        metrics,
        hangups,
        _watcher: watcher,
        _workers: workers,
        _admin_thread: admin_thread,
    })
}

/// The configuration as it serves: its connection limits lowered to what the open-file
/// limit can carry beside the store's connections (with a warning). The file's own limits
/// stay the configuration's, so that a reload does not take them for a change.
fn fitted_to_open_files(
    config: &Config,
    store_given: bool,
    workers: &Workers,
) -> Result<Config, StartError> {
    let store_connections = if store_given {
        0
    } else {
        config.store.connections(workers.count())
    };
    let (limits, lowered) =
        descriptors::fit(&config.limits, store_connections).map_err(StartError::Descriptors)?;
    if let Some(warning) = lowered {
        tracing::warn!("{warning}");
    }
    Ok(Config {
        limits,
        ..config.clone()
    })
}

/// The admin port, first, so that probes see "starting" while the store opens, on a
/// thread of its own: a probe never waits behind the proxy's deliveries.
async fn serve_admin(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<Admin>, Running, Arc<Workers>), StartError> {
    let admin_thread = Arc::new(Workers::start_apart("dedupe-admin").map_err(StartError::Workers)?);
    let admin = Arc::new(Admin::new(&config.admin, Arc::clone(metrics)));
    let server = Running::serve(
        bind("admin API", config.admin.listen).await?,
        admin::listener_limits(),
        ADMIN_GRACE,
        &admin_thread,
        {
            let admin = Arc::clone(&admin);
            move |request, ends, permit| Arc::clone(&admin).handle(request, ends, permit)
        },
    );
    Ok((admin, server, admin_thread))
}

/// The proxy's listener, served on the workers.
fn serve_proxy(
    listener: TcpListener,
    serving: &Config,
    proxy: &Arc<Proxy>,
    workers: &Arc<Workers>,
) -> Running {
    let proxy = Arc::clone(proxy);
    Running::serve(
        listener,
        serving.limits.clone(),
        serving.shutdown_grace.0,
        workers,
        move |request, ends: server::Ends, permit| {
            Arc::clone(&proxy).handle(request, ends.peer, permit)
        },
    )
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
        None => open_store(&config.store, workers).await?,
    };
    let listener = bind("proxy", config.listen).await?;
    Ok((store, listener))
}

/// Opens the configured backend. May block on disk I/O, so it runs off the async workers.
/// The shared stores open connections for each of `workers`.
async fn open_store(
    config: &StoreConfig,
    workers: &Workers,
) -> Result<Arc<dyn ClaimStore>, StoreError> {
    match config {
        StoreConfig::Sled(sled) => {
            let sled = sled.clone();
            let store = tokio::task::spawn_blocking(move || SledStore::open(&sled))
                .await
                .map_err(|error| StoreError::Backend(error.to_string()))??;
            Ok(Arc::new(store))
        }
        StoreConfig::Redis(config) => {
            Ok(Arc::new(RedisStore::connect(config, Some(workers)).await?))
        }
        StoreConfig::Postgres(config) => Ok(Arc::new(
            PostgresStore::connect(config, Some(workers)).await?,
        )),
    }
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

/// How long the store gets to take the charts' last minutes at shutdown.
const LAST_MINUTE_WITHIN: Duration = Duration::from_secs(2);

/// How long the delivery log gets to store its last entries at shutdown.
const LOG_CLOSE_WITHIN: Duration = Duration::from_secs(2);

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
        self.reporter.abort();
        self.minute_recorder.abort();
        self.hangups.abort();
        record_last_minute(&self.proxy, &self.metrics, LAST_MINUTE_WITHIN).await;
        self.proxy.recorder().close(LOG_CLOSE_WITHIN).await;
        let flushed = self.store.flush().await;
        self.admin_server.stop().await;
        match &flushed {
            Ok(()) => tracing::info!("dedupe-proxy stopped"),
            Err(error) => tracing::error!(%error, "the store could not be flushed at shutdown"),
        }
        flushed
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
