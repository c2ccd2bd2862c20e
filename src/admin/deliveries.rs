//! The delivery log on the admin port: `GET /v1/deliveries` (filtered pages, newest
//! first), `GET /v1/deliveries/{id}` (one entry whole: its recorded headers and body) and
//! `GET /v1/deliveries/tail` (Server-Sent Events of the entries stored from then on that
//! match a filter).
//!
//! A tail is bounded: [`TAILS_MAX`] at once, half of them per credential, each with a
//! small buffer; one that falls behind is told how many it missed (`event: lagged`). A
//! tail ends when its client has read nothing for [`UNREAD_LIMIT`], after
//! [`TAIL_LIFETIME`] (`event: end`: a client starts another), and when the proxy shuts
//! down, so that clients that stop reading cannot hold the places for good.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use axum::Extension;
use axum::extract::{RawQuery, State};

use super::access::Role;
use super::answers::{DeliveryDetail, DeliveryPage, DeliverySummary, answer_json};
use super::extract::{Live, PathNames};
use super::places::{Full, Place};
use super::tails::{TAILS_MAX, Tails};
use crate::body::{BoxError, ProxyBody};
use crate::delivery_log::Stored;
use crate::delivery_log::query::{self, Filter};
use crate::response::AdminRefusal;
use crate::store::log::{LogId, LoggedDelivery};
use crate::store::rfc3339;

/// How often an idle tail sends a comment, so that proxies on the way keep it open and a
/// client that went away is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Events a tail holds for a slow client before it waits (and then lags).
const TAIL_EVENTS: usize = 64;

/// How long a tail waits for its client to take an event before it ends.
const UNREAD_LIMIT: Duration = Duration::from_secs(30);

/// How long a tail runs at most.
const TAIL_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// `GET /v1/deliveries?<filter>[&limit=N][&cursor=C]`.
pub(super) async fn list(Live(serving): Live, RawQuery(query): RawQuery) -> Response<ProxyBody> {
    let (recorder, query) = (serving.proxy.recorder(), query.as_deref());
    let Some(log) = recorder.log() else {
        return AdminRefusal::NoDeliveryLog.into_response();
    };
    let listing = match Filter::parse(query, true) {
        Ok(listing) => listing,
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    match query::page(log.as_ref(), &listing).await {
        Ok(page) => {
            let deliveries = page.entries.iter().map(|(id, entry)| summary(*id, entry));
            let deliveries = deliveries.collect();
            answer_json(
                StatusCode::OK,
                &DeliveryPage {
                    deliveries,
                    next: page.next,
                },
            )
        }
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `GET /v1/deliveries/{id}`.
pub(super) async fn get(
    Live(serving): Live,
    PathNames(id): PathNames<String>,
) -> Response<ProxyBody> {
    let recorder = serving.proxy.recorder();
    let Some(log) = recorder.log() else {
        return AdminRefusal::NoDeliveryLog.into_response();
    };
    let Ok(id) = id.parse() else {
        return AdminRefusal::NoSuchDelivery.into_response();
    };
    match log.get(id).await {
        Ok(Some(entry)) => answer_json(StatusCode::OK, &detail(id, &entry)),
        Ok(None) => AdminRefusal::NoSuchDelivery.into_response(),
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `GET /v1/deliveries/tail?<filter>`: an event stream, each client within its
/// credential's share of the tails.
pub(super) async fn tail(
    State(tails): State<Tails>,
    Live(serving): Live,
    Extension(role): Extension<Role>,
    RawQuery(query): RawQuery,
) -> Response<ProxyBody> {
    let (tails, recorder, query) = (&tails, serving.proxy.recorder(), query.as_deref());
    let credential = role.credential();
    if recorder.log().is_none() {
        return AdminRefusal::NoDeliveryLog.into_response();
    }
    let filter = match Filter::parse(query, false) {
        Ok(listing) => listing.filter,
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    let place = match tails.take(credential) {
        Ok(place) => place,
        Err(Full::All) => {
            return AdminRefusal::TooMany(format!(
                "{TAILS_MAX} live tails run already; end one first"
            ))
            .into_response();
        }
        Err(Full::Credential) => {
            return AdminRefusal::TooMany(format!(
                "this credential runs {} live tails already, its share; end one first",
                TAILS_MAX / 2
            ))
            .into_response();
        }
    };
    let (events, frames) = mpsc::channel(TAIL_EVENTS);
    let stored = recorder.subscribe();
    let ends = Ends {
        closing: tails.closing(),
        unread: UNREAD_LIMIT,
        lifetime: TAIL_LIFETIME,
    };
    tokio::spawn(follow(stored, filter, events, ends, place));
    let mut response = Response::new(EventStream(frames).boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What ends a tail besides its client going away.
struct Ends {
    /// The proxy closing.
    closing: CancellationToken,
    /// The client reading nothing for this long.
    unread: Duration,
    /// Its age.
    lifetime: Duration,
}

/// Passes the stored entries `filter` admits to the client, until it goes away, stops
/// reading, or the tail's lifetime or the proxy ends.
async fn follow(
    mut stored: broadcast::Receiver<Stored>,
    filter: Filter,
    events: mpsc::Sender<Bytes>,
    ends: Ends,
    _place: Place,
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
    let over = tokio::time::sleep(ends.lifetime);
    tokio::pin!(over);
    let closing = &ends.closing;
    loop {
        let event = tokio::select! {
            () = closing.cancelled() => return,
            () = &mut over => {
                let _ = events.try_send(Bytes::from_static(b"event: end\ndata: {\"reason\":\"lifetime\"}\n\n"));
                return;
            }
            _ = idle.tick() => Bytes::from_static(b": keep-alive\n\n"),
            received = stored.recv() => match received {
                Ok(entry) if filter.admits(&entry.1) => {
                    let (id, entry) = &*entry;
                    let data = serde_json::to_string(&summary(*id, entry)).expect("JSON");
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
            sent = tokio::time::timeout(ends.unread, events.send(event)) => match sent {
                Ok(Ok(())) => {}
                // Gone, or reading nothing: its place goes to another client.
                Ok(Err(_)) | Err(_) => return,
            },
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

/// An entry as a page and the tail show it.
fn summary(id: LogId, entry: &LoggedDelivery) -> DeliverySummary {
    DeliverySummary {
        id: id.to_string(),
        at: rfc3339(entry.at),
        route: entry.route.clone(),
        scope: entry.scope.clone(),
        key: entry.key.clone(),
        outcome: entry.fate.as_str().to_owned(),
        refusal: entry.refusal.clone(),
        waited: entry.waited,
        replayed: entry.replayed,
        attempt: entry.attempt,
        status: (entry.status != 0).then_some(entry.status),
        upstream_status: entry.upstream_status,
        upstream_ms: entry.upstream_ms,
        duration_ms: entry.duration_ms,
        size: entry.size,
        method: entry.method.clone(),
        path: entry.path.clone(),
        request_id: entry.request_id.clone(),
        trace_id: entry.trace_id.clone(),
        client: entry.client.clone(),
        replica: entry.replica.clone(),
        body_recorded: entry.body.is_some(),
        by: entry.by.clone(),
    }
}

/// An entry whole: its recorded headers and body too.
fn detail(id: LogId, entry: &LoggedDelivery) -> DeliveryDetail {
    // Text when it is, else base64: the answer is always valid JSON.
    let (body, encoding) = match &entry.body {
        None => (None, None),
        Some(body) => match std::str::from_utf8(body) {
            Ok(text) => (Some(text.to_owned()), Some("utf-8")),
            Err(_) => (Some(BASE64_STANDARD.encode(body)), Some("base64")),
        },
    };
    DeliveryDetail {
        summary: summary(id, entry),
        headers: entry.headers.clone(),
        body_truncated: entry.body_truncated,
        body,
        body_encoding: encoding.map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::places::Places;

    fn ends(unread: Duration, lifetime: Duration) -> Ends {
        Ends {
            closing: CancellationToken::new(),
            unread,
            lifetime,
        }
    }

    fn filter() -> Filter {
        Filter::parse(None, false).unwrap().filter
    }

    /// A client that takes nothing loses its place once the buffer is full for the
    /// unread limit: the place is free for another.
    #[tokio::test(start_paused = true)]
    async fn a_tail_nobody_reads_ends_and_frees_its_place() {
        let places = Places::new(1, 1);
        let place = places.take("viewer_token").unwrap();
        let (_sender, stored) = broadcast::channel::<Stored>(4);
        let (events, _unread) = mpsc::channel(1);
        let following = tokio::spawn(follow(
            stored,
            filter(),
            events,
            ends(Duration::from_secs(30), TAIL_LIFETIME),
            place,
        ));
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!following.is_finished(), "within the unread limit");
        assert!(places.take("viewer_token").is_err());
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(following.is_finished());
        assert!(places.take("viewer_token").is_ok());
    }

    /// A tail read all along ends at its lifetime, saying so, so that the client starts
    /// another.
    #[tokio::test(start_paused = true)]
    async fn a_tail_read_all_along_ends_at_its_lifetime_saying_so() {
        let places = Places::new(1, 1);
        let place = places.take("token").unwrap();
        let (_sender, stored) = broadcast::channel::<Stored>(4);
        let (events, mut frames) = mpsc::channel(4);
        let following = tokio::spawn(follow(
            stored,
            filter(),
            events,
            ends(UNREAD_LIMIT, Duration::from_secs(60)),
            place,
        ));
        let mut last = Bytes::new();
        while let Some(frame) = frames.recv().await {
            last = frame;
        }
        assert_eq!(
            &last[..],
            b"event: end\ndata: {\"reason\":\"lifetime\"}\n\n"
        );
        assert!(following.await.is_ok());
        assert!(places.take("token").is_ok());
    }
}
