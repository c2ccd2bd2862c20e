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
/// means its body and those headers within [`REPLAY_RECORD_LIMIT`], the body ended within
/// `timeout` after the head. A chunked answer (frameworks often send JSON so) is read up
/// to that much to find out; one ended by closing the connection is never kept, since a
/// crash of the app ends it the same way. Whatever is not kept is relayed whole, what was
/// read first: nothing of it is lost.
pub(super) async fn keep_for_replay(
    response: Response<Incoming>,
    replay_headers: &[HeaderName],
    timeout: Duration,
) -> (Response<ProxyBody>, Option<RecordedResponse>) {
    let end_is_marked = end_is_marked(&response);
    // As the sender gets it: the headers that describe the connection are gone.
    let response = upstream::inbound(response);
    if !end_is_marked {
        return (response, None);
    }
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
    let body_room = REPLAY_RECORD_LIMIT.saturating_sub(headers_size);
    let declared_length = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if headers_size > REPLAY_RECORD_LIMIT || declared_length.is_some_and(|n| n > body_room) {
        return (response, None);
    }
    let (head, body) = response.into_parts();
    let body = match read_within(body, body_room, timeout).await {
        BodyRead::Whole(body) => body,
        BodyRead::Relayed(body) => return (Response::from_parts(head, body), None),
        BodyRead::Broken(error, body) => {
            tracing::warn!(%error, "upstream answer body failed; relaying what came, then the failure");
            return (Response::from_parts(head, body), None);
        }
    };
    let recorded = RecordedResponse {
        status: head.status.as_u16(),
        headers,
        body: body.clone(),
    };
    (Response::from_parts(head, body::full(body)), Some(recorded))
}

/// Whether the answer says where its body ends (a `Content-Length`, chunks, an HTTP/2
/// stream's end, or no body by its status), so that a body cut short shows as broken.
fn end_is_marked(response: &Response<Incoming>) -> bool {
    let status = response.status();
    response.version() == http::Version::HTTP_2
        || response.headers().contains_key(CONTENT_LENGTH)
        || response
            .headers()
            .contains_key(http::header::TRANSFER_ENCODING)
        || status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
}

/// What became of reading an answer's body to keep it.
enum BodyRead {
    /// All of it, within the room and the time.
    Whole(Bytes),
    /// Not kept (more than the room, not ended in time, or with trailers, which a
    /// recorded answer has no place for): what was read, then the rest as it comes.
    Relayed(ProxyBody),
    /// The body broke off: what was read, then the failure, so that the sender sees a
    /// broken answer rather than a whole empty one.
    Broken(BoxError, ProxyBody),
}

/// Reads `body` whole if it is at most `room` bytes and ends within `timeout`; otherwise
/// hands back what was read followed by the rest, so that nothing of it is lost.
async fn read_within(mut body: ProxyBody, room: u64, timeout: Duration) -> BodyRead {
    let mut kept = Kept::default();
    // The frame that did not fit (more data, or trailers), relayed after what was kept.
    let mut over = None;
    let reading = async {
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            match frame.data_ref() {
                Some(data) if kept.len() + data.len() as u64 <= room => {
                    kept.add(frame.into_data().unwrap_or_default());
                }
                _ => {
                    over = Some(frame);
                    return Ok(false);
                }
            }
        }
        Ok::<bool, BoxError>(true)
    };
    let ended = tokio::time::timeout(timeout, reading).await;
    if let Ok(Ok(true)) = ended {
        return BodyRead::Whole(kept.into_bytes());
    }
    let first = Some(kept.into_bytes()).filter(|read| !read.is_empty());
    let read = futures_util::stream::iter(first.map(Frame::data).into_iter().chain(over));
    let read = read.map(Ok);
    match ended {
        Ok(Err(error)) => {
            let failure = BoxError::from("the upstream answer broke off");
            let frames = read.chain(futures_util::stream::iter([Err(failure)]));
            BodyRead::Broken(error, BodyExt::boxed(StreamBody::new(frames)))
        }
        _ => {
            let frames = read.chain(BodyStream::new(body));
            BodyRead::Relayed(BodyExt::boxed(StreamBody::new(frames)))
        }
    }
}

/// A body's frames read so far, at most the record limit. The first is held as it came
/// (the usual answer is one frame, and `Bytes` shares its buffer: no copy); from a second
/// on, all are copied into one buffer, so that the many small frames of a drip-fed answer
/// do not each hold a share of the connection's read buffer.
#[derive(Default)]
struct Kept {
    first: Bytes,
    joined: Option<BytesMut>,
}

impl Kept {
    fn len(&self) -> u64 {
        self.joined.as_ref().map_or(self.first.len(), BytesMut::len) as u64
    }

    fn add(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        match &mut self.joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if self.first.is_empty() => self.first = data,
            None => {
                let mut joined = BytesMut::with_capacity(self.first.len() + data.len());
                joined.extend_from_slice(&std::mem::take(&mut self.first));
                joined.extend_from_slice(&data);
                self.joined = Some(joined);
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        self.joined.map_or(self.first, BytesMut::freeze)
    }
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
