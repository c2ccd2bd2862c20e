//! What the PostgreSQL store leaves on a server it shares with others: behind PgBouncer in
//! transaction mode, with `direct_url` or without, nothing in the pooler's sessions
//! (settings, prepared statements, `LISTEN`s, locks), and a warning when `url` seems to be
//! a pooler without `direct_url`; beside a replica that stopped reading its notifications,
//! a notification queue that does not fill. (Skipped locally without the servers; a failure in CI.)

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use dedupe_proxy::config::{DirectUrl, PostgresConfig, ServerUrl};
use dedupe_proxy::store::postgres::PostgresStore;
use dedupe_proxy::store::{ClaimOutcome, ClaimStore, Completion};
use dedupe_proxy::values::Secret;
use support::*;

fn config(table: &str, url: String, direct_url: Option<&str>) -> PostgresConfig {
    PostgresConfig {
        direct_url: direct_url.map(|url| DirectUrl(ServerUrl::Written(Secret::new(url.into())))),
        ..postgres_config(&url, table)
    }
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A store behind PgBouncer does all its kinds of work, many at once; then two clients,
/// each in a transaction (so between them they hold both of the pooler's server
/// sessions), find those sessions as a fresh one: the planner's settings at their
/// defaults, no prepared statement, no channel listened to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_the_pooled_sessions_are_left_as_they_were() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let table = "sessions_pooled";
    drop_postgres_tables(table).await;
    let config = config(table, servers.pgbouncer_url(), Some(POSTGRES_URL));
    let store = Arc::new(PostgresStore::connect(&config, None).await.unwrap());
    store.hear_outcomes(Arc::new(|_| {}));
    let mut work = tokio::task::JoinSet::new();
    for n in 0..40 {
        let store = Arc::clone(&store);
        work.spawn(async move {
            let key = format!("t:key-{n}");
            let ClaimOutcome::Claimed(claim) = store
                .claim(&key, [0; 32], Duration::from_secs(10))
                .await
                .unwrap()
            else {
                panic!("{key} was claimed before");
            };
            if n % 2 == 0 {
                let completion = Completion {
                    upstream_status: 200,
                    retention: Duration::from_secs(60),
                    response: None,
                };
                store.finish(&claim, completion).await.unwrap();
            } else {
                store.release(&claim).await.unwrap();
            }
            store.inspect(&key).await.unwrap();
            store.list("t", "", None, None, 10).await.unwrap();
            store.sweep(100).await.unwrap();
        });
    }
    while let Some(done) = work.join_next().await {
        done.unwrap();
    }
    assert_sessions_as_new(&servers.pgbouncer_url()).await;
}

/// A `direct_url` that reaches another database than `url` is refused at start: the
/// schema and the outcomes heard there would not be `url`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_url_to_another_database_than_url_is_refused() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let elsewhere = POSTGRES_URL.replace("/test", "/postgres");
    let config = config(
        "sessions_elsewhere",
        servers.pgbouncer_url(),
        Some(&elsewhere),
    );
    let error = match PostgresStore::connect(&config, None).await {
        Ok(_) => panic!("a direct URL to another database was taken"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("reach different databases"), "{error}");
}

/// Through a pooler without `direct_url`, the proxy still deduplicates and leaves nothing
/// in the pooler's sessions (no setting, prepared statement, `LISTEN` or lock: the pool's
/// other clients find them as new), and the log says to set `direct_url`; reached
/// directly, or with `direct_url`, it says nothing of the kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_pooler_without_direct_url_the_pooled_sessions_keep_their_defaults() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let table = "sessions_warning";
    drop_postgres_tables(table).await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A pool of its own, which no other test's proxy uses.
    let pooled = servers.pgbouncer_url().replace("/test", "/unguarded");
    for (name, store, warned) in [
        ("behind", format!("url: \"{pooled}\""), true),
        ("direct", format!("url: \"{POSTGRES_URL}\""), false),
        (
            "told",
            format!("url: \"{pooled}\", direct_url: \"{POSTGRES_URL}\""),
            false,
        ),
    ] {
        let path = dir.path().join(format!("{name}.yaml"));
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ postgres: {{ {store}, table: {table} }} }}\n{}",
            upstream.addr,
            json_route("    on_in_flight: wait\n")
        );
        std::fs::write(&path, text).unwrap();
        let proxy = Binary::start(&path);
        for round in 0..3 {
            let id = format!("evt_{name}_{round}");
            assert_eq!(
                post_event(proxy.addr, &id).await.dedupe(),
                "forwarded",
                "{name}"
            );
            assert_eq!(
                post_event(proxy.addr, &id).await.dedupe(),
                "duplicate",
                "{name}"
            );
        }
        let log = proxy.log_text();
        assert_eq!(
            log.contains("set `direct_url`"),
            warned,
            "{name}: {store}\n{log}"
        );
        // The overview (and the console's store card) says whether waiters are told.
        let overview = send(proxy.admin, "GET", "/v1/overview", &[], "").await;
        assert_eq!(
            overview.json()["store"]["outcomes_announced"],
            !warned,
            "{name}: {}",
            overview.body
        );
        drop(proxy);
        if name == "behind" {
            assert_sessions_as_new(&pooled).await;
        }
    }
}

/// Two clients of `pooled`, each in a transaction (so that between them they hold both of
/// the pooler's server sessions), find those sessions as a new one: the planner's
/// settings at their defaults, no prepared statement, no channel listened to, no lock.
async fn assert_sessions_as_new(pooled: &str) {
    let (first, second) = (client(pooled).await, client(pooled).await);
    first.batch_execute("BEGIN").await.unwrap();
    second.batch_execute("BEGIN").await.unwrap();
    for session in [&first, &second] {
        // A simple query: the test's own statement is not a prepared one.
        let rows = session
            .simple_query(
                "SELECT pg_backend_pid(), current_setting('enable_seqscan'),
                        current_setting('plan_cache_mode'),
                        (SELECT count(*) FROM pg_prepared_statements),
                        (SELECT count(*) FROM pg_listening_channels()),
                        (SELECT count(*) FROM pg_locks
                         WHERE locktype = 'advisory' AND pid = pg_backend_pid())",
            )
            .await
            .unwrap();
        let Some(row) = rows.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        }) else {
            panic!("no row: {rows:?}");
        };
        let [pid, seqscan, plans, prepared, channels, locks] =
            [0, 1, 2, 3, 4, 5].map(|column| row.get(column).unwrap_or_default());
        assert_eq!(
            (seqscan, plans, prepared, channels, locks),
            ("on", "auto", "0", "0", "0"),
            "server session {pid}"
        );
    }
}

/// A replica frozen while it listens (SIGSTOP: its connection stays open, unread) would
/// let the server's notification queue fill, after which every transaction that notifies
/// fails, everywhere. Another replica's listener ends the frozen one's session once the
/// queue passes its bound; the frozen replica listens again when it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_reading_its_notifications_is_cut_off_before_the_queue_fills() {
    if !service_available("PostgreSQL", 5432).await {
        return;
    }
    let table = "sessions_frozen";
    let channel = format!("{table}_outcomes");
    drop_postgres_tables(table).await;
    let observer = client(POSTGRES_URL).await;
    // A listener's query is `LISTEN <channel>` until its first check, 10 s later: the
    // frozen replica's is found before that, and a new one after its start.
    let listeners = format!(
        "SELECT pid FROM pg_stat_activity
         WHERE application_name = 'dedupe-proxy listener' AND query = 'LISTEN {channel}'"
    );
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("frozen.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ postgres: {{ url: \"{POSTGRES_URL}\", table: {table} }} }}\n{}",
            upstream.addr,
            json_route("    on_in_flight: wait\n")
        ),
    )
    .unwrap();
    let frozen = Binary::start(&path);
    let mut frozen_pid = None;
    for _ in 0..100 {
        if let Some(row) = observer.query(&listeners, &[]).await.unwrap().first() {
            frozen_pid = Some(row.get::<_, i32>(0));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let frozen_pid = frozen_pid.expect("the replica listens");
    frozen.signal("STOP");

    // The other replica, listening too, and a third that listens and reads.
    let config = config(table, POSTGRES_URL.into(), None);
    let other = PostgresStore::connect(&config, None).await.unwrap();
    other.hear_outcomes(Arc::new(|_| {}));
    let healthy = PostgresStore::connect(&config, None).await.unwrap();
    healthy.hear_outcomes(Arc::new(|_| {}));
    let mut listening = Vec::new();
    for _ in 0..100 {
        listening = observer.query(&listeners, &[]).await.unwrap();
        if listening.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let readers: Vec<i32> = listening
        .iter()
        .map(|row| row.get(0))
        .filter(|pid| *pid != frozen_pid)
        .collect();
    assert_eq!(readers.len(), 2, "the two replicas that read listen");

    // Notifications the frozen replica does not read: first its socket's buffers fill,
    // then the queue grows.
    let notifier = client(POSTGRES_URL).await;
    let flood = format!(
        "SELECT pg_notify('{channel}', lpad(g::text || '-' || $1::text, 7900, 'x'))
         FROM generate_series(1, 200) g"
    );
    let mut most_used = 0.0_f64;
    for round in 0..40 {
        notifier
            .execute(&flood, &[&round.to_string()])
            .await
            .unwrap();
        let usage: f64 = observer
            .query_one("SELECT pg_notification_queue_usage()", &[])
            .await
            .unwrap()
            .get(0);
        most_used = most_used.max(usage);
        if usage >= 0.002 {
            break;
        }
    }
    assert!(
        most_used >= 0.001,
        "the frozen replica held the queue back (most used {most_used})"
    );
    let stalled = format!("SELECT 1 FROM pg_stat_activity WHERE pid = {frozen_pid}");
    // Stalled once idle for three checks (30 s), ended at the next check.
    eventually(
        Duration::from_secs(60),
        "the frozen replica's listening session is ended",
        || async { observer.query(&stalled, &[]).await.unwrap().is_empty() },
    )
    .await;
    eventually(Duration::from_secs(5), "the queue empties", || async {
        notifier
            .execute("NOTIFY sessions_frozen_probe", &[])
            .await
            .unwrap();
        let usage: f64 = observer
            .query_one("SELECT pg_notification_queue_usage()", &[])
            .await
            .unwrap()
            .get(0);
        usage < 0.001
    })
    .await;

    for pid in &readers {
        let alive = format!("SELECT 1 FROM pg_stat_activity WHERE pid = {pid}");
        assert!(
            !observer.query(&alive, &[]).await.unwrap().is_empty(),
            "a listener that reads keeps its session"
        );
    }
    let thawed: std::time::SystemTime = observer
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    frozen.signal("CONT");
    let new_listener = format!("{listeners} AND backend_start > $1");
    eventually(
        Duration::from_secs(15),
        "the thawed replica listens again",
        || async {
            !observer
                .query(&new_listener, &[&thawed])
                .await
                .unwrap()
                .is_empty()
        },
    )
    .await;
    drop((other, healthy));
}

/// A replica that stalls while it holds a lane's lock (`queue.order_by`) holds up that
/// lane for at most the store's `timeout`, never the other lanes or the whole queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_lock_held_elsewhere_costs_a_timeout_not_the_queue() {
    use dedupe_proxy::store::queue::{Enqueued, Job, QueuedRequest};
    let table = "sessions_lanes";
    drop_postgres_tables(table).await;
    let config = postgres_config(POSTGRES_URL, table);
    let store = PostgresStore::connect(&config, None).await.unwrap();
    let queue = store.queue().unwrap();
    let job = |key: &str, lane: &str| {
        let request = QueuedRequest {
            method: "POST".into(),
            target: "/".into(),
            headers: vec![],
            body: bytes::Bytes::from_static(b"{}"),
        };
        let mut job = Job::new(key.into(), "r".into(), 1, request);
        job.lane = Some(lane.into());
        job
    };
    // Another session holds lane A's lock, as a replica stalled inside its transaction.
    let holder = client(POSTGRES_URL).await;
    holder
        .execute("SELECT pg_advisory_lock(hashtext('r'), hashtext('A'))", &[])
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let refused = queue.enqueue(&job("r:a1", "A")).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        started.elapsed() < config.timeout.0 + Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Both of the queue's connections are usable again: other lanes go on.
    for n in 0..4 {
        let stored = queue.enqueue(&job(&format!("r:b{n}"), "B")).await.unwrap();
        assert_eq!(stored, Enqueued::Stored);
    }
    holder
        .execute("SELECT pg_advisory_unlock_all()", &[])
        .await
        .unwrap();
    assert_eq!(
        queue.enqueue(&job("r:a1", "A")).await.unwrap(),
        Enqueued::Stored
    );
    drop_postgres_tables(table).await;
}

/// The proxy's sessions keep `synchronous_commit` as the server has it (they never turn it
/// off), and a database whose sessions commit before the disk has the commit is named in
/// a warning at start: there a crash of the database's host can lose acknowledged done
/// marks and queued jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_commits_before_its_disk_has_it_is_warned_of() {
    if !service_available("PostgreSQL", 5432).await {
        return;
    }
    let server = client(POSTGRES_URL).await;
    let exists = server
        .query(
            "SELECT 1 FROM pg_database WHERE datname = 'dedupe_commits_unsynced'",
            &[],
        )
        .await
        .unwrap();
    if exists.is_empty() {
        server
            .batch_execute("CREATE DATABASE dedupe_commits_unsynced")
            .await
            .unwrap();
    }
    server
        .batch_execute("ALTER DATABASE dedupe_commits_unsynced SET synchronous_commit = off")
        .await
        .unwrap();
    let upstream = Upstream::start().await;
    let warning = "synchronous_commit = off";
    for (database, warned) in [("dedupe_commits_unsynced", true), ("test", false)] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("postgres://postgres@127.0.0.1:5432/{database}");
        let store = format!("store: {{ postgres: {{ url: \"{url}\", table: commits_checked }} }}");
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\n{store}\n{}",
            upstream.addr,
            json_route("")
        );
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, text).unwrap();
        let proxy = tokio::task::spawn_blocking(move || Binary::start(&config))
            .await
            .unwrap();
        assert_eq!(
            proxy.log_text().contains(warning),
            warned,
            "{database}: {}",
            proxy.log_text()
        );
    }
    drop_postgres_tables("commits_checked").await;
}
