//! One attempt at delivering a taken job: the stored request sent again with the
//! attempt's own headers, the answer's start kept, and the job settled as the route's
//! policy says (delivered, due again, or dead).
//!
//! The one window in which the app may see a job twice: an attempt whose answer did not
//! come (a timeout, a connection lost after the request went out), or whose success the
//! store did not record (a crash between the app's answer and the completion, a visibility
//! that ended first), is tried again. The app tells a retry by `Dedupe-Attempt` above 1.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderValue, Request, StatusCode};

use crate::body::{self, ProxyBody};
use crate::delivery_log::Recorder;
use crate::metrics::{AttemptResult, Metrics};
use crate::route::Route;
use crate::route::delivery::{Answered, Next, QueuePolicy};
use crate::store::log::{Fate, LoggedDelivery};
use crate::store::queue::{ANSWER_KEPT, Attempt, DeliveryQueue, Job, Taken};
use crate::store::{Clock, StoreError, rfc3339};
use crate::upstream::{DEDUPE_ATTEMPT, DEDUPE_RECEIVED_AT, Upstream};

/// The most of an answer read to keep its start: a longer one is not read on.
const ANSWER_READ: u64 = 64 << 10;

/// What an attempt needs: the way to the app, the queue, the metrics and the time.
pub(super) struct AttemptContext {
    pub(super) upstream: Upstream,
    pub(super) queue: Arc<dyn DeliveryQueue>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) recorder: Arc<Recorder>,
}

/// Delivers a taken job once and settles it.
pub(super) async fn deliver(
    context: &AttemptContext,
    route: &Route,
    policy: &QueuePolicy,
    taken: Taken,
) {
    let mut job = taken.job.clone();
    let started_at = context.clock.now();
    let started = Instant::now();
    let (status, headers, detail) = match request(&job, taken.attempt.max(1)) {
        Ok(request) => send(context, route, request).await,
        Err(error) => (None, http::HeaderMap::new(), Bytes::from(error)),
    };
    job.record(Attempt {
        at: started_at,
        latency_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        status: status.map(|status| status.as_u16()),
        detail,
    });
    let answered = match status {
        Some(status) => Answered::Status(status, &headers),
        None => Answered::Failed,
    };
    let now = context.clock.now();
    let next = policy.next(
        answered,
        |status| route.is_success(status),
        job.attempts_this_round(),
        job.round_started(),
        now,
        rand::random::<f64>(),
    );
    let name = &route.name;
    let metrics = &context.metrics.queue;
    let settled = match next {
        Next::Delivered => {
            let seconds = now.saturating_sub(job.received_at) as f64 / 1000.0;
            let within = policy
                .target
                .is_some_and(|target| seconds <= target.as_secs_f64());
            metrics.delivered(name, seconds, within);
            metrics.attempted(name, AttemptResult::Delivered);
            tracing::info!(route = %name, key = %job.key, attempt = job.attempted, "queued event delivered");
            context.queue.complete(&taken).await
        }
        Next::RetryAt(at) => {
            metrics.attempted(name, AttemptResult::Retried);
            tracing::info!(route = %name, key = %job.key, attempt = job.attempted, status = ?status, in_ms = at.saturating_sub(now), "queued event to be tried again");
            context.queue.retry(&taken, &job, at).await
        }
        Next::Dead(reason) => {
            job.dead = Some((now, reason));
            metrics.attempted(name, AttemptResult::Dead);
            // Reported as a dead letter once it is one on disk.
            let buried = context.queue.bury(&taken, &job).await;
            if buried.is_ok() {
                metrics.died(name, reason.as_str());
                tracing::warn!(route = %name, key = %job.key, attempt = job.attempted, status = ?status, reason = reason.as_str(), "queued event put in dead letters");
            }
            buried
        }
    };
    // A dead letter is logged once buried; another attempt's end, as it is.
    if settled.is_ok() || !matches!(next, Next::Dead(_)) {
        log_attempt(context, route, &job, &next, started_at);
    }
    match settled {
        Ok(()) => {}
        Err(StoreError::NotOwner) => {
            tracing::warn!(route = %name, key = %job.key, "a queued job was taken again before its attempt ended (its visibility ran out); the later attempt decides");
        }
        Err(error) => {
            metrics.store_error(name);
            tracing::error!(route = %name, key = %job.key, %error, "the attempt's outcome was not recorded; the job is due again when its visibility ends");
        }
    }
}

/// Puts the attempt `job` just recorded in the delivery log, with what follows it.
fn log_attempt(context: &AttemptContext, route: &Route, job: &Job, next: &Next, started_at: u64) {
    if context.recorder.enabled() {
        let fate = match next {
            Next::Delivered => Fate::Delivered,
            Next::RetryAt(_) => Fate::Retrying,
            Next::Dead(_) => Fate::Dead,
        };
        context
            .recorder
            .record(logged(route, job, fate, started_at));
    }
}

/// The delivery log's entry of the attempt `job` just recorded.
fn logged(route: &Route, job: &Job, fate: Fate, started_at: u64) -> LoggedDelivery {
    let last = job.history.last();
    let target = &job.request.target;
    let key = job
        .key
        .strip_prefix(&route.namespace)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or(&job.key);
    LoggedDelivery {
        at: started_at,
        route: Some(route.name.clone()),
        scope: Some(route.namespace.clone()),
        key: Some(key.to_owned()),
        fate,
        refusal: None,
        waited: false,
        replayed: false,
        attempt: Some(job.attempted),
        status: 0,
        upstream_status: last.and_then(|attempt| attempt.status),
        upstream_ms: last.map(|attempt| u32::try_from(attempt.latency_ms).unwrap_or(u32::MAX)),
        duration_ms: last.map_or(0, |attempt| {
            u32::try_from(attempt.latency_ms).unwrap_or(u32::MAX)
        }),
        size: Some(job.request.body.len() as u64),
        method: job.request.method.clone(),
        path: target
            .split_once('?')
            .map_or(target.as_str(), |(path, _)| path)
            .to_owned(),
        request_id: None,
        trace_id: None,
        client: None,
        replica: None,
        headers: Vec::new(),
        body: None,
        body_truncated: false,
        by: None,
    }
}

/// Sends the request; the answer's status, headers and start, or why there was none.
async fn send(
    context: &AttemptContext,
    route: &Route,
    request: Request<ProxyBody>,
) -> (Option<StatusCode>, http::HeaderMap, Bytes) {
    let timeout = route.policy.upstream_timeout;
    let sent = context
        .upstream
        .send(
            &route.upstream.address,
            request,
            timeout,
            &AtomicBool::new(false),
        )
        .await;
    match sent {
        Ok(response) => {
            let (head, body) = response.into_parts();
            let read = body::read_limited(&head.headers, body, ANSWER_READ, timeout).await;
            let mut start = read.unwrap_or_default();
            start.truncate(ANSWER_KEPT);
            (Some(head.status), head.headers, start)
        }
        Err(error) => (None, http::HeaderMap::new(), Bytes::from(error.to_string())),
    }
}

/// The job's request, with this attempt's headers.
fn request(job: &Job, attempt: u32) -> Result<Request<ProxyBody>, String> {
    let stored = &job.request;
    let mut request = Request::builder()
        .method(stored.method.as_str())
        .uri(stored.target.as_str())
        .body(body::full(stored.body.clone()))
        .map_err(|error| format!("the stored request cannot be sent: {error}"))?;
    let headers = request.headers_mut();
    for (name, value) in &stored.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value.clone()),
        ) else {
            return Err(format!("the stored header `{name}` cannot be sent"));
        };
        headers.append(name, value);
    }
    headers.insert(DEDUPE_ATTEMPT.clone(), HeaderValue::from(attempt));
    if let Ok(value) = HeaderValue::from_str(&rfc3339(job.received_at)) {
        headers.insert(DEDUPE_RECEIVED_AT.clone(), value);
    }
    Ok(request)
}
