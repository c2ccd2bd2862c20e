//! The delivery lifecycle, as small named steps read top to bottom:
//!
//! ```text
//! handle ─▶ check Host and target (400) ─▶ match route on the path's normal form
//!              │ none ──▶ pass_unmatched (relay untouched within half the places, or 404)
//!              ▼
//!           deliver ─▶ check: read body (413, 408) ─▶ verify (401) ─▶ extract key
//!                               (400 / relay unkeyed)
//!              ─▶ claim_and_forward: claim the key, and with replay_guard: body the body's hash
//!                   ──done──▶ answer_duplicate (200, or 422 on a changed body)
//!                   ──in flight──▶ 409 + Retry-After, or with `on_in_flight: wait`,
//!                                  wait_for_outcome (then as done, held, or claimed)
//!                   ──held──▶ 409 + Retry-After (held)
//!                   ──store error──▶ 503 + Retry-After (or relay unkeyed)
//!              ▼
//!           forward_claimed: in a task of its own, holding the request's place
//!              ─▶ forward_in_order (`order:`): an event older than its entity's newest
//!                 done version is marked `Dedupe-Stale`, or skipped (done, 200 stale)
//!              ─▶ upstream success ─▶ record_success (done, the entity's version, answer)
//!              ─▶ upstream failure, 502, 504 ─▶ release, then answer
//!              ─▶ with `on_ambiguous: hold`, 504 or a connection lost after the request
//!                 ─▶ hold, then answer
//! ```
//!
//! Every answer on a matched route carries `Dedupe-Status`, added in one place (`handle`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderName;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use parking_lot::{Mutex, MutexGuard};
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, field};

use crate::body::{self, ProxyBody};
use crate::config::Config;
use crate::key::{Delivery, KeyError};
use crate::metrics::{KeyCounts, LeaseRenewal, Metrics, OrderCheck, ReleaseReason};
use crate::order::{Guard, OnStale, Ordered};
use crate::preset::FingerprintScope;
use crate::response::{self, DedupeStatus, Refusal};
use crate::route::{
    OnAmbiguous, OnInFlight, OnMissingKey, OnPayloadMismatch, OnStoreError, ReplayGuard, Route,
    Routing, Unmatched,
};
use crate::server::RequestPermit;
use crate::store::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, DoneRecord, Fingerprint,
    RecordedResponse, STALE_SKIPPED_STATUS, StoreError, Version, body_key, store_key,
};
use crate::target::{self, TargetError};
use crate::telemetry;
use crate::upstream::{self, DEDUPE_STALE, Upstream, UpstreamError};
use crate::values::UpstreamUrl;
use crate::verify::SignatureWork;
use crate::waiting::{Waiting, Woken};

/// The largest upstream answer kept for `duplicate_response.replay`: its body and the
/// headers recorded with it. Larger answers (or answers without a `Content-Length`)
/// stream through and are not replayed.
pub const REPLAY_RECORD_LIMIT: u64 = 64 * 1024;

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
    /// Requests forwarded without a claim (no route, no key, or the store failing) may use
    /// at most half of `limits.max_requests`: the other half stays for deliveries, however
    /// slow the application's other pages are, or whoever asks for them.
    relay_places: Arc<Semaphore>,
    open_claims: ClaimRegistry,
    /// Deliveries waiting for the outcome of their key (`on_in_flight: wait`), at most a
    /// quarter of `limits.max_requests`.
    waiting: Arc<Waiting>,
    /// Where large signature checks run, apart from the workers.
    signature_work: SignatureWork,
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
        let routing = config.routing();
        metrics.expect_routes(routing.table.names_and_checks());
        let waiting = Arc::new(Waiting::new(config.limits.max_requests / 4));
        let hearing = Arc::downgrade(&waiting);
        store.hear_outcomes(Arc::new(move |key| {
            if let Some(waiting) = hearing.upgrade() {
                waiting.announce(key);
            }
        }));
        Proxy {
            routing: ArcSwap::from_pointee(routing),
            body_read_timeout: config.limits.body_read_timeout.0,
            store,
            upstream: Upstream::new(workers),
            forwards: TaskTracker::new(),
            relay_places: Arc::new(Semaphore::new((config.limits.max_requests / 2).max(1))),
            open_claims: ClaimRegistry::default(),
            waiting,
            signature_work: SignatureWork::new(workers),
            metrics,
        }
    }

    /// The routing in force now.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.load_full()
    }

    /// Puts new routing in force for the next requests.
    pub fn set_routing(&self, routing: Routing) {
        self.metrics.expect_routes(routing.table.names_and_checks());
        self.routing.store(Arc::new(routing));
    }

    pub fn store(&self) -> &Arc<dyn ClaimStore> {
        &self.store
    }

    /// This process's claims being forwarded, and the store's done records.
    pub fn key_counts(&self) -> KeyCounts {
        KeyCounts {
            in_flight: self.open_claims.lock().len(),
            waiting: self.waiting.count(),
            done: self.store.done_keys(),
        }
    }

    /// Serves one request from a sender, holding `permit` for as long as it costs anything.
    pub async fn handle(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        peer: SocketAddr,
        permit: RequestPermit,
    ) -> Response<ProxyBody> {
        // What the app will not see must not choose the route either.
        upstream::strip_hop_by_hop(request.headers_mut());
        let routing = self.routing.load_full();
        let route = match find_route(&routing, &request) {
            Ok(route) => route.cloned(),
            Err(error) => {
                self.metrics.bad_request();
                return Refusal::BadTarget(error.to_string()).into_response();
            }
        };
        let Some(route) = route else {
            self.metrics.unmatched();
            return self.pass_unmatched(&routing, request, peer, permit).await;
        };
        let span = tracing::info_span!(
            "delivery",
            route = %route.name,
            key = field::Empty,
            upstream_status = field::Empty,
            trace_id = field::Empty
        );
        telemetry::continue_trace(&span, request.headers());
        let started = Instant::now();
        let (outcome, response) = self
            .deliver(&route, request, peer, permit)
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            let (status, elapsed_ms) = (
                response.status().as_u16(),
                started.elapsed().as_micros() as f64 / 1000.0,
            );
            // A refusal is whatever a sender chose to send: at info level, anyone could
            // fill the log. Its count is in the metrics.
            if outcome == DedupeStatus::Rejected {
                tracing::debug!(
                    outcome = outcome.as_str(),
                    status,
                    elapsed_ms,
                    "delivery answered"
                );
            } else {
                tracing::info!(
                    outcome = outcome.as_str(),
                    status,
                    elapsed_ms,
                    "delivery answered"
                );
            }
        });
        self.metrics.delivery(&route.name, outcome);
        telemetry::answered(&span, outcome.as_str(), response.status().as_u16());
        let response = if route.policy.problem_details {
            response::as_problem(response)
        } else {
            response
        };
        response::tag(response, outcome)
    }

    /// The lifecycle of a delivery on a matched route: check, claim, then forward or
    /// answer.
    async fn deliver(
        self: &Arc<Self>,
        route: &Arc<Route>,
        request: Request<Incoming>,
        peer: SocketAddr,
        permit: RequestPermit,
    ) -> Answer {
        match self.check(route, request, peer).await {
            Err(refusal) => (DedupeStatus::Rejected, refusal.into_response()),
            Ok(Checked::Unkeyed(request)) => {
                let timeout = route.policy.upstream_timeout;
                let response = self.relay(&route.upstream, request, timeout, permit).await;
                (DedupeStatus::Unkeyed, response)
            }
            Ok(Checked::Keyed {
                key,
                fingerprint,
                request,
                guard,
            }) => {
                let request = Outbound { request, guard };
                self.claim_and_forward(route, &key, fingerprint, request, permit)
                    .await
            }
        }
    }

    /// Reads the body (bounded), checks its signature, extracts its key and builds the
    /// request for the application: every step that needs no store. A refusal here has
    /// stored nothing.
    async fn check(
        &self,
        route: &Route,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Checked, Refusal> {
        let policy = &route.policy;
        let (head, body) = request.into_parts();
        let body = body::read_limited(&head.headers, body, policy.max_body, self.body_read_timeout)
            .await?;

        // A forgery must not claim (and so pre-empt) a real event's key. Refusals are logged
        // at debug level only, and counted: a forger must not flood the log.
        if let Some(verify) = &route.verify {
            let checked = async {
                let pending = verify.prepare(&head.headers, unix_now())?;
                self.signature_work.check(&route.name, pending, &body).await
            }
            .instrument(telemetry::step_span!("verify"))
            .await;
            checked.map_err(|failure| {
                tracing::debug!(reason = failure.code(), %failure, "signature refused");
                self.metrics.signature_refused(&route.name, failure.code());
                Refusal::Signature(failure)
            })?;
        }

        let delivery = Delivery {
            headers: &head.headers,
            query: head.uri.query(),
            body: &body,
        };
        let key = match route.key.extract(&delivery) {
            Ok(key) => key,
            Err(KeyError::TooLong(length)) => return Err(Refusal::KeyTooLong(length)),
            Err(missing) if policy.on_missing_key == OnMissingKey::Forward => {
                tracing::debug!(%missing, "forwarding without a key");
                let request =
                    upstream::outbound(head, body::full(body), &route.upstream, peer, None)?;
                return Ok(Checked::Unkeyed(request));
            }
            Err(missing) => return Err(Refusal::MissingKey(missing.to_string())),
        };
        Span::current().record("key", key.as_str());
        telemetry::keyed(&key);
        let guard = route
            .order
            .as_ref()
            .map_or(Guard::Off, |order| order.read(&route.namespace, &delivery));

        let fingerprint = fingerprint(policy.fingerprint, &head, &body);
        // Built before the claim, so that a request that cannot be forwarded claims nothing.
        let key_header = policy.forward_key_header.then_some(key.as_str());
        let request =
            upstream::outbound(head, body::full(body), &route.upstream, peer, key_header)?;
        Ok(Checked::Keyed {
            key,
            fingerprint,
            request,
            guard,
        })
    }

    /// Claims the key and acts on what the store says: forwards a claimed delivery,
    /// answers a duplicate or one in flight, or follows `on_store_error`.
    async fn claim_and_forward(
        self: &Arc<Self>,
        route: &Arc<Route>,
        key: &str,
        fingerprint: Fingerprint,
        request: Outbound,
        permit: RequestPermit,
    ) -> Answer {
        let policy = &route.policy;
        let claimed = self
            .claim(route, key, fingerprint)
            .instrument(telemetry::step_span!("claim"))
            .await;
        match claimed {
            Ok(Claiming::Claimed(open)) => self.forward_claimed(route, open, request, permit).await,
            Ok(Claiming::Done(record)) => self.answer_duplicate(route, record, fingerprint),
            Ok(Claiming::InFlight) if policy.on_in_flight == OnInFlight::Wait => {
                self.wait_for_outcome(route, key, fingerprint, request, permit)
                    .await
            }
            Ok(Claiming::InFlight) => in_flight(route),
            Ok(Claiming::Held) => held(route),
            Err(error) => {
                self.store_failed(route, error, request.request, permit)
                    .await
            }
        }
    }

    /// `on_in_flight: wait`: waits, within `in_flight_wait`, for the delivery that holds
    /// the key to finish or release it, and answers as that outcome says: the duplicate
    /// answer, or this delivery's own forward. Looks at the store again whenever this
    /// process announces an outcome of the key (or its body), and every `RECHECK`.
    async fn wait_for_outcome(
        self: &Arc<Self>,
        route: &Arc<Route>,
        key: &str,
        fingerprint: Fingerprint,
        request: Outbound,
        permit: RequestPermit,
    ) -> Answer {
        let until = tokio::time::Instant::now() + route.policy.in_flight_wait;
        let mut keys = vec![store_key(&route.namespace, key)];
        if route.replay_guard != ReplayGuard::Off {
            keys.push(body_key(&route.namespace, &fingerprint));
        }
        let Some(mut waiter) = self.waiting.register(&route.namespace, keys) else {
            return in_flight(route);
        };
        let mut last_look = false;
        loop {
            // The first look repeats the claim that found the key in flight, on purpose:
            // the waiter is registered now, so an outcome announced from here on wakes it.
            match self.claim(route, key, fingerprint).await {
                Ok(Claiming::Claimed(open)) => {
                    // A forward may take long: its place among the waiters goes back now.
                    drop(waiter);
                    return self.forward_claimed(route, open, request, permit).await;
                }
                Ok(Claiming::Done(record)) => {
                    return self.answer_duplicate(route, record, fingerprint);
                }
                Ok(Claiming::Held) => return held(route),
                Ok(Claiming::InFlight) if last_look => return in_flight(route),
                Ok(Claiming::InFlight) => {}
                // The key was in flight: forwarding now (`on_store_error: forward`) could
                // run the work twice. Look again later; the wait's end answers in flight.
                Err(error) => {
                    tracing::warn!(%error, "claim store failed while waiting for an outcome");
                    self.metrics.store_error();
                    if last_look {
                        return in_flight(route);
                    }
                }
            }
            // However a wake-up comes, the worker gets to run its other tasks in between.
            tokio::task::coop::consume_budget().await;
            match waiter.wait(until).await {
                Woken::Look => {}
                // One more look: an outcome may have landed on another replica since.
                Woken::TimedOut => last_look = true,
                Woken::Closing => return in_flight(route),
            }
        }
    }

    /// Ends every wait for an outcome with the in-flight answer, and starts no new one.
    pub fn stop_waiting(&self) {
        self.waiting.close();
    }

    /// The store could not claim: the delivery is forwarded unclaimed or refused, as the
    /// route's `on_store_error` says.
    async fn store_failed(
        &self,
        route: &Route,
        error: StoreError,
        mut request: Request<ProxyBody>,
        permit: RequestPermit,
    ) -> Answer {
        tracing::warn!(%error, "claim store failed");
        self.metrics.store_error();
        let policy = &route.policy;
        match policy.on_store_error {
            OnStoreError::Forward => {
                request.headers_mut().remove(&upstream::DEDUPE_KEY);
                let timeout = policy.upstream_timeout;
                let response = self.relay(&route.upstream, request, timeout, permit).await;
                (DedupeStatus::Unkeyed, response)
            }
            OnStoreError::Reject => unavailable(route),
        }
    }

    /// Claims the delivery's key and, when the route guards against replays, its body:
    /// a body done under another key answers as that key's duplicate. From the first
    /// claim on, the claims are released if the delivery goes no further (its sender hangs
    /// up while the store answers, say).
    async fn claim(
        &self,
        route: &Arc<Route>,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Claiming, StoreError> {
        let lease = route.policy.lease;
        // Other replicas' waiting duplicates learn of the outcome through the store.
        let announce = route.policy.on_in_flight == OnInFlight::Wait;
        let event_key = store_key(&route.namespace, key);
        let event = match self.store.claim(&event_key, fingerprint, lease).await? {
            ClaimOutcome::Claimed(claim) => Claim { announce, ..claim },
            ClaimOutcome::Done(record) => return Ok(Claiming::Done(record)),
            ClaimOutcome::InFlight { .. } => return Ok(Claiming::InFlight),
            ClaimOutcome::Held(_) => return Ok(Claiming::Held),
        };
        let mut open = self.open_claims.register(event, route, self);
        if route.replay_guard == ReplayGuard::Off {
            return Ok(Claiming::Claimed(open));
        }
        let body = body_key(&route.namespace, &fingerprint);
        let outcome = match self.store.claim(&body, fingerprint, lease).await {
            Ok(ClaimOutcome::Claimed(claim)) => {
                open.add_body(Claim { announce, ..claim });
                return Ok(Claiming::Claimed(open));
            }
            Ok(ClaimOutcome::Done(record)) => {
                tracing::debug!("a body already done under another key: a replay with a new ID");
                Ok(Claiming::Done(record))
            }
            Ok(ClaimOutcome::InFlight { .. }) => Ok(Claiming::InFlight),
            Ok(ClaimOutcome::Held(_)) => Ok(Claiming::Held),
            Err(error) => Err(error),
        };
        // The event key was claimed only to learn the body's fate: give it back unrecorded.
        open.give_back().await;
        outcome
    }

    /// Forwards a claimed delivery in a task of its own: when the sender hangs up, hyper
    /// drops this handler's future, but the forward and the recording of its outcome
    /// must still run to their end, and keep their place among `max_requests` meanwhile.
    async fn forward_claimed(
        self: &Arc<Self>,
        route: &Arc<Route>,
        mut open: OpenClaim,
        request: Outbound,
        permit: RequestPermit,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let (dropped, settled_on_drop) = oneshot::channel();
        open.if_dropped = ReleaseReason::TaskFailed;
        open.on_drop = Some(dropped);
        let proxy = Arc::clone(self);
        let route = Arc::clone(route);
        self.forwards.spawn(
            async move {
                let claims = open.claims().clone();
                let handling = proxy.forward_in_order(&route, open, request);
                let outcome = proxy.renewing(route.policy.lease, &claims, handling).await;
                // The sender may be gone; the outcome is recorded either way.
                let _ = answer.send(outcome);
                drop(permit);
            }
            .instrument(Span::current()),
        );
        match answered.await {
            Ok(answer) => answer,
            // The task died (a panic): dropping its open claim held the key if the request
            // had gone out on a route that holds (and the hold was written), else released it.
            Err(_) => {
                let status = match settled_on_drop.await {
                    Ok(true) => DedupeStatus::Held,
                    _ => DedupeStatus::Released,
                };
                (status, Refusal::Internal.into_response())
            }
        }
    }

    /// Runs `handling` (a claimed delivery's forward and the recording of its outcome)
    /// while renewing its claims every third of their lease: however long the app, its
    /// answer's body or the store take, no claim ends while this proxy still handles its
    /// delivery and reaches the store.
    async fn renewing<T>(
        &self,
        lease: Duration,
        claims: &Claims,
        handling: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(handling);
        tokio::select! {
            biased;
            done = &mut handling => return done,
            () = self.renew_until_settled(lease, claims) => {}
        }
        handling.await
    }

    /// Renews `claims` every third of `lease` until they are settled (or lost). A renewal
    /// the store does not answer is tried again sooner, within the lease.
    async fn renew_until_settled(&self, lease: Duration, claims: &Claims) {
        let period = lease / 3;
        let mut next = tokio::time::Instant::now() + period;
        let settling = || claims.progress.settling.load(Ordering::SeqCst);
        loop {
            tokio::time::sleep_until(next).await;
            let mut failed = false;
            for claim in claims.iter() {
                if settling() {
                    return;
                }
                match self.store.renew(claim, lease).await {
                    Ok(()) => self.metrics.lease_renewal(LeaseRenewal::Renewed),
                    Err(StoreError::NotOwner) if settling() => return,
                    Err(StoreError::NotOwner) => {
                        self.metrics.lease_renewal(LeaseRenewal::Lost);
                        tracing::error!(key = %claim.key, "the claim's lease was taken over while its delivery still runs: the event may run twice (the store was out of reach for longer than the lease)");
                        return;
                    }
                    Err(error) => {
                        self.metrics.store_error();
                        self.metrics.lease_renewal(LeaseRenewal::Failed);
                        tracing::warn!(%error, key = %claim.key, "a lease could not be renewed; trying again");
                        failed = true;
                    }
                }
            }
            next = tokio::time::Instant::now() + if failed { period / 4 } else { period };
        }
    }

    /// With `order:`, forwards as the guard's verdict says: an event older than the newest
    /// done for its entity is forwarded marked with `Dedupe-Stale`, or skipped.
    async fn forward_in_order(&self, route: &Route, open: OpenClaim, outbound: Outbound) -> Answer {
        let Outbound { mut request, guard } = outbound;
        let on_stale = route.order.as_ref().map(|order| order.on_stale);
        match self.order_verdict(route, guard).await {
            Verdict::Unguarded => self.forward_and_record(route, open, request, None).await,
            Verdict::InOrder(ordered) => {
                self.forward_and_record(route, open, request, Some(&ordered))
                    .await
            }
            Verdict::Stale(_) if on_stale == Some(OnStale::Skip) => {
                let completion = Completion {
                    upstream_status: STALE_SKIPPED_STATUS,
                    retention: route.policy.retention,
                    response: None,
                };
                self.mark_done(open.claims(), &completion).await;
                open.settle();
                (DedupeStatus::Stale, response::stale())
            }
            Verdict::Stale(newest) => {
                // A version's text is digits or an RFC 3339 time: always a header value.
                if let Ok(value) = http::HeaderValue::from_str(&newest.text) {
                    request.headers_mut().insert(DEDUPE_STALE.clone(), value);
                }
                self.forward_and_record(route, open, request, None).await
            }
            // Its version is still recorded on success: recording only ever raises it.
            Verdict::StoreFailed(ordered)
                if route.policy.on_store_error == OnStoreError::Forward =>
            {
                self.forward_and_record(route, open, request, Some(&ordered))
                    .await
            }
            Verdict::StoreFailed(_) => {
                self.release(route, open.claims(), ReleaseReason::StoreError)
                    .await;
                open.settle();
                unavailable(route)
            }
        }
    }

    /// Compares a claimed event's version with the newest done for its entity, and counts
    /// what it found.
    async fn order_verdict(&self, route: &Route, guard: Guard) -> Verdict {
        let (order, ordered) = match (&route.order, guard) {
            (Some(order), Guard::Versioned(ordered)) => (order, ordered),
            (_, Guard::Unversioned(reason)) => {
                tracing::debug!(%reason, "forwarded without the order check");
                self.metrics
                    .order_checked(&route.name, OrderCheck::Unversioned);
                return Verdict::Unguarded;
            }
            _ => return Verdict::Unguarded,
        };
        let newest = match self.store.newest_version(&ordered.store_key).await {
            Ok(newest) => newest.map(|record| record.newest),
            Err(error) => {
                if matches!(error, StoreError::Backend(_)) {
                    self.metrics.store_error();
                }
                tracing::warn!(%error, entity = %ordered.entity, "claim store failed while reading the entity's newest version");
                self.metrics
                    .order_checked(&route.name, OrderCheck::StoreError);
                return Verdict::StoreFailed(ordered);
            }
        };
        match newest.filter(|newest| newest.sort_key > ordered.version.sort_key) {
            Some(newest) => {
                let (check, action) = match order.on_stale {
                    OnStale::Mark => (OrderCheck::StaleMarked, "marked"),
                    OnStale::Skip => (OrderCheck::StaleSkipped, "skipped"),
                };
                tracing::info!(entity = %ordered.entity, version = %ordered.version.text, newest = %newest.text, action, "stale event");
                self.metrics.order_checked(&route.name, check);
                Verdict::Stale(newest)
            }
            None => {
                self.metrics.order_checked(&route.name, OrderCheck::InOrder);
                Verdict::InOrder(ordered)
            }
        }
    }

    /// Forwards a claimed delivery and records its outcome; on success, `advance` is the
    /// entity's version to record as done (`order:`).
    async fn forward_and_record(
        &self,
        route: &Route,
        open: OpenClaim,
        mut request: Request<ProxyBody>,
        advance: Option<&Ordered>,
    ) -> Answer {
        let started = Instant::now();
        let step = telemetry::step_span!("forward");
        telemetry::propagate(&step, request.headers_mut());
        let sent = self
            .upstream
            .send(
                &route.upstream.address,
                request,
                route.policy.upstream_timeout,
                &open.claims.progress.dispatched,
            )
            .instrument(step)
            .await;
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.upstream_answered(&route.name, elapsed);
        if let Ok(response) = &sent {
            Span::current().record("upstream_status", response.status().as_u16());
        }
        tracing::debug!(elapsed_ms = elapsed * 1000.0, "upstream answered");
        let outcome = self
            .record_outcome(route, &open, sent, advance)
            .instrument(telemetry::step_span!("record"))
            .await;
        open.settle();
        outcome
    }

    /// Records what the forward came to: the key done (and the entity's version), released
    /// for a retry, or held.
    async fn record_outcome(
        &self,
        route: &Route,
        open: &OpenClaim,
        sent: Result<Response<Incoming>, UpstreamError>,
        advance: Option<&Ordered>,
    ) -> Answer {
        match sent {
            Ok(response) if route.is_success(response.status()) => (
                DedupeStatus::Forwarded,
                self.record_success(route, open.claims(), response, advance)
                    .await,
            ),
            Ok(response) => {
                self.release(route, open.claims(), ReleaseReason::UpstreamStatus)
                    .await;
                (DedupeStatus::Released, upstream::inbound(response))
            }
            Err(error) => {
                tracing::warn!(%error, "forward failed");
                let ambiguity = ambiguity(&error);
                let (reason, refusal) = failure(error);
                match ambiguity {
                    Some(ambiguity) if route.policy.on_ambiguous == OnAmbiguous::Hold => {
                        let retention = route.policy.retention;
                        let held = self
                            .hold(&route.name, retention, open.claims(), ambiguity)
                            .await;
                        let status = if held {
                            DedupeStatus::Held
                        } else {
                            DedupeStatus::Released
                        };
                        (status, refusal.into_response())
                    }
                    _ => {
                        self.release(route, open.claims(), reason).await;
                        (DedupeStatus::Released, refusal.into_response())
                    }
                }
            }
        }
    }

    /// Holds `claims` (see [`hold_claims`]); returns whether the event's key is held.
    async fn hold(
        &self,
        route: &str,
        retention: Duration,
        claims: &Claims,
        ambiguity: Ambiguity,
    ) -> bool {
        let (store, waiting, metrics) = (&*self.store, &*self.waiting, &*self.metrics);
        hold_claims(store, waiting, metrics, route, retention, claims, ambiguity).await
    }

    /// Records the entity's version (`order:`) and marks the key (and a guarded body)
    /// done, then hands back the upstream's answer. If a mark cannot be written the answer is still
    /// the upstream's success: the work happened, and an error would make the provider run
    /// it again at once.
    async fn record_success(
        &self,
        route: &Route,
        claims: &Claims,
        response: Response<Incoming>,
        advance: Option<&Ordered>,
    ) -> Response<ProxyBody> {
        let upstream_status = response.status().as_u16();
        let (response, recorded) = if route.policy.duplicate_response.replay {
            let replayed = &route.policy.duplicate_response.replay_headers;
            keep_for_replay(response, replayed, route.policy.upstream_timeout).await
        } else {
            (upstream::inbound(response), None)
        };
        let completion = Completion {
            upstream_status,
            retention: route.policy.retention,
            response: recorded,
        };
        // The version first: should the done mark then fail, the redelivery carries the
        // same version, which is not stale, and runs as it would without `order`.
        if let Some(ordered) = advance {
            let retention = route.policy.retention;
            let recorded = self
                .store
                .record_version(&ordered.store_key, &ordered.version, retention)
                .await;
            if let Err(error) = recorded {
                if matches!(error, StoreError::Backend(_)) {
                    self.metrics.store_error();
                }
                tracing::error!(%error, "upstream succeeded but the entity's version was not recorded; an older event of it will not be found stale");
            }
        }
        self.mark_done(claims, &completion).await;
        response
    }

    /// Marks the claims done, waking their waiters.
    async fn mark_done(&self, claims: &Claims, completion: &Completion) {
        claims.progress.settling.store(true, Ordering::SeqCst);
        for claim in claims.iter() {
            if let Err(error) = self.store.finish(claim, completion.clone()).await {
                self.metrics.store_error();
                tracing::error!(%error, "the done mark was not recorded; a redelivery of this event would run again");
            }
            self.waiting.announce(&claim.key);
        }
    }

    async fn release(&self, route: &Route, claims: &Claims, reason: ReleaseReason) {
        release_claims(
            &*self.store,
            &self.waiting,
            &self.metrics,
            &route.name,
            claims,
            reason,
        )
        .await;
    }

    /// A request no route matches: streamed through untouched, or refused.
    async fn pass_unmatched(
        &self,
        routing: &Routing,
        request: Request<Incoming>,
        peer: SocketAddr,
        permit: RequestPermit,
    ) -> Response<ProxyBody> {
        if routing.unmatched == Unmatched::Reject {
            return Refusal::NoRoute.into_response();
        }
        let (head, body) = request.into_parts();
        let upstream = &routing.fallback_upstream;
        match upstream::outbound(head, body::streaming(body), upstream, peer, None) {
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
    async fn relay(
        &self,
        upstream: &UpstreamUrl,
        mut request: Request<ProxyBody>,
        timeout: Duration,
        permit: RequestPermit,
    ) -> Response<ProxyBody> {
        let Ok(place) = Arc::clone(&self.relay_places).try_acquire_owned() else {
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
        let sent = self
            .upstream
            .send(&upstream.address, request, timeout, &AtomicBool::new(false))
            .instrument(step)
            .await;
        place.answered();
        match sent {
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
        }
    }

    /// Waits up to `grace` for forward tasks to finish, then releases the claims of those
    /// still running, so that the provider's retry is forwarded at once after a restart;
    /// on a route with `on_ambiguous: hold`, those whose request went out are held.
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
        // Each claim is settled under the route it started with: a reload since may have
        // renamed, changed or removed that route.
        for Registered { route, claims } in self.open_claims.take_all() {
            let policy = &route.policy;
            if policy.on_ambiguous == OnAmbiguous::Hold
                && claims.progress.dispatched.load(Ordering::SeqCst)
                && self
                    .hold(&route.name, policy.retention, &claims, Ambiguity::Shutdown)
                    .await
            {
                continue;
            }
            release_claims(
                &*self.store,
                &self.waiting,
                &self.metrics,
                &route.name,
                &claims,
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
    ) -> Answer {
        if record.fingerprint != fingerprint {
            tracing::debug!(
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

/// The answer to a delivery whose key another delivery holds.
fn in_flight(route: &Route) -> Answer {
    let refusal = Refusal::InFlight {
        status: route.policy.in_flight_status,
        retry_after: route.policy.retry_after,
    };
    (DedupeStatus::InFlight, refusal.into_response())
}

/// The answer to a delivery refused because the store failed (`on_store_error: reject`).
fn unavailable(route: &Route) -> Answer {
    let refusal = Refusal::StoreUnavailable {
        retry_after: route.policy.retry_after,
    };
    (DedupeStatus::Unavailable, refusal.into_response())
}

/// The answer to a delivery whose key is held.
fn held(route: &Route) -> Answer {
    let refusal = Refusal::Held {
        status: route.policy.in_flight_status,
        retry_after: route.policy.retry_after,
    };
    (DedupeStatus::Held, refusal.into_response())
}

/// Releases a delivery's claims so that a retry (or a waiting duplicate) runs the work,
/// counting why (once per delivery).
async fn release_claims(
    store: &dyn ClaimStore,
    waiting: &Waiting,
    metrics: &Metrics,
    route: &str,
    claims: &Claims,
    reason: ReleaseReason,
) {
    claims.progress.settling.store(true, Ordering::SeqCst);
    let mut released = false;
    for claim in claims.iter() {
        match store.release(claim).await {
            Ok(()) => released = true,
            Err(error) => {
                if matches!(error, StoreError::Backend(_)) {
                    metrics.store_error();
                }
                tracing::warn!(%error, reason = reason.as_str(), key = %claim.key, "claim not released; the key frees itself when its lease ends");
            }
        }
        waiting.announce(&claim.key);
    }
    if released {
        metrics.released(route, reason);
        tracing::debug!(reason = reason.as_str(), "claim released");
    }
}

/// `on_ambiguous: hold`: the application may have done the work, so nothing runs it
/// again until an operator resolves the key. Returns whether the event's key is held.
/// If its hold cannot be written, the key stays in flight until its lease ends (then a
/// redelivery runs the work), and a guarded body is released rather than held alone,
/// where no operator could reach it.
async fn hold_claims(
    store: &dyn ClaimStore,
    waiting: &Waiting,
    metrics: &Metrics,
    route: &str,
    retention: Duration,
    claims: &Claims,
    ambiguity: Ambiguity,
) -> bool {
    claims.progress.settling.store(true, Ordering::SeqCst);
    let held = hold_claim(store, waiting, metrics, &claims.event, retention, ambiguity).await;
    if let Some(body) = &claims.body {
        if held {
            hold_claim(store, waiting, metrics, body, retention, ambiguity).await;
        } else if let Err(error) = store.release(body).await {
            tracing::warn!(%error, "claim not released; the key frees itself when its lease ends");
        }
        waiting.announce(&body.key);
    }
    if held {
        tracing::warn!(
            reason = ambiguity.as_str(),
            route,
            key = %claims.event.key,
            "delivery held: the application may have done the work; nothing runs it again until an operator resolves the key (POST /v1/keys/{{route}}/{{key}}/resolve)"
        );
    }
    held
}

async fn hold_claim(
    store: &dyn ClaimStore,
    waiting: &Waiting,
    metrics: &Metrics,
    claim: &Claim,
    retention: Duration,
    ambiguity: Ambiguity,
) -> bool {
    let held = match store.hold(claim, ambiguity, retention).await {
        Ok(()) => true,
        Err(error) => {
            if matches!(error, StoreError::Backend(_)) {
                metrics.store_error();
            }
            tracing::error!(%error, key = %claim.key, "the key could not be held; when its lease ends a redelivery runs the work again");
            false
        }
    };
    waiting.announce(&claim.key);
    held
}

/// A relay's place, kept until its timeout if the relay is dropped (its sender hung up)
/// before the upstream answered: the application may still be working on it, and the
/// proxy cannot know when it stops. Costs a task only when abandoned.
struct RelayPlace {
    permit: Option<RequestPermit>,
    deadline: tokio::time::Instant,
}

impl RelayPlace {
    fn keep(permit: RequestPermit, timeout: Duration) -> RelayPlace {
        RelayPlace {
            permit: Some(permit),
            deadline: tokio::time::Instant::now() + timeout,
        }
    }

    /// The upstream answered (or failed): the place goes with the response.
    fn answered(mut self) {
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

/// Why a forward got no answer, as a release reason and the sender's answer.
fn failure(error: UpstreamError) -> (ReleaseReason, Refusal) {
    match error {
        UpstreamError::Unreachable(_) => (
            ReleaseReason::UpstreamUnreachable,
            Refusal::UpstreamUnreachable,
        ),
        UpstreamError::Dropped(_) => (ReleaseReason::UpstreamDropped, Refusal::UpstreamUnreachable),
        UpstreamError::SenderBody(detail) => {
            (ReleaseReason::Abandoned, Refusal::BodyUnreadable(detail))
        }
        UpstreamError::Timeout(after) => (
            ReleaseReason::UpstreamTimeout,
            Refusal::UpstreamTimeout(after),
        ),
    }
}

/// Whether a failed forward may have reached the application: a refused connection did
/// not; a timeout, or a connection lost after the request went out, may have.
fn ambiguity(error: &UpstreamError) -> Option<Ambiguity> {
    match error {
        UpstreamError::Unreachable(_) => None,
        UpstreamError::Timeout(_) => Some(Ambiguity::UpstreamTimeout),
        // Part of the request may have reached the app.
        UpstreamError::Dropped(_) | UpstreamError::SenderBody(_) => {
            Some(Ambiguity::UpstreamDropped)
        }
    }
}

/// The route a request goes to, if any, once its host and target are found sound: the
/// first that takes it in any reading an application may take of it.
fn find_route<'r>(
    routing: &'r Routing,
    request: &Request<Incoming>,
) -> Result<Option<&'r Arc<Route>>, TargetError> {
    let target = target::addressed(
        request.version(),
        request.method(),
        request.uri(),
        request.headers(),
        routing.table.limits_hosts(),
    )?;
    routing.table.find(&target)
}

/// What a delivery ends with: its `Dedupe-Status` and the answer.
type Answer = (DedupeStatus, Response<ProxyBody>);

/// A delivery that passed every step that needs no store.
enum Checked {
    /// Ready to claim its key, with the request for the application built.
    Keyed {
        key: String,
        fingerprint: Fingerprint,
        request: Request<ProxyBody>,
        guard: Guard,
    },
    /// Without a usable key, on a route that forwards such deliveries unclaimed.
    Unkeyed(Request<ProxyBody>),
}

/// A keyed delivery's request for the application, and what it carries for the order
/// guard.
struct Outbound {
    request: Request<ProxyBody>,
    guard: Guard,
}

/// What the order guard found for a claimed delivery.
enum Verdict {
    /// No `order:`, no usable version: forwarded as it is.
    Unguarded,
    /// Not older than the entity's newest done version: forwarded, and its version
    /// recorded on success.
    InOrder(Ordered),
    /// Older than `Version`, the entity's newest done.
    Stale(Version),
    /// The store could not say: `on_store_error` decides.
    StoreFailed(Ordered),
}

/// What claiming a delivery found.
enum Claiming {
    Claimed(OpenClaim),
    Done(DoneRecord),
    InFlight,
    Held,
}

/// The claims one delivery holds: its event key's, and its body's when the route guards
/// against replays. They are finished or released together.
#[derive(Debug, Clone)]
struct Claims {
    event: Claim,
    body: Option<Claim>,
    progress: Arc<Progress>,
}

/// How far a claimed delivery has gone, as the shutdown drain and the lease renewals see
/// it.
#[derive(Debug, Default)]
struct Progress {
    /// Its request went to the app (see `Upstream::send`).
    dispatched: AtomicBool,
    /// Its claims are being finished, held or released: a renewal refused from now on was
    /// refused because of that, not because the lease was lost.
    settling: AtomicBool,
}

impl Claims {
    fn iter(&self) -> impl Iterator<Item = &Claim> {
        std::iter::once(&self.event).chain(self.body.as_ref())
    }
}

/// Buffers a small upstream answer so that duplicates can be answered with it, with the
/// headers `replay_headers` names; a large or unsized one streams through and is not
/// kept. Small means its body and those headers within [`REPLAY_RECORD_LIMIT`].
async fn keep_for_replay(
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
    let small = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|length| length.saturating_add(headers_size) <= REPLAY_RECORD_LIMIT);
    if !small {
        return (response, None);
    }
    let (head, body) = response.into_parts();
    let body = match tokio::time::timeout(timeout, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => {
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

/// The hash a duplicate's is compared with: of the body, or of the method, the target
/// (path and query, as sent) and the body, each length-prefixed, so that no two requests
/// share their bytes.
fn fingerprint(scope: FingerprintScope, head: &http::request::Parts, body: &[u8]) -> Fingerprint {
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

/// The Unix time in seconds, for signature timestamps.
fn unix_now() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// Claims whose forward is under way, with their route's name. Shutdown releases (or
/// holds) the ones still open when its grace ends; a delivery dropped before it settles
/// its claims (its sender left before the forward began, or the forward task died)
/// releases its own.
#[derive(Clone, Default)]
struct ClaimRegistry(Arc<Mutex<HashMap<u128, Registered>>>);

/// An open claim as the registry keeps it.
struct Registered {
    /// The route the delivery matched, as it was then.
    route: Arc<Route>,
    claims: Claims,
}

impl ClaimRegistry {
    fn register(&self, event: Claim, route: &Arc<Route>, proxy: &Proxy) -> OpenClaim {
        let claims = Claims {
            event,
            body: None,
            progress: Arc::default(),
        };
        let registered = Registered {
            route: Arc::clone(route),
            claims: claims.clone(),
        };
        self.lock().insert(claims.event.token, registered);
        OpenClaim {
            registry: self.clone(),
            claims,
            store: Arc::clone(&proxy.store),
            waiting: Arc::clone(&proxy.waiting),
            metrics: Arc::clone(&proxy.metrics),
            settled: false,
            if_dropped: ReleaseReason::Abandoned,
            on_drop: None,
            forwards: proxy.forwards.clone(),
        }
    }

    fn take_all(&self) -> Vec<Registered> {
        self.lock().drain().map(|(_, open)| open).collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u128, Registered>> {
        self.0.lock()
    }
}

/// A delivery's claims until they are settled: finished or released.
struct OpenClaim {
    registry: ClaimRegistry,
    claims: Claims,
    store: Arc<dyn ClaimStore>,
    waiting: Arc<Waiting>,
    metrics: Arc<Metrics>,
    settled: bool,
    /// Why the claims are released if this is dropped unsettled.
    if_dropped: ReleaseReason,
    /// Told, if this is dropped unsettled, whether its claims were held.
    on_drop: Option<oneshot::Sender<bool>>,
    /// Where a dropped claim is settled: among the forwards, which a drain waits for.
    forwards: TaskTracker,
}

impl OpenClaim {
    fn claims(&self) -> &Claims {
        &self.claims
    }

    /// Adds the body's claim (a route that guards against replays).
    fn add_body(&mut self, body: Claim) {
        self.claims.body = Some(body);
        if let Some(registered) = self.registry.lock().get_mut(&self.claims.event.token) {
            registered.claims.body.clone_from(&self.claims.body);
        }
    }

    /// Releases the claims without counting a release, or waking waiters: nothing was
    /// forwarded, and what stopped it (the body's own claim) still stands.
    async fn give_back(mut self) {
        self.settled = true;
        self.claims.progress.settling.store(true, Ordering::SeqCst);
        self.registry.lock().remove(&self.claims.event.token);
        for claim in self.claims.iter() {
            if let Err(error) = self.store.release(claim).await {
                tracing::warn!(%error, "claim not released; the key frees itself when its lease ends");
            }
        }
    }

    fn settle(mut self) {
        self.settled = true;
    }
}

impl Drop for OpenClaim {
    fn drop(&mut self) {
        let Some(Registered { route, .. }) = self.registry.lock().remove(&self.claims.event.token)
        else {
            return;
        };
        if self.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, waiting) = (Arc::clone(&self.store), Arc::clone(&self.waiting));
        let metrics = Arc::clone(&self.metrics);
        let (claims, reason, told) = (self.claims.clone(), self.if_dropped, self.on_drop.take());
        // A forward that failed after its request went out may have done the work: on a
        // route that holds such keys, it is held like any other ambiguous forward.
        let hold = reason == ReleaseReason::TaskFailed
            && route.policy.on_ambiguous == OnAmbiguous::Hold
            && claims.progress.dispatched.load(Ordering::SeqCst);
        let settling = async move {
            let held = if hold {
                let (name, retention) = (&route.name, route.policy.retention);
                let ambiguity = Ambiguity::ForwardFailed;
                hold_claims(
                    &*store, &waiting, &metrics, name, retention, &claims, ambiguity,
                )
                .await
            } else {
                release_claims(&*store, &waiting, &metrics, &route.name, &claims, reason).await;
                false
            };
            if let Some(told) = told {
                let _ = told.send(held);
            }
        };
        self.forwards.spawn_on(settling, &runtime);
    }
}
