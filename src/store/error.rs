//! Why a store operation failed, and the bound on how long a backend may take to say.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// Why a store operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The claim's lease was taken over, or the key forgotten; nothing was changed.
    #[error("the claim is no longer held by this owner")]
    NotOwner,
    /// The backend could not be reached or failed; follow `on_store_error`.
    #[error("store failure: {0}")]
    Backend(String),
    /// An operator's request this backend cannot answer: a malformed cursor, or a
    /// listing it cannot make. Never a delivery's.
    #[error("{0}")]
    BadRequest(String),
}

impl StoreError {
    /// A failure of the `engine` backend.
    pub(crate) fn of(engine: &str, error: impl Display) -> StoreError {
        StoreError::Backend(format!("{engine}: {error}"))
    }

    /// The failure, said to have happened while doing `what`.
    pub(crate) fn context(self, what: &str) -> StoreError {
        match self {
            StoreError::Backend(text) => StoreError::Backend(format!("{what}: {text}")),
            other => other,
        }
    }

    /// A failure of the `engine` backend with its causes, which name what went wrong
    /// beneath a driver's summary ("error performing TLS handshake": which check failed).
    pub(crate) fn caused(engine: &str, error: &dyn std::error::Error) -> StoreError {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text = format!("{text}: {cause_text}");
            }
            source = cause.source();
        }
        StoreError::of(engine, text)
    }
}

/// Awaits a call to the `engine` backend for at most `timeout`.
pub(crate) async fn within<T, E: Into<StoreError>>(
    engine: &str,
    timeout: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| StoreError::of(engine, format!("no answer within {timeout:?}")))?
        .map_err(Into::into)
}
