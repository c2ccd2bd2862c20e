//! What the delivery log is told of a request: its head as it came ([`Noted`]), and the
//! marks the lifecycle's steps leave on the answer's extensions (the key and what the
//! route records of the request, a wait, a replayed answer, the app's answer), which
//! `handle` takes off again before the answer goes out. Extensions are never sent, and
//! cost nothing when the log is off: `handle` only looks when it records.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, Request, Response};

use crate::body::ProxyBody;
use crate::delivery_log::Recorder;
use crate::response::{DedupeStatus, RefusalParts};
use crate::route::Route;
use crate::route::logging::LogPolicy;
use crate::store::log::{Fate, LoggedDelivery};
use crate::store::{Clock, SystemClock};

/// The longest request id or trace id kept: a sender's header is its own to fill.
const ID_MAX: usize = 128;

/// Named once: a name given as text is parsed again at every look.
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The request's head, as the log keeps it.
pub(super) struct Noted {
    started: Instant,
    method: String,
    path: String,
    request_id: Option<String>,
    trace_id: Option<String>,
    client: SocketAddr,
    content_length: Option<u64>,
}

/// The key of a keyed delivery, and what its route records of the request.
#[derive(Clone)]
pub(super) struct Captured {
    pub(super) key: String,
    pub(super) size: u64,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Option<Bytes>,
    pub(super) body_truncated: bool,
}

impl Captured {
    pub(super) fn of(key: &str, policy: &LogPolicy, headers: &HeaderMap, body: &Bytes) -> Captured {
        let kept = |body: &Bytes| {
            let length = body
                .len()
                .min(usize::try_from(policy.max_body_bytes).unwrap_or(0));
            // A copy (64 KiB at most): a slice would keep the buffer the body was read into
            // alive, however large, while the entry waits to be stored.
            Bytes::copy_from_slice(&body[..length])
        };
        Captured {
            key: key.to_owned(),
            size: body.len() as u64,
            headers: policy
                .headers
                .iter()
                .flat_map(|name| {
                    headers.get_all(name).iter().map(move |value| {
                        (
                            name.as_str().to_owned(),
                            String::from_utf8_lossy(value.as_bytes()).into_owned(),
                        )
                    })
                })
                .collect(),
            body: policy.bodies.then(|| kept(body)),
            body_truncated: policy.bodies && body.len() as u64 > policy.max_body_bytes,
        }
    }
}

/// The delivery waited for another of its key (`on_in_flight: wait`).
#[derive(Clone, Copy)]
pub(super) struct Waited;

/// The duplicate was answered with the app's recorded answer.
#[derive(Clone, Copy)]
pub(super) struct Replayed;

/// The app's answer to the forward: its status (none without one) and how long it took.
#[derive(Clone, Copy)]
pub(super) struct UpstreamAnswer {
    pub(super) status: Option<u16>,
    pub(super) elapsed: Duration,
}

/// Marks `response` with `mark` (if any), for the log.
pub(super) fn mark<T: Clone + Send + Sync + 'static>(
    mut response: Response<ProxyBody>,
    mark: impl Into<Option<T>>,
) -> Response<ProxyBody> {
    if let Some(mark) = mark.into() {
        response.extensions_mut().insert(mark);
    }
    response
}

/// The first `max` bytes of `text`, cut at a character's boundary.
fn bounded(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

impl Noted {
    /// The head of `request`, if the log records it.
    pub(super) fn when<B>(
        records: bool,
        request: &Request<B>,
        client: SocketAddr,
    ) -> Option<Noted> {
        records.then(|| Noted::of(request, client))
    }

    fn of<B>(request: &Request<B>, client: SocketAddr) -> Noted {
        let headers = request.headers();
        let text = |name: &HeaderName| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(|text| bounded(text, ID_MAX))
        };
        // A W3C `traceparent` is `00-<trace id>-<span id>-<flags>`.
        let trace_id = text(&TRACEPARENT).and_then(|parent| {
            let id = parent.split('-').nth(1)?;
            (id.len() == 32 && id.bytes().all(|byte| byte.is_ascii_hexdigit()))
                .then(|| id.to_ascii_lowercase())
        });
        Noted {
            started: Instant::now(),
            method: bounded(request.method().as_str(), ID_MAX),
            // A target may be as long as the head's limit: 1 KiB of it is enough to tell.
            path: bounded(request.uri().path(), 1024),
            request_id: text(&X_REQUEST_ID),
            trace_id,
            client,
            content_length: text(&CONTENT_LENGTH).and_then(|length| length.parse().ok()),
        }
    }

    /// The entry of a request on `route` (none: unmatched), answered `response` with
    /// `outcome`; the marks are taken off the answer.
    pub(super) fn entry(
        self,
        route: Option<&Route>,
        outcome: Option<DedupeStatus>,
        response: &mut Response<ProxyBody>,
    ) -> LoggedDelivery {
        let extensions = response.extensions_mut();
        let captured = extensions.remove::<Captured>();
        let upstream = extensions.remove::<UpstreamAnswer>();
        let waited = extensions.remove::<Waited>().is_some();
        let replayed = extensions.remove::<Replayed>().is_some();
        let refusal = extensions.get::<RefusalParts>().map(|parts| parts.code);
        let fate = match outcome {
            None => Fate::Unmatched,
            Some(outcome) => fate(outcome, refusal),
        };
        let (key, size, headers, body, body_truncated) = match captured {
            Some(captured) => (
                Some(captured.key),
                Some(captured.size),
                captured.headers,
                captured.body,
                captured.body_truncated,
            ),
            None => (None, self.content_length, Vec::new(), None, false),
        };
        LoggedDelivery {
            at: SystemClock.now(),
            route: route.map(|route| route.name.clone()),
            scope: route.map(|route| route.namespace.clone()),
            key,
            fate,
            refusal: refusal.map(str::to_owned),
            waited,
            replayed,
            attempt: None,
            status: response.status().as_u16(),
            upstream_status: upstream.and_then(|answer| answer.status),
            upstream_ms: upstream.map(|answer| whole_ms(answer.elapsed)),
            duration_ms: whole_ms(self.started.elapsed()),
            size,
            method: self.method,
            path: self.path,
            request_id: self.request_id,
            trace_id: self.trace_id,
            client: Some(address_text(self.client)),
            // The writer names the replica, off the request path.
            replica: None,
            headers,
            body,
            body_truncated,
            by: None,
        }
    }
}

/// Hands `recorder` the entry of a request answered `response`, if it was noted.
pub(super) fn record(
    noted: Option<Noted>,
    recorder: &Recorder,
    route: Option<&Route>,
    outcome: Option<DedupeStatus>,
    response: &mut Response<ProxyBody>,
) {
    if let Some(noted) = noted {
        recorder.record(noted.entry(route, outcome, response));
    }
}

/// `address` as `Display` writes it ([`crate::upstream::push_ip`]).
fn address_text(address: SocketAddr) -> String {
    let SocketAddr::V4(v4) = address else {
        return address.to_string();
    };
    let mut text = String::with_capacity(21);
    crate::upstream::push_ip(&mut text, address.ip());
    text.push(':');
    text.push_str(itoa::Buffer::new().format(v4.port()));
    text
}

pub(super) fn whole_ms(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX)
}

/// The log's name for what `Dedupe-Status` says, with the refusal's code where the proxy
/// refused.
fn fate(outcome: DedupeStatus, refusal: Option<&str>) -> Fate {
    match outcome {
        DedupeStatus::Rejected if refusal.is_some_and(|code| code.contains("signature")) => {
            Fate::SignatureRefused
        }
        DedupeStatus::Rejected => Fate::BadRequest,
        DedupeStatus::Unkeyed => Fate::Unkeyed,
        DedupeStatus::Unavailable => Fate::StoreError,
        DedupeStatus::Duplicate => Fate::Duplicate,
        DedupeStatus::InFlight => Fate::InFlight,
        DedupeStatus::Forwarded => Fate::Forwarded,
        DedupeStatus::Released => Fate::UpstreamError,
        DedupeStatus::Held => Fate::Held,
        DedupeStatus::Stale => Fate::Stale,
        DedupeStatus::Queued => Fate::Queued,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_reads_as_display_writes_it() {
        for address in [
            "0.0.0.0:0",
            "127.0.0.1:8080",
            "255.255.255.255:65535",
            "10.20.3.4:9",
            "[::1]:443",
            "[2001:db8::7]:65535",
        ] {
            let address: SocketAddr = address.parse().unwrap();
            assert_eq!(address_text(address), address.to_string());
        }
    }
}
