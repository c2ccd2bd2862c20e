//! The delivery lifecycle, as small named steps read top to bottom:
//!
//! ```text
//! handle ─▶ match route ──none──▶ pass_unmatched (forward untouched, or 404)
//!              │
//!              ▼
//!           deliver: read body (413) ─▶ extract key (400 / forward unkeyed)
//!              ─▶ claim ──done──▶ answer_duplicate (200, or 422 on a changed body)
//!                   │    ──in flight──▶ 409 + Retry-After
//!                   │    ──store error──▶ 503 + Retry-After (or forward unkeyed)
//!                   ▼
//!           forward_claimed: in a task of its own
//!              ─▶ upstream success ─▶ record_success (done, then answer)
//!              ─▶ upstream failure, 502, 504 ─▶ release, then answer
//! ```
//!
//! Every answer on a matched route carries `Dedupe-Status`, added in one place (`handle`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, field};

use crate::body::{self, BodyError, ProxyBody};
use crate::config::values::UpstreamUrl;
use crate::config::{Config, OnMissingKey, OnPayloadMismatch, OnStoreError, Unmatched};
use crate::key::{Delivery, KeyError};
use crate::metrics::{Metrics, ReleaseReason};
use crate::response::{self, DedupeStatus, Refusal};
use crate::route::{Route, Routing};
use crate::store::{
    Claim, ClaimOutcome, ClaimStore, Completion, DoneRecord, Fingerprint, RecordedResponse,
    store_key,
};
use crate::upstream::{self, Upstream, UpstreamError};

/// The largest upstream answer kept for `duplicate_response.replay`. Larger answers (or
/// answers without a `Content-Length`) stream through and are not replayed.
pub const REPLAY_BODY_LIMIT: u64 = 64 * 1024;

/// The proxy service: shared by every connection.
pub struct Proxy {
    /// The routes and what to do without one; a reload swaps them at once, while a
    /// delivery keeps the route it matched.
    routing: ArcSwap<Routing>,
    body_read_timeout: Duration,
    store: Arc<dyn ClaimStore>,
    upstream: Upstream,
    /// Forward tasks, which outlive their senders; shutdown waits for them.
    forwards: TaskTracker,
    open_claims: OpenClaims,
    metrics: Arc<Metrics>,
}

impl Proxy {
    /// A proxy whose connections run on `workers` workers.
    pub fn new(
        config: &Config,
        store: Arc<dyn ClaimStore>,
        metrics: Arc<Metrics>,
        workers: usize,
    ) -> Proxy {
        Proxy {
            routing: ArcSwap::from_pointee(Routing::from_config(config)),
            body_read_timeout: config.limits.body_read_timeout.0,
            store,
            upstream: Upstream::new(workers),
            forwards: TaskTracker::new(),
            open_claims: OpenClaims::default(),
            metrics,
        }
    }

    /// The routing in force now.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.load_full()
    }

    /// Puts new routing in force for the next requests.
    pub fn apply(&self, routing: Routing) {
        self.routing.store(Arc::new(routing));
    }

    pub fn store(&self) -> &Arc<dyn ClaimStore> {
        &self.store
    }

    /// This process's claims being forwarded, and the store's done records.
    pub fn key_counts(&self) -> crate::store::KeyCounts {
        crate::store::KeyCounts {
            in_flight: self.open_claims.lock().len(),
            done: self.store.done_keys(),
        }
    }

    /// Serves one request from a sender.
    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let routing = self.routing.load_full();
        let host = request_host(&request);
        let route = routing
            .table
            .find(request.method(), host.as_deref(), request.uri().path())
            .cloned();
        let Some(route) = route else {
            self.metrics.unmatched();
            return self.pass_unmatched(&routing, request, peer).await;
        };
        let span = tracing::info_span!(
            "delivery",
            route = %route.name,
            key = field::Empty,
            upstream_status = field::Empty
        );
        let started = Instant::now();
        let (outcome, response) = self
            .deliver(&route, request, peer)
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            tracing::info!(
                outcome = outcome.as_str(),
                status = response.status().as_u16(),
                elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
                "delivery answered"
            );
        });
        self.metrics.delivery(&route.name, outcome);
        response::tag(response, outcome)
    }

    /// The lifecycle of a delivery on a matched route.
    async fn deliver(
        self: &Arc<Self>,
        route: &Arc<Route>,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> (DedupeStatus, Response<ProxyBody>) {
        let policy = &route.policy;
        let (head, body) = request.into_parts();

        let read = body::read_limited(
            &head.headers,
            body,
            policy.max_body.0,
            self.body_read_timeout,
        );
        let body = match read.await {
            Ok(body) => body,
            Err(error) => {
                let refusal = match error {
                    BodyError::TooLarge { limit } => Refusal::BodyTooLarge { limit },
                    BodyError::Broken(reason) => Refusal::BodyUnreadable(reason),
                    BodyError::TimedOut(after) => Refusal::BodyTimeout(after),
                };
                return (DedupeStatus::Rejected, refusal.into_response());
            }
        };

        // A forgery must not claim (and so pre-empt) a real event's key.
        if let Some(verify) = &route.verify
            && let Err(failure) = verify.verify(&head.headers, &body, unix_now())
        {
            tracing::warn!(reason = failure.code(), %failure, "signature refused");
            self.metrics.signature_refused(&route.name, failure.code());
            return (
                DedupeStatus::Rejected,
                Refusal::Signature(failure).into_response(),
            );
        }

        let delivery = Delivery {
            headers: &head.headers,
            query: head.uri.query(),
            body: &body,
        };
        let key = match route.key.extract(&delivery) {
            Ok(key) => key,
            Err(KeyError::TooLong(length)) => {
                return (
                    DedupeStatus::Rejected,
                    Refusal::KeyTooLong(length).into_response(),
                );
            }
            Err(missing) => match policy.on_missing_key {
                OnMissingKey::Forward => {
                    tracing::debug!(%missing, "forwarding without a key");
                    return (
                        DedupeStatus::Unkeyed,
                        self.forward_unkeyed(route, head, body, peer).await,
                    );
                }
                OnMissingKey::Reject => {
                    return (
                        DedupeStatus::Rejected,
                        Refusal::MissingKey(missing.to_string()).into_response(),
                    );
                }
            },
        };
        Span::current().record("key", key.as_str());

        let fingerprint: Fingerprint = Sha256::digest(&body).into();
        let claimed = self
            .store
            .claim(
                &store_key(&route.namespace, &key),
                fingerprint,
                policy.lease.0,
            )
            .await;
        match claimed {
            Ok(ClaimOutcome::Claimed(claim)) => {
                self.forward_claimed(route, claim, head, body, &key, peer)
                    .await
            }
            Ok(ClaimOutcome::Done(record)) => self.answer_duplicate(route, record, fingerprint),
            Ok(ClaimOutcome::InFlight { .. }) => {
                let refusal = Refusal::InFlight {
                    status: policy.in_flight_status.0,
                    retry_after: policy.retry_after.0,
                };
                (DedupeStatus::InFlight, refusal.into_response())
            }
            Err(error) => {
                tracing::warn!(%error, "claim store failed");
                self.metrics.store_error();
                match policy.on_store_error {
                    OnStoreError::Forward => (
                        DedupeStatus::Unkeyed,
                        self.forward_unkeyed(route, head, body, peer).await,
                    ),
                    OnStoreError::Reject => {
                        let refusal = Refusal::StoreUnavailable {
                            retry_after: policy.retry_after.0,
                        };
                        (DedupeStatus::Unavailable, refusal.into_response())
                    }
                }
            }
        }
    }

    /// Forwards a claimed delivery in a task of its own: when the sender hangs up, hyper
    /// drops this handler's future, but the forward and the recording of its outcome
    /// must still run to their end.
    async fn forward_claimed(
        self: &Arc<Self>,
        route: &Arc<Route>,
        claim: Claim,
        head: http::request::Parts,
        body: Bytes,
        key: &str,
        peer: SocketAddr,
    ) -> (DedupeStatus, Response<ProxyBody>) {
        let key_header = route.policy.forward_key_header.then_some(key);
        let request = upstream::outbound(head, body::full(body), &route.upstream, peer, key_header);
        let (answer, answered) = oneshot::channel();
        let open = self.open_claims.hold(claim, route, self);
        let proxy = Arc::clone(self);
        let route = Arc::clone(route);
        self.forwards.spawn(
            async move {
                let outcome = proxy.forward_and_record(&route, open, request).await;
                // The sender may be gone; the outcome is recorded either way.
                let _ = answer.send(outcome);
            }
            .instrument(Span::current()),
        );
        answered.await.unwrap_or_else(|_| {
            // The task died (a panic); dropping its open claim released the key.
            (DedupeStatus::Released, Refusal::Internal.into_response())
        })
    }

    async fn forward_and_record(
        &self,
        route: &Route,
        open: OpenClaim,
        request: Request<ProxyBody>,
    ) -> (DedupeStatus, Response<ProxyBody>) {
        let started = Instant::now();
        let sent = self
            .upstream
            .send(&route.upstream, request, route.policy.upstream_timeout.0)
            .await;
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.upstream_answered(&route.name, elapsed);
        if let Ok(response) = &sent {
            Span::current().record("upstream_status", response.status().as_u16());
        }
        tracing::debug!(elapsed_ms = elapsed * 1000.0, "upstream answered");
        let outcome = match sent {
            Ok(response) if route.is_success(response.status()) => (
                DedupeStatus::Forwarded,
                self.record_success(route, open.claim(), response).await,
            ),
            Ok(response) => {
                self.release(route, open.claim(), ReleaseReason::UpstreamStatus)
                    .await;
                (DedupeStatus::Released, upstream::inbound(response))
            }
            Err(error) => {
                tracing::warn!(%error, "forward failed");
                let (reason, refusal) = match error {
                    UpstreamError::Unreachable(detail) => (
                        ReleaseReason::UpstreamUnreachable,
                        Refusal::UpstreamUnreachable(detail),
                    ),
                    UpstreamError::Timeout(after) => (
                        ReleaseReason::UpstreamTimeout,
                        Refusal::UpstreamTimeout(after),
                    ),
                };
                self.release(route, open.claim(), reason).await;
                (DedupeStatus::Released, refusal.into_response())
            }
        };
        open.settle();
        outcome
    }

    /// Marks the key done, then hands back the upstream's answer. If the mark cannot be
    /// written the answer is still the upstream's success: the work happened, and an
    /// error would make the provider run it again at once.
    async fn record_success(
        &self,
        route: &Route,
        claim: &Claim,
        response: Response<Incoming>,
    ) -> Response<ProxyBody> {
        let upstream_status = response.status().as_u16();
        let (response, recorded) = if route.policy.duplicate_response.replay {
            keep_for_replay(response, route.policy.upstream_timeout.0).await
        } else {
            (upstream::inbound(response), None)
        };
        let completion = Completion {
            upstream_status,
            retention: route.policy.retention.0,
            response: recorded,
        };
        if let Err(error) = self.store.finish(claim, completion).await {
            self.metrics.store_error();
            tracing::error!(%error, "upstream succeeded but the done mark was not recorded; a redelivery of this event would run again");
        }
        response
    }

    async fn release(&self, route: &Route, claim: &Claim, reason: ReleaseReason) {
        release(&*self.store, &self.metrics, &route.name, claim, reason).await;
    }

    /// Forwards without deduplication (`on_missing_key` or `on_store_error: forward`).
    async fn forward_unkeyed(
        &self,
        route: &Route,
        head: http::request::Parts,
        body: Bytes,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let timeout = route.policy.upstream_timeout.0;
        self.relay(&route.upstream, head, body::full(body), peer, timeout)
            .await
    }

    /// A request no route matches: streamed through untouched, or refused.
    async fn pass_unmatched(
        &self,
        routing: &Routing,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        if routing.unmatched == Unmatched::Reject {
            return Refusal::NoRoute.into_response();
        }
        let (head, body) = request.into_parts();
        let upstream = &routing.fallback_upstream;
        let timeout = routing.unmatched_timeout;
        self.relay(upstream, head, body::streaming(body), peer, timeout)
            .await
    }

    /// Sends to `upstream` without a claim and relays whatever comes back.
    async fn relay(
        &self,
        upstream: &UpstreamUrl,
        head: http::request::Parts,
        body: ProxyBody,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Response<ProxyBody> {
        let request = upstream::outbound(head, body, upstream, peer, None);
        match self.upstream.send(upstream, request, timeout).await {
            Ok(response) => upstream::inbound(response),
            Err(UpstreamError::Unreachable(detail)) => {
                Refusal::UpstreamUnreachable(detail).into_response()
            }
            Err(UpstreamError::Timeout(after)) => Refusal::UpstreamTimeout(after).into_response(),
        }
    }

    /// Waits up to `grace` for forward tasks to finish, then releases the claims of those
    /// still running, so that the provider's retry is forwarded at once after a restart.
    pub async fn drain(&self, grace: Duration) {
        self.forwards.close();
        if tokio::time::timeout(grace, self.forwards.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.forwards.len(),
                "forwards still running when the shutdown grace ended"
            );
        }
        for (route, claim) in self.open_claims.take_all() {
            release(
                &*self.store,
                &self.metrics,
                &route,
                &claim,
                ReleaseReason::Shutdown,
            )
            .await;
        }
    }

    /// The answer to a delivery whose key is done.
    fn answer_duplicate(
        &self,
        route: &Route,
        record: DoneRecord,
        fingerprint: Fingerprint,
    ) -> (DedupeStatus, Response<ProxyBody>) {
        if record.fingerprint != fingerprint {
            tracing::warn!(
                "duplicate key with a different body than the delivery that was processed"
            );
            self.metrics.payload_mismatch(&route.name);
            if route.policy.on_payload_mismatch == OnPayloadMismatch::Reject {
                return (
                    DedupeStatus::Rejected,
                    Refusal::PayloadMismatch.into_response(),
                );
            }
        }
        (
            DedupeStatus::Duplicate,
            response::duplicate(&route.policy.duplicate_response, record.response),
        )
    }
}

/// Releases a claim so that a retry runs the work, counting why.
async fn release(
    store: &dyn ClaimStore,
    metrics: &Metrics,
    route: &str,
    claim: &Claim,
    reason: ReleaseReason,
) {
    match store.release(claim).await {
        Ok(()) => {
            metrics.released(route, reason);
            tracing::debug!(reason = reason.as_str(), "claim released");
        }
        Err(error) => {
            if matches!(error, crate::store::StoreError::Backend(_)) {
                metrics.store_error();
            }
            tracing::warn!(%error, reason = reason.as_str(), key = %claim.key, "claim not released; the key frees itself when its lease ends");
        }
    }
}

/// Buffers a small upstream answer so that duplicates can be answered with it; a large
/// or unsized one streams through and is not kept.
async fn keep_for_replay(
    response: Response<Incoming>,
    timeout: Duration,
) -> (Response<ProxyBody>, Option<RecordedResponse>) {
    let small = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|length| length <= REPLAY_BODY_LIMIT);
    if !small {
        return (upstream::inbound(response), None);
    }
    let (head, body) = upstream::inbound(response).into_parts();
    let body = match tokio::time::timeout(timeout, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => {
            tracing::warn!("upstream answer body failed; relaying the status without it");
            return (Response::from_parts(head, body::empty()), None);
        }
    };
    let recorded = RecordedResponse {
        status: head.status.as_u16(),
        content_type: head
            .headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned),
        body: body.clone(),
    };
    (Response::from_parts(head, body::full(body)), Some(recorded))
}

/// The Unix time in seconds, for signature timestamps.
fn unix_now() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// The host a request was sent to: its `Host` header, or an HTTP/2 request's authority.
fn request_host(request: &Request<Incoming>) -> Option<String> {
    request
        .headers()
        .get(HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| {
            request
                .uri()
                .authority()
                .map(|authority| authority.as_str())
        })
        .map(str::to_owned)
}

/// Claims whose forward is under way, with their route's name. Shutdown releases the
/// ones still open when its grace ends; a forward task that dies without settling
/// releases its own.
#[derive(Clone, Default)]
struct OpenClaims(Arc<Mutex<HashMap<u128, (String, Claim)>>>);

impl OpenClaims {
    fn hold(&self, claim: Claim, route: &Route, proxy: &Proxy) -> OpenClaim {
        self.lock()
            .insert(claim.token, (route.name.clone(), claim.clone()));
        OpenClaim {
            registry: self.clone(),
            claim,
            route: route.name.clone(),
            store: Arc::clone(&proxy.store),
            metrics: Arc::clone(&proxy.metrics),
            settled: false,
        }
    }

    fn take_all(&self) -> Vec<(String, Claim)> {
        self.lock().drain().map(|(_, open)| open).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, (String, Claim)>> {
        // The map stays consistent even if a holder panicked.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A claim being forwarded: settled once finished or released.
struct OpenClaim {
    registry: OpenClaims,
    claim: Claim,
    route: String,
    store: Arc<dyn ClaimStore>,
    metrics: Arc<Metrics>,
    settled: bool,
}

impl OpenClaim {
    fn claim(&self) -> &Claim {
        &self.claim
    }

    fn settle(mut self) {
        self.settled = true;
    }
}

impl Drop for OpenClaim {
    fn drop(&mut self) {
        let still_open = self.registry.lock().remove(&self.claim.token).is_some();
        if still_open && !self.settled {
            let (store, metrics) = (Arc::clone(&self.store), Arc::clone(&self.metrics));
            let (route, claim) = (self.route.clone(), self.claim.clone());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    release(&*store, &metrics, &route, &claim, ReleaseReason::TaskFailed).await;
                });
            }
        }
    }
}
