//! Queued delivery (`delivery: queued`): the proxy acknowledges a request once the store
//! holds it as a job (`proxy/accept.rs`), and [`Deliveries`] delivers the jobs in the
//! background: one loop per queued route takes due jobs from the store's queue
//! ([`crate::store::queue`]) within the route's `max_concurrency` and `rate`, and each
//! attempt (`attempt.rs`) ends delivered, due again later (the route's
//! [`QueuePolicy`](crate::route::delivery::QueuePolicy): full jitter, `Retry-After`), or dead.
//!
//! The queue lives in the store, so a job survives a crash of the proxy, and the replicas
//! sharing a store share its jobs: a take hides a job from the others for its visibility
//! (twice the route's `upstream_timeout` and 5 s), after which a job whose worker died is
//! taken again. Pausing a route is kept in the store too, for every replica.

mod attempt;

use self::attempt::Attempts;
use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::{Held, Metrics};
use crate::route::Route;
use crate::store::queue::{DeliveryQueue, Enqueued, Job, QueueCounts};
use crate::store::{Clock, StoreError, SystemClock};
use crate::upstream::Upstream;

/// How long a take hides a job beyond twice the route's `upstream_timeout` (the answer's
/// head, then its body): time to record the outcome.
const VISIBILITY_MARGIN: Duration = Duration::from_secs(5);

/// How often an idle route looks for due jobs (this replica's own acceptances wake it
/// at once; another replica's are found on this beat).
const POLL: Duration = Duration::from_millis(250);

/// How often the paused routes are read again from the store, and the counts taken.
const REFRESH: Duration = Duration::from_secs(2);

/// The most jobs one take asks for.
const TAKE_BATCH: usize = 32;

/// A store failure's pause before a route's loop tries again.
const STORE_PAUSE: Duration = Duration::from_secs(1);

/// What the admin API shows of a queued route.
#[derive(Debug, Clone, Default)]
pub struct RouteQueue {
    pub route: String,
    pub counts: QueueCounts,
    pub in_flight: u64,
    pub paused: bool,
}

/// A queued route's running loop.
struct Running {
    route: Arc<Route>,
    stop: CancellationToken,
    wake: Arc<Notify>,
    places: Arc<Semaphore>,
}

/// The delivery of every queued route's jobs.
pub struct Deliveries {
    queue: Arc<dyn DeliveryQueue>,
    attempts: Arc<Attempts>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    running: Mutex<HashMap<String, Running>>,
    /// Whether the store's durability warning was looked for (once queued routes run).
    warned: std::sync::atomic::AtomicBool,
    paused: RwLock<HashSet<String>>,
    /// Every loop and attempt, which shutdown waits for.
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Deliveries {
    pub(crate) fn new(queue: Arc<dyn DeliveryQueue>, metrics: Arc<Metrics>) -> Arc<Deliveries> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let attempts = Arc::new(Attempts {
            upstream: Upstream::new(0),
            queue: Arc::clone(&queue),
            metrics: Arc::clone(&metrics),
            clock: Arc::clone(&clock),
        });
        let deliveries = Arc::new(Deliveries {
            queue,
            attempts,
            metrics,
            clock,
            running: Mutex::new(HashMap::new()),
            warned: std::sync::atomic::AtomicBool::new(false),
            paused: RwLock::new(HashSet::new()),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        });
        deliveries
            .tasks
            .spawn(Arc::clone(&deliveries).refresh_forever());
        deliveries
    }

    /// Stores an accepted request's job (durably, before it is acknowledged).
    pub(crate) async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError> {
        self.queue.enqueue(job).await
    }

    /// Tells a route's loop that a job was just accepted.
    pub(crate) fn accepted(&self, route: &str) {
        if let Some(running) = self.running.lock().get(route) {
            running.wake.notify_one();
        }
    }

    /// Delivers the queued routes among `routes` from now on: a route that is new or
    /// changed gets a new loop (attempts under way finish with the settings they began
    /// with), and a route gone or no longer queued stops; its jobs wait in the store.
    pub(crate) fn set_routes<'r>(
        self: &Arc<Self>,
        routes: impl IntoIterator<Item = &'r Arc<Route>>,
    ) {
        let mut running = self.running.lock();
        let mut kept = HashSet::new();
        for route in routes {
            let Some(policy) = &route.policy.queue else {
                continue;
            };
            kept.insert(route.name.clone());
            self.metrics.queue.expect_route(&route.name, policy.target);
            if let Some(old) = running.remove(&route.name) {
                old.stop.cancel();
            }
            let places = Arc::new(Semaphore::new(policy.max_concurrency as usize));
            let loop_of = Running {
                route: Arc::clone(route),
                stop: self.stop.child_token(),
                wake: Arc::new(Notify::new()),
                places: Arc::clone(&places),
            };
            let limiter = policy.rate.map(|rate| {
                let per_second = NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN);
                let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
                RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst))
            });
            self.tasks.spawn(Arc::clone(self).deliver_route(
                Arc::clone(route),
                loop_of.stop.clone(),
                Arc::clone(&loop_of.wake),
                places,
                limiter,
            ));
            running.insert(route.name.clone(), loop_of);
        }
        if !kept.is_empty() && !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let queue = Arc::clone(&self.queue);
            self.tasks.spawn(async move {
                if let Some(warning) = queue.durability_warning().await {
                    tracing::warn!("{warning}");
                }
            });
        }
        running.retain(|name, old| {
            let keep = kept.contains(name);
            if !keep {
                old.stop.cancel();
            }
            keep
        });
    }

    /// Takes and delivers a route's due jobs until stopped.
    async fn deliver_route(
        self: Arc<Self>,
        route: Arc<Route>,
        stop: CancellationToken,
        wake: Arc<Notify>,
        places: Arc<Semaphore>,
        limiter: Option<DefaultDirectRateLimiter>,
    ) {
        let visibility = route.policy.upstream_timeout * 2 + VISIBILITY_MARGIN;
        let burst = route
            .policy
            .queue
            .as_ref()
            .and_then(|policy| policy.rate.map(|rate| rate.burst as usize))
            .unwrap_or(TAKE_BATCH);
        loop {
            if self.paused.read().contains(&route.name) {
                if idle(&stop, &wake, REFRESH).await {
                    return;
                }
                continue;
            }
            let first = tokio::select! {
                place = Arc::clone(&places).acquire_owned() => place.expect("never closed"),
                () = stop.cancelled() => return,
            };
            // Only this loop takes places: those free now stay free until it takes them.
            let wanted = (1 + places.available_permits()).min(TAKE_BATCH).min(burst);
            let taken = match self.queue.take(&route.name, wanted, visibility).await {
                Ok(taken) => taken,
                Err(error) => {
                    tracing::warn!(route = %route.name, %error, "cannot take queued jobs");
                    self.metrics.queue.store_error(&route.name);
                    drop(first);
                    if idle(&stop, &wake, STORE_PAUSE).await {
                        return;
                    }
                    continue;
                }
            };
            if taken.is_empty() {
                drop(first);
                if idle(&stop, &wake, POLL).await {
                    return;
                }
                continue;
            }
            let mut place = Some(first);
            for job in taken {
                if let Some(limiter) = &limiter {
                    limiter.until_ready().await;
                }
                let place = match place.take() {
                    Some(place) => place,
                    None => Arc::clone(&places)
                        .try_acquire_owned()
                        .expect("counted free before the take"),
                };
                let attempts = Arc::clone(&self.attempts);
                let route = Arc::clone(&route);
                self.tasks.spawn(async move {
                    attempt::deliver(&attempts, &route, job).await;
                    drop(place);
                });
            }
        }
    }

    /// Reads the paused routes from the store and counts every queued route's jobs, every
    /// [`REFRESH`], until stopped.
    async fn refresh_forever(self: Arc<Self>) {
        loop {
            if self.running.lock().is_empty() {
                tokio::select! {
                    () = tokio::time::sleep(REFRESH) => continue,
                    () = self.stop.cancelled() => return,
                }
            }
            match self.queue.paused().await {
                Ok(paused) => *self.paused.write() = paused.into_iter().collect(),
                Err(error) => tracing::debug!(%error, "cannot read the paused routes"),
            }
            match self.routes().await {
                Ok(routes) => {
                    let now = self.clock.now();
                    for route in routes {
                        let oldest = route
                            .counts
                            .oldest
                            .map_or(0.0, |oldest| now.saturating_sub(oldest) as f64 / 1000.0);
                        self.metrics.queue.held(
                            &route.route,
                            Held {
                                waiting: route.counts.waiting,
                                retrying: route.counts.retrying,
                                dead: route.counts.dead,
                                in_flight: route.in_flight,
                                paused: route.paused,
                                oldest_age_seconds: oldest,
                            },
                        );
                    }
                }
                Err(error) => tracing::debug!(%error, "cannot count the queued jobs"),
            }
            tokio::select! {
                () = tokio::time::sleep(REFRESH) => {}
                () = self.stop.cancelled() => return,
            }
        }
    }

    /// What each queued route's queue holds, as of now.
    pub(crate) async fn routes(&self) -> Result<Vec<RouteQueue>, StoreError> {
        let (names, in_flight): (Vec<String>, Vec<u64>) = {
            let running = self.running.lock();
            let mut routes: Vec<_> = running
                .iter()
                .map(|(name, running)| {
                    let max = running
                        .route
                        .policy
                        .queue
                        .as_ref()
                        .map_or(0, |policy| policy.max_concurrency as usize);
                    let busy = max.saturating_sub(running.places.available_permits());
                    (name.clone(), busy as u64)
                })
                .collect();
            routes.sort();
            routes.into_iter().unzip()
        };
        let counts = self.queue.counts(&names).await?;
        let paused = self.paused.read().clone();
        Ok(names
            .into_iter()
            .zip(in_flight)
            .zip(counts)
            .map(|((route, in_flight), counts)| RouteQueue {
                paused: paused.contains(&route),
                route,
                counts,
                in_flight,
            })
            .collect())
    }

    /// Pauses or resumes a route's deliveries, for every replica sharing the store.
    pub(crate) async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError> {
        self.queue.set_paused(route, paused).await?;
        {
            let mut set = self.paused.write();
            if paused {
                set.insert(route.to_owned());
            } else {
                set.remove(route);
            }
        }
        self.accepted(route);
        Ok(())
    }

    pub(crate) fn queue(&self) -> &Arc<dyn DeliveryQueue> {
        &self.queue
    }

    /// Stops taking jobs and waits up to `grace` for the attempts under way. A job whose
    /// attempt is cut off is due again when its visibility ends.
    pub(crate) async fn stop(&self, grace: Duration) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("queued deliveries still running when the shutdown grace ended");
        }
    }
}

/// Waits for a wake-up, `pause`, or the stop; true when stopped.
async fn idle(stop: &CancellationToken, wake: &Notify, pause: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = wake.notified() => false,
        () = tokio::time::sleep(pause) => false,
    }
}
