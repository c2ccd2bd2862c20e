//! What only the sled backend does (the shared contract is in `conformance.rs`): the
//! sweep that reads only what expired, in batches; recovery after a restart, across every
//! expiry window; data directories it cannot read and the directory lock; group commit
//! with `durability: fsync`; entity records (`order:`) swept by their expiry index; the
//! delivery queue's lanes mended when a crash left them half changed.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dedupe_proxy::config::{Durability, SledConfig};
use dedupe_proxy::store::queue::{Attempt, BEHIND, DeadReason, Enqueued, Job, QueuedRequest};
use dedupe_proxy::store::sled::SledStore;
use dedupe_proxy::store::{
    Claim, ClaimOutcome, ClaimStore, Completion, Expiry, Forgotten, KeyState, ManualClock,
    QUEUED_STATUS, StateFilter, StoreError,
};
use support::{done, once_unlocked, open_sled};

const START: u64 = 1_800_000_000_000;
const LEASE: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(3600);
const BODY: [u8; 32] = [7; 32];

fn sled_config(path: &Path, durability: Durability) -> SledConfig {
    SledConfig {
        path: path.to_owned(),
        durability,
        ..SledConfig::default()
    }
}

struct Fixture {
    store: SledStore,
    clock: Arc<ManualClock>,
    dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let store = open_sled(&dir.path().join("db"), &clock);
    Fixture { store, clock, dir }
}

async fn claimed(store: &SledStore, key: &str) -> Claim {
    match store.claim(key, BODY, LEASE).await.unwrap() {
        ClaimOutcome::Claimed(claim) => claim,
        other => panic!("expected a claim of {key}, got {other:?}"),
    }
}

fn kept_for(retention: Duration) -> Completion {
    Completion {
        retention,
        ..done(200, RETENTION)
    }
}

/// The widest window that holds records kept for ten seconds: a power of two near an
/// eighth of the retention, at least 1024 ms.
const SHORT_WINDOW: Duration = Duration::from_millis(1024);

#[tokio::test]
async fn the_sweep_reads_only_what_expired() {
    let f = fixture();
    for i in 0..1000 {
        let claim = claimed(&f.store, &format!("short{i}")).await;
        let completion = kept_for(Duration::from_secs(10));
        f.store.finish(&claim, completion).await.unwrap();
    }
    for i in 0..3000 {
        let claim = claimed(&f.store, &format!("long{i}")).await;
        f.store.finish(&claim, done(200, RETENTION)).await.unwrap();
    }
    assert_eq!(f.store.done_keys(), Some(4000));
    let nothing = f.store.sweep(100_000).await.unwrap();
    assert_eq!(
        (nothing.examined, nothing.removed),
        (0, 0),
        "nothing has expired yet"
    );

    // Expired records read as absent at once, and their keys can be claimed again...
    f.clock.advance(Duration::from_secs(10));
    assert_eq!(f.store.inspect("short0").await.unwrap(), None);
    let again = claimed(&f.store, "short1").await;
    f.store.release(&again).await.unwrap();
    // ...and are removed once their whole window has passed, without reading the others.
    f.clock.advance(SHORT_WINDOW);
    let swept = f.store.sweep(100_000).await.unwrap();
    assert_eq!(swept.removed, 1000);
    assert_eq!(swept.examined, 1000, "the 3000 live keys were not read");
    assert_eq!(f.store.done_keys(), Some(3000));
    assert!(matches!(
        f.store.inspect("long0").await.unwrap(),
        Some(KeyState::Done(_))
    ));
    let again = f.store.sweep(100_000).await.unwrap();
    assert_eq!((again.examined, again.removed), (0, 0));
}

#[tokio::test]
async fn the_sweep_works_in_batches_and_keeps_records_done_again() {
    let f = fixture();
    for i in 0..25 {
        let claim = claimed(&f.store, &format!("k{i}")).await;
        f.store
            .finish(&claim, kept_for(Duration::from_secs(1)))
            .await
            .unwrap();
    }
    f.clock.advance(Duration::from_secs(1));
    // k0 is delivered and done again after expiring: its new record must survive.
    let fresh = claimed(&f.store, "k0").await;
    f.store.finish(&fresh, done(200, RETENTION)).await.unwrap();
    f.clock.advance(SHORT_WINDOW);
    let mut batches = Vec::new();
    loop {
        let swept = f.store.sweep(10).await.unwrap();
        batches.push(swept.removed);
        if swept.examined < 10 {
            break;
        }
    }
    // The 25 expired records, k0's old one included, in batches of about 10: a batch
    // removes whole values of 8 records, up to the one that reaches its limit.
    assert_eq!(batches.iter().sum::<usize>(), 25, "{batches:?}");
    assert!(batches.len() >= 2, "{batches:?}");
    assert!(batches.iter().all(|&batch| batch < 10 + 8), "{batches:?}");
    assert!(matches!(
        f.store.inspect("k0").await.unwrap(),
        Some(KeyState::Done(_))
    ));
    assert_eq!(f.store.done_keys(), Some(1));
}

#[tokio::test]
async fn abandoned_leases_are_swept_too() {
    let f = fixture();
    claimed(&f.store, "orphan").await;
    f.clock.advance(LEASE);
    assert_eq!(f.store.sweep(100).await.unwrap().removed, 1);
    assert_eq!(f.store.inspect("orphan").await.unwrap(), None);
}

async fn reopen(path: &Path, clock: &Arc<ManualClock>) -> SledStore {
    let config = sled_config(path, Durability::Batched);
    once_unlocked(|| SledStore::open_with_clock(&config, clock.clone())).await
}

#[tokio::test]
async fn a_restart_releases_the_earlier_process_claims_and_keeps_done_keys() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let open_claim = claimed(&f.store, "open").await;
    let finished = claimed(&f.store, "finished").await;
    f.store
        .finish(&finished, done(200, RETENTION))
        .await
        .unwrap();
    drop(f.store);

    let store = reopen(&path, &f.clock).await;
    assert_eq!(
        store.inspect("open").await.unwrap(),
        None,
        "released at start-up"
    );
    claimed(&store, "open").await;
    assert!(matches!(
        store.finish(&open_claim, done(200, RETENTION)).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        store.claim("finished", BODY, LEASE).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
}

#[tokio::test]
async fn a_restart_finds_every_done_key_in_every_window() {
    let f = fixture();
    let path = f.dir.path().join("db");
    // Retentions from a second to a week, finished over a simulated hour: many windows.
    let retentions = [1, 10, 60, 3600, 86_400, 7 * 86_400].map(Duration::from_secs);
    for i in 0..600 {
        let claim = claimed(&f.store, &format!("e{i}")).await;
        let retention = retentions[i % retentions.len()];
        f.store.finish(&claim, kept_for(retention)).await.unwrap();
        f.clock.advance(Duration::from_secs(6));
    }
    let live = |i: usize| {
        // finished at START + 6 s × i, now START + 3600 s
        6 * i as u64 + retentions[i % retentions.len()].as_secs() > 3600
    };
    let held = f.store.done_keys();
    drop(f.store);
    let store = reopen(&path, &f.clock).await;
    // Counted again in the background after start-up.
    let counted = std::time::Instant::now();
    while store.done_keys() != held && counted.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.done_keys(), held, "counted again after start-up");
    for i in 0..600 {
        let state = store.inspect(&format!("e{i}")).await.unwrap();
        assert_eq!(
            matches!(state, Some(KeyState::Done(_))),
            live(i),
            "e{i} after the restart"
        );
        if live(i) {
            let again = store.claim(&format!("e{i}"), BODY, LEASE).await.unwrap();
            assert!(matches!(again, ClaimOutcome::Done(_)), "e{i}: {again:?}");
        }
    }
}

#[tokio::test]
async fn a_data_directory_from_before_salts_is_refused_clearly() {
    // A development build before 0.1.0 filed done records in a `done` tree, unsalted.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = sled::open(&path).unwrap();
        db.open_tree("done")
            .unwrap()
            .insert("stripe:evt_1", &b"record"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let error = SledStore::open(&sled_config(&path, Durability::Batched))
        .err()
        .expect("refused");
    let text = error.to_string();
    assert!(
        text.contains("data directory") && text.contains("without a record-key salt"),
        "{text}"
    );
}

#[tokio::test]
async fn a_second_process_on_the_data_directory_is_refused_clearly() {
    let f = fixture();
    let error = SledStore::open(&sled_config(&f.dir.path().join("db"), Durability::Batched))
        .err()
        .expect("the directory is locked");
    assert!(
        error.to_string().contains("in use by another process"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_durability_shares_flushes_between_concurrent_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let store = Arc::new(
        SledStore::open_with_clock(
            &sled_config(&dir.path().join("db"), Durability::Fsync),
            clock,
        )
        .unwrap(),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let claim = claimed(&store, &format!("k{i}")).await;
            store.finish(&claim, done(200, RETENTION)).await
        });
    }
    let finished = tokio::time::timeout(Duration::from_secs(30), async {
        let mut ok = 0;
        while let Some(result) = tasks.join_next().await {
            result.unwrap().unwrap();
            ok += 1;
        }
        ok
    })
    .await
    .expect("group commit must not deadlock");
    assert_eq!(finished, 200);
}

/// Entity records (`order:`) are swept by their expiry index, in batches, reading only
/// what expired: a record that a newer version replaced is kept though its first index
/// entry expired; a record survives a restart.
#[tokio::test]
async fn entity_records_are_swept_by_expiry_and_survive_a_restart() {
    let Fixture { store, clock, dir } = fixture();
    let version = |text: &str| dedupe_proxy::testing::parse_version(text).unwrap();
    let short = Duration::from_secs(10);
    for n in 0..25 {
        let entity = format!("t#entity:{n}");
        assert!(
            store
                .record_version(&entity, &version("1"), short)
                .await
                .unwrap()
        );
    }
    // Moved on before it expired: its record now lasts the long retention.
    clock.advance(Duration::from_secs(5));
    assert!(
        store
            .record_version("t#entity:0", &version("2"), RETENTION)
            .await
            .unwrap()
    );
    clock.advance(Duration::from_secs(6));
    let mut batches = Vec::new();
    loop {
        let swept = store.sweep(10).await.unwrap();
        batches.push((swept.examined, swept.removed));
        if swept.examined < 10 {
            break;
        }
    }
    // 25 index entries from the first versions, of which entity 0's points to a live
    // record now; its second entry has not expired.
    assert_eq!(batches, [(10, 9), (10, 10), (5, 5)]);
    assert_eq!(store.sweep(10).await.unwrap().examined, 0);

    drop(store);
    let store = loop {
        match SledStore::open_with_clock(
            &sled_config(&dir.path().join("db"), Durability::Batched),
            clock.clone(),
        ) {
            Ok(store) => break store,
            Err(StoreError::Backend(text)) if text.contains("in use") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => panic!("{error}"),
        }
    };
    let kept = store.newest_version("t#entity:0").await.unwrap().unwrap();
    assert_eq!(kept.newest, version("2"));
    assert_eq!(store.newest_version("t#entity:1").await.unwrap(), None);
}

/// The tree of the queue's records, each under its seq.
const JOBS: &str = "jobs_by_seq";

/// Where `tree` holds the record of the job `key`: the first record that mentions it (no
/// key of these tests is part of another).
fn seq_of(tree: &sled::Tree, key: &str) -> Option<sled::IVec> {
    tree.iter()
        .map(Result::unwrap)
        .find(|(_, record)| mentions(record, key))
        .map(|(seq, _)| seq)
}

fn mentions(record: &[u8], key: &str) -> bool {
    record.windows(key.len()).any(|part| part == key.as_bytes())
}

/// A job of route `r` named `key`, received at the start.
fn queued(key: &str) -> Job {
    let request = QueuedRequest {
        method: "POST".into(),
        target: "/".into(),
        headers: vec![],
        body: bytes::Bytes::from_static(b"{}"),
    };
    Job::new(key.into(), "r".into(), START, request)
}

/// The database under `path`, opened as sled itself, once the store has let go of it.
async fn open_raw(path: &Path) -> sled::Db {
    once_unlocked(|| sled::open(path)).await
}

#[tokio::test]
async fn a_restart_mends_a_lane_and_drops_the_former_order_trees() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let laned = |key: &str| {
        let request = QueuedRequest {
            method: "POST".into(),
            target: "/".into(),
            headers: vec![],
            body: bytes::Bytes::from_static(b"{}"),
        };
        let mut job = Job::new(key.into(), "r".into(), START, request);
        job.lane = Some("A".into());
        job
    };
    let queue = f.store.queue().unwrap();
    queue.enqueue(&laned("r:a1")).await.unwrap();
    queue.enqueue(&laned("r:a2")).await.unwrap();
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].job.key, "r:a1");
    drop((queue, f.store));

    // A crash after a1's completion removed its record, before a2 was made due; and the
    // trees where an earlier version kept the orders.
    let former = ["jobs_due", "jobs_received", "jobs_dead", "jobs_lanes"];
    {
        let db = open_raw(&path).await;
        let jobs = db.open_tree(JOBS).unwrap();
        jobs.remove(seq_of(&jobs, "r:a1").unwrap()).unwrap();
        for tree in former {
            db.open_tree(tree).unwrap().insert("r\0stale", "").unwrap();
        }
        db.flush().unwrap();
    }
    let store = reopen(&path, &f.clock).await;
    let queue = store.queue().unwrap();
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    let keys: Vec<&str> = taken.iter().map(|taken| taken.job.key.as_str()).collect();
    assert_eq!(keys, ["r:a2"], "the lane moved on");
    drop((queue, store));

    let db = open_raw(&path).await;
    let names: Vec<String> = db
        .tree_names()
        .iter()
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect();
    for tree in former {
        assert!(
            !names.iter().any(|name| name == tree),
            "{tree} is gone: {names:?}"
        );
    }
    assert_eq!(db.open_tree(JOBS).unwrap().len(), 1, "a2 alone is queued");
}

#[tokio::test]
async fn an_accepted_job_is_one_record_and_nothing_else_on_disk() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let queue = f.store.queue().unwrap();
    for n in 0..50 {
        let request = QueuedRequest {
            method: "POST".into(),
            target: "/".into(),
            headers: vec![],
            body: bytes::Bytes::from_static(b"{}"),
        };
        let mut job = Job::new(format!("r:{n}"), "r".into(), START, request);
        job.lane = (n % 2 == 0).then(|| "A".into());
        queue.enqueue(&job).await.unwrap();
    }
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    assert_eq!(taken.len(), 10, "lane A's first and nine without a lane");
    drop((queue, f.store));

    let db = open_raw(&path).await;
    for name in db.tree_names() {
        let tree = db.open_tree(&name).unwrap();
        let name = String::from_utf8_lossy(&name).into_owned();
        match name.as_str() {
            JOBS => assert_eq!(tree.len(), 50, "one record a job"),
            // sled's own tree, where the store keeps its record-key salt.
            "__sled__default" => assert_eq!(tree.len(), 1, "the salt alone"),
            _ => assert!(tree.is_empty(), "the queue wrote to {name}"),
        }
    }
}

/// The indexes in memory are rebuilt from the records: after a restart the counts, the
/// oldest job and the dead letters' pages are as before (a job taken when it stopped is
/// due again, counted as it was).
#[tokio::test]
async fn a_restart_rebuilds_the_queue_indexes_as_they_were() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let queue = f.store.queue().unwrap();
    for n in 0..12 {
        let request = QueuedRequest {
            method: "POST".into(),
            target: "/".into(),
            headers: vec![],
            body: bytes::Bytes::from_static(b"{}"),
        };
        let mut job = Job::new(format!("r:{n:02}"), "r".into(), START + n, request);
        job.lane = (n % 3 == 0).then(|| format!("lane{}", n % 2));
        queue.enqueue(&job).await.unwrap();
    }
    let taken = queue.take("r", 8, LEASE).await.unwrap();
    assert_eq!(taken.len(), 8);
    let attempt = Attempt {
        at: START,
        latency_ms: 1,
        status: Some(503),
        detail: bytes::Bytes::new(),
    };
    for (n, taken) in taken.iter().enumerate() {
        let mut job = taken.job.clone();
        job.record(attempt.clone());
        match n % 4 {
            0 => queue.retry(taken, &job, START + 1).await.unwrap(),
            1 => {
                job.dead = Some((START + n as u64, DeadReason::Refused));
                queue.bury(taken, &job).await.unwrap();
            }
            2 => queue.complete(taken).await.unwrap(),
            _ => {} // still taken when the process stops
        }
    }
    let routes = ["r".to_owned()];
    let counts = |queue: &std::sync::Arc<dyn dedupe_proxy::store::queue::DeliveryQueue>| {
        let queue = queue.clone();
        let routes = routes.clone();
        async move {
            let counts = queue.counts(&routes).await.unwrap().pop().unwrap();
            let first = queue.dead("r", None, 1).await.unwrap();
            let rest = queue.dead("r", first.next.as_deref(), 10).await.unwrap();
            let dead: Vec<String> = first
                .jobs
                .iter()
                .chain(&rest.jobs)
                .map(|job| job.key.clone())
                .collect();
            (
                counts.waiting,
                counts.retrying,
                counts.dead,
                counts.oldest,
                dead,
            )
        }
    };
    let before = counts(&queue).await;
    assert_eq!(before.2, 2, "two buried");
    assert_eq!(before.4.len(), 2, "both listed, one page after the other");
    drop((queue, f.store));

    let store = reopen(&path, &f.clock).await;
    let queue = store.queue().unwrap();
    assert_eq!(counts(&queue).await, before);
}

/// Jobs are stored in the order they came, whatever their keys, and of jobs due at once
/// the first stored is taken first.
#[tokio::test]
async fn queued_jobs_are_stored_and_taken_in_the_order_they_came() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let queue = f.store.queue().unwrap();
    let keys = ["r:evt_m", "r:evt_z", "r:evt_a", "r:evt_q", "r:evt_b"];
    for key in keys {
        queue.enqueue(&queued(key)).await.unwrap();
    }
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    let taken: Vec<&str> = taken.iter().map(|taken| taken.job.key.as_str()).collect();
    assert_eq!(taken, keys, "due at the same time, taken as they came");
    drop((queue, f.store));

    let db = open_raw(&path).await;
    let (mut seqs, mut stored) = (Vec::new(), Vec::new());
    for record in db.open_tree(JOBS).unwrap().iter() {
        let (seq, record) = record.unwrap();
        seqs.push(u64::from_be_bytes(seq.as_ref().try_into().unwrap()));
        stored.push(*keys.iter().find(|key| mentions(&record, key)).unwrap());
    }
    assert_eq!(stored, keys);
    assert!(
        seqs.windows(2).all(|pair| pair[0] < pair[1]) && seqs[4] < 1 << 32,
        "seqs big-endian, growing: {seqs:?}"
    );
}

/// A job record as an earlier version stored it, in the tree `jobs` under its store key.
#[derive(serde::Serialize)]
struct FormerRecord<'a> {
    due_at: u64,
    token: u64,
    takes: u32,
    lane_place: u64,
    job: &'a Job,
}

/// `job`'s record as an earlier version wrote it, due at `due_at`, taken if `token` is
/// not 0, and at `lane_place` in its lane.
fn former_record(job: &Job, due_at: u64, token: u64, lane_place: u64) -> Vec<u8> {
    let record = FormerRecord {
        due_at,
        token,
        takes: u32::from(token != 0),
        lane_place,
        job,
    };
    postcard::to_stdvec(&record).unwrap()
}

/// An earlier version's queue (records under their store keys, in the tree `jobs`) is
/// moved when the database opens: every job there once, a taken one due again, a lane's
/// order kept, a record that does not read kept byte for byte, the old tree gone. A move
/// cut short copies only what it had not copied; of two records of a key, a second copy
/// is removed and one that differs left alone, uncounted.
#[tokio::test]
async fn an_earlier_versions_queue_is_moved_when_it_opens() {
    let f = fixture();
    let path = f.dir.path().join("db");
    drop(f.store);
    let mut dead = queued("r:dead");
    dead.dead = Some((START, DeadReason::Refused));
    let laned = |key: &str| {
        let mut job = queued(key);
        job.lane = Some("A".into());
        job
    };
    // A taken job is due again when its take's lease ends; a lane's second job (which
    // sorts first by key) waits behind its first.
    let leased = START + 3_600_000;
    let former = [
        (
            "r:waiting",
            former_record(&queued("r:waiting"), START, 0, 0),
        ),
        ("r:taken", former_record(&queued("r:taken"), leased, 7, 0)),
        ("r:dead", former_record(&dead, 0, 0, 0)),
        ("r:lane-1", former_record(&laned("r:lane-1"), BEHIND, 0, 6)),
        ("r:lane-2", former_record(&laned("r:lane-2"), START, 0, 5)),
        ("r:unreadable", b"\x09not a record".to_vec()),
    ];
    {
        let db = open_raw(&path).await;
        let tree = db.open_tree("jobs").unwrap();
        for (key, record) in &former {
            tree.insert(key, record.clone()).unwrap();
        }
        db.flush().unwrap();
    }
    let routes = ["r".to_owned()];
    let store = reopen(&path, &f.clock).await;
    let queue = store.queue().unwrap();
    let counts = queue.counts(&routes).await.unwrap().pop().unwrap();
    assert_eq!((counts.waiting + counts.retrying, counts.dead), (4, 1));
    assert!(queue.job("r", "r:dead").await.unwrap().is_some());
    let again = queue.enqueue(&queued("r:waiting")).await.unwrap();
    assert!(matches!(again, Enqueued::AlreadyQueued));
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    let mut keys: Vec<&str> = taken.iter().map(|taken| taken.job.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["r:lane-2", "r:taken", "r:waiting"],
        "the taken job is due again, the lane's first alone"
    );
    drop((taken, queue, store));

    {
        let db = open_raw(&path).await;
        let names: Vec<sled::IVec> = db.tree_names();
        assert!(
            !names.iter().any(|name| &**name == b"jobs"),
            "the old tree is gone"
        );
        let jobs = db.open_tree(JOBS).unwrap();
        assert_eq!(jobs.len(), 6);
        let mut records = jobs.iter().values().map(Result::unwrap);
        assert!(records.any(|record| &*record == b"\x09not a record"));
        // As if an open had stopped in the middle of a move, once it had copied r:dead,
        // and had not yet copied r:late.
        let tree = db.open_tree("jobs").unwrap();
        tree.insert("r:dead", former_record(&dead, 0, 0, 0))
            .unwrap();
        let late = former_record(&queued("r:late"), START, 0, 0);
        tree.insert("r:late", late).unwrap();
        // And two more records of queued keys: a copy, and one that differs.
        let copy = jobs.get(seq_of(&jobs, "r:dead").unwrap()).unwrap().unwrap();
        jobs.insert((u64::MAX - 1).to_be_bytes(), copy).unwrap();
        let other = former_record(&queued("r:waiting"), START + 5, 0, 0);
        jobs.insert((u64::MAX - 2).to_be_bytes(), other).unwrap();
        db.flush().unwrap();
    }
    let store = reopen(&path, &f.clock).await;
    let queue = store.queue().unwrap();
    let counts = queue.counts(&routes).await.unwrap().pop().unwrap();
    assert_eq!((counts.waiting + counts.retrying, counts.dead), (5, 1));
    drop((queue, store));
    let db = open_raw(&path).await;
    let jobs = db.open_tree(JOBS).unwrap();
    let records_of = |key: &str| {
        jobs.iter()
            .values()
            .filter(|record| mentions(record.as_ref().unwrap(), key))
            .count()
    };
    assert_eq!(
        (jobs.len(), records_of("r:dead"), records_of("r:waiting")),
        (8, 1, 2),
        "one record of r:dead, the other r:waiting left alone"
    );
}

/// A queued acceptance writes one record: the job's, which keeps its key's done record.
/// The queue answers claims for the key until the job leaves (also after a restart); the
/// done record is then filed with the others, for the rest of its retention.
#[tokio::test]
async fn a_queued_job_keeps_its_keys_done_record_until_it_leaves() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let accepted = done(QUEUED_STATUS, RETENTION);
    let enqueue_done = async |store: &SledStore, key: &str| {
        let claim = claimed(store, key).await;
        let job = queued(key);
        store.enqueue_done(&claim, &job, &accepted).await.unwrap()
    };
    let is_done =
        async |store: &SledStore, key: &str| match store.claim(key, BODY, LEASE).await.unwrap() {
            ClaimOutcome::Done(record) => Some(record),
            ClaimOutcome::Claimed(claim) => {
                store.release(&claim).await.unwrap();
                None
            }
            other => panic!("{key}: {other:?}"),
        };
    assert_eq!(enqueue_done(&f.store, "r:a").await, Some(Enqueued::Stored));
    assert_eq!(f.store.done_keys(), Some(1), "counted, not filed");
    let record = is_done(&f.store, "r:a").await.expect("done while queued");
    assert_eq!(
        (
            record.upstream_status,
            record.fingerprint,
            record.expires_at
        ),
        (QUEUED_STATUS, BODY, START + RETENTION.as_millis() as u64)
    );
    assert!(matches!(
        f.store.inspect("r:a").await.unwrap(),
        Some(KeyState::Done(_))
    ));
    let listed = f
        .store
        .list("r", "", Some(StateFilter::Done), None, 10)
        .await
        .unwrap();
    let keys: Vec<&str> = listed.keys.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["r:a"]);
    // One record on disk: the job's.
    drop(f.store);
    {
        let db = open_raw(&path).await;
        for name in db.tree_names() {
            let tree = db.open_tree(&name).unwrap();
            match &*String::from_utf8_lossy(&name) {
                JOBS => assert_eq!(tree.len(), 1),
                "__sled__default" => assert_eq!(tree.len(), 1, "the salt alone"),
                other => assert!(tree.is_empty(), "{other} was written to"),
            }
        }
    }

    // After a restart, from the job's record; then filed as the job is delivered.
    let store = reopen(&path, &f.clock).await;
    assert!(is_done(&store, "r:a").await.is_some());
    let queue = store.queue().unwrap();
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    // Delivered later: the retention still counts from the acceptance.
    f.clock.advance(Duration::from_secs(60));
    queue.complete(&taken[0]).await.unwrap();
    assert_eq!(store.done_keys(), Some(1));
    assert_eq!(queue.job("r", "r:a").await.unwrap(), None);
    assert_eq!(is_done(&store, "r:a").await, Some(record));

    // A dead letter's key stays done, and is filed as the letter is discarded.
    enqueue_done(&store, "r:b").await;
    let taken = queue.take("r", 10, LEASE).await.unwrap();
    let mut dead = taken[0].job.clone();
    dead.dead = Some((START, DeadReason::Refused));
    queue.bury(&taken[0], &dead).await.unwrap();
    assert!(is_done(&store, "r:b").await.is_some());
    f.clock.advance(Duration::from_secs(60));
    assert!(queue.discard("r", "r:b").await.unwrap());
    assert_eq!(store.done_keys(), Some(2));
    let filed = is_done(&store, "r:b").await.expect("filed as discarded");
    assert_eq!(
        filed.expires_at,
        START + 60_000 + RETENTION.as_millis() as u64,
        "its retention counted from its acceptance"
    );

    // An operator's forget reaches the job's done record: the key is claimed again, and a
    // resend finds its job queued (and marks the key done as a finish does).
    enqueue_done(&store, "r:c").await;
    assert_eq!(store.forget("r:c").await.unwrap(), Forgotten::Removed);
    assert_eq!(is_done(&store, "r:c").await, None);
    assert_eq!(
        enqueue_done(&store, "r:c").await,
        Some(Enqueued::AlreadyQueued)
    );
    assert!(is_done(&store, "r:c").await.is_some());

    // And so does a change of expiry.
    enqueue_done(&store, "r:d").await;
    // The clock moved two minutes above.
    let moved = START + 120_000 + 10;
    assert_eq!(store.set_expiry("r:d", moved).await.unwrap(), Expiry::Set);
    assert_eq!(
        is_done(&store, "r:d").await.map(|done| done.expires_at),
        Some(moved)
    );
    f.clock.advance(Duration::from_millis(10));
    assert_eq!(is_done(&store, "r:d").await, None, "expired, as moved");
}

/// Keys whose jobs keep their done records are listed in key order, page by page, past
/// jobs whose done record an operator forgot.
#[tokio::test]
async fn keys_done_by_their_queued_jobs_are_listed_in_order_page_by_page() {
    let f = fixture();
    let accepted = done(QUEUED_STATUS, RETENTION);
    let mut expected = Vec::new();
    for n in (0..150).rev() {
        let key = format!("r:k{n:03}");
        let claim = claimed(&f.store, &key).await;
        let stored = f.store.enqueue_done(&claim, &queued(&key), &accepted).await;
        assert_eq!(stored.unwrap(), Some(Enqueued::Stored));
        // The first hundred forgotten: a page's first look finds few done.
        if n < 100 {
            assert_eq!(f.store.forget(&key).await.unwrap(), Forgotten::Removed);
        } else {
            expected.push(key);
        }
    }
    expected.sort();
    let (mut listed, mut after) = (Vec::new(), None);
    loop {
        let page = f
            .store
            .list("r", "k", Some(StateFilter::Done), after.as_deref(), 7)
            .await
            .unwrap();
        assert!(page.keys.len() <= 7);
        listed.extend(page.keys.into_iter().map(|(key, _)| key));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, expected);

    // Without a state: a key in flight and a filed done key beside them, each once.
    let _open = claimed(&f.store, "r:k-open").await;
    let finished = claimed(&f.store, "r:kz").await;
    f.store
        .finish(&finished, done(200, RETENTION))
        .await
        .unwrap();
    let (mut listed, mut after) = (Vec::new(), None);
    loop {
        let page = f
            .store
            .list("r", "k", None, after.as_deref(), 9)
            .await
            .unwrap();
        listed.extend(page.keys);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let in_flight: Vec<&str> = (listed.iter())
        .filter(|(_, state)| matches!(state, KeyState::InFlight { .. }))
        .map(|(key, _)| key.as_str())
        .collect();
    assert_eq!(in_flight, ["r:k-open"]);
    let mut done_keys: Vec<String> = (listed.iter())
        .filter(|(_, state)| matches!(state, KeyState::Done(_)))
        .map(|(key, _)| key.clone())
        .collect();
    done_keys.sort();
    expected.push("r:kz".into());
    assert_eq!(done_keys, expected, "each done key once");
}
