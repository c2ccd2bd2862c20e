//! Bodies: the one body type the proxy passes around, and the bounded read of a
//! delivery's body (the proxy must see the whole body to find the key and fingerprint it).

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::header::CONTENT_LENGTH;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited};
use hyper::body::Incoming;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every body the proxy sends, to the upstream or back to the sender.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body held in memory.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A body passed through as it arrives, never buffered whole.
pub fn streaming(body: Incoming) -> ProxyBody {
    body.map_err(BoxError::from).boxed()
}

/// Why a delivery's body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("body exceeds max_body of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("body could not be read: {0}")]
    Broken(String),
    #[error("body not received within {0:?}")]
    TimedOut(Duration),
}

/// Reads a whole body of at most `limit` bytes within `timeout`. A `Content-Length` over
/// the limit is refused before reading, so that hyper never answers `100 Continue` to it;
/// a chunked body is cut off as soon as it passes the limit.
pub(crate) async fn read_limited<B>(
    headers: &HeaderMap,
    body: B,
    limit: u64,
    timeout: Duration,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(BodyError::TooLarge { limit });
    }
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<LengthLimitError>() => Err(BodyError::TooLarge { limit }),
        Ok(Err(error)) => Err(BodyError::Broken(error.to_string())),
        Err(_) => Err(BodyError::TimedOut(timeout)),
    }
}
