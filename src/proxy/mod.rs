//! The delivery lifecycle, as small named steps read top to bottom:
//!
//! ```text
//! handle ─▶ check Host and target (400) ─▶ match route on the path's normal form
//!              │ none ──▶ pass_unmatched (relay untouched within half the places, or 404)
//!              ▼
//!           deliver ─▶ check: read body (413, 408) ─▶ verify (401) ─▶ extract key
//!                               (400 / relay unkeyed)
//!              ─▶ claim_and_forward: claim the key (and, with `replay_guard: body`, the body's hash)
//!                   ──done──▶ answer_duplicate (200, or 422 on a changed body)
//!                   ──in flight──▶ 409 + Retry-After, or with `on_in_flight: wait`,
//!                                  wait_for_outcome (then as done, held, or claimed)
//!                   ──held──▶ 409 + Retry-After (held)
//!                   ──store error──▶ 503 + Retry-After (or relay unkeyed)
//!              ▼
//!           after_claim, with `delivery: queued` ─▶ accept_queued: in a task of its own,
//!              store the job (503 if it cannot be kept, or the queue is full), mark the
//!              key done, answer 202 (a job already there: the duplicate answer)
//!           after_claim, otherwise ─▶ forward_claimed: in a task of its own, holding the request's place
//!              ─▶ forward_in_order (`order:`): an event older than its entity's newest
//!                 done version is marked `Dedupe-Stale`, or skipped (done, 200 stale)
//!              ─▶ upstream success ─▶ record_success (done, the entity's version, answer)
//!              ─▶ upstream failure, 502, 504 ─▶ release, then answer
//!              ─▶ with `on_ambiguous: hold`, 504 or a connection lost after the request
//!                 ─▶ hold, then answer
//! ```
//!
//! Every answer on a matched route carries `Dedupe-Status`, added in one place (`handle`).
//!
//! Beside the lifecycle: `ledger.rs` keeps each delivery's claims until they are settled
//! (renewed meanwhile; done, released or held as the forward ended, or at shutdown),
//! `answers.rs` the answers to deliveries not forwarded and what a failed forward means,
//! `replay.rs` the fingerprint and the kept answer a duplicate gets, `accept.rs` the
//! accepting step of queued delivery, `outbound.rs` a keyed delivery's request (checked
//! before the claim, built after it), `relay.rs` the requests forwarded without a claim
//! (no route, no key, or the store failing) and their places, and `stale.rs` the order
//! guard's verdict on a claimed delivery.

mod accept;
mod answers;
mod ledger;
mod noted;
pub(crate) mod operator;
mod outbound;
mod relay;
mod replay;
mod routing;
mod stale;

use self::answers::{Answer, held, in_flight, unavailable};
use self::ledger::{Ledger, OpenClaim};
use self::noted::{Captured, Noted, Replayed, UpstreamAnswer, Waited, mark};
use self::outbound::{CheckedRequest, Outbound};
use self::replay::fingerprint;
use self::routing::{body_stays_on, find_route};
use self::stale::Verdict;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, field};

use crate::body::{self, ProxyBody};
use crate::config::Config;
use crate::delivery_log::Recorder;
use crate::key::{Delivery, KeyError};
use crate::metrics::{KeyCounts, Metrics, ReleaseReason};
use crate::order::{Guard, OnStale, Ordered};
use crate::queue::Deliveries;
use crate::response::{self, DedupeStatus, Refusal};
use crate::route::{
    OnInFlight, OnMissingKey, OnPayloadMismatch, OnStoreError, ReplayGuard, Route, Routing,
};
use crate::server::RequestPermit;
use crate::store::{
    Claim, ClaimOutcome, ClaimStore, Completion, DoneRecord, Fingerprint, STALE_SKIPPED_STATUS,
    StoreError, body_key, store_key,
};
use crate::telemetry;
use crate::upstream::{self, DEDUPE_STALE, Upstream};
use crate::verify::SignatureWork;
use crate::waiting::{Waiting, Woken};

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
    /// The claims of the deliveries under way, until they are settled.
    ledger: Ledger,
    /// Deliveries waiting for the outcome of their key (`on_in_flight: wait`), at most a
    /// quarter of `limits.max_requests`.
    waiting: Arc<Waiting>,
    /// Where large signature checks run, apart from the workers.
    signature_work: SignatureWork,
    metrics: Arc<Metrics>,
    /// The delivery of queued routes' jobs, when the store keeps a queue.
    deliveries: Option<Arc<Deliveries>>,
    /// What became of each request, for the delivery log.
    recorder: Arc<Recorder>,
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
        let recorder = Arc::new(Recorder::start(
            &config.delivery_log,
            store.delivery_log(),
            Arc::clone(&metrics),
        ));
        let deliveries = store
            .queue()
            .map(|queue| Deliveries::new(queue, Arc::clone(&metrics), Arc::clone(&recorder)));
        if let Some(deliveries) = &deliveries {
            deliveries.set_routes(routing.table.shared_routes());
        }
        let forwards = TaskTracker::new();
        let ledger = Ledger::new(
            Arc::clone(&store),
            Arc::clone(&waiting),
            Arc::clone(&metrics),
            forwards.clone(),
        );
        Proxy {
            routing: ArcSwap::from_pointee(routing),
            body_read_timeout: config.limits.body_read_timeout.0,
            store,
            upstream: Upstream::new(workers),
            relay_places: Arc::new(Semaphore::new((config.limits.max_requests / 2).max(1))),
            ledger,
            forwards,
            waiting,
            signature_work: SignatureWork::new(workers),
            metrics,
            deliveries,
            recorder,
        }
    }

    /// The routing in force now.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.load_full()
    }

    /// Puts new routing in force for the next requests.
    pub fn set_routing(&self, routing: Routing) {
        self.metrics.expect_routes(routing.table.names_and_checks());
        if let Some(deliveries) = &self.deliveries {
            deliveries.set_routes(routing.table.shared_routes());
        }
        self.routing.store(Arc::new(routing));
    }

    pub fn store(&self) -> &Arc<dyn ClaimStore> {
        &self.store
    }

    /// Stores a claimed delivery as a job and marks its key done (`accept.rs`), in a task
    /// of its own that keeps the request's place, then answers `accepted_status`.
    async fn accept_queued(
        self: &Arc<Self>,
        route: &Arc<Route>,
        open: OpenClaim,
        outbound: Outbound,
        permit: RequestPermit,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let (proxy, route) = (Arc::clone(self), Arc::clone(route));
        self.forwards.spawn(
            async move {
                // Boxed, as a forward's is ([`Proxy::forward_claimed`]).
                let (request, body) = (outbound.request, outbound.body);
                let enqueuing = proxy.enqueuing();
                let storing = Box::pin(enqueuing.store_job(&route, open, request, body));
                let accepted = storing.instrument(telemetry::step_span!("enqueue")).await;
                let _ = answer.send(accepted);
                drop(permit);
            }
            .instrument(Span::current()),
        );
        match answered.await {
            Ok(answer) => answer,
            // The task died (a panic): its open claim was released as it dropped.
            Err(_) => (DedupeStatus::Released, Refusal::Internal.into_response()),
        }
    }

    /// What storing a queued delivery's job needs (`accept.rs`).
    fn enqueuing(&self) -> accept::Enqueuing<'_> {
        accept::Enqueuing {
            ledger: &self.ledger,
            metrics: &self.metrics,
            deliveries: self.deliveries.as_ref(),
        }
    }

    /// What relaying a request without a claim needs (`relay.rs`).
    fn relaying(&self) -> relay::Relaying<'_> {
        relay::Relaying {
            upstream: &self.upstream,
            places: &self.relay_places,
            body_read_timeout: self.body_read_timeout,
        }
    }

    /// The delivery log's recorder.
    pub(crate) fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// The delivery of queued routes, when the store keeps a queue.
    pub(crate) fn deliveries(&self) -> Option<&Arc<Deliveries>> {
        self.deliveries.as_ref()
    }

    /// This process's claims being forwarded, and the store's done records.
    pub fn key_counts(&self) -> KeyCounts {
        KeyCounts {
            in_flight: self.ledger.open_count(),
            waiting: self.waiting.count(),
            done: self.store.done_keys(),
            syncs: self.store.disk_syncs(),
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
        let (route, overridable) = match find_route(&routing, &request) {
            Ok((route, overridable)) => (route.cloned(), overridable),
            Err(error) => {
                self.metrics.bad_request();
                return Refusal::from(error).into_response();
            }
        };
        let reroutes = overridable.then_some(routing.as_ref());
        let Some(route) = route else {
            self.metrics.unmatched();
            let noted = Noted::when(self.recorder.records_unmatched(), &request, peer);
            let mut response = self
                .relaying()
                .pass_unmatched(&routing, request, peer, permit, overridable)
                .await;
            noted::record(noted, &self.recorder, None, None, &mut response);
            return response;
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
        let noted = Noted::when(self.recorder.enabled(), &request, peer);
        let (outcome, mut response) = self
            .deliver(&route, request, peer, permit, reroutes)
            .instrument(span.clone())
            .await;
        noted::record(
            noted,
            &self.recorder,
            Some(&route),
            Some(outcome),
            &mut response,
        );
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
    /// answer. `reroutes` is the routing when a `_method` in the body could take the
    /// request to another route ([`find_route`]).
    async fn deliver(
        self: &Arc<Self>,
        route: &Arc<Route>,
        request: Request<Incoming>,
        peer: SocketAddr,
        permit: RequestPermit,
        reroutes: Option<&Routing>,
    ) -> Answer {
        match self.check(route, request, peer, reroutes).await {
            Err(refusal) => (DedupeStatus::Rejected, refusal.into_response()),
            Ok(Checked::Unkeyed(request)) => {
                let timeout = route.policy.upstream_timeout;
                let response = (self.relaying())
                    .relay(&route.upstream, request, timeout, permit)
                    .await;
                (DedupeStatus::Unkeyed, response)
            }
            Ok(Checked::Keyed {
                key,
                fingerprint,
                request,
            }) => {
                let captured = self.recorder.enabled().then(|| {
                    let headers = &request.forwardable.head().headers;
                    Captured::of(&key, &route.policy.log, headers, &request.body)
                });
                let (outcome, response) = self
                    .claim_and_forward(route, &key, fingerprint, request, permit)
                    .await;
                (outcome, mark::<Captured>(response, captured))
            }
        }
    }

    /// Reads the body (bounded), checks its signature, extracts its key and checks that
    /// the request can be forwarded (it is built once claimed): every step that needs no
    /// store. A refusal here has stored nothing.
    async fn check(
        &self,
        route: &Route,
        request: Request<Incoming>,
        peer: SocketAddr,
        reroutes: Option<&Routing>,
    ) -> Result<Checked, Refusal> {
        let policy = &route.policy;
        let (head, body) = request.into_parts();
        let body = body::read_limited(&head.headers, body, policy.max_body, self.body_read_timeout)
            .await?;
        if let Some(routing) = reroutes {
            body_stays_on(routing, &head, &body, Some(route))?;
        }

        // A forgery must not claim (and so pre-empt) a real event's key. Refusals are logged
        // at debug level only, and counted: a forger must not flood the log.
        if let Some(verify) = &route.verify {
            let checked = async {
                let delivery = crate::verify::Signed {
                    headers: &head.headers,
                    body: &body,
                };
                let pending = verify.prepare(delivery, crate::verify::unix_now())?;
                self.signature_work.check(&route.name, pending, &body).await
            }
            .instrument(telemetry::step_span!("verify"))
            .await;
            checked.map_err(|failure| {
                tracing::debug!(reason = failure.code(), %failure, "signature refused");
                self.metrics.signature_refused(&route.name, failure.code());
                failure
            })?;
        }

        let delivery = Delivery {
            headers: &head.headers,
            query: head.uri.query(),
            body: &body,
        };
        let key = match route.key.extract(&delivery) {
            Ok(key) => key,
            Err(missing @ KeyError::Missing { .. })
                if policy.on_missing_key == OnMissingKey::Forward =>
            {
                tracing::debug!(%missing, "forwarding without a key");
                let request =
                    upstream::outbound(head, body::full(body), &route.upstream, peer, None)?;
                return Ok(Checked::Unkeyed(request));
            }
            Err(refused) => return Err(refused.into()),
        };
        Span::current().record("key", key.as_str());
        telemetry::keyed(&key);
        let guard = route
            .order
            .as_ref()
            .map_or(Guard::Off, |order| order.read(&route.namespace, &delivery));

        let fingerprint = fingerprint(policy.fingerprint, &head, &body);
        // Checked before the claim, so that a request that cannot be forwarded claims
        // nothing; built after it, so that a duplicate costs no request.
        let forwardable = upstream::Forwardable::check(head, &route.upstream)?;
        Ok(Checked::Keyed {
            key,
            fingerprint,
            request: CheckedRequest {
                forwardable,
                guard,
                body,
                peer,
            },
        })
    }

    /// Claims the key and acts on what the store says: forwards a claimed delivery,
    /// answers a duplicate or one in flight, or follows `on_store_error`.
    async fn claim_and_forward(
        self: &Arc<Self>,
        route: &Arc<Route>,
        key: &str,
        fingerprint: Fingerprint,
        request: CheckedRequest,
        permit: RequestPermit,
    ) -> Answer {
        let policy = &route.policy;
        let claimed = self
            .claim(route, key, fingerprint)
            .instrument(telemetry::step_span!("claim"))
            .await;
        match claimed {
            Ok(Claiming::Claimed(open)) => {
                self.after_claim(route, key, open, request, permit).await
            }
            Ok(Claiming::Done(record)) => self.answer_duplicate(route, record, fingerprint),
            Ok(Claiming::InFlight) if policy.on_in_flight == OnInFlight::Wait => {
                let waiting = self.wait_for_outcome(route, key, fingerprint, request, permit);
                // Boxed: a wait is rare, and its state would make every delivery's larger.
                let (outcome, response) = Box::pin(waiting).await;
                (outcome, mark(response, Waited))
            }
            Ok(Claiming::InFlight) => in_flight(route),
            Ok(Claiming::Held) => held(route),
            Err(error) => {
                let request = request.build(route, None).request;
                Box::pin(self.store_failed(route, error, request, permit)).await
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
        request: CheckedRequest,
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
                    return self.after_claim(route, key, open, request, permit).await;
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
        request: Request<ProxyBody>,
        permit: RequestPermit,
    ) -> Answer {
        tracing::warn!(%error, "claim store failed");
        self.metrics.store_error();
        let policy = &route.policy;
        match policy.on_store_error {
            OnStoreError::Forward => {
                let timeout = policy.upstream_timeout;
                let response = (self.relaying())
                    .relay(&route.upstream, request, timeout, permit)
                    .await;
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
        let mut open = self.ledger.register(event, route);
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

    /// What a claimed delivery goes on to: queued (`delivery: queued`), or forwarded.
    async fn after_claim(
        self: &Arc<Self>,
        route: &Arc<Route>,
        key: &str,
        open: OpenClaim,
        request: CheckedRequest,
        permit: RequestPermit,
    ) -> Answer {
        let key_header = route.policy.forward_key_header.then_some(key);
        let request = request.build(route, key_header);
        if route.policy.queue.is_some() {
            return Box::pin(self.accept_queued(route, open, request, permit)).await;
        }
        self.forward_claimed(route, open, request, permit).await
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
        let settled_on_drop = open.when_dropped(ReleaseReason::TaskFailed);
        let proxy = Arc::clone(self);
        let route = Arc::clone(route);
        self.forwards.spawn(
            async move {
                let claims = open.claims().clone();
                // Boxed: the forward's state is kilobytes, and a task's future is moved as
                // it is spawned and as it ends (docs/performance.md, "The hot path, lean
                // again").
                let handling = Box::pin(proxy.forward_in_order(&route, open, request));
                let lease = route.policy.lease;
                let outcome = proxy.ledger.renewing(lease, &claims, handling).await;
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

    /// With `order:`, forwards as the guard's verdict says: an event older than the newest
    /// done for its entity is forwarded marked with `Dedupe-Stale`, or skipped.
    async fn forward_in_order(&self, route: &Route, open: OpenClaim, outbound: Outbound) -> Answer {
        let Outbound {
            mut request, guard, ..
        } = outbound;
        let on_stale = route.order.as_ref().map(|order| order.on_stale);
        match stale::verdict(&*self.store, &self.metrics, route, guard).await {
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
                open.finish(&completion).await;
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
                open.release(route, ReleaseReason::StoreError).await;
                unavailable(route)
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
                &open.claims().progress.dispatched,
            )
            .instrument(step)
            .await;
        let answered = UpstreamAnswer {
            status: sent
                .as_ref()
                .ok()
                .map(|response| response.status().as_u16()),
            elapsed: started.elapsed(),
        };
        let elapsed = answered.elapsed.as_secs_f64();
        self.metrics.upstream_answered(&route.name, elapsed);
        if let Ok(response) = &sent {
            Span::current().record("upstream_status", response.status().as_u16());
        }
        tracing::debug!(elapsed_ms = elapsed * 1000.0, "upstream answered");
        let outcome = self
            .ledger
            .record_outcome(route, open, sent, advance)
            .instrument(telemetry::step_span!("record"))
            .await;
        (outcome.0, mark(outcome.1, answered))
    }

    /// Waits up to `grace` for forward tasks to finish, then releases the claims of those
    /// still running, so that the provider's retry is forwarded at once after a restart;
    /// on a route with `on_ambiguous: hold`, those whose request went out are held.
    pub async fn drain(&self, grace: Duration) {
        // Queued deliveries stop taking jobs and end their attempts alongside the forwards.
        let queued = async {
            if let Some(deliveries) = &self.deliveries {
                deliveries.stop(grace).await;
            }
        };
        tokio::join!(queued, self.drain_forwards(grace));
    }

    /// The forwards' part of [`Proxy::drain`].
    async fn drain_forwards(&self, grace: Duration) {
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
        self.ledger.settle_the_rest().await;
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
        let policy = &route.policy.duplicate_response;
        let replayed = (policy.replay && record.response.is_some()).then_some(Replayed);
        let response = response::duplicate(policy, record.response);
        (
            DedupeStatus::Duplicate,
            mark::<Replayed>(response, replayed),
        )
    }
}

/// A delivery that passed every step that needs no store.
// Moved once per request: a box would cost an allocation to save a copy of a few hundred
// bytes.
#[allow(clippy::large_enum_variant)]
enum Checked {
    /// Ready to claim its key, with the request for the application checked.
    Keyed {
        key: String,
        fingerprint: Fingerprint,
        request: CheckedRequest,
    },
    /// Without a usable key, on a route that forwards such deliveries unclaimed.
    Unkeyed(Request<ProxyBody>),
}

/// What claiming a delivery found.
enum Claiming {
    Claimed(OpenClaim),
    Done(DoneRecord),
    InFlight,
    Held,
}
