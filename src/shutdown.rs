//! Shutdown signals: SIGTERM (Kubernetes, `docker stop`) and SIGINT (Ctrl-C). SIGHUP
//! reloads the configuration instead (see `reload`).

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};

/// Installs the SIGTERM and SIGINT handlers at once, so that a signal arriving while the
/// proxy is still starting is kept rather than killing the process, and returns a future
/// that resolves on the first of them. Call it inside the runtime, before starting.
pub fn on_signal() -> impl Future<Output = ()> {
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    }
}
