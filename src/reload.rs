//! Live configuration: reloading the file on SIGHUP, on `POST /v1/reload`, and when the
//! file changes on disk (including a Kubernetes ConfigMap update, which swaps a symlink
//! in the mounted directory rather than writing the file).
//!
//! A reload swaps the routing in one step: requests already matched keep their route,
//! connections stay open. An invalid file is logged with its line and column, counted,
//! and the running routes stay. Settings that only apply at start (listeners, store,
//! limits, shutdown grace) are reported as needing a restart.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::proxy::Proxy;

/// How long file events settle before the file is read (an editor or the kubelet may
/// write in several steps).
const SETTLE: Duration = Duration::from_millis(200);

/// How long a read of the file may take: one that blocks (a hung network filesystem)
/// fails the reload, and the running routes stay.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What a successful reload did.
#[derive(Debug, Clone, Serialize)]
pub struct Reloaded {
    pub routes: usize,
    /// Changed settings that apply only after a restart.
    pub restart_needed: Vec<&'static str>,
}

/// The last reload tried: when, and what came of it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct LastReload {
    /// RFC 3339.
    pub at: String,
    pub ok: bool,
    /// The routes loaded, or every error found, on one line.
    pub detail: String,
}

/// Reloads the configuration file into a running proxy.
pub struct Reloader {
    /// The configuration the process started with (its file and command-line
    /// overrides are what a reload reads again): what a restart would change.
    started: Config,
    proxy: Arc<Proxy>,
    metrics: Arc<Metrics>,
    /// The file's text as last loaded, so that file events that change nothing are ignored.
    loaded_text: Mutex<Option<String>>,
    last: Mutex<Option<LastReload>>,
    /// A read of the file on a blocking thread holds it: one at a time, so that reads a
    /// hung filesystem holds do not pile up. A reload asked while the watcher's read runs
    /// (the file was just saved) waits for it rather than failing.
    reading: Arc<tokio::sync::Semaphore>,
}

impl Reloader {
    pub fn new(started: Config, proxy: Arc<Proxy>, metrics: Arc<Metrics>) -> Reloader {
        let loaded_text = crate::config::read_file(&started.source).ok();
        Reloader {
            started,
            proxy,
            metrics,
            loaded_text: Mutex::new(loaded_text),
            last: Mutex::new(None),
            reading: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The last reload tried since the start, if any.
    pub fn last(&self) -> Option<LastReload> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The store the process opened: `sled`, `redis` or `postgres`.
    pub fn store_kind(&self) -> &'static str {
        self.started.store.kind()
    }

    /// Reads the file again and puts its routing in force, or keeps the running one.
    pub async fn reload(&self) -> Result<Reloaded, ConfigError> {
        let read = self.read_and_parse().await;
        self.put_in_force(read)
    }

    /// Reloads if the file's text differs from what was last loaded.
    async fn reload_if_changed(&self) {
        let read = self.read_and_parse().await;
        if let Ok((text, _)) = &read
            && self
                .loaded_text
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                == Some(text)
        {
            return;
        }
        tracing::info!(file = %self.started.source.display(), "configuration file changed: reloading");
        let _ = self.put_in_force(read);
    }

    /// The file's text ([`crate::config::read_file`]) and what it configures, read and
    /// parsed on a blocking thread within [`READ_TIMEOUT`], so that no read stops a port.
    async fn read_and_parse(&self) -> Result<(String, Config), ConfigError> {
        let failed = |reason: &str| ConfigError::Read {
            file: self.started.source.display().to_string(),
            source: std::io::Error::other(reason.to_owned()),
        };
        let turn = tokio::time::timeout(READ_TIMEOUT, Arc::clone(&self.reading).acquire_owned());
        let Ok(Ok(turn)) = turn.await else {
            return Err(failed(
                "an earlier read of the file has not returned (a hung filesystem?)",
            ));
        };
        let (path, overrides) = (self.started.source.clone(), self.started.overrides.clone());
        let read = tokio::task::spawn_blocking(move || {
            let read = crate::config::read_file(&path).and_then(|text| {
                let config = Config::parse(&text, &path, &overrides)?;
                Ok((text, config))
            });
            // Given back once parsed too: reads and parses that outlast the timeout do
            // not pile up.
            drop(turn);
            read
        });
        match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(read)) => read,
            Ok(Err(panicked)) => Err(failed(&panicked.to_string())),
            Err(_) => Err(failed(&format!(
                "the file could not be read within {READ_TIMEOUT:?} (a hung filesystem?)"
            ))),
        }
    }

    /// Puts what was read in force, or keeps the running routing.
    fn put_in_force(
        &self,
        read: Result<(String, Config), ConfigError>,
    ) -> Result<Reloaded, ConfigError> {
        let reloaded = self.load_again(read);
        // Kept to be shown (`/v1/overview`): a message may quote a secret of the file.
        let detail = match &reloaded {
            Ok(reloaded) => match reloaded.routes {
                1 => "1 route".to_owned(),
                routes => format!("{routes} routes"),
            },
            Err(error) => crate::redact::text(&error.on_one_line()).into_owned(),
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastReload {
            at: crate::store::rfc3339(crate::store::Clock::now(&crate::store::SystemClock)),
            ok: reloaded.is_ok(),
            detail,
        });
        reloaded
    }

    fn load_again(
        &self,
        read: Result<(String, Config), ConfigError>,
    ) -> Result<Reloaded, ConfigError> {
        let (text, config) = match read {
            Ok(read) => read,
            Err(error) => {
                self.metrics.reloaded(false);
                let reason = error.on_one_line();
                tracing::error!(error = %reason, "configuration reload failed; the running routes stay");
                return Err(error);
            }
        };
        crate::redact::remember(config.secrets());
        for warning in &config.warnings {
            tracing::warn!("{warning}");
        }
        self.proxy.set_routing(config.routing());
        let reloaded = Reloaded {
            routes: config.routes.len(),
            restart_needed: self.restart_needed(&config),
        };
        *self.loaded_text.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
        self.metrics.reloaded(true);
        tracing::info!(routes = reloaded.routes, "configuration reloaded");
        if !reloaded.restart_needed.is_empty() {
            tracing::warn!(
                settings = ?reloaded.restart_needed,
                "changed settings apply only after a restart"
            );
        }
        Ok(reloaded)
    }

    fn restart_needed(&self, new: &Config) -> Vec<&'static str> {
        let old = &self.started;
        [
            ("listen", old.listen != new.listen),
            ("admin", old.admin != new.admin),
            ("store", old.store != new.store),
            ("limits", old.limits != new.limits),
            ("shutdown_grace", old.shutdown_grace != new.shutdown_grace),
            ("telemetry", old.telemetry != new.telemetry),
            ("delivery_log", old.delivery_log != new.delivery_log),
        ]
        .into_iter()
        .filter_map(|(setting, changed)| changed.then_some(setting))
        .collect()
    }
}

/// Reloads on every SIGHUP.
pub fn reload_on_hangup(reloader: Arc<Reloader>) -> tokio::task::JoinHandle<()> {
    let mut hangups = signal(SignalKind::hangup()).expect("installing the SIGHUP handler");
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP received: reloading the configuration");
            let _ = reloader.reload().await;
        }
    })
}

/// Reloads when the configuration file changes. The directory is watched, not the
/// file, because a ConfigMap update replaces the `..data` symlink the file points
/// through; the file's text is compared so that unrelated events change nothing.
/// Returns the watcher, which stops when dropped.
pub fn reload_on_change(reloader: Arc<Reloader>) -> notify::Result<notify::RecommendedWatcher> {
    let directory = match reloader.started.source.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    let (events, mut changes) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = events.send(());
        }
    })?;
    watcher.watch(&directory, RecursiveMode::NonRecursive)?;
    tokio::spawn(async move {
        while changes.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while changes.try_recv().is_ok() {}
            reloader.reload_if_changed().await;
        }
    });
    Ok(watcher)
}
