//! The real sled store, made to fail on demand, and the proxy in front of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedupe_proxy::config::StoreConfig;
use dedupe_proxy::store::minutes::MinuteFigures;
use dedupe_proxy::store::queue::{DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken};
use dedupe_proxy::store::sled::SledStore;
use dedupe_proxy::store::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, EntityRecord, Expiry, Fingerprint,
    Forgotten, KeyState, Page, Resolution, StateFilter, StoreError, Swept, Version,
};

use super::*;

/// The real sled store, made to fail on demand, counting the claims made of it.
pub struct FailingStore {
    pub inner: SledStore,
    pub fail_claims: bool,
    /// Fails every claim after this many.
    pub fail_claims_after: Option<usize>,
    pub fail_finish: bool,
    /// Panics in `finish`, as a bug in the proxy's recording would.
    pub panic_finish: bool,
    pub fail_hold: bool,
    /// Fails reading and recording entities' versions (`order:`).
    pub fail_versions: bool,
    /// Answers the replay guard's body claims half a second late.
    pub slow_body_claims: bool,
    /// Fails every lease renewal while set.
    pub fail_renewals: Arc<std::sync::atomic::AtomicBool>,
    pub claims: Arc<AtomicUsize>,
    /// Fails every forgetting after this many.
    pub fail_forgets_after: Option<usize>,
    pub forgets: AtomicUsize,
    /// The delivery queue queued routes use (none unless set).
    pub queue: Option<Arc<dyn DeliveryQueue>>,
    /// Fails writing and reading the minutes' figures while set.
    pub fail_minutes: Arc<std::sync::atomic::AtomicBool>,
}

impl FailingStore {
    pub fn new(inner: SledStore) -> FailingStore {
        FailingStore {
            inner,
            fail_claims: false,
            fail_claims_after: None,
            fail_finish: false,
            panic_finish: false,
            fail_hold: false,
            fail_versions: false,
            slow_body_claims: false,
            fail_renewals: Arc::default(),
            claims: Arc::default(),
            fail_forgets_after: None,
            forgets: AtomicUsize::new(0),
            queue: None,
            fail_minutes: Arc::default(),
        }
    }
}

#[async_trait]
impl ClaimStore for FailingStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let earlier = self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_claims || self.fail_claims_after.is_some_and(|after| earlier >= after) {
            return Err(StoreError::Backend("injected claim failure".into()));
        }
        if self.slow_body_claims && key.contains("#body:") {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.inner.claim(key, fingerprint, lease).await
    }
    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        if self.fail_finish {
            return Err(StoreError::Backend("injected finish failure".into()));
        }
        assert!(
            !self.panic_finish,
            "injected panic while recording the outcome"
        );
        self.inner.finish(claim, completion).await
    }
    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.inner.release(claim).await
    }
    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), StoreError> {
        if self.fail_renewals.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected renewal failure".into()));
        }
        self.inner.renew(claim, lease).await
    }
    async fn hold(
        &self,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if self.fail_hold {
            return Err(StoreError::Backend("injected hold failure".into()));
        }
        self.inner.hold(claim, reason, retention).await
    }
    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError> {
        self.inner.resolve(key, resolution).await
    }
    async fn record_minute(&self, figures: &MinuteFigures) -> Result<(), StoreError> {
        if self.fail_minutes.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected minute failure".into()));
        }
        self.inner.record_minute(figures).await
    }
    async fn minutes(&self, since: u64) -> Result<Vec<MinuteFigures>, StoreError> {
        if self.fail_minutes.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected minute failure".into()));
        }
        self.inner.minutes(since).await
    }
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.inner
            .list(namespace, prefix, state, after, limit)
            .await
    }
    async fn count_held(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.count_held().await
    }
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        self.inner.inspect(key).await
    }
    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        let earlier = self.forgets.fetch_add(1, Ordering::SeqCst);
        if self
            .fail_forgets_after
            .is_some_and(|after| earlier >= after)
        {
            return Err(StoreError::Backend("injected forget failure".into()));
        }
        self.inner.forget(key).await
    }
    async fn set_expiry(&self, key: &str, expires_at: u64) -> Result<Expiry, StoreError> {
        self.inner.set_expiry(key, expires_at).await
    }
    async fn newest_version(&self, entity: &str) -> Result<Option<EntityRecord>, StoreError> {
        if self.fail_versions {
            return Err(StoreError::Backend("injected version failure".into()));
        }
        self.inner.newest_version(entity).await
    }
    async fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        if self.fail_versions {
            return Err(StoreError::Backend("injected version failure".into()));
        }
        self.inner.record_version(entity, version, retention).await
    }
    async fn forget_entity(&self, entity: &str) -> Result<bool, StoreError> {
        self.inner.forget_entity(entity).await
    }
    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        self.inner.sweep(limit).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
    fn done_keys(&self) -> Option<u64> {
        self.inner.done_keys()
    }
    fn queue(&self) -> Option<Arc<dyn DeliveryQueue>> {
        self.queue.clone()
    }
    fn delivery_log(&self) -> Option<Arc<dyn dedupe_proxy::store::log::DeliveryLog>> {
        self.inner.delivery_log()
    }
}

pub async fn proxy_on_failing_store(
    upstream: &Upstream,
    extra: &str,
    fail_claims: bool,
    fail_finish: bool,
) -> (dedupe_proxy::App, tempfile::TempDir) {
    proxy_on_store(upstream, &json_route(extra), |inner| FailingStore {
        fail_claims,
        fail_finish,
        ..FailingStore::new(inner)
    })
    .await
}

pub async fn proxy_on_store(
    upstream: &Upstream,
    routes: &str,
    store: impl FnOnce(SledStore) -> FailingStore,
) -> (dedupe_proxy::App, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let config = parse_config(&config_text(upstream.addr, &data.path().join("db"), routes));
    let StoreConfig::Sled(sled) = &config.store else {
        panic!("sled expected")
    };
    let store = store(SledStore::open(sled).unwrap());
    (
        dedupe_proxy::start_with_store(config, Arc::new(store))
            .await
            .unwrap(),
        data,
    )
}

/// The real sled queue, whose first `fail_paused_reads` reads of the paused routes fail,
/// counting the jobs taken and released.
pub struct FailingQueue {
    pub inner: Arc<dyn DeliveryQueue>,
    pub fail_paused_reads: AtomicUsize,
    pub taken: AtomicUsize,
    pub released: AtomicUsize,
}

#[async_trait]
impl DeliveryQueue for FailingQueue {
    async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError> {
        self.inner.enqueue(job).await
    }
    async fn take(
        &self,
        route: &str,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<Taken>, StoreError> {
        let taken = self.inner.take(route, limit, visibility).await?;
        self.taken.fetch_add(taken.len(), Ordering::SeqCst);
        Ok(taken)
    }
    async fn complete(&self, taken: &Taken) -> Result<(), StoreError> {
        self.inner.complete(taken).await
    }
    async fn retry(&self, taken: &Taken, job: &Job, due_at: u64) -> Result<(), StoreError> {
        self.inner.retry(taken, job, due_at).await
    }
    async fn release(&self, taken: &Taken, due_at: u64) -> Result<(), StoreError> {
        self.inner.release(taken, due_at).await?;
        self.released.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn bury(&self, taken: &Taken, job: &Job) -> Result<(), StoreError> {
        self.inner.bury(taken, job).await
    }
    async fn job(&self, route: &str, key: &str) -> Result<Option<Job>, StoreError> {
        self.inner.job(route, key).await
    }
    async fn dead(
        &self,
        route: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        self.inner.dead(route, after, limit).await
    }
    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        self.inner.revive(route, key).await
    }
    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        self.inner.discard(route, key).await
    }
    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError> {
        self.inner.counts(routes).await
    }
    async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError> {
        self.inner.set_paused(route, paused).await
    }
    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        let failing =
            self.fail_paused_reads
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                });
        if failing.is_ok() {
            return Err(StoreError::Backend("injected read failure".into()));
        }
        self.inner.paused().await
    }
}
