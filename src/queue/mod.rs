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
mod fill;
mod paused;
mod places;

use self::attempt::AttemptContext;
use self::fill::Fill;
pub(crate) use self::fill::Place;
use self::paused::Paused;
use self::places::{Places, Waiting};
use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::delivery_log::Recorder;
use crate::metrics::{Metrics, QueueGauges};
use crate::route::Route;
use crate::store::queue::{DeliveryQueue, Enqueued, Job, QueueCounts, Taken};
use crate::store::{Clock, Millis, StoreError, SystemClock};
use crate::upstream::Upstream;

/// How long a take hides a job beyond twice the route's `upstream_timeout` (the answer's
/// head, then its body): time to record the outcome.
const VISIBILITY_MARGIN: Duration = Duration::from_secs(5);

// A job taken ahead waits for its place out of its visibility's margin.
const _: () = assert!(places::LONGEST_WAIT.as_millis() < VISIBILITY_MARGIN.as_millis());

/// How often an idle route looks for due jobs (this replica's own acceptances wake it
/// at once; another replica's are found on this beat).
const POLL: Duration = Duration::from_millis(250);

/// How often the paused routes are read again from the store, and the counts taken.
const REFRESH: Duration = Duration::from_secs(2);

/// How many of a route's dead letters past their retention are discarded at most at each
/// refresh, read a page at a time.
const EXPIRED_PER_SWEEP: u64 = 1000;
const EXPIRY_PAGE: usize = 10;

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
    places: Arc<Places>,
    /// Set once the route is gone from the configuration.
    draining: Arc<AtomicBool>,
}

impl Running {
    fn clone_handles(&self) -> Handles {
        Handles {
            stop: self.stop.clone(),
            wake: Arc::clone(&self.wake),
            places: Arc::clone(&self.places),
            draining: Arc::clone(&self.draining),
        }
    }
}

/// What a route's loop shares with its [`Running`] entry.
struct Handles {
    stop: CancellationToken,
    wake: Arc<Notify>,
    places: Arc<Places>,
    draining: Arc<AtomicBool>,
}

/// Whether two versions of a route deliver alike: the loop of one serves the other.
fn same_delivery(old: &Route, new: &Route) -> bool {
    old.policy.queue == new.policy.queue
        && old.upstream == new.upstream
        && old.policy.upstream_timeout == new.policy.upstream_timeout
        && old.policy.success_status == new.policy.success_status
}

/// Why an accepted request got no place in its route's queue.
pub(crate) enum Unplaced {
    /// The route holds `max_queued` jobs.
    Full,
    /// The store could not count them.
    Store(StoreError),
}

/// The delivery of every queued route's jobs.
pub struct Deliveries {
    queue: Arc<dyn DeliveryQueue>,
    attempts: Arc<AttemptContext>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    running: Mutex<HashMap<String, Running>>,
    /// Whether the store's durability warning was looked for (once queued routes run).
    warned: AtomicBool,
    paused: Paused,
    /// Set once the paused routes were first read from the store: no loop takes a job
    /// before, or a restart would deliver for a route an operator paused.
    paused_read: tokio::sync::OnceCell<()>,
    /// Held by a pause or resume made here, from the store's write to this replica's.
    changing_pause: tokio::sync::Mutex<()>,
    /// Each route's jobs, dead letters included, as last counted (every [`REFRESH`]) and
    /// accepted here since.
    fill: Arc<Fill>,
    /// Every loop and attempt, which shutdown waits for.
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Deliveries {
    pub(crate) fn new(
        queue: Arc<dyn DeliveryQueue>,
        metrics: Arc<Metrics>,
        recorder: Arc<Recorder>,
    ) -> Arc<Deliveries> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let attempts = Arc::new(AttemptContext {
            upstream: Upstream::new(0),
            queue: Arc::clone(&queue),
            metrics: Arc::clone(&metrics),
            clock: Arc::clone(&clock),
            recorder,
        });
        let deliveries = Arc::new(Deliveries {
            queue,
            attempts,
            metrics,
            clock,
            running: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
            paused: Paused::default(),
            paused_read: tokio::sync::OnceCell::new(),
            changing_pause: tokio::sync::Mutex::new(()),
            fill: Arc::default(),
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

    /// A place for one more of `route`'s jobs, unless it holds `max_queued` (counted
    /// first if it never was): kept once the job is stored.
    pub(crate) async fn place(&self, route: &str, max_queued: u64) -> Result<Place, Unplaced> {
        if !self.fill.is_counted(route) {
            let before = self.fill.before_count(route);
            let counts = self
                .queue
                .counts(&[route.to_owned()])
                .await
                .map_err(Unplaced::Store)?;
            let held = counts
                .first()
                .map_or(0, |counts| counts.waiting + counts.retrying + counts.dead);
            self.fill.counted(route, held, before);
        }
        self.fill
            .take(route, max_queued)
            .map_err(|_| Unplaced::Full)
    }

    /// Tells a route's loop that a job was just accepted, unless the route is paused: its
    /// loop would wake only to sleep again, a thread switch per acceptance (a resume here
    /// wakes it; one made by another replica, at the next read of the paused routes).
    pub(crate) fn accepted(&self, route: &str) {
        if !self.paused.contains(route) {
            self.wake(route);
        }
    }

    /// Wakes a route's loop, to look at its jobs and whether it is paused.
    fn wake(&self, route: &str) {
        if let Some(running) = self.running.lock().get(route) {
            running.wake.notify_one();
        }
    }

    /// Discards the dead letters of each queued route among `with_dead` (those the last
    /// count found some in) that died more than its `dead_retention` ago, oldest first,
    /// [`EXPIRED_PER_SWEEP`] at most per route.
    async fn expire_dead_letters(&self, with_dead: &HashSet<String>) {
        let routes: Vec<(String, Duration)> = self
            .running
            .lock()
            .iter()
            .filter(|(name, _)| with_dead.contains(*name))
            .filter_map(|(name, running)| {
                let policy = running.route.policy.queue.as_ref()?;
                Some((name.clone(), policy.dead_retention))
            })
            .collect();
        let now = self.clock.now();
        for (route, retention) in routes {
            let before = now.saturating_sub(crate::store::millis(retention));
            match self.expire_dead(&route, before).await {
                Ok(0) => {}
                Ok(discarded) => {
                    self.metrics.queue.dead_expired(&route, discarded);
                    tracing::info!(route = %route, discarded, "dead letters past their retention discarded");
                }
                Err(error) => {
                    tracing::debug!(route = %route, %error, "cannot discard expired dead letters")
                }
            }
        }
    }

    /// Discards `route`'s dead letters that died before `before`, reading a few at a
    /// time (each is read whole, its body too).
    async fn expire_dead(&self, route: &str, before: Millis) -> Result<u64, StoreError> {
        let mut discarded = 0;
        // The oldest alone first: on most refreshes even it is not due yet.
        let mut page_size = 1;
        while discarded < EXPIRED_PER_SWEEP {
            let page = self.queue.dead(route, None, page_size).await?;
            page_size = EXPIRY_PAGE;
            let expired: Vec<&Job> = page
                .jobs
                .iter()
                .filter(|job| job.dead.is_some_and(|(died, _)| died < before))
                .collect();
            let more = expired.len() == page.jobs.len() && page.next.is_some();
            for job in expired {
                if self.queue.discard(route, &job.key).await? {
                    discarded += 1;
                }
            }
            if !more {
                break;
            }
        }
        Ok(discarded)
    }

    /// Delivers the queued routes among `routes` from now on. A route whose delivery
    /// settings are unchanged keeps its loop; a changed one gets a new loop that shares the
    /// old one's places (resized), so that attempts under way still count against
    /// `max_concurrency`; a route gone or no longer queued keeps delivering what it
    /// accepted, with its last settings, until its queue holds nothing but dead letters.
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
            let places = match running.get(&route.name) {
                Some(old) if same_delivery(&old.route, route) => {
                    old.draining.store(false, Ordering::Relaxed);
                    continue;
                }
                Some(old) => {
                    old.stop.cancel();
                    old.places.resize(policy.max_concurrency as usize);
                    Arc::clone(&old.places)
                }
                None => Arc::new(Places::new(policy.max_concurrency as usize)),
            };
            let started = self.start_loop(route, places);
            running.insert(route.name.clone(), started);
        }
        for (name, old) in running.iter() {
            if !kept.contains(name) {
                old.draining.store(true, Ordering::Relaxed);
            }
        }
        if !kept.is_empty() && !self.warned.swap(true, Ordering::Relaxed) {
            let queue = Arc::clone(&self.queue);
            self.tasks.spawn(async move {
                if let Some(warning) = queue.durability_warning().await {
                    tracing::warn!("{warning}");
                }
            });
        }
    }

    /// Starts a route's loop on `places`.
    fn start_loop(self: &Arc<Self>, route: &Arc<Route>, places: Arc<Places>) -> Running {
        let running = Running {
            route: Arc::clone(route),
            stop: self.stop.child_token(),
            wake: Arc::new(Notify::new()),
            places,
            draining: Arc::new(AtomicBool::new(false)),
        };
        let limiter = route
            .policy
            .queue
            .as_ref()
            .and_then(|policy| policy.rate)
            .map(|rate| {
                let per_second = NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN);
                let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
                RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst))
            });
        self.tasks.spawn(Arc::clone(self).deliver_route(
            Arc::clone(route),
            running.clone_handles(),
            limiter,
        ));
        running
    }

    /// Takes and delivers a route's due jobs until stopped, or, once the route is gone
    /// from the configuration, until nothing but dead letters is left.
    async fn deliver_route(
        self: Arc<Self>,
        route: Arc<Route>,
        handles: Handles,
        limiter: Option<DefaultDirectRateLimiter>,
    ) {
        let Handles {
            stop,
            wake,
            places,
            draining,
        } = handles;
        let visibility = route.policy.upstream_timeout * 2 + VISIBILITY_MARGIN;
        tokio::select! {
            () = self.read_paused_once() => {}
            () = stop.cancelled() => return,
        }
        loop {
            if self.paused.contains(&route.name) {
                if idle(&stop, &wake, REFRESH).await {
                    return;
                }
                continue;
            }
            let room = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                room = places.room(limiter.is_none()) => room,
            };
            let Some(wanted) = how_many(limiter.as_ref(), room, &stop).await else {
                return;
            };
            // A pause or a stop may have come while this loop waited for room or its rate.
            if stop.is_cancelled() {
                return;
            }
            if self.paused.contains(&route.name) {
                continue;
            }
            // Before the take: its visibility counts from there.
            let asked = Instant::now();
            let taken = match self.queue.take(&route.name, wanted, visibility).await {
                Ok(taken) => taken,
                Err(error) => {
                    tracing::warn!(route = %route.name, %error, "cannot take queued jobs");
                    self.metrics.queue.store_error(&route.name);
                    if idle(&stop, &wake, STORE_PAUSE).await {
                        return;
                    }
                    continue;
                }
            };
            if taken.is_empty() {
                if draining.load(Ordering::Relaxed) && self.drained(&route.name, &stop).await {
                    return;
                }
                if idle(&stop, &wake, POLL).await {
                    return;
                }
                continue;
            }
            for job in taken {
                let waiting = places.wait(asked);
                let deliveries = Arc::clone(&self);
                let route = Arc::clone(&route);
                let stop = stop.clone();
                self.tasks.spawn(async move {
                    deliveries
                        .deliver_when_placed(&route, job, waiting, &stop)
                        .await;
                });
            }
        }
    }

    /// Delivers a job once it has a place. Puts it back, due at once, if meanwhile its
    /// loop stopped (a reload or the shutdown) or its route was paused, or if it had to
    /// wait and no place came in time ([`Waiting::place_in_time`]).
    async fn deliver_when_placed(
        &self,
        route: &Route,
        job: Taken,
        waiting: Waiting,
        stop: &CancellationToken,
    ) {
        let place = tokio::select! {
            biased;
            () = stop.cancelled() => None,
            place = waiting.place_in_time() => place,
        };
        let policy = route.policy.queue.as_ref();
        let (Some(place), Some(policy)) = (place, policy) else {
            return self.put_back(route, &job).await;
        };
        if stop.is_cancelled() || self.paused.contains(&route.name) {
            drop(place);
            return self.put_back(route, &job).await;
        }
        attempt::deliver(&self.attempts, route, policy, job).await;
        place.ended();
    }

    /// Gives a job taken ahead back unsent, due at once, its take uncounted. If the store
    /// fails, the job is due again when its visibility ends.
    async fn put_back(&self, route: &Route, taken: &Taken) {
        let now = self.clock.now();
        match self.queue.release(taken, now).await {
            Ok(()) => self.wake(&route.name),
            // Its visibility ended and another take has it: that take's now.
            Err(StoreError::NotOwner) => {}
            Err(error) => {
                self.metrics.queue.store_error(&route.name);
                tracing::warn!(route = %route.name, key = %taken.job.key, %error, "a job taken ahead cannot be put back; it is due again when its visibility ends");
            }
        }
    }

    /// For a route gone from the configuration: whether its queue holds nothing to
    /// deliver any more, in which case its loop is taken off the running ones.
    async fn drained(&self, route: &str, stop: &CancellationToken) -> bool {
        let Ok(counts) = self.queue.counts(&[route.to_owned()]).await else {
            return false;
        };
        let left = counts.first().map_or(0, |c| c.waiting + c.retrying);
        if left > 0 {
            return false;
        }
        let mut running = self.running.lock();
        if running.get(route).is_some_and(|loop_of| {
            loop_of.draining.load(Ordering::Relaxed) && loop_of.stop == *stop
        }) {
            running.remove(route);
            tracing::info!(
                route,
                "a route gone from the configuration has delivered its queue"
            );
            return true;
        }
        false
    }

    /// Reads the paused routes from the store, the first time it is asked, until a read
    /// succeeds (no loop takes a job before: a restart must not deliver for a route an
    /// operator paused); later reads are the refresh's.
    async fn read_paused_once(&self) {
        self.paused_read
            .get_or_init(|| async {
                while !self.read_paused().await {
                    tokio::time::sleep(STORE_PAUSE).await;
                }
            })
            .await;
    }

    /// Reads the paused routes from the store; false if it could not be read (what was
    /// known stays).
    async fn read_paused(&self) -> bool {
        let begun = self.paused.begin_read();
        match self.queue.paused().await {
            Ok(paused) => {
                for route in self.paused.replace_from_store(begun, paused) {
                    self.wake(&route);
                }
                true
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the paused routes");
                false
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
            self.read_paused().await;
            let before: HashMap<String, u64> = self
                .running
                .lock()
                .keys()
                .map(|route| (route.clone(), self.fill.before_count(route)))
                .collect();
            match self.routes().await {
                Ok(routes) => {
                    let now = self.clock.now();
                    for route in &routes {
                        let counts = &route.counts;
                        let held = counts.waiting + counts.retrying + counts.dead;
                        let before = before.get(&route.route).copied().unwrap_or(u64::MAX);
                        self.fill.counted(&route.route, held, before);
                    }
                    let with_dead: HashSet<String> = routes
                        .iter()
                        .filter(|route| route.counts.dead > 0)
                        .map(|route| route.route.clone())
                        .collect();
                    for route in routes {
                        let oldest = route
                            .counts
                            .oldest
                            .map_or(0.0, |oldest| now.saturating_sub(oldest) as f64 / 1000.0);
                        self.metrics.queue.held(
                            &route.route,
                            QueueGauges {
                                waiting: route.counts.waiting,
                                retrying: route.counts.retrying,
                                dead: route.counts.dead,
                                in_flight: route.in_flight,
                                paused: route.paused,
                                oldest_age_seconds: oldest,
                            },
                        );
                    }
                    self.expire_dead_letters(&with_dead).await;
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
                .map(|(name, running)| (name.clone(), running.places.in_use() as u64))
                .collect();
            routes.sort();
            routes.into_iter().unzip()
        };
        let counts = self.queue.counts(&names).await?;
        Ok(names
            .into_iter()
            .zip(in_flight)
            .zip(counts)
            .map(|((route, in_flight), counts)| RouteQueue {
                paused: self.paused.contains(&route),
                route,
                counts,
                in_flight,
            })
            .collect())
    }

    /// Pauses or resumes a route's deliveries, for every replica sharing the store.
    pub(crate) async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError> {
        // One change at a time, so that the store and this replica end in the same order.
        let _one = self.changing_pause.lock().await;
        self.queue.set_paused(route, paused).await?;
        self.paused.set_here(route, paused);
        self.wake(route);
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

/// How many jobs a route's loop takes now, given `room` for them: with a rate, one once it
/// may start (a job taken early could outlive its visibility waiting, and another replica
/// take it too); without, as many as there is room for. `None` once stopped.
async fn how_many(
    limiter: Option<&DefaultDirectRateLimiter>,
    room: usize,
    stop: &CancellationToken,
) -> Option<usize> {
    let Some(limiter) = limiter else {
        return Some(room.min(TAKE_BATCH));
    };
    tokio::select! {
        () = limiter.until_ready() => Some(1),
        () = stop.cancelled() => None,
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
