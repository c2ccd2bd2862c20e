//! The delivery queue's contract (`delivery: queued`), one suite run unchanged against
//! sled, Redis, PostgreSQL, their TLS servers, the Redis Cluster and PostgreSQL through
//! PgBouncer: idempotent enqueue, a take that hides a job for its visibility and no longer,
//! tokens that refuse a late owner, retries due later, dead letters listed in order, revived
//! and discarded, concurrent takers that never share a job, counts, and pausing.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dedupe_proxy::store::queue::{
    Attempt, DeadReason, DeliveryQueue, Enqueued, Job, QueuedRequest,
};
use dedupe_proxy::store::{Clock, StoreError};
use support::Harness;

const VISIBLE: Duration = Duration::from_secs(60);

/// A queue under test, with a route of its own.
struct Queue {
    h: Harness,
    queue: Arc<dyn DeliveryQueue>,
    route: String,
}

impl Queue {
    fn of(h: Harness) -> Queue {
        let queue = h.store.queue().expect("every store keeps a queue");
        Queue {
            queue,
            route: format!("q{:012x}", rand::random::<u64>() >> 16),
            h,
        }
    }

    fn now(&self) -> u64 {
        match &self.h.clock {
            Some(clock) => clock.now(),
            None => dedupe_proxy::store::millis(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap(),
            ),
        }
    }

    fn job(&self, name: &str) -> Job {
        Job::new(
            format!("{}:{name}", self.route),
            self.route.clone(),
            self.now(),
            QueuedRequest {
                method: "POST".into(),
                target: format!("/hooks?event={name}"),
                headers: vec![(
                    "content-type".into(),
                    Bytes::from_static(b"application/json"),
                )],
                body: Bytes::from(format!(r#"{{"id":"{name}"}}"#)),
            },
        )
    }

    async fn enqueue(&self, name: &str) -> Enqueued {
        self.queue.enqueue(&self.job(name)).await.unwrap()
    }

    /// Enqueues the job `name` in `lane`.
    async fn enqueue_in(&self, lane: &str, name: &str) -> Enqueued {
        let mut job = self.job(name);
        job.lane = Some(lane.to_owned());
        self.queue.enqueue(&job).await.unwrap()
    }

    /// The jobs a take of up to ten gets, with their names, sorted by name.
    async fn take_sorted(&self) -> Vec<(String, dedupe_proxy::store::queue::Taken)> {
        let mut taken: Vec<_> = self
            .take(10, VISIBLE)
            .await
            .into_iter()
            .map(|taken| (self.name(&taken.job.key), taken))
            .collect();
        taken.sort_by(|a, b| a.0.cmp(&b.0));
        taken
    }

    fn name(&self, key: &str) -> String {
        key.trim_start_matches(&format!("{}:", self.route))
            .to_owned()
    }

    async fn take(
        &self,
        limit: usize,
        visibility: Duration,
    ) -> Vec<dedupe_proxy::store::queue::Taken> {
        self.queue
            .take(&self.route, limit, visibility)
            .await
            .unwrap()
    }

    async fn counts(&self) -> dedupe_proxy::store::queue::QueueCounts {
        let mut counts = self
            .queue
            .counts(std::slice::from_ref(&self.route))
            .await
            .unwrap();
        counts.pop().unwrap()
    }

    fn attempt(&self, status: u16) -> Attempt {
        Attempt {
            at: self.now(),
            latency_ms: 3,
            status: Some(status),
            detail: Bytes::from_static(b"no"),
        }
    }

    /// Takes the next due job and buries it, with the app's `status`.
    async fn bury(&self, status: u16) -> String {
        let taken = self.take(1, VISIBLE).await.pop().expect("a due job");
        let mut job = taken.job.clone();
        job.record(self.attempt(status));
        job.dead = Some((self.now(), DeadReason::Refused));
        self.queue.bury(&taken, &job).await.unwrap();
        job.key
    }
}

async fn enqueue_is_idempotent_and_a_take_hides_the_job(h: Harness) {
    let q = Queue::of(h);
    assert_eq!(q.enqueue("a").await, Enqueued::Stored);
    assert_eq!(q.enqueue("a").await, Enqueued::AlreadyQueued);
    let counts = q.counts().await;
    assert_eq!((counts.waiting, counts.retrying, counts.dead), (1, 0, 0));
    assert!(counts.oldest.is_some());
    let taken = q.take(10, VISIBLE).await;
    assert_eq!(taken.len(), 1);
    let expected = q.job("a");
    assert_eq!(taken[0].job.key, expected.key);
    assert_eq!(taken[0].job.request, expected.request);
    assert_eq!(taken[0].job.attempted, 0);
    assert!(q.take(10, VISIBLE).await.is_empty(), "hidden while taken");
    q.queue.complete(&taken[0]).await.unwrap();
    assert!(
        q.queue
            .job(&q.route, &taken[0].job.key)
            .await
            .unwrap()
            .is_none()
    );
    let counts = q.counts().await;
    assert_eq!(
        (counts.waiting, counts.retrying, counts.oldest),
        (0, 0, None)
    );
    // Delivered and gone: the same key may be queued again (its done record, not the
    // queue, answers duplicates).
    assert_eq!(q.enqueue("a").await, Enqueued::Stored);
}

async fn a_job_whose_visibility_ends_is_taken_again_and_its_late_owner_refused(h: Harness) {
    let q = Queue::of(h);
    q.enqueue("v").await;
    let first = q.take(1, Duration::from_millis(300)).await.pop().unwrap();
    q.h.pass(Duration::from_millis(600)).await;
    let second = q.take(1, VISIBLE).await.pop().expect("due again");
    assert_ne!(first.token, second.token);
    // Each take is counted, so that the app can tell a retry, even of a cut-off attempt.
    assert_eq!((first.attempt, second.attempt), (1, 2));
    let mut job = first.job.clone();
    job.record(q.attempt(500));
    let late = q.queue.retry(&first, &job, q.now()).await;
    assert!(matches!(late, Err(StoreError::NotOwner)), "{late:?}");
    // Nor may it give the job back: the second take's number was sent, or will be.
    assert!(matches!(
        q.queue.release(&first, q.now()).await,
        Err(StoreError::NotOwner)
    ));
    job.dead = Some((q.now(), DeadReason::Refused));
    assert!(matches!(
        q.queue.bury(&first, &job).await,
        Err(StoreError::NotOwner)
    ));
    // A late owner's success removes nothing: the job is another take's now (which
    // delivers it again), and its lane's next job must not run beside it.
    assert!(matches!(
        q.queue.complete(&first).await,
        Err(StoreError::NotOwner)
    ));
    // The current owner's retry stands.
    let mut job = second.job.clone();
    job.record(q.attempt(503));
    q.queue.retry(&second, &job, q.now()).await.unwrap();
    let counts = q.counts().await;
    assert_eq!((counts.waiting, counts.retrying), (0, 1));
    let third = q.take(1, VISIBLE).await.pop().unwrap();
    assert_eq!(third.job.attempted, 1);
    assert_eq!(third.job.history[0].status, Some(503));
}

async fn a_retry_is_due_at_its_time_and_not_before(h: Harness) {
    let q = Queue::of(h);
    q.enqueue("r").await;
    let taken = q.take(1, VISIBLE).await.pop().unwrap();
    let mut job = taken.job.clone();
    job.record(q.attempt(500));
    q.queue.retry(&taken, &job, q.now() + 400).await.unwrap();
    assert!(q.take(1, VISIBLE).await.is_empty(), "not due yet");
    q.h.pass(Duration::from_millis(600)).await;
    assert_eq!(q.take(1, VISIBLE).await.len(), 1);
}

/// A job released unsent (taken ahead of a free place, then paused) is as it was before
/// its take: due, waiting, and its next take counted as its first; released twice, or
/// once settled, it is not its taker's to release (a release after another took it:
/// `a_job_whose_visibility_ends_is_taken_again_and_its_late_owner_refused`).
async fn a_job_released_unsent_is_as_it_was_before_its_take(h: Harness) {
    let q = Queue::of(h);
    q.enqueue("back").await;
    let taken = q.take(1, VISIBLE).await.pop().unwrap();
    assert_eq!(taken.attempt, 1);
    q.queue.release(&taken, q.now()).await.unwrap();
    let counts = q.counts().await;
    assert_eq!((counts.waiting, counts.retrying), (1, 0));
    assert!(matches!(
        q.queue.release(&taken, q.now()).await,
        Err(StoreError::NotOwner)
    ));
    let again = q.take(1, VISIBLE).await.pop().expect("due at once");
    assert_eq!(again.attempt, 1, "the released take does not count");
    // Released once more after a real attempt: the attempt's own take still counts.
    q.queue.release(&again, q.now()).await.unwrap();
    let third = q.take(1, VISIBLE).await.pop().expect("due at once");
    let mut job = third.job.clone();
    job.record(q.attempt(503));
    q.queue.retry(&third, &job, q.now()).await.unwrap();
    let fourth = q.take(1, VISIBLE).await.pop().expect("due at once");
    assert_eq!(fourth.attempt, 2);
    assert!(matches!(
        q.queue.release(&third, q.now()).await,
        Err(StoreError::NotOwner)
    ));
    q.queue.release(&fourth, q.now() + 60_000).await.unwrap();
    assert!(
        q.take(1, VISIBLE).await.is_empty(),
        "due when released to be"
    );
}

async fn dead_letters_are_listed_in_order_revived_and_discarded(h: Harness) {
    let q = Queue::of(h);
    let mut dead = Vec::new();
    for name in ["d1", "d2", "d3", "d4", "d5"] {
        q.enqueue(name).await;
        dead.push(q.bury(422).await);
        q.h.pass(Duration::from_millis(5)).await;
    }
    let counts = q.counts().await;
    assert_eq!((counts.waiting, counts.dead, counts.oldest), (0, 5, None));
    // Two pages of two, then the last.
    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = q.queue.dead(&q.route, after.as_deref(), 2).await.unwrap();
        assert!(page.jobs.len() <= 2);
        listed.extend(page.jobs.iter().map(|job| job.key.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, dead);
    let first = q.queue.job(&q.route, &dead[0]).await.unwrap().unwrap();
    assert_eq!(first.dead.map(|(_, why)| why), Some(DeadReason::Refused));
    assert_eq!(first.last_status(), Some(422));

    // Revived: due now, a new round, counted as waiting.
    assert!(q.queue.revive(&q.route, &dead[0]).await.unwrap());
    assert!(
        !q.queue.revive(&q.route, &dead[0]).await.unwrap(),
        "not dead now"
    );
    let revived = q.take(1, VISIBLE).await.pop().unwrap();
    assert_eq!(revived.job.key, dead[0]);
    assert_eq!(revived.job.attempts_this_round(), 0);
    assert_eq!(revived.job.attempted, 1);

    // Discarded: gone; a queued job is not discarded.
    assert!(q.queue.discard(&q.route, &dead[1]).await.unwrap());
    assert!(!q.queue.discard(&q.route, &dead[1]).await.unwrap());
    assert!(q.queue.job(&q.route, &dead[1]).await.unwrap().is_none());
    assert!(!q.queue.discard(&q.route, &dead[0]).await.unwrap());
    assert_eq!(q.counts().await.dead, 3);

    // A cursor of another listing is refused, not misread.
    let refused = q.queue.dead(&q.route, Some("not a cursor"), 2).await;
    assert!(
        matches!(refused, Err(StoreError::BadRequest(_))),
        "{refused:?}"
    );
}

async fn concurrent_takers_never_share_a_job(h: Harness) {
    let q = Arc::new(Queue::of(h));
    for index in 0..60 {
        q.enqueue(&format!("c{index}")).await;
    }
    let mut takers = Vec::new();
    for _ in 0..6 {
        let q = Arc::clone(&q);
        takers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let taken = q.take(4, VISIBLE).await;
                if taken.is_empty() {
                    return mine;
                }
                for job in taken {
                    mine.push(job.job.key.clone());
                    q.queue.complete(&job).await.unwrap();
                }
            }
        }));
    }
    let mut all = Vec::new();
    for taker in takers {
        all.extend(taker.await.unwrap());
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "each job taken once");
    assert_eq!(distinct.len(), 60);
}

fn names(taken: &[(String, dedupe_proxy::store::queue::Taken)]) -> Vec<&str> {
    taken.iter().map(|(name, _)| name.as_str()).collect()
}

async fn a_lane_delivers_one_job_at_a_time_in_the_order_stored(h: Harness) {
    let q = Queue::of(h);
    // Claims in a scope named `queue`, of keys like the queue's own, are elsewhere.
    for key in [
        format!("queue:{{{}}}:lane:A", q.route),
        format!("queue:{{{}}}:jobs", q.route),
    ] {
        q.h.store
            .claim(&key, [0; 32], VISIBLE)
            .await
            .expect("a claim beside the queue");
    }
    for (lane, name) in [("A", "a1"), ("A", "a2"), ("B", "b1"), ("A", "a3")] {
        assert_eq!(q.enqueue_in(lane, name).await, Enqueued::Stored);
    }
    assert_eq!(q.enqueue_in("A", "a2").await, Enqueued::AlreadyQueued);
    q.enqueue("n1").await;
    assert_eq!(
        q.counts().await.waiting,
        5,
        "the jobs behind count as waiting"
    );
    let taken = q.take_sorted().await;
    assert_eq!(names(&taken), ["a1", "b1", "n1"], "only each lane's first");

    // A retry keeps the lane's place: a2 stays behind a1.
    let a1 = &taken[0].1;
    let mut job = a1.job.clone();
    job.record(q.attempt(503));
    q.queue.retry(a1, &job, q.now()).await.unwrap();
    for (_, other) in &taken[1..] {
        q.queue.complete(other).await.unwrap();
    }
    let again = q.take_sorted().await;
    assert_eq!(names(&again), ["a1"]);
    q.queue.complete(&again[0].1).await.unwrap();

    // Delivered: the next is due. Buried: the next is due too.
    let a2 = q.take_sorted().await;
    assert_eq!(names(&a2), ["a2"]);
    let mut job = a2[0].1.job.clone();
    job.record(q.attempt(422));
    job.dead = Some((q.now(), DeadReason::Refused));
    q.queue.bury(&a2[0].1, &job).await.unwrap();
    let a3 = q.take_sorted().await;
    assert_eq!(names(&a3), ["a3"]);

    // Revived while a3 is out: it goes behind a3.
    assert!(q.queue.revive(&q.route, &job.key).await.unwrap());
    assert!(q.take_sorted().await.is_empty(), "a2 waits behind a3");
    q.queue.complete(&a3[0].1).await.unwrap();
    let revived = q.take_sorted().await;
    assert_eq!(names(&revived), ["a2"]);
    q.queue.complete(&revived[0].1).await.unwrap();
    assert!(q.take_sorted().await.is_empty());
    let counts = q.counts().await;
    assert_eq!((counts.waiting, counts.retrying, counts.dead), (0, 0, 0));

    // An emptied lane takes a new job at once.
    q.enqueue_in("A", "a4").await;
    q.enqueue_in("A", "a5").await;
    let a4 = q.take(10, Duration::from_millis(500)).await;
    assert_eq!(a4.len(), 1);
    // Its visibility ended: a4 is taken again, a5 still waits.
    q.h.pass(Duration::from_millis(700)).await;
    let again = q.take_sorted().await;
    assert_eq!(names(&again), ["a4"]);
    assert_eq!(again[0].1.attempt, 2);
    // Dead, then a5 goes; a4 replayed into the lane emptied meanwhile is due at once,
    // and discarding a dead letter leaves the lane as it is.
    let mut job = again[0].1.job.clone();
    job.dead = Some((q.now(), DeadReason::Refused));
    q.queue.bury(&again[0].1, &job).await.unwrap();
    let a5 = q.take_sorted().await;
    assert_eq!(names(&a5), ["a5"]);
    q.queue.complete(&a5[0].1).await.unwrap();
    assert!(q.queue.revive(&q.route, &job.key).await.unwrap());
    let replayed = q.take_sorted().await;
    assert_eq!(names(&replayed), ["a4"]);
    job = replayed[0].1.job.clone();
    job.dead = Some((q.now(), DeadReason::Refused));
    q.queue.bury(&replayed[0].1, &job).await.unwrap();
    q.enqueue_in("A", "a6").await;
    assert!(q.queue.discard(&q.route, &job.key).await.unwrap());
    assert_eq!(names(&q.take_sorted().await), ["a6"]);
}

/// Lanes as a sender may write them (the hash tag's braces, separators, a space, a
/// non-ASCII letter, the longest a key may be, and one a prefix of another) are each a
/// lane of their own, on every store.
async fn odd_lanes_are_lanes_of_their_own(h: Harness) {
    let q = Queue::of(h);
    let long = "x".repeat(512);
    let lanes = ["}{route}:lane/", "a b\u{e9}", "a", "ab", long.as_str()];
    for (n, lane) in lanes.iter().enumerate() {
        q.enqueue_in(lane, &format!("l{n}-1")).await;
        q.enqueue_in(lane, &format!("l{n}-2")).await;
    }
    let firsts = q.take_sorted().await;
    assert_eq!(names(&firsts), ["l0-1", "l1-1", "l2-1", "l3-1", "l4-1"]);
    for (_, taken) in &firsts {
        q.queue.complete(taken).await.unwrap();
    }
    let seconds = q.take_sorted().await;
    assert_eq!(names(&seconds), ["l0-2", "l1-2", "l2-2", "l3-2", "l4-2"]);
}

async fn concurrent_enqueues_and_takers_keep_a_lane_in_order(h: Harness) {
    enqueue_while_taking(h, Some("one")).await;
}

/// Jobs stored while takers run are each taken once (none left behind by a take that
/// met it half written).
async fn jobs_stored_while_takers_run_are_all_taken(h: Harness) {
    enqueue_while_taking(h, None).await;
}

/// Eight senders store jobs while three workers take and complete them; with a lane, the
/// workers get one job of it at a time, in each sender's order.
async fn enqueue_while_taking(h: Harness, lane: Option<&'static str>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const SENDERS: usize = 8;
    const EACH: usize = 40;
    let q = Arc::new(Queue::of(h));
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let q = Arc::clone(&q);
        senders.push(tokio::spawn(async move {
            for index in 0..EACH {
                let name = format!("s{sender}-{index:02}");
                match lane {
                    Some(lane) => q.enqueue_in(lane, &name).await,
                    None => q.enqueue(&name).await,
                };
            }
        }));
    }
    let out = Arc::new(AtomicUsize::new(0));
    let delivered = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (q, out, delivered) = (Arc::clone(&q), Arc::clone(&out), Arc::clone(&delivered));
        workers.push(tokio::spawn(async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while delivered.lock().len() < SENDERS * EACH {
                assert!(std::time::Instant::now() < deadline, "jobs left untaken");
                let taken = q.take(10, VISIBLE).await;
                if taken.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                if lane.is_none() {
                    for job in taken {
                        delivered.lock().push(q.name(&job.job.key));
                        q.queue.complete(&job).await.unwrap();
                    }
                    continue;
                }
                assert_eq!(taken.len(), 1, "a lane gave out {} jobs", taken.len());
                assert_eq!(
                    out.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two jobs out at once"
                );
                delivered.lock().push(q.name(&taken[0].job.key));
                // The job is out a while, while the other workers take: none may get
                // another of its lane until it is completed (the count drops just before).
                tokio::time::sleep(Duration::from_millis(1)).await;
                out.fetch_sub(1, Ordering::SeqCst);
                q.queue.complete(&taken[0]).await.unwrap();
            }
        }));
    }
    for task in senders.into_iter().chain(workers) {
        task.await.unwrap();
    }
    let delivered = delivered.lock().clone();
    assert_eq!(delivered.len(), SENDERS * EACH);
    let distinct: HashSet<_> = delivered.iter().collect();
    assert_eq!(distinct.len(), SENDERS * EACH, "a job taken twice");
    if lane.is_none() {
        return;
    }
    for sender in 0..SENDERS {
        let own: Vec<_> = delivered
            .iter()
            .filter(|name| name.starts_with(&format!("s{sender}-")))
            .collect();
        let mut sorted = own.clone();
        sorted.sort();
        assert_eq!(own, sorted, "sender {sender}'s jobs out of order");
    }
}

async fn pausing_is_kept_in_the_store(h: Harness) {
    let q = Queue::of(h);
    q.queue.set_paused(&q.route, true).await.unwrap();
    assert!(q.queue.paused().await.unwrap().contains(&q.route));
    q.queue.set_paused(&q.route, true).await.unwrap();
    q.queue.set_paused(&q.route, false).await.unwrap();
    assert!(!q.queue.paused().await.unwrap().contains(&q.route));
}

/// Duplicate enqueues of a job (a sender's retry accepted twice) racing its worker's
/// retry leave the retried job due: an enqueue of a key already queued writes nothing.
async fn duplicate_enqueues_racing_a_retry_lose_no_job(h: Harness) {
    let q = Arc::new(Queue::of(h));
    for round in 0..40 {
        let name = format!("d{round}");
        assert_eq!(q.enqueue(&name).await, Enqueued::Stored);
        let taken = q.take(1, VISIBLE).await.pop().expect("due");
        let mut job = taken.job.clone();
        job.record(q.attempt(503));
        let duplicates = {
            let (q, name) = (Arc::clone(&q), name.clone());
            tokio::spawn(async move {
                for _ in 0..20 {
                    assert_eq!(q.enqueue(&name).await, Enqueued::AlreadyQueued);
                }
            })
        };
        q.queue.retry(&taken, &job, q.now()).await.unwrap();
        duplicates.await.unwrap();
        let again = q.take(1, VISIBLE).await;
        assert_eq!(again.len(), 1, "round {round}: the retried job is due");
        q.queue.complete(&again[0]).await.unwrap();
    }
}

macro_rules! backend {
    ($module:ident, $harness:ident, $($test:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    if let Some(harness) = super::Harness::$harness().await {
                        super::$test(harness).await;
                    }
                }
            )*
        }
    };
}

macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        backend!(sled_backend, sled, $($test),*);
        backend!(redis_backend, redis, $($test),*);
        backend!(postgres_backend, postgres, $($test),*);
        backend!(redis_tls_backend, redis_tls, $($test),*);
        backend!(redis_cluster_backend, redis_cluster, $($test),*);
        backend!(postgres_tls_backend, postgres_tls, $($test),*);
        backend!(postgres_pooled_backend, postgres_pooled, $($test),*);
    };
}

contract!(
    enqueue_is_idempotent_and_a_take_hides_the_job,
    a_job_whose_visibility_ends_is_taken_again_and_its_late_owner_refused,
    a_retry_is_due_at_its_time_and_not_before,
    a_job_released_unsent_is_as_it_was_before_its_take,
    dead_letters_are_listed_in_order_revived_and_discarded,
    concurrent_takers_never_share_a_job,
    pausing_is_kept_in_the_store,
    a_lane_delivers_one_job_at_a_time_in_the_order_stored,
    concurrent_enqueues_and_takers_keep_a_lane_in_order,
    odd_lanes_are_lanes_of_their_own,
    jobs_stored_while_takers_run_are_all_taken,
    duplicate_enqueues_racing_a_retry_lose_no_job,
);

/// Redis evicting a route's job records (a server not set to `noeviction`, which the start
/// warns of) holds no lane for good: a take drops the entries whose record is gone, and
/// the next job stored in the lane is due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_holds_no_lane_on_redis() {
    let Some(h) = Harness::redis().await else {
        return;
    };
    let q = Queue::of(h);
    q.enqueue_in("l", "e1").await;
    q.enqueue_in("l", "e2").await;
    evict_job_records(&q).await;
    assert!(q.take(10, VISIBLE).await.is_empty());
    assert_eq!(q.enqueue_in("l", "e3").await, Enqueued::Stored);
    let taken = q.take(10, VISIBLE).await;
    let keys: Vec<&str> = taken.iter().map(|taken| taken.job.key.as_str()).collect();
    assert_eq!(keys, [format!("{}:e3", q.route)]);
    let counts = q.counts().await;
    assert_eq!((counts.waiting, counts.retrying), (1, 0), "{counts:?}");
}

/// Dead letters whose records Redis evicted are dropped from the list as it is read: they
/// neither count against `max_queued` nor end a listing (or the retention's sweep) early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_dead_letters_leave_the_list_on_redis() {
    let Some(h) = Harness::redis().await else {
        return;
    };
    let q = Queue::of(h);
    q.enqueue("d1").await;
    q.bury(410).await;
    q.enqueue("d2").await;
    q.bury(410).await;
    assert_eq!(q.counts().await.dead, 2);
    evict_job_records(&q).await;
    let page = q.queue.dead(&q.route, None, 1).await.unwrap();
    assert!(page.jobs.is_empty());
    assert!(
        page.next.is_some(),
        "the listing goes on past the evicted one"
    );
    let page = q
        .queue
        .dead(&q.route, page.next.as_deref(), 1)
        .await
        .unwrap();
    assert!(page.jobs.is_empty() && page.next.is_none());
    assert_eq!(q.counts().await.dead, 0);
}

/// Evicts `q`'s route's job records as Redis does when full: the whole hash at once.
async fn evict_job_records(q: &Queue) {
    let client = redis::Client::open(support::REDIS_URL).unwrap();
    let mut link = client.get_multiplexed_async_connection().await.unwrap();
    let jobs = format!("dedupe-test:queue/{{{}}}/jobs", q.route);
    let _: () = redis::cmd("DEL")
        .arg(&jobs)
        .query_async(&mut link)
        .await
        .unwrap();
}
