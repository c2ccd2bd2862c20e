//! The accepting step of `delivery: queued`: a claimed delivery is stored as a job and
//! acknowledged, and the key marked done (its retention counting from the acceptance), so
//! that a duplicate gets the duplicate answer while the job waits. A request is only
//! acknowledged once its job is durable; a store that cannot keep it gets 503, and the
//! sender tries again.
//!
//! Stored and marked done in a task of its own: a sender that hangs up while the job is
//! being stored cancels nothing, so its retry finds the key done. On sled the job's record
//! keeps the key's done record, one write for both. On Redis and PostgreSQL the job is
//! stored, then the key marked done: a crash between the two leaves a job and a claim
//! that frees itself when its lease ends; the sender, unanswered, sends again, and the
//! enqueue finds the job there if it is not delivered yet (if it is, the app gets the
//! event a second time, with `Dedupe-Attempt: 1`: the one case outside the attempts' own
//! window).

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response};

use super::answers::{Answer, unavailable};
use super::ledger::{Ledger, OpenClaim};
use crate::body::{self, ProxyBody};
use crate::key::{Delivery, KeyTemplate};
use crate::metrics::{Metrics, ReleaseReason};
use crate::queue::{Deliveries, Unplaced};
use crate::response::{self, DedupeStatus, Refusal};
use crate::route::Route;
use crate::store::queue::{Enqueued, Job, QueuedRequest};
use crate::store::{Clock, Completion, QUEUED_STATUS, SystemClock};

/// What storing a claimed delivery as a job needs of the proxy.
pub(super) struct Enqueuing<'p> {
    pub(super) ledger: &'p Ledger,
    pub(super) metrics: &'p Metrics,
    pub(super) deliveries: Option<&'p Arc<Deliveries>>,
}

impl Enqueuing<'_> {
    /// Stores the job and marks the key done (in one write where the store can); a store
    /// that cannot keep the job gets the claim released and a 503.
    pub(super) async fn store_job(
        &self,
        route: &Arc<Route>,
        open: OpenClaim,
        request: Request<ProxyBody>,
        body: Bytes,
    ) -> Answer {
        let (Some(deliveries), Some(policy)) = (self.deliveries, &route.policy.queue) else {
            tracing::error!("a queued route on a store without a queue");
            return self.keep_nothing(route, open, unavailable(route)).await;
        };
        let place = match deliveries.place(&route.name, policy.max_queued).await {
            Ok(place) => place,
            Err(Unplaced::Full) => {
                tracing::debug!(max_queued = policy.max_queued, "the queue is full");
                let retry_after = route.policy.retry_after;
                let full = Refusal::QueueFull { retry_after }.into_response();
                return self
                    .keep_nothing(route, open, (DedupeStatus::Unavailable, full))
                    .await;
            }
            Err(Unplaced::Store(error)) => {
                tracing::warn!(%error, "the queue could not be counted");
                self.metrics.store_error();
                return self.keep_nothing(route, open, unavailable(route)).await;
            }
        };
        let mut job = Job::new(
            open.claims().event.key.clone(),
            route.name.clone(),
            SystemClock.now(),
            stored_request(&request, body),
        );
        job.lane = lane(policy.order_by.as_ref(), &request, &job.request.body);
        let done = Completion {
            upstream_status: QUEUED_STATUS,
            retention: route.policy.retention,
            response: None,
        };
        // Where the store's queue keeps the done record in the job, one write for both.
        let stored = match self.ledger.enqueue_done(open.claims(), &job, &done).await {
            Ok(Some(enqueued)) => Ok((enqueued, true)),
            Ok(None) => deliveries
                .enqueue(&job)
                .await
                .map(|enqueued| (enqueued, false)),
            Err(error) => Err(error),
        };
        match stored {
            Ok((enqueued, marked)) => {
                if enqueued == Enqueued::Stored {
                    place.keep();
                }
                if marked {
                    open.settled_by_store();
                } else {
                    open.finish(&done).await;
                }
                if enqueued == Enqueued::AlreadyQueued {
                    tracing::debug!("the event was queued already");
                    let duplicate = response::duplicate(&route.policy.duplicate_response, None);
                    return (DedupeStatus::Duplicate, duplicate);
                }
                deliveries.accepted(&route.name);
                let mut answer = Response::new(body::full(policy.accepted_body.clone()));
                *answer.status_mut() = policy.accepted_status;
                answer
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                (DedupeStatus::Queued, answer)
            }
            Err(error) => {
                tracing::warn!(%error, "the delivery could not be queued");
                self.metrics.store_error();
                self.keep_nothing(route, open, unavailable(route)).await
            }
        }
    }

    /// Releases the claim of a request whose job is not stored, and answers `answer`.
    async fn keep_nothing(&self, route: &Arc<Route>, open: OpenClaim, answer: Answer) -> Answer {
        open.release(route, ReleaseReason::StoreError).await;
        answer
    }
}

/// The job's lane, if the route orders its deliveries: an event the template cannot read
/// goes without one, delivered as soon as it can be (refusing it would lose it).
fn lane(
    order_by: Option<&KeyTemplate>,
    request: &Request<ProxyBody>,
    body: &[u8],
) -> Option<String> {
    let delivery = Delivery {
        headers: request.headers(),
        query: request.uri().query(),
        body,
    };
    match order_by?.extract(&delivery) {
        Ok(lane) => Some(lane),
        Err(error) => {
            tracing::debug!(%error, "the event has no lane: delivered unordered");
            None
        }
    }
}

/// The request as the upstream will get it, apart from each attempt's own headers.
fn stored_request(request: &Request<ProxyBody>, body: Bytes) -> QueuedRequest {
    QueuedRequest {
        method: request.method().as_str().to_owned(),
        target: request
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |target| target.as_str().to_owned()),
        headers: request
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    Bytes::copy_from_slice(value.as_bytes()),
                )
            })
            .collect(),
        body,
    }
}
