//! Requests forwarded without a claim (no route takes them, no usable key, or the store
//! failing with `on_store_error: forward`): relayed within their half of the places, and
//! a relay's place kept past an abandoned relay until its timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::Semaphore;
use tracing::{Instrument, Span};

use super::answers::failure;
use super::noted::{UpstreamAnswer, mark};
use crate::body::{self, ProxyBody};
use crate::config::defaults;
use crate::response::Refusal;
use crate::route::{Routing, Unmatched};
use crate::server::RequestPermit;
use crate::telemetry;
use crate::upstream::{self, Upstream, UpstreamError};
use crate::values::UpstreamUrl;

/// What relaying a request without a claim needs of the proxy.
pub(super) struct Relaying<'p> {
    pub(super) upstream: &'p Upstream,
    /// The relays' half of the request places.
    pub(super) places: &'p Arc<Semaphore>,
    pub(super) body_read_timeout: Duration,
}

impl Relaying<'_> {
    /// A request no route matches: streamed through untouched, or refused. One that a
    /// `_method` in its body could take to a route (`overridable`) is read first, within
    /// the default `max_body`, and refused if it names one.
    pub(super) async fn pass_unmatched(
        &self,
        routing: &Routing,
        request: Request<Incoming>,
        peer: SocketAddr,
        permit: RequestPermit,
        overridable: bool,
    ) -> Response<ProxyBody> {
        if routing.unmatched == Unmatched::Reject {
            return Refusal::NoRoute.into_response();
        }
        let (head, body) = request.into_parts();
        let body = if overridable {
            let read = body::read_limited(
                &head.headers,
                body,
                defaults::MAX_BODY,
                self.body_read_timeout,
            )
            .await;
            let read = read.map_err(Refusal::from).and_then(|read| {
                super::routing::body_stays_on(routing, &head, &read, None)?;
                Ok(read)
            });
            match read {
                Ok(read) => body::full(read),
                Err(refusal) => return refusal.into_response(),
            }
        } else {
            body::streaming(body)
        };
        let upstream = &routing.fallback_upstream;
        match upstream::outbound(head, body, upstream, peer, None) {
            Ok(request) => {
                self.relay(upstream, request, routing.unmatched_timeout, permit)
                    .await
            }
            Err(unforwardable) => Refusal::from(unforwardable).into_response(),
        }
    }

    /// Sends a request (made by [`upstream::outbound`]) to `upstream` without a claim,
    /// within the relays' half of the places, and relays whatever comes back. A sender
    /// who hangs up must not free its place while the application may still work on its
    /// request, or hanging up in a loop would drive the application without bound: an
    /// abandoned relay keeps its place until its timeout.
    pub(super) async fn relay(
        &self,
        upstream: &UpstreamUrl,
        mut request: Request<ProxyBody>,
        timeout: Duration,
        permit: RequestPermit,
    ) -> Response<ProxyBody> {
        let Ok(place) = Arc::clone(self.places).try_acquire_owned() else {
            return Refusal::Overloaded.into_response();
        };
        permit.also_hold(place);
        let place = RelayPlace::keep(permit, timeout);
        // On a matched route (unkeyed, or the store failing) the relay is its delivery's
        // forward; a request no route took has no trace of its own, and passes untouched.
        let step = if Span::current().is_none() {
            Span::none()
        } else {
            telemetry::step_span!("forward")
        };
        telemetry::propagate(&step, request.headers_mut());
        let started = std::time::Instant::now();
        let sent = self
            .upstream
            .send(&upstream.address, request, timeout, &AtomicBool::new(false))
            .instrument(step)
            .await;
        place.answered();
        let answered = UpstreamAnswer {
            status: sent
                .as_ref()
                .ok()
                .map(|response| response.status().as_u16()),
            elapsed: started.elapsed(),
        };
        let response = match sent {
            Ok(response) => upstream::inbound(response),
            Err(error) => {
                // A sender that breaks off its own body must not fill the log.
                if matches!(error, UpstreamError::SenderBody(_)) {
                    tracing::debug!(%error, "forward failed");
                } else {
                    tracing::warn!(%error, "forward failed");
                }
                let (_, refusal) = failure(error);
                refusal.into_response()
            }
        };
        mark(response, answered)
    }
}

/// A relay's place, kept until its timeout if the relay is dropped (its sender hung up)
/// before the upstream answered: the application may still be working on it, and the
/// proxy cannot know when it stops. Costs a task only when abandoned.
pub(super) struct RelayPlace {
    permit: Option<RequestPermit>,
    deadline: tokio::time::Instant,
}

impl RelayPlace {
    pub(super) fn keep(permit: RequestPermit, timeout: Duration) -> RelayPlace {
        RelayPlace {
            permit: Some(permit),
            deadline: tokio::time::Instant::now() + timeout,
        }
    }

    /// The upstream answered (or failed): the place goes with the response.
    pub(super) fn answered(mut self) {
        self.permit = None;
    }
}

impl Drop for RelayPlace {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let deadline = self.deadline;
            runtime.spawn(async move {
                tokio::time::sleep_until(deadline).await;
                drop(permit);
            });
        }
    }
}
