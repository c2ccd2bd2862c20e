//! What a duplicate is compared with and answered with: the delivery's fingerprint, and
//! the application's first answer, kept when it is small enough to replay.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::HeaderName;
use http::Response;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::{Frame, Incoming};
use sha2::{Digest, Sha256};

use crate::body::{self, BoxError, ProxyBody};
use crate::preset::FingerprintScope;
use crate::store::{Fingerprint, RecordedResponse};
use crate::upstream;

/// The largest upstream answer kept for `duplicate_response.replay`: its body and the
/// headers recorded with it. Larger answers stream through and are not replayed.
pub const REPLAY_RECORD_LIMIT: u64 = 64 * 1024;

/// Buffers a small upstream answer so that duplicates can be answered with it, with the
/// headers `replay_headers` names; a large one streams through and is not kept. Small
/// means its body and those headers within [`REPLAY_RECORD_LIMIT`]; an answer without a
/// `Content-Length` (chunked, or ended by closing) is read up to that much to find out.
pub(super) async fn keep_for_replay(
    response: Response<Incoming>,
    replay_headers: &[HeaderName],
    timeout: Duration,
) -> (Response<ProxyBody>, Option<RecordedResponse>) {
    // As the sender gets it: the headers that describe the connection are gone.
    let response = upstream::inbound(response);
    // The body is kept as the app encoded it, so its encoding goes with it, listed or not.
    let unlisted_encoding =
        (!replay_headers.contains(&CONTENT_ENCODING)).then_some(&CONTENT_ENCODING);
    let headers: Vec<(String, Bytes)> = replay_headers
        .iter()
        .chain(unlisted_encoding)
        .flat_map(|name| {
            response.headers().get_all(name).iter().map(move |value| {
                (
                    name.as_str().to_owned(),
                    Bytes::copy_from_slice(value.as_bytes()),
                )
            })
        })
        .collect();
    let headers_size: u64 = headers
        .iter()
        .map(|(name, value)| (name.len() + value.len()) as u64)
        .sum();
    let room = REPLAY_RECORD_LIMIT.saturating_sub(headers_size);
    let declared = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if headers_size > REPLAY_RECORD_LIMIT || declared.is_some_and(|length| length > room) {
        return (response, None);
    }
    let (head, body) = response.into_parts();
    let body = match read_within(body, room, timeout).await {
        Read::Whole(body) => body,
        Read::TooLong(body) => return (Response::from_parts(head, body), None),
        Read::Failed => {
            tracing::warn!("upstream answer body failed; relaying the status without it");
            return (Response::from_parts(head, body::empty()), None);
        }
    };
    let recorded = RecordedResponse {
        status: head.status.as_u16(),
        headers,
        body: body.clone(),
    };
    (Response::from_parts(head, body::full(body)), Some(recorded))
}

/// What became of reading an answer's body to keep it.
enum Read {
    /// All of it, within the room.
    Whole(Bytes),
    /// More than the room, or not ended in time, or with trailers: what was read, then
    /// the rest as it comes.
    TooLong(ProxyBody),
    /// The body broke off.
    Failed,
}

/// Reads `body` whole if it is at most `room` bytes and ends within `timeout`; otherwise
/// hands back what was read followed by the rest, so that nothing of it is lost.
async fn read_within(mut body: ProxyBody, room: u64, timeout: Duration) -> Read {
    // The frames as they came: one (the usual answer) is kept without a copy.
    let mut parts: Vec<Bytes> = Vec::new();
    let mut length = 0u64;
    let mut trailers = None;
    let reading = async {
        while let Some(frame) = body.frame().await {
            match frame?.into_data() {
                Ok(data) => {
                    length += data.len() as u64;
                    if !data.is_empty() {
                        parts.push(data);
                    }
                    if length > room {
                        return Ok(false);
                    }
                }
                Err(frame) => {
                    trailers = Some(frame);
                    return Ok(false);
                }
            }
        }
        Ok::<bool, BoxError>(true)
    };
    let outcome = tokio::time::timeout(timeout, reading).await;
    match outcome {
        Ok(Ok(true)) => Read::Whole(joined(parts, length)),
        Ok(Err(_)) => Read::Failed,
        Ok(Ok(false)) | Err(_) => {
            let read = parts.into_iter().map(Frame::data).chain(trailers);
            let frames = futures_util::stream::iter(read.map(Ok)).chain(BodyStream::new(body));
            Read::TooLong(BodyExt::boxed(StreamBody::new(frames)))
        }
    }
}

/// The parts of a body as one.
fn joined(mut parts: Vec<Bytes>, length: u64) -> Bytes {
    if parts.len() <= 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut whole = BytesMut::with_capacity(usize::try_from(length).unwrap_or(0));
    for part in parts {
        whole.extend_from_slice(&part);
    }
    whole.freeze()
}

/// The hash a duplicate's is compared with: of the body, or of the method, the target
/// (path and query, as sent) and the body, each length-prefixed, so that no two requests
/// share their bytes.
pub(super) fn fingerprint(
    scope: FingerprintScope,
    head: &http::request::Parts,
    body: &[u8],
) -> Fingerprint {
    match scope {
        FingerprintScope::Body => Sha256::digest(body).into(),
        FingerprintScope::Request => {
            let mut hash = Sha256::new();
            let target = head
                .uri
                .path_and_query()
                .map_or("/", |target| target.as_str());
            for part in [head.method.as_str().as_bytes(), target.as_bytes(), body] {
                hash.update((part.len() as u64).to_be_bytes());
                hash.update(part);
            }
            hash.finalize().into()
        }
    }
}
