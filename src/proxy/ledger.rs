//! Claim bookkeeping: the claims each delivery holds while its forward runs, renewed until
//! they are settled, and settled as the forward's outcome says (done, released for a
//! retry, or held for an operator), once, whether the delivery ends, is dropped or is
//! still running when the proxy shuts down.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Response;
use hyper::body::Incoming;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use super::answers::{Answer, ambiguity, failure};
use super::replay::keep_for_replay;
use crate::body::ProxyBody;
use crate::metrics::{LeaseRenewal, Metrics, ReleaseReason};
use crate::order::Ordered;
use crate::response::DedupeStatus;
use crate::route::{OnAmbiguous, Route};
use crate::store::queue::{Enqueued, Job};
use crate::store::{Ambiguity, Claim, ClaimStore, Completion, StoreError};
use crate::upstream::{self, UpstreamError};
use crate::waiting::Waiting;

/// The claims of the deliveries under way, and what settles them.
pub(super) struct Ledger {
    store: Arc<dyn ClaimStore>,
    waiting: Arc<Waiting>,
    metrics: Arc<Metrics>,
    /// Where a dropped claim is settled: among the forwards, which a drain waits for.
    forwards: TaskTracker,
    open: ClaimRegistry,
}

impl Ledger {
    pub(super) fn new(
        store: Arc<dyn ClaimStore>,
        waiting: Arc<Waiting>,
        metrics: Arc<Metrics>,
        forwards: TaskTracker,
    ) -> Ledger {
        Ledger {
            store,
            waiting,
            metrics,
            forwards,
            open: ClaimRegistry::default(),
        }
    }

    /// Keeps a delivery's new claim until it is settled.
    pub(super) fn register(&self, event: Claim, route: &Arc<Route>) -> OpenClaim {
        let claims = Claims {
            event,
            body: None,
            progress: Arc::default(),
        };
        let registered = Registered {
            route: Arc::clone(route),
            claims: claims.clone(),
        };
        self.open.lock().insert(claims.event.token, registered);
        OpenClaim {
            registry: self.open.clone(),
            claims,
            store: Arc::clone(&self.store),
            waiting: Arc::clone(&self.waiting),
            metrics: Arc::clone(&self.metrics),
            settled: false,
            if_dropped: ReleaseReason::Abandoned,
            on_drop: None,
            forwards: self.forwards.clone(),
        }
    }

    /// How many deliveries hold claims now.
    pub(super) fn open_count(&self) -> usize {
        self.open.lock().len()
    }

    /// At shutdown, once the grace has ended: releases the claims still open so that the
    /// provider's retry is forwarded at once after a restart; on a route with
    /// `on_ambiguous: hold`, those whose request went out are held. Each is settled under
    /// the route it started with: a reload since may have renamed, changed or removed it.
    pub(super) async fn settle_the_rest(&self) {
        for Registered { route, claims } in self.open.take_all() {
            let policy = &route.policy;
            if policy.on_ambiguous == OnAmbiguous::Hold
                && claims.progress.dispatched.load(Ordering::SeqCst)
                && self
                    .hold(&route.name, policy.retention, &claims, Ambiguity::Shutdown)
                    .await
            {
                continue;
            }
            let (store, waiting, metrics) = (&*self.store, &*self.waiting, &*self.metrics);
            let reason = ReleaseReason::Shutdown;
            release_claims(store, waiting, metrics, &route.name, &claims, reason).await;
        }
    }

    /// Runs `handling` (a claimed delivery's forward and the recording of its outcome)
    /// while renewing its claims every third of their lease: however long the app, its
    /// answer's body or the store take, no claim ends while this proxy still handles its
    /// delivery and reaches the store.
    pub(super) async fn renewing<T>(
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

    /// Records what the forward came to: the key done (and the entity's version), released
    /// for a retry, or held; the claim is settled either way.
    pub(super) async fn record_outcome(
        &self,
        route: &Route,
        open: OpenClaim,
        sent: Result<Response<Incoming>, UpstreamError>,
        advance: Option<&Ordered>,
    ) -> Answer {
        let outcome = self.outcome(route, &open, sent, advance).await;
        open.settle();
        outcome
    }

    async fn outcome(
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

    /// Stores `job` with the event key's done record kept in it, where the store's queue
    /// can (one write for both), and marks the body's claim (`replay_guard`) done apart.
    /// `None` where it cannot: nothing was stored, and the claims are still open.
    pub(super) async fn enqueue_done(
        &self,
        claims: &Claims,
        job: &Job,
        completion: &Completion,
    ) -> Result<Option<Enqueued>, StoreError> {
        // Before the call: the store ends the claim, and a renewal refused meanwhile was
        // refused for that.
        claims.progress.settling.store(true, Ordering::SeqCst);
        let stored = self
            .store
            .enqueue_done(&claims.event, job, completion)
            .await;
        let Ok(Some(_)) = stored else {
            claims.progress.settling.store(false, Ordering::SeqCst);
            return stored;
        };
        self.waiting.announce(&claims.event.key);
        if let Some(body) = &claims.body {
            let body_only = Claims {
                event: body.clone(),
                body: None,
                progress: Arc::clone(&claims.progress),
            };
            self.mark_done(&body_only, completion).await;
        }
        stored
    }

    /// Marks the claims done, waking their waiters.
    async fn mark_done(&self, claims: &Claims, completion: &Completion) {
        mark_claims_done(
            &*self.store,
            &self.waiting,
            &self.metrics,
            claims,
            completion,
        )
        .await;
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
}

/// Marks a delivery's claims done, waking their waiters.
async fn mark_claims_done(
    store: &dyn ClaimStore,
    waiting: &Waiting,
    metrics: &Metrics,
    claims: &Claims,
    completion: &Completion,
) {
    claims.progress.settling.store(true, Ordering::SeqCst);
    for claim in claims.iter() {
        if let Err(error) = store.finish(claim, completion.clone()).await {
            metrics.store_error();
            tracing::error!(%error, "the done mark was not recorded; a redelivery of this event would run again");
        }
        waiting.announce(&claim.key);
    }
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

/// The claims one delivery holds: its event key's, and its body's when the route guards
/// against replays. They are finished or released together.
#[derive(Debug, Clone)]
pub(super) struct Claims {
    pub(super) event: Claim,
    pub(super) body: Option<Claim>,
    pub(super) progress: Arc<Progress>,
}

/// How far a claimed delivery has gone, as the shutdown drain and the lease renewals see
/// it.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Its request went to the app (see `Upstream::send`).
    pub(super) dispatched: AtomicBool,
    /// Its claims are being finished, held or released: a renewal refused from now on was
    /// refused because of that, not because the lease was lost.
    pub(super) settling: AtomicBool,
}

impl Claims {
    pub(super) fn iter(&self) -> impl Iterator<Item = &Claim> {
        std::iter::once(&self.event).chain(self.body.as_ref())
    }
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
    fn take_all(&self) -> Vec<Registered> {
        self.lock().drain().map(|(_, open)| open).collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u128, Registered>> {
        self.0.lock()
    }
}

/// A delivery's claims until they are settled: finished or released.
pub(super) struct OpenClaim {
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
    pub(super) fn claims(&self) -> &Claims {
        &self.claims
    }

    /// Adds the body's claim (a route that guards against replays).
    pub(super) fn add_body(&mut self, body: Claim) {
        self.claims.body = Some(body);
        if let Some(registered) = self.registry.lock().get_mut(&self.claims.event.token) {
            registered.claims.body.clone_from(&self.claims.body);
        }
    }

    /// Releases the claims without counting a release, or waking waiters: nothing was
    /// forwarded, and what stopped it (the body's own claim) still stands.
    pub(super) async fn give_back(mut self) {
        self.settled = true;
        self.claims.progress.settling.store(true, Ordering::SeqCst);
        self.registry.lock().remove(&self.claims.event.token);
        for claim in self.claims.iter() {
            if let Err(error) = self.store.release(claim).await {
                tracing::warn!(%error, "claim not released; the key frees itself when its lease ends");
            }
        }
    }

    /// Settles the claims as `reason` says if this is dropped unsettled (its task failed):
    /// the answer tells whether they were held.
    pub(super) fn when_dropped(&mut self, reason: ReleaseReason) -> oneshot::Receiver<bool> {
        let (told, answer) = oneshot::channel();
        self.if_dropped = reason;
        self.on_drop = Some(told);
        answer
    }

    /// Marks the claims done (the work happened, or needs none), waking their waiters.
    pub(super) async fn finish(self, completion: &Completion) {
        let (store, waiting, metrics) = (&*self.store, &*self.waiting, &*self.metrics);
        mark_claims_done(store, waiting, metrics, &self.claims, completion).await;
        self.settle();
    }

    /// Releases the claims, so that a retry (or a waiting duplicate) runs the work.
    pub(super) async fn release(self, route: &Route, reason: ReleaseReason) {
        let (store, waiting, metrics) = (&*self.store, &*self.waiting, &*self.metrics);
        release_claims(store, waiting, metrics, &route.name, &self.claims, reason).await;
        self.settle();
    }

    /// The claims are settled already: the store ended them with the write that stored
    /// their job ([`Ledger::enqueue_done`]).
    pub(super) fn settled_by_store(self) {
        self.settle();
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
