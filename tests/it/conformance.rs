//! The claim-store contract ("Claim states" in `docs/contract.md`), one suite run unchanged
//! against sled, Redis, PostgreSQL, Redis over mutual TLS, a six-node Redis Cluster and a
//! TLS-only PostgreSQL (`verify-full`): every transition (hold and resolve too), owner
//! checks, lease takeover, retention expiry, the recorded answer, concurrent claims from
//! many tasks, listing a namespace by state, counting held keys, announced outcomes, and
//! entities' newest versions (`order:`).
//!
//! Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, database `test`) are real
//! servers, and `tests/servers` starts the TLS ones and the cluster; without them these
//! tests are skipped with a message, except in CI (`CI=true`), where a missing server is
//! a failure. sled time is a manual clock;
//! the shared stores keep real time, so leases and retentions here are short.
//! Backend-specific behaviour (sled's sweep, restart and durability) is in `sled_store.rs`.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dedupe_proxy::config::PostgresConfig;
use dedupe_proxy::store::postgres::PostgresStore;
use dedupe_proxy::store::redis::RedisStore;
use dedupe_proxy::store::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, DoneRecord, Expiry, Forgotten,
    KeyState, RESOLVED_STATUS, RecordedResponse, Resolution, StateFilter, StoreError, entity_key,
};
use dedupe_proxy::testing::parse_version;
use dedupe_proxy::testing::{Workers, current_worker};
use dedupe_proxy::values::TableName;
use support::{
    BODY, Harness, LEASE, done, plain_postgres_config, plain_redis_config, redis_cluster_config,
    unavailable,
};

/// Retentions no test outlives unless it waits for them on purpose (and `LEASE`, in
/// `support`): the shared stores keep real time, and a loaded CI machine can stall a test
/// for most of a second.
const RETENTION: Duration = Duration::from_secs(60);
/// The lease and retention of the tests that wait for them to run out.
const SHORT_LEASE: Duration = Duration::from_millis(400);
const SHORT_RETENTION: Duration = Duration::from_secs(2);

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap()
}

async fn announced(h: &Harness, name: &str) -> Claim {
    Claim {
        announce: true,
        ..h.claimed(name).await
    }
}

/// A finish or release of an announced claim is heard by whoever listens to the store
/// (another replica); an unannounced one is not. The embedded store has no one to tell.
/// A shared store keeps each replica's latest report, whatever its version (a rolling
/// upgrade's replicas side by side): a newer report replaces its replica's, and one older
/// than an hour is dropped by the next report. A store nothing shares keeps none.
async fn each_replicas_latest_report_is_kept_whatever_its_version(h: Harness) {
    use dedupe_proxy::store::replicas::{FORGOTTEN_AFTER, ReplicaReport};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let run = format!("{:x}", rand::random::<u64>());
    let report = |name: &str, version: &str, seen_at: u64, forwarded: u64| ReplicaReport {
        id: format!("{name}-{run}"),
        version: version.into(),
        started_at: seen_at - 60_000,
        seen_at,
        requests: [("forwarded".to_owned(), forwarded)].into(),
    };
    if h.store.replicas().await.unwrap().is_none() {
        h.store
            .report_replica(&report("a", "0.1.0", now, 1))
            .await
            .unwrap();
        assert_eq!(h.store.replicas().await.unwrap(), None, "nothing is shared");
        return;
    }
    let day_ago = now - FORGOTTEN_AFTER.as_millis() as u64 - 60_000;
    for written in [
        report("old", "0.0.9", day_ago, 7),
        report("a", "0.1.0", now, 1),
        report("b", "0.2.0", now, 2),
        report("a", "0.1.0", now + 1000, 4),
    ] {
        h.store.report_replica(&written).await.unwrap();
    }
    let mut ours: Vec<(String, String, u64)> = h
        .store
        .replicas()
        .await
        .unwrap()
        .unwrap()
        .into_iter()
        .filter(|report| report.id.ends_with(&run))
        .map(|report| (report.id, report.version, report.requests["forwarded"]))
        .collect();
    ours.sort();
    assert_eq!(
        ours,
        [
            (format!("a-{run}"), "0.1.0".to_owned(), 4),
            (format!("b-{run}"), "0.2.0".to_owned(), 2),
        ]
    );
}

/// Every store keeps each replica's figures of each minute for a day: minutes of several
/// replicas side by side are read from a given minute on, the day's first minute among
/// them, and a write drops the minutes more than a day old.
async fn each_replicas_minutes_are_kept_a_day(h: Harness) {
    use dedupe_proxy::store::minutes::{
        KEPT_FOR, MINUTE, MinuteFigures, QueueDepth, RouteMinute, minute_of,
    };
    let now = minute_of(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    );
    let run = format!("{:x}", rand::random::<u64>());
    let figures = |name: &str, minute: u64, forwarded: u64| MinuteFigures {
        replica: format!("{name}-{run}"),
        minute,
        routes: [(
            "hooks".to_owned(),
            RouteMinute {
                outcomes: [("forwarded".to_owned(), forwarded)].into(),
                latency: vec![0, forwarded],
                queue: Some(QueueDepth {
                    waiting: forwarded,
                    oldest_age_seconds: 1.5,
                }),
            },
        )]
        .into(),
    };
    let day = KEPT_FOR.as_millis() as u64;
    let old = figures("a", now - day - MINUTE, 9);
    h.store.record_minute(&old).await.unwrap();
    let ours = |read: Vec<MinuteFigures>| {
        let mut ours: Vec<(String, u64, u64)> = read
            .into_iter()
            .filter(|figures| figures.replica.ends_with(&run))
            .map(|figures| {
                let forwarded = figures.routes["hooks"].outcomes["forwarded"];
                (figures.replica, figures.minute, forwarded)
            })
            .collect();
        ours.sort();
        ours
    };
    let since_before = now - day - 2 * MINUTE;
    let written = [
        figures("a", now - day + 2 * MINUTE, 8),
        figures("a", now - MINUTE, 1),
        figures("b", now - MINUTE, 2),
        figures("a", now, 3),
    ];
    for figures in &written {
        h.store.record_minute(figures).await.unwrap();
    }
    // The same minute written again (a retried write) is kept once.
    h.store.record_minute(&written[3]).await.unwrap();
    let all = h.store.minutes(since_before).await.unwrap();
    let read_back = all.iter().find(|figures| figures == &&written[2]);
    assert!(read_back.is_some(), "a minute reads back whole");
    assert_eq!(
        ours(all),
        [
            (format!("a-{run}"), now - day + 2 * MINUTE, 8),
            (format!("a-{run}"), now - MINUTE, 1),
            (format!("a-{run}"), now, 3),
            (format!("b-{run}"), now - MINUTE, 2),
        ],
        "the minute more than a day older is dropped"
    );
    assert_eq!(
        ours(h.store.minutes(now).await.unwrap()),
        [(format!("a-{run}"), now, 3)]
    );
}

async fn announced_outcomes_are_heard(h: Harness) {
    let (tell, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    h.store.hear_outcomes(Arc::new(move |key: &str| {
        let _ = tell.send(key.to_owned());
    }));
    let shared = h.clock.is_none();
    if shared {
        // The subscription starts in the background: announce until it hears.
        let mut ready = false;
        for attempt in 0..100 {
            let probe = announced(&h, &format!("probe-{attempt}")).await;
            h.store.release(&probe).await.unwrap();
            if tokio::time::timeout(Duration::from_millis(50), heard.recv())
                .await
                .is_ok()
            {
                ready = true;
                break;
            }
        }
        assert!(ready, "no announcement was heard in 5 s");
        while heard.try_recv().is_ok() {}
    }
    let quiet = h.claimed("quiet").await;
    h.store.finish(&quiet, done(200, RETENTION)).await.unwrap();
    let finished = announced(&h, "finished").await;
    h.store
        .finish(&finished, done(200, RETENTION))
        .await
        .unwrap();
    let released = announced(&h, "released").await;
    h.store.release(&released).await.unwrap();
    assert!(matches!(h.state("finished").await, Some(KeyState::Done(_))));
    assert_eq!(h.state("released").await, None);
    if shared {
        let mut got = Vec::new();
        while got.len() < 2 {
            let key = tokio::time::timeout(Duration::from_secs(5), heard.recv())
                .await
                .expect("both outcomes heard within 5 s")
                .unwrap();
            got.push(key);
        }
        // A cluster's nodes pass on what they publish in no particular order.
        got.sort();
        assert_eq!(got, [h.key("finished"), h.key("released")]);
        let more = tokio::time::timeout(Duration::from_millis(300), heard.recv()).await;
        assert!(more.is_err(), "the unannounced finish was heard: {more:?}");
    } else {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(heard.try_recv().is_err(), "the embedded store tells no one");
    }
}

/// Holds a claim of `name` (claimed with a short lease, which a hold outlasts).
async fn held(h: &Harness, name: &str, retention: Duration) -> Claim {
    let claim = h.claimed_for(name, SHORT_LEASE).await;
    h.store
        .hold(&claim, Ambiguity::UpstreamTimeout, retention)
        .await
        .unwrap();
    claim
}

/// Every reason a key is held for is read back as it was written.
async fn every_hold_reason_is_kept(h: Harness) {
    let reasons = [
        Ambiguity::UpstreamTimeout,
        Ambiguity::UpstreamDropped,
        Ambiguity::Shutdown,
        Ambiguity::ForwardFailed,
    ];
    for (index, reason) in reasons.into_iter().enumerate() {
        let name = format!("reason{index}");
        let claim = h.claimed_for(&name, LEASE).await;
        h.store.hold(&claim, reason, RETENTION).await.unwrap();
        let Some(KeyState::Held(record)) = h.state(&name).await else {
            panic!("{reason:?}: held expected");
        };
        assert_eq!(record.reason, reason);
    }
}

async fn a_held_key_stops_every_claim_until_an_operator_resolves_it(h: Harness) {
    let claim = h.claimed_for("k", SHORT_LEASE).await;
    let impostor = Claim {
        token: claim.token ^ 1,
        ..claim.clone()
    };
    assert!(matches!(
        h.store
            .hold(&impostor, Ambiguity::UpstreamDropped, RETENTION)
            .await,
        Err(StoreError::NotOwner)
    ));
    h.store
        .hold(&claim, Ambiguity::UpstreamDropped, RETENTION)
        .await
        .unwrap();
    // The lease's end frees nothing: a hold lasts until resolved (or its retention ends).
    h.pass(SHORT_LEASE + Duration::from_millis(100)).await;
    let ClaimOutcome::Held(record) = h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap() else {
        panic!("held expected");
    };
    assert_eq!(record.reason, Ambiguity::UpstreamDropped);
    assert_eq!(record.fingerprint, BODY);
    assert!(record.expires_at >= record.held_at + millis(RETENTION));
    assert_eq!(h.state("k").await, Some(KeyState::Held(record)));
    // Neither its late owner nor a forget undoes a hold.
    assert!(matches!(
        h.store.finish(&claim, done(200, RETENTION)).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        h.store.release(&claim).await,
        Err(StoreError::NotOwner)
    ));
    assert_eq!(h.store.forget(&h.key("k")).await.unwrap(), Forgotten::Held);
    h.store.sweep(10_000).await.unwrap();
    assert!(matches!(h.state("k").await, Some(KeyState::Held(_))));

    let resolution = Resolution::Done {
        retention: RETENTION,
    };
    assert!(h.store.resolve(&h.key("k"), resolution).await.unwrap());
    let ClaimOutcome::Done(done_record) = h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap()
    else {
        panic!("done expected");
    };
    assert_eq!(done_record.upstream_status, RESOLVED_STATUS);
    assert_eq!(done_record.fingerprint, BODY);
    assert!(
        !h.store.resolve(&h.key("k"), resolution).await.unwrap(),
        "a done key is not held"
    );
}

async fn only_a_held_key_is_resolved_and_a_released_one_runs_again(h: Harness) {
    held(&h, "k", RETENTION).await;
    assert!(
        !h.store
            .resolve(&h.key("other"), Resolution::Release)
            .await
            .unwrap()
    );
    let in_flight = h.claimed("other").await;
    assert!(
        !h.store
            .resolve(&h.key("other"), Resolution::Release)
            .await
            .unwrap(),
        "an in-flight key is not held"
    );
    h.store.release(&in_flight).await.unwrap();
    assert!(
        h.store
            .resolve(&h.key("k"), Resolution::Release)
            .await
            .unwrap()
    );
    assert_eq!(h.state("k").await, None);
    h.claimed("k").await;
}

async fn a_held_key_expires_with_its_retention(h: Harness) {
    held(&h, "k", SHORT_RETENTION).await;
    h.pass(SHORT_RETENTION / 4).await;
    assert!(matches!(
        h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    h.pass(SHORT_RETENTION).await;
    assert_eq!(h.state("k").await, None);
    assert!(
        !h.store
            .resolve(&h.key("k"), Resolution::Release)
            .await
            .unwrap()
    );
    h.store.sweep(10_000).await.unwrap();
    h.claimed("k").await;
    // The sweep leaves the new claim alone.
    h.store.sweep(10_000).await.unwrap();
    assert!(matches!(
        h.state("k").await,
        Some(KeyState::InFlight { .. })
    ));
}

/// A namespace no other test or run uses: `name` and, on a shared store, this run's id.
fn own_namespace(h: &Harness, name: &str) -> String {
    format!("{name}{}", h.run.trim_end_matches(':'))
}

async fn listing_pages_through_a_namespace_by_state(h: Harness) {
    let namespace = own_namespace(&h, "list");
    let key = |name: &str| format!("{namespace}:{name}");
    let claim = |name: &'static str| {
        let store = Arc::clone(&h.store);
        let full = key(name);
        async move {
            match store.claim(&full, BODY, LEASE).await.unwrap() {
                ClaimOutcome::Claimed(claim) => claim,
                other => panic!("{other:?}"),
            }
        }
    };
    for name in ["a", "b", "c"] {
        claim(name).await;
    }
    for name in ["px", "p?3"] {
        claim(name).await;
    }
    for name in ["d", "e", "p*1", "p*2"] {
        let done_claim = claim(name).await;
        h.store
            .finish(&done_claim, done(200, RETENTION))
            .await
            .unwrap();
    }
    for name in ["f", "g", "h", "i"] {
        let held_claim = claim(name).await;
        h.store
            .hold(&held_claim, Ambiguity::UpstreamTimeout, RETENTION)
            .await
            .unwrap();
    }
    // Another namespace, and a body key of this one, are never listed.
    let outside = h
        .store
        .claim(&format!("{namespace}x:a"), BODY, LEASE)
        .await
        .unwrap();
    assert!(matches!(outside, ClaimOutcome::Claimed(_)));
    let body = h
        .store
        .claim(&format!("{namespace}#body:00"), BODY, LEASE)
        .await
        .unwrap();
    assert!(matches!(body, ClaimOutcome::Claimed(_)));

    let matching = |prefix: &'static str, state: Option<StateFilter>| {
        let store = Arc::clone(&h.store);
        let namespace = namespace.clone();
        async move {
            let (mut keys, mut after, mut pages) = (Vec::new(), None::<String>, 0);
            loop {
                let page = store
                    .list(&namespace, prefix, state, after.as_deref(), 2)
                    .await?;
                assert!(page.keys.len() <= 2);
                for (key, found) in &page.keys {
                    if let Some(state) = state {
                        assert!(state.admits(found), "{key}: {found:?}");
                    }
                    assert!(key.starts_with(&format!("{namespace}:{prefix}")), "{key}");
                    keys.push(key.clone());
                }
                pages += 1;
                assert!(pages < 50, "the listing never ends");
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            keys.sort();
            Ok::<_, StoreError>(keys)
        }
    };
    let all_of = |state| matching("", state);
    let names = |names: &[&str]| names.iter().map(|name| key(name)).collect::<Vec<_>>();
    assert_eq!(
        all_of(Some(StateFilter::Held)).await.unwrap(),
        names(&["f", "g", "h", "i"])
    );
    assert_eq!(
        all_of(Some(StateFilter::InFlight)).await.unwrap(),
        names(&["a", "b", "c", "p?3", "px"])
    );
    assert_eq!(
        all_of(Some(StateFilter::Done)).await.unwrap(),
        names(&["d", "e", "p*1", "p*2"])
    );
    assert_eq!(
        all_of(None).await.unwrap(),
        names(&[
            "a", "b", "c", "d", "e", "f", "g", "h", "i", "p*1", "p*2", "p?3", "px"
        ])
    );
    // A prefix is literal (no pattern), and picks keys in every state.
    assert_eq!(matching("p*", None).await.unwrap(), names(&["p*1", "p*2"]));
    assert_eq!(
        matching("p", Some(StateFilter::InFlight)).await.unwrap(),
        names(&["p?3", "px"])
    );
    assert_eq!(
        matching("p*", Some(StateFilter::Held)).await.unwrap(),
        names(&[])
    );
    assert_eq!(matching("zz", None).await.unwrap(), names(&[]));
}

async fn held_keys_are_counted_by_namespace(h: Harness) {
    let (one, two) = (own_namespace(&h, "countone"), own_namespace(&h, "counttwo"));
    for (namespace, name) in [(&one, "a"), (&one, "b"), (&two, "a")] {
        let full = format!("{namespace}:{name}");
        let ClaimOutcome::Claimed(claim) = h.store.claim(&full, BODY, LEASE).await.unwrap() else {
            panic!("claimed expected");
        };
        h.store
            .hold(&claim, Ambiguity::UpstreamTimeout, RETENTION)
            .await
            .unwrap();
    }
    let ClaimOutcome::Claimed(body) = h
        .store
        .claim(&format!("{one}#body:00"), BODY, LEASE)
        .await
        .unwrap()
    else {
        panic!("claimed expected");
    };
    h.store
        .hold(&body, Ambiguity::UpstreamTimeout, RETENTION)
        .await
        .unwrap();
    let count = |namespace: &str, counts: &[(String, u64)]| {
        counts
            .iter()
            .find(|(found, _)| found == namespace)
            .map_or(0, |(_, count)| *count)
    };
    let counts = h.store.count_held().await.unwrap();
    assert_eq!(
        (count(&one, &counts), count(&two, &counts)),
        (2, 1),
        "{counts:?}"
    );
    assert!(
        h.store
            .resolve(&format!("{one}:a"), Resolution::Release)
            .await
            .unwrap()
    );
    let counts = h.store.count_held().await.unwrap();
    assert_eq!(
        (count(&one, &counts), count(&two, &counts)),
        (1, 1),
        "{counts:?}"
    );
}

async fn claim_then_claim_again_is_in_flight(h: Harness) {
    h.claimed("k").await;
    let ClaimOutcome::InFlight { lease_until } =
        h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap()
    else {
        panic!("in flight expected");
    };
    let Some(KeyState::InFlight {
        claimed_at,
        lease_until: seen,
        fingerprint,
    }) = h.state("k").await
    else {
        panic!("in flight expected");
    };
    assert_eq!(seen, lease_until);
    assert_eq!(lease_until - claimed_at, millis(LEASE));
    assert_eq!(fingerprint, BODY);
}

async fn finish_records_done_and_duplicates_see_it(h: Harness) {
    let claim = h.claimed("k").await;
    h.store.finish(&claim, done(201, RETENTION)).await.unwrap();
    let ClaimOutcome::Done(record) = h.store.claim(&h.key("k"), [0; 32], LEASE).await.unwrap()
    else {
        panic!("done expected");
    };
    assert_eq!(record.upstream_status, 201);
    assert_eq!(
        record.fingerprint, BODY,
        "the first delivery's fingerprint is kept"
    );
    assert!(record.claimed_at <= record.completed_at);
    assert_eq!(record.expires_at - record.completed_at, millis(RETENTION));
    assert_eq!(record.response, None);
    assert!(matches!(h.state("k").await, Some(KeyState::Done(_))));
}

async fn release_makes_the_key_claimable_again(h: Harness) {
    let claim = h.claimed("k").await;
    h.store.release(&claim).await.unwrap();
    assert_eq!(h.state("k").await, None);
    let again = h.claimed("k").await;
    assert_ne!(again.token, claim.token);
}

async fn only_the_owner_finishes_or_releases(h: Harness) {
    let claim = h.claimed("k").await;
    let impostor = Claim {
        token: claim.token ^ 1,
        ..claim.clone()
    };
    assert!(matches!(
        h.store.finish(&impostor, done(200, RETENTION)).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        h.store.release(&impostor).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        h.state("k").await,
        Some(KeyState::InFlight { .. })
    ));
    let stray = Claim {
        key: h.key("never-claimed"),
        ..claim.clone()
    };
    assert!(matches!(
        h.store.finish(&stray, done(200, RETENTION)).await,
        Err(StoreError::NotOwner)
    ));
    assert_eq!(h.state("never-claimed").await, None);
    h.store.finish(&claim, done(200, RETENTION)).await.unwrap();
}

async fn an_expired_lease_is_taken_over_and_the_late_owner_refused(h: Harness) {
    let late = h.claimed_for("k", SHORT_LEASE).await;
    h.pass(SHORT_LEASE + Duration::from_millis(100)).await;
    let taker = h.claimed("k").await;
    assert!(matches!(
        h.store.finish(&late, done(200, RETENTION)).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        h.store.release(&late).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(
        h.state("k").await,
        Some(KeyState::InFlight { .. })
    ));
    h.store.finish(&taker, done(200, RETENTION)).await.unwrap();
    assert!(matches!(
        h.store.release(&late).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(h.state("k").await, Some(KeyState::Done(_))));
}

async fn a_renewed_lease_outlives_its_first_end_for_its_owner_only(h: Harness) {
    // Long enough that a store answering slowly under the whole suite's load (the claim
    // below waits its turn in a batch) still asks within the renewed lease: with 400 ms,
    // 100 ms of delay made this fail now and then.
    const RENEWED: Duration = Duration::from_secs(2);
    let claim = h.claimed_for("k", RENEWED).await;
    let Some(KeyState::InFlight {
        lease_until: first_end,
        ..
    }) = h.state("k").await
    else {
        panic!("in flight expected");
    };
    h.pass(RENEWED / 2).await;
    h.store.renew(&claim, RENEWED).await.unwrap();
    // Past the first lease's end, well within the renewed one.
    h.pass(RENEWED / 2 + RENEWED / 10).await;
    assert!(
        matches!(
            h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "past the first lease's end, the renewed claim still holds the key"
    );
    let Some(KeyState::InFlight { lease_until, .. }) = h.state("k").await else {
        panic!("in flight expected");
    };
    assert!(lease_until > first_end, "{lease_until} > {first_end}");
    let impostor = Claim {
        token: claim.token ^ 1,
        ..claim.clone()
    };
    assert!(matches!(
        h.store.renew(&impostor, LEASE).await,
        Err(StoreError::NotOwner)
    ));
    h.store.finish(&claim, done(200, RETENTION)).await.unwrap();
    assert!(matches!(
        h.store.renew(&claim, LEASE).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(h.state("k").await, Some(KeyState::Done(_))));

    // A lease left to run out and taken over is the new owner's: the late one cannot
    // renew it back.
    let late = h.claimed_for("j", SHORT_LEASE).await;
    h.pass(SHORT_LEASE + Duration::from_millis(100)).await;
    let taker = h.claimed("j").await;
    assert!(matches!(
        h.store.renew(&late, LEASE).await,
        Err(StoreError::NotOwner)
    ));
    h.store.finish(&taker, done(200, RETENTION)).await.unwrap();
    let held = held(&h, "h", LEASE).await;
    assert!(matches!(
        h.store.renew(&held, LEASE).await,
        Err(StoreError::NotOwner)
    ));
    assert!(matches!(h.state("h").await, Some(KeyState::Held(_))));
}

async fn done_keys_expire_after_their_retention(h: Harness) {
    let claim = h.claimed("k").await;
    let completion = Completion {
        retention: SHORT_RETENTION,
        ..done(200, RETENTION)
    };
    h.store.finish(&claim, completion).await.unwrap();
    h.pass(SHORT_RETENTION / 4).await;
    assert!(matches!(
        h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap(),
        ClaimOutcome::Done(_)
    ));
    h.pass(SHORT_RETENTION).await;
    assert_eq!(h.state("k").await, None);
    h.claimed("k").await;
    // And the sweep leaves the new claim alone.
    h.store.sweep(10_000).await.unwrap();
    assert!(matches!(
        h.state("k").await,
        Some(KeyState::InFlight { .. })
    ));
}

async fn forget_removes_done_keys_but_not_in_flight_ones(h: Harness) {
    let claim = h.claimed("k").await;
    assert_eq!(
        h.store.forget(&h.key("k")).await.unwrap(),
        Forgotten::InFlight
    );
    h.store.finish(&claim, done(200, RETENTION)).await.unwrap();
    assert_eq!(
        h.store.forget(&h.key("k")).await.unwrap(),
        Forgotten::Removed
    );
    assert_eq!(
        h.store.forget(&h.key("k")).await.unwrap(),
        Forgotten::Absent
    );
    h.claimed("k").await;
}

/// A done key's expiry moves sooner or later with the rest of its record kept; an
/// in-flight, held or absent key is left alone.
async fn a_done_keys_expiry_moves_and_nothing_else_does(h: Harness) {
    let claim = h.claimed("k").await;
    assert_eq!(
        h.store.set_expiry(&h.key("k"), u64::MAX / 2).await.unwrap(),
        Expiry::InFlight
    );
    let answer = RecordedResponse {
        status: 201,
        headers: vec![("content-type".into(), Bytes::from_static(b"text/plain"))],
        body: Bytes::from_static(b"made"),
    };
    let completion = Completion {
        response: Some(answer.clone()),
        ..done(201, SHORT_RETENTION)
    };
    h.store.finish(&claim, completion).await.unwrap();
    let Some(KeyState::Done(before)) = h.state("k").await else {
        panic!("done expected");
    };
    // Later: past the retention it was finished with, the key is still a duplicate.
    let later = before.completed_at + millis(RETENTION);
    assert_eq!(
        h.store.set_expiry(&h.key("k"), later).await.unwrap(),
        Expiry::Set
    );
    let moved = DoneRecord {
        expires_at: later,
        ..before.clone()
    };
    assert_eq!(h.state("k").await, Some(KeyState::Done(moved)));
    h.pass(SHORT_RETENTION + Duration::from_millis(200)).await;
    h.store.sweep(10_000).await.unwrap();
    let ClaimOutcome::Done(record) = h.store.claim(&h.key("k"), BODY, LEASE).await.unwrap() else {
        panic!("still done after the retention it had");
    };
    assert_eq!(record.response, Some(answer));
    // Sooner, about 3 s from now (SHORT_RETENTION and a little have passed): once that
    // time passes, the key is gone and the next delivery runs.
    let sooner = before.completed_at + millis(SHORT_RETENTION) + 3_200;
    assert_eq!(
        h.store.set_expiry(&h.key("k"), sooner).await.unwrap(),
        Expiry::Set
    );
    let Some(KeyState::Done(shortened)) = h.state("k").await else {
        panic!("done until its new expiry");
    };
    assert_eq!(shortened.expires_at, sooner);
    h.pass(Duration::from_millis(3_400)).await;
    assert_eq!(h.state("k").await, None);
    h.claimed("k").await;

    held(&h, "h", RETENTION).await;
    assert_eq!(
        h.store.set_expiry(&h.key("h"), u64::MAX / 2).await.unwrap(),
        Expiry::Held
    );
    assert_eq!(
        h.store
            .set_expiry(&h.key("none"), u64::MAX / 2)
            .await
            .unwrap(),
        Expiry::Absent
    );
}

/// Operators moving one key's expiry at once, and forgetting it meanwhile, leave it done
/// at one of the expiries asked for, or forgotten: never lost, never brought back.
async fn concurrent_expiry_moves_leave_one_of_them(h: Harness) {
    const ROUNDS: usize = 40;
    let h = Arc::new(h);
    for round in 0..ROUNDS {
        let name = format!("moved{round}");
        let claim = h.claimed(&name).await;
        h.store.finish(&claim, done(200, RETENTION)).await.unwrap();
        let Some(KeyState::Done(record)) = h.state(&name).await else {
            panic!("done expected");
        };
        // Expiries a day to a month on: windows of their own on the embedded store.
        let asked: Vec<u64> = (1..=12)
            .map(|days| record.completed_at + days * 2 * 86_400_000)
            .collect();
        let mut tasks = tokio::task::JoinSet::new();
        for expires_at in asked.clone() {
            let (h, key) = (Arc::clone(&h), h.key(&name));
            tasks.spawn(async move { h.store.set_expiry(&key, expires_at).await.unwrap() });
        }
        while let Some(set) = tasks.join_next().await {
            assert_eq!(set.unwrap(), Expiry::Set, "round {round}");
        }
        let Some(KeyState::Done(moved)) = h.state(&name).await else {
            panic!("round {round}: the key was lost");
        };
        assert!(
            asked.contains(&moved.expires_at),
            "round {round}: {moved:?}"
        );
        // A forget racing moves: once both are done, the key is absent or done at an
        // expiry asked for, and a forget after that leaves it absent.
        let (h2, key) = (Arc::clone(&h), h.key(&name));
        let mover = tokio::spawn(async move { h2.store.set_expiry(&key, asked[3]).await });
        h.store.forget(&h.key(&name)).await.unwrap();
        mover.await.unwrap().unwrap();
        h.store.forget(&h.key(&name)).await.unwrap();
        assert_eq!(h.state(&name).await, None, "round {round}: brought back");
    }
}

async fn the_recorded_answer_is_kept_for_replay(h: Harness) {
    let header =
        |name: &str, value: &'static str| (name.to_owned(), Bytes::from_static(value.as_bytes()));
    for (name, headers) in [
        ("plain", vec![header("content-type", "application/json")]),
        ("none", vec![]),
        (
            "full",
            vec![
                header("content-type", "application/json"),
                header("location", "/orders/1"),
                header("set-cookie", "a=1"),
                header("set-cookie", "b=2"),
            ],
        ),
    ] {
        let claim = h.claimed(name).await;
        let response = RecordedResponse {
            status: 201,
            headers,
            body: Bytes::from_static(b"{\"order\":1}"),
        };
        let completion = Completion {
            response: Some(response.clone()),
            ..done(201, RETENTION)
        };
        h.store.finish(&claim, completion).await.unwrap();
        let outcome = h.store.claim(&h.key(name), BODY, LEASE).await.unwrap();
        let ClaimOutcome::Done(record) = outcome else {
            panic!("done expected");
        };
        assert_eq!(record.response, Some(response), "{name}");
    }
}

async fn concurrent_claims_of_one_key_give_exactly_one_owner(h: Harness) {
    let h = Arc::new(h);
    for round in 0..20 {
        let key = h.key(&format!("k{round}"));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (store, key) = (Arc::clone(&h.store), key.clone());
            tasks.spawn(async move { store.claim(&key, BODY, LEASE).await.unwrap() });
        }
        let mut owners = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.unwrap() {
                ClaimOutcome::Claimed(_) => owners += 1,
                ClaimOutcome::InFlight { .. } => {}
                ClaimOutcome::Done(_) | ClaimOutcome::Held(_) => panic!("nothing finished"),
            }
        }
        assert_eq!(owners, 1, "round {round}");
    }
}

/// Every key the proxy accepts (it refuses empty values, control characters and invalid
/// UTF-8, and keys over 512 bytes) is stored, found and kept apart from its neighbours.
async fn every_key_the_proxy_accepts_is_stored_apart(h: Harness) {
    use dedupe_proxy::key::{Delivery, KeyTemplate, MAX_KEY_BYTES};
    let template: KeyTemplate = "{json:/id}".parse().unwrap();
    // Each ID as JSON text.
    let long = format!("\"{}\"", "a".repeat(MAX_KEY_BYTES - 40));
    let ids = [
        long.as_str(),
        r#""café ☃ 𝄞 مرحبا""#,
        r#""quote\" back\\slash 'single' %00 %zz""#,
        // Zero-width characters and the byte-order mark are refused; these are not.
        r#""\ufffd\u00a0e\u0301""#,
        r#""a:b:c/d?e#f""#,
        "12345678901234567890123",
        "-1.5e-300",
    ];
    let mut keys = Vec::new();
    for id in ids {
        let body = format!(r#"{{"id":{id}}}"#);
        let headers = http::HeaderMap::new();
        let delivery = Delivery {
            headers: &headers,
            query: None,
            body: body.as_bytes(),
        };
        let key = template
            .extract(&delivery)
            .unwrap_or_else(|error| panic!("{id}: {error}"));
        keys.push(key.clone());
        // A neighbour that differs in its last character.
        let mut neighbour = key;
        let last = neighbour.pop().unwrap();
        neighbour.push(if last == 'x' { 'y' } else { 'x' });
        keys.push(neighbour);
    }
    for key in keys.iter().step_by(2) {
        let claim = h.claimed(key).await;
        h.store.finish(&claim, done(200, RETENTION)).await.unwrap();
    }
    for (n, key) in keys.iter().enumerate() {
        let outcome = h.store.claim(&h.key(key), BODY, LEASE).await.unwrap();
        match (n % 2, outcome) {
            (0, ClaimOutcome::Done(_)) | (1, ClaimOutcome::Claimed(_)) => {}
            (_, other) => panic!("{key:?}: {other:?}"),
        }
    }
}

/// An entity's record keeps the largest version recorded, in the versions' order (numbers
/// and RFC 3339 times alike), whatever order they come in; it is kept apart from the keys
/// of its namespace, and an operator can forget it.
async fn the_newest_version_of_an_entity_only_grows(h: Harness) {
    assert_eq!(h.newest("order").await, None);
    assert!(h.record("order", "1767225600", RETENTION).await);
    assert!(!h.record("order", "9", RETENTION).await, "older");
    assert!(
        !h.record("order", "2026-01-01T00:00:00Z", RETENTION).await,
        "as new"
    );
    assert_eq!(h.newest("order").await.as_deref(), Some("1767225600"));
    assert!(h.record("order", "2026-01-01T00:00:00.5Z", RETENTION).await);
    assert_eq!(
        h.newest("order").await.as_deref(),
        Some("2026-01-01T00:00:00.5Z")
    );
    assert!(h.record("order", "1767225601", RETENTION).await);
    assert_eq!(h.newest("other").await, None);
    // The key of the same name, in the same namespace, is apart.
    let namespace = own_namespace(&h, "ordered");
    let version = parse_version("7").unwrap();
    let entity = entity_key(&namespace, "x");
    assert!(
        h.store
            .record_version(&entity, &version, RETENTION)
            .await
            .unwrap()
    );
    let event = format!("{namespace}:x");
    assert_eq!(h.store.inspect(&event).await.unwrap(), None);
    let outcome = h.store.claim(&event, BODY, LEASE).await.unwrap();
    assert!(matches!(outcome, ClaimOutcome::Claimed(_)), "{outcome:?}");
    // Every page: on Redis one may be empty and still have a next.
    let (mut listed, mut after) = (Vec::new(), None);
    loop {
        let page = h
            .store
            .list(&namespace, "", None, after.as_deref(), 1000)
            .await
            .unwrap();
        listed.extend(page.keys.into_iter().map(|(key, _)| key));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, std::slice::from_ref(&event));
    assert_eq!(
        h.store
            .count_held()
            .await
            .unwrap()
            .iter()
            .find(|(n, _)| n.contains("ordered")),
        None
    );
    let newest = h.store.newest_version(&entity).await.unwrap().unwrap();
    assert_eq!(newest.newest, version);
    let record = h
        .store
        .newest_version(&h.entity("order"))
        .await
        .unwrap()
        .unwrap();
    assert!(record.expires_at >= record.recorded_at + millis(RETENTION));
    assert!(h.store.forget_entity(&h.entity("order")).await.unwrap());
    assert!(!h.store.forget_entity(&h.entity("order")).await.unwrap());
    assert_eq!(h.newest("order").await, None);
    assert!(
        h.record("order", "1", RETENTION).await,
        "after a forget, any version"
    );
}

/// An entity's record lasts its retention; once expired, any version is recorded again,
/// and the sweep leaves a live record alone.
async fn an_entity_record_expires_with_its_retention(h: Harness) {
    assert!(h.record("e", "100", SHORT_RETENTION).await);
    h.pass(SHORT_RETENTION / 4).await;
    assert!(!h.record("e", "50", SHORT_RETENTION).await);
    h.pass(SHORT_RETENTION).await;
    assert_eq!(h.newest("e").await, None);
    assert!(!h.store.forget_entity(&h.entity("e")).await.unwrap());
    assert!(
        h.record("e", "50", RETENTION).await,
        "the expired record is replaced"
    );
    h.store.sweep(10_000).await.unwrap();
    assert_eq!(h.newest("e").await.as_deref(), Some("50"));
}

/// Versions recorded at once, from many tasks: the largest stays, and at least one of them
/// reports that it was recorded.
async fn concurrent_versions_leave_the_largest(h: Harness) {
    let h = Arc::new(h);
    for round in 0..5 {
        let entity = h.entity(&format!("race{round}"));
        let mut tasks = tokio::task::JoinSet::new();
        let versions: Vec<u64> = (0..24).map(|_| rand::random::<u32>().into()).collect();
        for version in versions.clone() {
            let (store, entity) = (Arc::clone(&h.store), entity.clone());
            tasks.spawn(async move {
                let version = parse_version(&version.to_string()).unwrap();
                store
                    .record_version(&entity, &version, RETENTION)
                    .await
                    .unwrap()
            });
        }
        let mut recorded = 0;
        while let Some(outcome) = tasks.join_next().await {
            recorded += usize::from(outcome.unwrap());
        }
        assert!(recorded >= 1, "round {round}");
        let newest = h.store.newest_version(&entity).await.unwrap().unwrap();
        let largest = versions.iter().max().unwrap().to_string();
        assert_eq!(newest.newest.text, largest, "round {round}");
    }
}

/// Runs `test` on every backend at once, each on a harness of its own (most of their time
/// is spent waiting for the servers' clocks, so one after another took a minute); a
/// failure names the backends it failed on.
async fn on_every_backend<Test, Running>(name: &str, test: Test)
where
    Test: Fn(Harness) -> Running,
    Running: std::future::Future<Output = ()> + Send + 'static,
{
    let backends = [
        ("sled", Harness::sled().await),
        ("redis", Harness::redis().await),
        ("postgres", Harness::postgres().await),
        ("redis_tls", Harness::redis_tls().await),
        ("redis_cluster", Harness::redis_cluster().await),
        ("postgres_tls", Harness::postgres_tls().await),
        ("postgres_pooled", Harness::postgres_pooled().await),
    ];
    let runs: Vec<_> = backends
        .into_iter()
        .filter_map(|(backend, harness)| Some((backend, tokio::spawn(test(harness?)))))
        .collect();
    let mut failed = Vec::new();
    for (backend, run) in runs {
        if let Err(error) = run.await {
            let payload = error.into_panic();
            let message = (payload.downcast_ref::<String>().cloned())
                .or_else(|| {
                    payload
                        .downcast_ref::<&str>()
                        .map(|text| (*text).to_owned())
                })
                .unwrap_or_default();
            failed.push(format!("{backend}: {message}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{name} failed on:\n{}",
        failed.join("\n")
    );
}

/// Runs each contract test against each backend.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod every_backend {
            $(
                // A thread a backend and one more: sled's calls hold their thread while
                // they run, and the other backends' timings must not wait behind them.
                #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
                async fn $test() {
                    super::on_every_backend(stringify!($test), super::$test).await;
                }
            )*
        }
    };
}

conformance!(
    announced_outcomes_are_heard,
    a_held_key_stops_every_claim_until_an_operator_resolves_it,
    every_hold_reason_is_kept,
    only_a_held_key_is_resolved_and_a_released_one_runs_again,
    a_held_key_expires_with_its_retention,
    listing_pages_through_a_namespace_by_state,
    held_keys_are_counted_by_namespace,
    claim_then_claim_again_is_in_flight,
    finish_records_done_and_duplicates_see_it,
    release_makes_the_key_claimable_again,
    only_the_owner_finishes_or_releases,
    an_expired_lease_is_taken_over_and_the_late_owner_refused,
    a_renewed_lease_outlives_its_first_end_for_its_owner_only,
    done_keys_expire_after_their_retention,
    forget_removes_done_keys_but_not_in_flight_ones,
    a_done_keys_expiry_moves_and_nothing_else_does,
    concurrent_expiry_moves_leave_one_of_them,
    the_recorded_answer_is_kept_for_replay,
    concurrent_claims_of_one_key_give_exactly_one_owner,
    every_key_the_proxy_accepts_is_stored_apart,
    the_newest_version_of_an_entity_only_grows,
    an_entity_record_expires_with_its_retention,
    concurrent_versions_leave_the_largest,
    each_replicas_latest_report_is_kept_whatever_its_version,
    each_replicas_minutes_are_kept_a_day,
);

/// A test of `$test` on a `$store` opened with two workers, skipped (or failed in CI) as
/// `unavailable` says when its server is missing.
macro_rules! on_two_workers {
    ($name:ident, $test:ident, $store:ident, $config:expr, $what:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let workers = Workers::start(2).unwrap();
            match $store::connect(&$config, Some(&workers)).await {
                Ok(store) => $test(Arc::new(store), workers).await,
                Err(error) => drop(unavailable($what, error)),
            }
        }
    };
}

/// The shared stores give each worker a connection of its own: a claim made through one
/// worker's connection is seen, finished and found done through another's and through the
/// connection of callers outside the workers.
async fn workers_connections_share_one_store(store: Arc<dyn ClaimStore>, workers: Workers) {
    let key = format!("t:{:016x}:workers", rand::random::<u64>());
    let on = |worker: usize, step: &'static str| {
        let (store, key) = (Arc::clone(&store), key.clone());
        let running = workers.run_on(worker, async move {
            assert_eq!(current_worker(), Some(worker), "{step} runs on its worker");
            match step {
                "claim" => Some(store.claim(&key, BODY, LEASE).await.unwrap()),
                _ => None,
            }
        });
        async move { running.await.unwrap() }
    };
    let Some(ClaimOutcome::Claimed(claim)) = on(0, "claim").await else {
        panic!("the first claim owns the key");
    };
    assert!(matches!(
        on(1, "claim").await,
        Some(ClaimOutcome::InFlight { .. })
    ));
    let finishing = {
        let store = Arc::clone(&store);
        workers.run_on(0, async move {
            store.finish(&claim, done(200, RETENTION)).await
        })
    };
    finishing.await.unwrap().unwrap();
    assert!(matches!(on(1, "claim").await, Some(ClaimOutcome::Done(_))));
    assert!(matches!(
        store.inspect(&key).await.unwrap(),
        Some(KeyState::Done(_))
    ));
}

/// Two workers claim the same forty keys at once, in opposite orders, each worker many at
/// a time (so the PostgreSQL store sends them in batches that share keys): a key done
/// before stays done, one in flight stays in flight, and each absent key gets exactly one
/// owner. No claim fails: batches that share keys must not deadlock.
async fn overlapping_claims_from_two_workers(store: Arc<dyn ClaimStore>, workers: Workers) {
    let run = format!("t:{:016x}:overlap", rand::random::<u64>());
    let keys: Vec<String> = (0..40).map(|index| format!("{run}{index:02}")).collect();
    for (index, key) in keys.iter().enumerate() {
        match index % 3 {
            0 => {
                let ClaimOutcome::Claimed(claim) = store.claim(key, BODY, LEASE).await.unwrap()
                else {
                    panic!("{key} was absent");
                };
                store.finish(&claim, done(200, RETENTION)).await.unwrap();
            }
            1 => drop(store.claim(key, BODY, LEASE).await.unwrap()),
            _ => {}
        }
    }
    let claim_all = |worker: usize, mut order: Vec<String>| {
        if worker == 1 {
            order.reverse();
        }
        let store = Arc::clone(&store);
        workers.run_on(worker, async move {
            let mut claims = tokio::task::JoinSet::new();
            for key in order {
                let store = Arc::clone(&store);
                claims.spawn(async move { (key.clone(), store.claim(&key, BODY, LEASE).await) });
            }
            claims.join_all().await
        })
    };
    let (first, second) = tokio::join!(claim_all(0, keys.clone()), claim_all(1, keys.clone()));
    let mut outcomes: std::collections::HashMap<String, Vec<ClaimOutcome>> = Default::default();
    for (key, outcome) in first.unwrap().into_iter().chain(second.unwrap()) {
        outcomes.entry(key).or_default().push(outcome.unwrap());
    }
    for (index, key) in keys.iter().enumerate() {
        let seen = &outcomes[key];
        let count = |want: fn(&ClaimOutcome) -> bool| seen.iter().filter(|o| want(o)).count();
        let (claimed, in_flight, done) = (
            count(|o| matches!(o, ClaimOutcome::Claimed(_))),
            count(|o| matches!(o, ClaimOutcome::InFlight { .. })),
            count(|o| matches!(o, ClaimOutcome::Done(_))),
        );
        let expected = match index % 3 {
            0 => (0, 0, 2),
            1 => (0, 2, 0),
            _ => (1, 1, 0),
        };
        assert_eq!((claimed, in_flight, done), expected, "{key}: {seen:?}");
    }
}

on_two_workers!(
    redis_overlapping_claims_from_two_workers,
    overlapping_claims_from_two_workers,
    RedisStore,
    plain_redis_config(),
    "Redis"
);

on_two_workers!(
    postgres_overlapping_claims_from_two_workers,
    overlapping_claims_from_two_workers,
    PostgresStore,
    plain_postgres_config(),
    "PostgreSQL"
);

on_two_workers!(
    redis_workers_connections_share_one_store,
    workers_connections_share_one_store,
    RedisStore,
    plain_redis_config(),
    "Redis"
);

on_two_workers!(
    postgres_workers_connections_share_one_store,
    workers_connections_share_one_store,
    PostgresStore,
    plain_postgres_config(),
    "PostgreSQL"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_workers_connections_share_one_store() {
    let Some(servers) = support::TestServers::get() else {
        return;
    };
    let workers = Workers::start(2).unwrap();
    match RedisStore::connect(&redis_cluster_config(&servers), Some(&workers)).await {
        Ok(store) => workers_connections_share_one_store(Arc::new(store), workers).await,
        Err(error) => drop(unavailable("the Redis Cluster", error)),
    }
}

/// A value under a claim key that the proxy did not write (another program sharing the
/// prefix, a hand edit, a cut-short value) is a store failure for that key, handled by
/// `on_store_error`: never a panic, never read as absent (which would forward a duplicate),
/// and `forget` leaves it alone.
#[tokio::test]
async fn redis_values_the_proxy_did_not_write_are_store_errors() {
    let config = plain_redis_config();
    let store = match RedisStore::connect(&config, None).await {
        Ok(store) => store,
        Err(error) => return drop(unavailable("Redis", error)),
    };
    let client = redis::Client::open(support::REDIS_URL).unwrap();
    let mut direct = client.get_multiplexed_async_connection().await.unwrap();
    let run = format!("t:{:016x}:foreign", rand::random::<u64>());
    // A hash, as development builds before the string layout wrote.
    let hash_key = format!("{run}hash");
    redis::cmd("HSET")
        .arg(format!("{}{hash_key}", config.prefix))
        .arg("s")
        .arg("d")
        .exec_async(&mut direct)
        .await
        .unwrap();
    assert!(matches!(
        store.claim(&hash_key, BODY, LEASE).await,
        Err(StoreError::Backend(_))
    ));
    assert!(matches!(
        store.inspect(&hash_key).await,
        Err(StoreError::Backend(_))
    ));
    assert!(matches!(
        store.forget(&hash_key).await,
        Err(StoreError::Backend(_))
    ));
    let foreign: [&[u8]; 5] = [b"", b"x", b"f", b"d\xff\xff\xff", &[b'f'; 40]];
    for (index, value) in foreign.into_iter().enumerate() {
        let key = format!("{run}{index}");
        redis::cmd("SET")
            .arg(format!("{}{key}", config.prefix))
            .arg(value)
            .exec_async(&mut direct)
            .await
            .unwrap();
        let claimed = store.claim(&key, BODY, LEASE).await;
        assert!(
            matches!(claimed, Err(StoreError::Backend(_))),
            "{value:?}: {claimed:?}"
        );
        let inspected = store.inspect(&key).await;
        assert!(
            matches!(inspected, Err(StoreError::Backend(_))),
            "{value:?}: {inspected:?}"
        );
        if !value.starts_with(b"d") {
            let forgotten = store.forget(&key).await;
            assert!(
                matches!(
                    forgotten,
                    Err(StoreError::Backend(_)) | Ok(Forgotten::InFlight)
                ),
                "{value:?}: {forgotten:?}"
            );
            let kept: Option<Vec<u8>> = redis::cmd("GET")
                .arg(format!("{}{key}", config.prefix))
                .query_async(&mut direct)
                .await
                .unwrap();
            assert_eq!(kept.as_deref(), Some(value), "forget left it alone");
        }
    }
}

/// A table made before `held` existed (two states, no `hold_reason`) is brought up to date
/// at start, its records kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_table_from_before_held_keys_is_upgraded_and_keeps_its_records() {
    let Some(client) = postgres_client().await else {
        return;
    };
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS dedupe_before_held; {}",
            support::table_from_before_held("dedupe_before_held")
        ))
        .await
        .unwrap();
    let config = PostgresConfig {
        table: TableName("dedupe_before_held".into()),
        ..plain_postgres_config()
    };
    let store = PostgresStore::connect(&config, None).await.unwrap();
    let Some(KeyState::Done(old)) = store.inspect("t:old").await.unwrap() else {
        panic!("the old record is kept");
    };
    assert_eq!(old.upstream_status, 201);
    let replayed = old.response.expect("its answer is kept");
    assert_eq!(
        (replayed.status, replayed.headers, replayed.body),
        (
            201,
            vec![("content-type".to_owned(), Bytes::from_static(b"text/plain"))],
            Bytes::from_static(b"hi")
        )
    );
    // Held keys and keys in flight, few among many done ones, have partial indexes of
    // their own (a clearing counts the keys in flight first).
    for state in ["held", "in_flight"] {
        let valid: Option<bool> = client
            .query_opt(
                "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
                &[&format!("dedupe_before_held_{state}")],
            )
            .await
            .unwrap()
            .map(|row| row.get(0));
        assert_eq!(valid, Some(true), "the index of {state} keys");
    }
    let h = Harness::shared(Arc::new(store));
    held(&h, "k", RETENTION).await;
    assert!(matches!(h.state("k").await, Some(KeyState::Held(_))));
    // A second start finds it up to date.
    drop(PostgresStore::connect(&config, None).await.unwrap());
}

/// Keys in flight, a few among many done ones, are listed (as a clearing counts them
/// first) through their partial index: the server's statistics show it scanned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keys_in_flight_are_listed_through_their_index() {
    let Some(client) = postgres_client().await else {
        return;
    };
    let table = "dedupe_in_flight_listing";
    support::drop_postgres_tables(table).await;
    let config = PostgresConfig {
        table: TableName(table.into()),
        ..plain_postgres_config()
    };
    let h = Harness::shared(Arc::new(
        PostgresStore::connect(&config, None).await.unwrap(),
    ));
    client
        .batch_execute(&format!(
            "INSERT INTO {table} (key, state, claimed_at, expires_at, body_sha256)
             SELECT '{done}' || g, 'done', 0, 9000000000000000, '\\x00'::bytea
             FROM generate_series(1, 20000) g;
             ANALYZE {table}",
            done = h.key("done-")
        ))
        .await
        .unwrap();
    for name in ["f1", "f2", "f3"] {
        h.claimed(name).await;
    }
    let index = format!("{table}_in_flight");
    let scans = || async {
        client
            .query_one(
                "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes
                 WHERE indexrelname = $1",
                &[&index],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let before = scans().await;
    let page = h
        .store
        .list("t", &h.run, Some(StateFilter::InFlight), None, 10)
        .await
        .unwrap();
    let listed: Vec<&str> = page.keys.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(listed, [h.key("f1"), h.key("f2"), h.key("f3")]);
    // A session reports its statistics when idle, within about ten seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while scans().await == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the listing did not scan {index}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A batch of done marks locks its rows in the plan's order, which another transaction
/// can cross: here one holds `b` while the batch (`a`, `b`) holds `a` and waits, then asks
/// for `a`. The batch waited first, so the server aborts it as the deadlock's victim; it
/// changed nothing, runs again once the other commits, and every mark is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_batch_the_server_aborts_as_a_deadlock_runs_again() {
    let Some(observer) = postgres_client().await else {
        return;
    };
    let table = "dedupe_batch_deadlock";
    support::drop_postgres_tables(table).await;
    let config = PostgresConfig {
        table: TableName(table.into()),
        pool_size: 1,
        ..plain_postgres_config()
    };
    let store = Arc::new(PostgresStore::connect(&config, None).await.unwrap());
    let mut claims = Vec::new();
    for key in ["a", "b", "c"] {
        match store.claim(key, BODY, LEASE).await.unwrap() {
            ClaimOutcome::Claimed(claim) => claims.push(claim),
            other => panic!("{key}: {other:?}"),
        }
    }
    let [a, b, c] = <[Claim; 3]>::try_from(claims).unwrap();
    let lock_row = |key: &'static str| async move {
        let holder = postgres_client().await.unwrap();
        holder
            .batch_execute(&format!(
                "BEGIN; SELECT 1 FROM {table} WHERE key = '{key}' FOR UPDATE"
            ))
            .await
            .unwrap();
        holder
    };
    // Waiting statements other than the observer's.
    let waiting = || async {
        let row = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
                   AND datname = current_database() AND query LIKE '%dedupe_batch_deadlock%'
                   AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    let until_waiting = |count: i64| async move {
        for _ in 0..500 {
            if waiting().await >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{count} statements never waited for a lock");
    };
    let deadlocks = || async {
        observer
            .query_one(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let deadlocks_before = deadlocks().await;
    let (holding_c, holding_b) = (lock_row("c").await, lock_row("b").await);
    // `c`'s mark takes the store's only connection and waits for its row...
    let finishing_c = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.finish(&c, done(200, RETENTION)).await }
    });
    until_waiting(1).await;
    // ...so that `a`'s and `b`'s queue meanwhile, and go in one statement.
    let finishing = [a.clone(), b.clone()].map(|claim| {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.finish(&claim, done(200, RETENTION)).await })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    holding_c.batch_execute("ROLLBACK").await.unwrap();
    finishing_c.await.unwrap().unwrap();
    // The batch has `a` and waits for `b`; the holder of `b` now asks for `a`, checking
    // for deadlocks later than the batch does, so that the batch is the one aborted.
    until_waiting(1).await;
    let crossing = tokio::spawn(async move {
        holding_b
            .batch_execute(&format!(
                "SET deadlock_timeout = '10s'; SELECT 1 FROM {table} WHERE key = 'a' FOR UPDATE; COMMIT"
            ))
            .await
    });
    for finished in finishing {
        finished.await.unwrap().unwrap();
    }
    crossing.await.unwrap().unwrap();
    // The statistics reach the view within its stats interval.
    support::eventually(
        Duration::from_secs(3),
        "the deadlock is counted",
        || async { deadlocks().await > deadlocks_before },
    )
    .await;
    for claim in [&a, &b] {
        assert!(
            matches!(
                store.inspect(&claim.key).await.unwrap(),
                Some(KeyState::Done(_))
            ),
            "{} is done",
            claim.key
        );
    }
}

/// A plain connection to the test database, for what a test reads or writes behind the
/// store; none (the test skipped) without PostgreSQL.
async fn postgres_client() -> Option<tokio_postgres::Client> {
    if !support::service_available("PostgreSQL", 5432).await {
        return None;
    }
    let (client, connection) =
        tokio_postgres::connect(support::POSTGRES_URL, tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    Some(client)
}

/// PostgreSQL's sweep deletes expired entity rows (Redis expires them by TTL, sled's sweep
/// is in `sled_store.rs`), and leaves live ones; an entity's value of another form on Redis
/// guards nothing and is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_expired_entity_rows_are_swept() {
    let Some(client) = postgres_client().await else {
        return;
    };
    client
        .batch_execute("DROP TABLE IF EXISTS dedupe_entity_sweep, dedupe_entity_sweep_entities")
        .await
        .unwrap();
    let config = PostgresConfig {
        table: TableName("dedupe_entity_sweep".into()),
        ..plain_postgres_config()
    };
    let store = PostgresStore::connect(&config, None).await.unwrap();
    let version = parse_version("5").unwrap();
    for n in 0..3 {
        let entity = format!("t#entity:{n}");
        let retention = if n == 0 {
            RETENTION
        } else {
            Duration::from_millis(50)
        };
        assert!(
            store
                .record_version(&entity, &version, retention)
                .await
                .unwrap()
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let swept = store.sweep(1000).await.unwrap();
    assert_eq!((swept.examined, swept.removed), (2, 2));
    let rows = client
        .query("SELECT key FROM dedupe_entity_sweep_entities", &[])
        .await
        .unwrap();
    let keys: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(keys, ["t#entity:0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_entity_value_of_another_form_is_replaced() {
    let Some(h) = Harness::redis().await else {
        return;
    };
    let mut connection = redis::Client::open(support::REDIS_URL)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = format!("dedupe-test:{}", h.entity("odd"));
    let _: () = redis::AsyncCommands::set(&mut connection, &key, "written by someone else")
        .await
        .unwrap();
    assert_eq!(h.newest("odd").await, None);
    assert!(h.record("odd", "3", RETENTION).await);
    assert_eq!(h.newest("odd").await.as_deref(), Some("3"));
}

/// Claims `key` but stops waiting after 100 ms, while `stall` keeps the server from
/// answering for longer; then the claim must be given back once the server answers: left
/// in flight, it would turn the provider's retries away until its lease (a minute here,
/// five by default) ended.
async fn an_unanswered_claim_is_given_back<Waits>(
    store: Arc<dyn ClaimStore>,
    key: &str,
    stall: impl std::future::Future<Output = ()> + Send + 'static,
    waiting: impl Fn() -> Waits,
) where
    Waits: std::future::Future<Output = bool>,
{
    // Connections opened first: a claim still waiting for one would never be sent.
    store
        .claim(&format!("{key}-warm"), BODY, LEASE)
        .await
        .unwrap();
    let stalled = tokio::spawn(stall);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let claiming = {
        let (store, key) = (Arc::clone(&store), key.to_owned());
        tokio::spawn(async move { store.claim(&key, BODY, LEASE).await })
    };
    support::eventually(
        Duration::from_secs(5),
        "the claim waiting on the server",
        &waiting,
    )
    .await;
    assert!(
        !claiming.is_finished(),
        "the claim must still be waiting on the stalled server"
    );
    claiming.abort();
    stalled.await.unwrap();
    support::eventually(
        Duration::from_secs(5),
        "the unanswered claim given back",
        || async { store.inspect(key).await.unwrap().is_none() },
    )
    .await;
    assert!(matches!(
        store.claim(key, BODY, LEASE).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
}

/// A redis-server of one test's own, on a free loopback port: pausing it holds up no other
/// test.
struct OwnRedis {
    server: std::process::Child,
    url: String,
}

impl OwnRedis {
    async fn start() -> Option<OwnRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn();
        let server = match server {
            Ok(server) => server,
            Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
                panic!("redis-server must be installed in CI: {error}")
            }
            Err(error) => {
                eprintln!("skipped: redis-server cannot be started ({error})");
                return None;
            }
        };
        let own = OwnRedis {
            server,
            url: format!("redis://127.0.0.1:{port}/0"),
        };
        support::eventually(
            Duration::from_secs(10),
            "redis-server listening",
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
        Some(own)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_unanswered_claim_is_given_back() {
    let Some(redis) = OwnRedis::start().await else {
        return;
    };
    let config = dedupe_proxy::config::RedisConfig {
        url: dedupe_proxy::config::ServerUrl::Written(dedupe_proxy::values::Secret::new(
            redis.url.clone(),
        )),
        ..plain_redis_config()
    };
    let store = Arc::new(RedisStore::connect(&config, None).await.unwrap());
    let url = redis.url.clone();
    // Writes wait 500 ms: the claim's SET among them.
    let stall = async move {
        let client = redis::Client::open(url).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(500)
            .arg("WRITE")
            .query_async(&mut connection)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Sent at once on its open connection, and held by the pause.
    let sent = || async { true };
    an_unanswered_claim_is_given_back(store, "unanswered", stall, sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_unanswered_claim_is_given_back() {
    let Some(locker) = postgres_client().await else {
        return;
    };
    let table = "dedupe_unanswered";
    support::drop_postgres_tables(table).await;
    let config = PostgresConfig {
        table: TableName(table.into()),
        ..plain_postgres_config()
    };
    let store = Arc::new(PostgresStore::connect(&config, None).await.unwrap());
    let observer = postgres_client().await.unwrap();
    // Another session locks the table for 500 ms: the claim's insert waits behind it.
    let stall = async move {
        locker
            .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        locker.batch_execute("COMMIT").await.unwrap();
    };
    let blocked = || async {
        let waiting = format!(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '{table}'::regclass"
        );
        let row = observer.query_one(&waiting, &[]).await.unwrap();
        row.get::<_, i64>(0) > 0
    };
    an_unanswered_claim_is_given_back(store, "unanswered", stall, blocked).await;
}
