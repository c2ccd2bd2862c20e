//! The delivery log on the admin port: `GET /v1/deliveries` (filtered pages, newest
//! first), `GET /v1/deliveries/{id}` (one entry whole: its recorded headers and body) and
//! `GET /v1/deliveries/tail` (Server-Sent Events of the entries stored from then on that
//! match a filter).
//!
//! A tail is bounded: [`TAILS_MAX`] at once, each with a small buffer; one that falls
//! behind is told how many it missed (`event: lagged`), and every tail ends when the
//! proxy shuts down.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::body::{BoxError, ProxyBody};
use crate::delivery_log::query::{self, Filter};
use crate::delivery_log::{Recorder, Stored};
use crate::response::{AdminRefusal, json_response};

/// Live tails at once at most: the admin port has 64 connections in all.
pub(super) const TAILS_MAX: usize = 8;

/// How often an idle tail sends a comment, so that proxies on the way keep it open and a
/// client that went away is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Events a tail holds for a slow client before it waits (and then lags).
const TAIL_EVENTS: usize = 64;

/// The tails running now, and what ends them.
pub(super) struct Tails {
    places: Arc<Semaphore>,
    closing: CancellationToken,
}

impl Default for Tails {
    fn default() -> Self {
        Tails {
            places: Arc::new(Semaphore::new(TAILS_MAX)),
            closing: CancellationToken::new(),
        }
    }
}

impl Tails {
    /// Ends every tail, and starts none from now on.
    pub(super) fn close(&self) {
        self.closing.cancel();
        self.places.close();
    }
}

/// `GET /v1/deliveries?<filter>[&limit=N][&cursor=C]`.
pub(super) async fn list(recorder: &Recorder, query: Option<&str>) -> Response<ProxyBody> {
    let Some(log) = recorder.log() else {
        return AdminRefusal::NoDeliveryLog.into_response();
    };
    let listing = match Filter::parse(query, true) {
        Ok(listing) => listing,
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    match query::page(log.as_ref(), &listing).await {
        Ok(page) => {
            let entries: Vec<_> = page
                .entries
                .iter()
                .map(|(id, entry)| query::describe(*id, entry, false))
                .collect();
            let body = json!({ "deliveries": entries, "next": page.next });
            json_response(StatusCode::OK, body.to_string())
        }
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `GET /v1/deliveries/{id}`.
pub(super) async fn get(recorder: &Recorder, id: &str) -> Response<ProxyBody> {
    let Some(log) = recorder.log() else {
        return AdminRefusal::NoDeliveryLog.into_response();
    };
    let Ok(id) = id.parse() else {
        return AdminRefusal::NoSuchDelivery.into_response();
    };
    match log.get(id).await {
        Ok(Some(entry)) => json_response(
            StatusCode::OK,
            query::describe(id, &entry, true).to_string(),
        ),
        Ok(None) => AdminRefusal::NoSuchDelivery.into_response(),
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `GET /v1/deliveries/tail?<filter>`: an event stream.
pub(super) fn tail(tails: &Tails, recorder: &Recorder, query: Option<&str>) -> Response<ProxyBody> {
    if recorder.log().is_none() {
        return AdminRefusal::NoDeliveryLog.into_response();
    }
    let filter = match Filter::parse(query, false) {
        Ok(listing) => listing.filter,
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    let Ok(place) = Arc::clone(&tails.places).try_acquire_owned() else {
        return AdminRefusal::TooMany(format!("{TAILS_MAX} live tails run already; end one first"))
            .into_response();
    };
    let (events, frames) = mpsc::channel(TAIL_EVENTS);
    let stored = recorder.subscribe();
    tokio::spawn(follow(stored, filter, events, tails.closing.clone(), place));
    let mut response = Response::new(EventStream(frames).boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Passes the stored entries `filter` admits to the client, until it goes away or the
/// proxy closes.
async fn follow(
    mut stored: broadcast::Receiver<Stored>,
    filter: Filter,
    events: mpsc::Sender<Bytes>,
    closing: CancellationToken,
    _place: OwnedSemaphorePermit,
) {
    // Said at once, so that the client knows the tail runs.
    if events
        .send(Bytes::from_static(b": tailing\n\n"))
        .await
        .is_err()
    {
        return;
    }
    let mut idle = tokio::time::interval(KEEP_ALIVE);
    idle.reset();
    loop {
        let event = tokio::select! {
            () = closing.cancelled() => return,
            _ = idle.tick() => Bytes::from_static(b": keep-alive\n\n"),
            received = stored.recv() => match received {
                Ok(entry) if filter.admits(&entry.1) => {
                    let (id, entry) = &*entry;
                    let data = query::describe(*id, entry, false);
                    Bytes::from(format!("id: {id}\nevent: delivery\ndata: {data}\n\n"))
                }
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    Bytes::from(format!("event: lagged\ndata: {}\n\n", json!({ "missed": missed })))
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        tokio::select! {
            () = closing.cancelled() => return,
            sent = events.send(event) => if sent.is_err() { return },
        }
    }
}

/// The body of an event stream: what [`follow`] sends, as it comes.
struct EventStream(mpsc::Receiver<Bytes>);

impl Body for EventStream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|event| event.map(|bytes| Ok(Frame::data(bytes))))
    }
}
