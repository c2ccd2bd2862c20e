//! What only the sled backend does (the shared contract is in `conformance.rs`): the
//! sweep that reads only what expired, in batches; recovery after a restart; the
//! directory lock; group commit with `durability: fsync`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dedupe_proxy::config::{Durability, SledConfig};
use dedupe_proxy::store::sled::SledStore;
use dedupe_proxy::store::{
    Claim, ClaimOutcome, ClaimStore, Completion, KeyState, ManualClock, StoreError,
};

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

fn open(path: &Path, clock: &Arc<ManualClock>) -> SledStore {
    SledStore::open_with_clock(&sled_config(path, Durability::Batched), clock.clone()).unwrap()
}

struct Fixture {
    store: SledStore,
    clock: Arc<ManualClock>,
    dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let store = open(&dir.path().join("db"), &clock);
    Fixture { store, clock, dir }
}

fn done(status: u16) -> Completion {
    Completion {
        upstream_status: status,
        retention: RETENTION,
        response: None,
    }
}

async fn claimed(store: &SledStore, key: &str) -> Claim {
    match store.claim(key, BODY, LEASE).await.unwrap() {
        ClaimOutcome::Claimed(claim) => claim,
        other => panic!("expected a claim of {key}, got {other:?}"),
    }
}

#[tokio::test]
async fn the_sweep_reads_only_what_expired() {
    let f = fixture();
    for i in 0..1000 {
        let claim = claimed(&f.store, &format!("short{i}")).await;
        f.store
            .finish(
                &claim,
                Completion {
                    retention: Duration::from_secs(10),
                    ..done(200)
                },
            )
            .await
            .unwrap();
    }
    for i in 0..3000 {
        let claim = claimed(&f.store, &format!("long{i}")).await;
        f.store.finish(&claim, done(200)).await.unwrap();
    }
    let nothing = f.store.sweep(100_000).await.unwrap();
    assert_eq!(
        (nothing.examined, nothing.removed),
        (0, 0),
        "nothing has expired yet"
    );
    f.clock.advance(Duration::from_secs(10));
    let swept = f.store.sweep(100_000).await.unwrap();
    assert_eq!(swept.removed, 1000);
    assert_eq!(swept.examined, 1000, "the 3000 live keys were not read");
    assert_eq!(
        f.store
            .inspect("long0")
            .await
            .unwrap()
            .map(|s| matches!(s, KeyState::Done(_))),
        Some(true)
    );
    let again = f.store.sweep(100_000).await.unwrap();
    assert_eq!((again.examined, again.removed), (0, 0));
}

#[tokio::test]
async fn the_sweep_works_in_batches_and_skips_records_that_moved_on() {
    let f = fixture();
    for i in 0..25 {
        let claim = claimed(&f.store, &format!("k{i}")).await;
        f.store
            .finish(
                &claim,
                Completion {
                    retention: Duration::from_secs(1),
                    ..done(200)
                },
            )
            .await
            .unwrap();
    }
    f.clock.advance(Duration::from_secs(1));
    // k0 is delivered and done again after expiring: its new record must survive.
    let fresh = claimed(&f.store, "k0").await;
    f.store.finish(&fresh, done(200)).await.unwrap();
    let mut removed = 0;
    loop {
        let swept = f.store.sweep(10).await.unwrap();
        removed += swept.removed;
        if swept.examined < 10 {
            break;
        }
    }
    assert_eq!(removed, 24);
    assert!(matches!(
        f.store.inspect("k0").await.unwrap(),
        Some(KeyState::Done(_))
    ));
}

#[tokio::test]
async fn abandoned_leases_are_swept_too() {
    let f = fixture();
    claimed(&f.store, "orphan").await;
    f.clock.advance(LEASE);
    assert_eq!(f.store.sweep(100).await.unwrap().removed, 1);
    assert_eq!(f.store.inspect("orphan").await.unwrap(), None);
}

#[tokio::test]
async fn a_restart_releases_the_earlier_process_claims_and_keeps_done_keys() {
    let f = fixture();
    let path = f.dir.path().join("db");
    let open_claim = claimed(&f.store, "open").await;
    let finished = claimed(&f.store, "finished").await;
    f.store.finish(&finished, done(200)).await.unwrap();
    drop(f.store);

    // sled's background flusher lets go of the directory lock a moment after the drop;
    // a restarted process never sees this, its predecessor being gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let store = loop {
        match SledStore::open_with_clock(&sled_config(&path, Durability::Batched), f.clock.clone())
        {
            Ok(store) => break store,
            Err(error) if std::time::Instant::now() < deadline => {
                assert!(error.to_string().contains("in use"), "{error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{error}"),
        }
    };
    assert_eq!(
        store.inspect("open").await.unwrap(),
        None,
        "released at start-up"
    );
    claimed(&store, "open").await;
    assert!(matches!(
        store.finish(&open_claim, done(200)).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        store.claim("finished", BODY, LEASE).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
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
            store.finish(&claim, done(200)).await
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
