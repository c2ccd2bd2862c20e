//! Shutdown signals: SIGTERM (Kubernetes, `docker stop`) and SIGINT (Ctrl-C).

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};

/// Installs the SIGTERM and SIGINT handlers at once, so that a signal arriving while the
/// proxy is still starting is kept rather than killing the process, and returns a future
/// that resolves on the first of them. Call it inside the runtime, before starting.
///
/// SIGHUP is caught too: its default action would kill the process, and operators send it
/// expecting a reload. Live reload is not built yet, so it is logged and otherwise ignored.
pub fn on_signal() -> impl Future<Output = ()> {
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    let mut hangup = signal(SignalKind::hangup()).expect("installing the SIGHUP handler");
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::warn!(
                "SIGHUP received: live reload is not available yet; restart to apply a new configuration"
            );
        }
    });
    async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    }
}
