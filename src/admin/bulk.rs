//! Dead letters picked by a filter (route, status, reason, key prefix, time of death),
//! for a listing's page and for bulk replays: a replay of every match runs in the
//! background, and can be watched and cancelled.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::answers::{DeadFilterView, ReplayProgress};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::queue::Deliveries;
use crate::route::Route;
use crate::store::queue::{DeadReason, DeliveryQueue, Job, dead_cursor};
use crate::store::{Millis, StoreError, parse_rfc3339, rfc3339};

/// The most dead letters read to fill one page of matches: a filter that matches little
/// ends a page early, with its `next`, rather than read the whole list.
const SCAN_BUDGET: usize = 1000;

/// How many dead letters a replay revives between looks at its cancellation.
const REPLAY_STEP: usize = 100;

/// The most replays remembered, and running at once.
const REPLAYS_KEPT: usize = 32;
const REPLAYS_RUNNING: usize = 4;

/// Which dead letters a listing or a replay takes.
#[derive(Debug, Clone, Default)]
pub(super) struct DeadFilter {
    status: Option<u16>,
    reason: Option<String>,
    key_prefix: Option<String>,
    since: Option<Millis>,
    until: Option<Millis>,
}

impl DeadFilter {
    /// The filter, the page size and the cursor a query asks for.
    pub(super) fn parse(
        query: Option<&str>,
        default_limit: usize,
        max_limit: usize,
    ) -> Result<(DeadFilter, usize, Option<String>), String> {
        let mut filter = DeadFilter::default();
        let (mut limit, mut after) = (default_limit, None);
        for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*name {
                "status" => {
                    filter.status = Some(
                        value
                            .parse::<u16>()
                            .ok()
                            .filter(|status| (100..600).contains(status))
                            .ok_or_else(|| format!("status `{value}` is not an HTTP status"))?,
                    );
                }
                "reason" if DeadReason::NAMES.contains(&&*value) => {
                    filter.reason = Some(value.into_owned());
                }
                "reason" => {
                    let names = DeadReason::NAMES.join(", ");
                    return Err(format!("reason `{value}` is not one of {names}"));
                }
                "key_prefix" => filter.key_prefix = Some(value.into_owned()),
                "since" => filter.since = Some(parse_rfc3339(&name, &value)?),
                "until" => filter.until = Some(parse_rfc3339(&name, &value)?),
                "limit" => {
                    limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=max_limit).contains(n))
                        .ok_or_else(|| format!("limit must be a number from 1 to {max_limit}"))?;
                }
                "after" => after = Some(value.into_owned()),
                other => return Err(format!("unknown query parameter `{other}`")),
            }
        }
        Ok((filter, limit, after))
    }

    fn admits(&self, route: &Route, job: &Job) -> bool {
        let key = job
            .key
            .strip_prefix(&route.namespace)
            .and_then(|rest| rest.strip_prefix(':'))
            .unwrap_or(&job.key);
        let died = job.dead.map_or(0, |(at, _)| at);
        self.status
            .is_none_or(|status| job.last_status() == Some(status))
            && self
                .reason
                .as_deref()
                .is_none_or(|reason| job.dead.map(|(_, why)| why.as_str()) == Some(reason))
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|prefix| key.starts_with(prefix))
            && self.since.is_none_or(|since| died >= since)
            && self.until.is_none_or(|until| died < until)
    }

    fn describe(&self) -> DeadFilterView {
        DeadFilterView {
            status: self.status,
            reason: self.reason.clone(),
            key_prefix: self.key_prefix.clone(),
            since: self.since.map(rfc3339),
            until: self.until.map(rfc3339),
        }
    }
}

/// Up to `limit` of the route's dead letters that `filter` admits, after the cursor
/// `after`, and the cursor to go on from (none once the list is read to its end).
pub(super) async fn matching(
    queue: &dyn DeliveryQueue,
    route: &Route,
    filter: &DeadFilter,
    mut after: Option<String>,
    limit: usize,
) -> Result<(Vec<Job>, Option<String>), StoreError> {
    let mut found = Vec::new();
    let mut read = 0;
    loop {
        let page = queue
            .dead(&route.name, after.as_deref(), limit.min(100))
            .await?;
        for job in page.jobs {
            read += 1;
            after = Some(dead_cursor(&job));
            if filter.admits(route, &job) {
                found.push(job);
                if found.len() == limit {
                    return Ok((found, after));
                }
            }
        }
        if page.next.is_none() {
            return Ok((found, None));
        }
        if read >= SCAN_BUDGET {
            return Ok((found, after));
        }
    }
}

/// A bulk replay's progress.
struct Replay {
    id: u64,
    route: String,
    filter: DeadFilterView,
    matched: AtomicU64,
    replayed: AtomicU64,
    state: Mutex<&'static str>,
    error: Mutex<Option<String>>,
    cancel: CancellationToken,
}

impl Replay {
    fn describe(&self) -> ReplayProgress {
        ReplayProgress {
            id: self.id,
            route: self.route.clone(),
            filter: self.filter.clone(),
            state: (*self.state.lock()).to_owned(),
            matched: self.matched.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            error: self.error.lock().clone(),
        }
    }
}

/// The bulk replays started through this admin port (each clone shares them).
#[derive(Default, Clone)]
pub(super) struct Replays {
    replays: Arc<Mutex<BTreeMap<u64, Arc<Replay>>>>,
    next_id: Arc<AtomicU64>,
}

impl Replays {
    /// Starts replaying every dead letter of `route` that `filter` admits. Refused while
    /// [`REPLAYS_RUNNING`] run.
    pub(super) fn start(
        &self,
        deliveries: Arc<Deliveries>,
        route: Arc<Route>,
        mut filter: DeadFilter,
    ) -> Result<ReplayProgress, String> {
        // Only letters dead before the start: one that dies again while the replay runs
        // is not replayed again by it.
        let now = crate::store::Clock::now(&crate::store::SystemClock);
        filter.until = Some(filter.until.map_or(now, |until| until.min(now)));
        let mut replays = self.replays.lock();
        let running = replays
            .values()
            .filter(|replay| *replay.state.lock() == "running")
            .count();
        if running >= REPLAYS_RUNNING {
            return Err(format!(
                "{REPLAYS_RUNNING} replays are running already: wait for one, or cancel one"
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let replay = Arc::new(Replay {
            id,
            route: route.name.clone(),
            filter: filter.describe(),
            matched: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            state: Mutex::new("running"),
            error: Mutex::new(None),
            cancel: CancellationToken::new(),
        });
        replays.insert(id, Arc::clone(&replay));
        while replays.len() > REPLAYS_KEPT {
            let Some(oldest_done) = replays
                .iter()
                .find(|(_, replay)| *replay.state.lock() != "running")
                .map(|(id, _)| *id)
            else {
                break;
            };
            replays.remove(&oldest_done);
        }
        let described = replay.describe();
        tokio::spawn(run(deliveries, route, filter, replay));
        Ok(described)
    }

    pub(super) fn get(&self, id: u64) -> Option<ReplayProgress> {
        self.replays.lock().get(&id).map(|replay| replay.describe())
    }

    /// Cancels a running replay; what it replayed stays replayed.
    pub(super) fn cancel(&self, id: u64) -> Option<ReplayProgress> {
        let replays = self.replays.lock();
        let replay = replays.get(&id)?;
        replay.cancel.cancel();
        Some(replay.describe())
    }
}

/// Revives every match, [`REPLAY_STEP`] at a time, until the list ends or the replay is
/// cancelled.
async fn run(
    deliveries: Arc<Deliveries>,
    route: Arc<Route>,
    filter: DeadFilter,
    replay: Arc<Replay>,
) {
    let queue = Arc::clone(deliveries.queue());
    let mut after = None;
    let ended = loop {
        if replay.cancel.is_cancelled() {
            break "cancelled";
        }
        let (jobs, next) =
            match matching(queue.as_ref(), &route, &filter, after.take(), REPLAY_STEP).await {
                Ok(found) => found,
                Err(error) => {
                    *replay.error.lock() = Some(error.to_string());
                    break "failed";
                }
            };
        replay
            .matched
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        for job in jobs {
            match queue.revive(&route.name, &job.key).await {
                Ok(true) => {
                    replay.replayed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => {}
                Err(error) => {
                    *replay.error.lock() = Some(error.to_string());
                }
            }
        }
        deliveries.accepted(&route.name);
        match next {
            Some(cursor) => after = Some(cursor),
            None => break "done",
        }
    };
    tracing::info!(route = %route.name, id = replay.id, state = ended, replayed = replay.replayed.load(Ordering::Relaxed), "bulk replay of dead letters ended");
    *replay.state.lock() = ended;
}
