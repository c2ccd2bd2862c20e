//! Why a forward got no answer, as the pool and the forward both report it.

use std::time::Duration;

/// Why a forward got no answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed after the request went out, before an answer: the
    /// application may have done the work.
    #[error("upstream closed the connection before answering: {0}")]
    Dropped(String),
    /// The sender's own body broke off while it streamed to the upstream (a request no
    /// route took, whose body is not read first): the sender's doing, not the app's.
    #[error("the sender's body broke off while it was forwarded: {0}")]
    SenderBody(String),
}
