//! The delivery log's contract (`store::log::DeliveryLog`), run unchanged against sled,
//! Redis, PostgreSQL, their TLS servers, the Redis Cluster and PostgreSQL through
//! PgBouncer: ids that grow in the order stored (concurrent writers too), reads newest
//! first from any id, one entry by its id, and trimming by count and by age.
//!
//! The backends run one after another in one test: a log is one per store, and a trim
//! in one backend's test must not meet another's entries on a server they share.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dedupe_proxy::store::log::{DeliveryLog, Fate, LogId, LoggedDelivery};
use support::Harness;

fn now() -> u64 {
    dedupe_proxy::store::millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap(),
    )
}

fn entry(key: &str) -> LoggedDelivery {
    LoggedDelivery {
        at: now(),
        route: Some("hooks".into()),
        scope: Some("hooks".into()),
        key: Some(key.into()),
        fate: Fate::Forwarded,
        refusal: None,
        waited: false,
        replayed: true,
        attempt: Some(3),
        status: 200,
        upstream_status: Some(200),
        upstream_ms: Some(4),
        duration_ms: 5,
        size: Some(14),
        method: "POST".into(),
        path: "/hooks".into(),
        request_id: Some("r".into()),
        trace_id: None,
        client: Some("127.0.0.1:1".into()),
        replica: None,
        headers: vec![("x-event".into(), "ünïcode".into())],
        body: Some(bytes::Bytes::from_static(b"\xff\x00binary")),
        body_truncated: true,
        by: Some("api:token".into()),
    }
}

async fn keys(log: &dyn DeliveryLog, before: Option<LogId>, limit: usize) -> Vec<String> {
    log.read(before, limit)
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|(_, entry)| entry.key.unwrap())
        .collect()
}

async fn the_log_keeps_its_contract(h: Harness) {
    let log = h.store.delivery_log().expect("every store keeps a log");
    log.trim(u64::MAX, 0).await.unwrap();
    assert!(
        log.read(None, 10).await.unwrap().entries.is_empty(),
        "an empty log"
    );

    let mut ids = Vec::new();
    for key in ["a", "b", "c"] {
        ids.extend(log.append(&[entry(key)]).await.unwrap());
    }
    ids.extend(log.append(&[entry("d"), entry("e")]).await.unwrap());
    assert_eq!(ids.len(), 5);
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");

    assert_eq!(keys(&*log, None, 10).await, ["e", "d", "c", "b", "a"]);
    assert_eq!(keys(&*log, Some(ids[2]), 10).await, ["b", "a"]);
    assert_eq!(keys(&*log, None, 2).await, ["e", "d"]);
    // A read says where the next goes on from, and nothing once it read the oldest.
    assert_eq!(log.read(None, 2).await.unwrap().more_before, Some(ids[3]));
    assert_eq!(log.read(None, 10).await.unwrap().more_before, None);
    assert_eq!(
        log.read(Some(ids[1]), 1).await.unwrap().more_before,
        Some(ids[0])
    );
    assert_eq!(keys(&*log, Some(ids[3]), 2).await, ["c", "b"]);
    let read = log.read(Some(ids[1]), 5).await.unwrap().entries;
    assert_eq!(read, vec![(ids[0], entry_at("a", &read[0].1))]);

    let whole = log.get(ids[2]).await.unwrap().unwrap();
    assert_eq!(whole.key.as_deref(), Some("c"));
    assert_eq!(
        whole.headers,
        [("x-event".to_owned(), "ünïcode".to_owned())]
    );
    assert_eq!(whole.body.as_deref(), Some(&b"\xff\x00binary"[..]));
    assert_eq!(log.get(LogId(ids[4].0 + 1_000_000, 0)).await.unwrap(), None);
    // Ids a caller makes up, at either end of what an id holds, name nothing and read
    // from the newest or from nothing.
    for made_up in [
        LogId(0, 0),
        LogId(u64::MAX, u64::MAX),
        LogId(ids[4].0, u64::MAX),
    ] {
        assert_eq!(log.get(made_up).await.unwrap(), None, "{made_up}");
    }
    assert_eq!(
        keys(&*log, Some(LogId(u64::MAX, u64::MAX)), 2).await,
        ["e", "d"]
    );
    assert_eq!(
        log.read(Some(LogId(0, 0)), 10).await.unwrap(),
        Default::default()
    );
    assert!(log.read(None, 0).await.unwrap().entries.is_empty());
    assert_eq!(log.get(LogId(ids[4].0, 999)).await.unwrap(), None);

    // Two writers at once: every entry stored, each under an id of its own.
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..40 {
                    ids.extend(
                        log.append(&[entry(&format!("w{writer}-{n}"))])
                            .await
                            .unwrap(),
                    );
                }
                ids
            })
        })
        .collect();
    let mut written = HashSet::new();
    for writer in writers {
        written.extend(writer.await.unwrap());
    }
    assert_eq!(written.len(), 80);
    assert_eq!(log.read(None, 500).await.unwrap().entries.len(), 85);

    // By count: the newest three stay.
    let newest = keys(&*log, None, 3).await;
    log.trim(0, 3).await.unwrap();
    assert_eq!(keys(&*log, None, 10).await, newest);

    // By age: what was stored before the time goes.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let cutoff = now();
    tokio::time::sleep(Duration::from_millis(30)).await;
    log.append(&[entry("late")]).await.unwrap();
    log.trim(cutoff, 1000).await.unwrap();
    assert_eq!(keys(&*log, None, 10).await, ["late"]);
}

/// `expected`'s entry named `key`, at the time it was stored with.
fn entry_at(key: &str, stored: &LoggedDelivery) -> LoggedDelivery {
    LoggedDelivery {
        at: stored.at,
        ..entry(key)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_keeps_the_log_contract() {
    let harnesses = [
        Harness::sled().await,
        Harness::redis().await,
        Harness::postgres().await,
        Harness::redis_tls().await,
        Harness::redis_cluster().await,
        Harness::postgres_tls().await,
        Harness::postgres_pooled().await,
    ];
    for harness in harnesses.into_iter().flatten() {
        the_log_keeps_its_contract(harness).await;
    }
}

/// A PostgreSQL log an earlier version wrote, a row per entry and no `entries` column,
/// reads on beside the batches written after: in order, by id, trimmed by count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_log_of_an_earlier_version_reads_on() {
    use dedupe_proxy::store::postgres::PostgresStore;
    use dedupe_proxy::values::TableName;

    if !support::service_available("PostgreSQL", 5432).await {
        return;
    }
    let (client, connection) =
        tokio_postgres::connect(support::POSTGRES_URL, tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    let table = "dedupe_log_upgrade";
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}, {table}_entities, {table}_jobs, {table}_paused,
                                 {table}_deliveries CASCADE;
             CREATE TABLE {table}_deliveries (id bigserial PRIMARY KEY, at bigint NOT NULL,
                                              entry bytea NOT NULL);"
        ))
        .await
        .unwrap();
    for key in ["old-a", "old-b"] {
        let old = entry(key);
        client
            .execute(
                &format!("INSERT INTO {table}_deliveries (at, entry) VALUES ($1, $2)"),
                &[&(old.at as i64), &old.encode()],
            )
            .await
            .unwrap();
    }

    let config = dedupe_proxy::config::PostgresConfig {
        table: TableName(table.into()),
        ..support::plain_postgres_config()
    };
    let store = PostgresStore::connect(&config, None).await.unwrap();
    let log = dedupe_proxy::store::ClaimStore::delivery_log(&store).unwrap();
    // Batches are stored out of line, uncompressed.
    let storage: i8 = client
        .query_one(
            &format!(
                "SELECT attstorage FROM pg_attribute
                 WHERE attrelid = '{table}_deliveries'::regclass AND attname = 'entry'"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(storage as u8, b'e');
    let ids = log.append(&[entry("new-a"), entry("new-b")]).await.unwrap();
    assert_eq!(ids[0].0, ids[1].0, "one row for the batch");
    assert_eq!(
        keys(&*log, None, 10).await,
        ["new-b", "new-a", "old-b", "old-a"]
    );
    assert_eq!(keys(&*log, Some(ids[1]), 2).await, ["new-a", "old-b"]);
    let read = log.read(None, 10).await.unwrap().entries;
    let old_b = read[2].0;
    assert_eq!(
        log.get(old_b).await.unwrap().unwrap().key.as_deref(),
        Some("old-b")
    );
    assert_eq!(log.get(LogId(old_b.0, 1)).await.unwrap(), None);

    // The batch's row holds the newest two; the old rows go, one entry each.
    assert_eq!(log.trim(0, 2).await.unwrap(), 2);
    assert_eq!(keys(&*log, None, 10).await, ["new-b", "new-a"]);

    // Rows that do not read (a later version's, after a rollback) are passed over, and
    // a read looks at no more rows than a row per entry would take.
    for _ in 0..20 {
        client
            .execute(
                &format!("INSERT INTO {table}_deliveries (at, entries, entry) VALUES (0, 1, $1)"),
                &[&b"\x09not a chunk".to_vec()],
            )
            .await
            .unwrap();
    }
    let short = log.read(None, 5).await.unwrap();
    assert!(short.entries.is_empty(), "six rows looked at");
    let more_before = short.more_before.expect("older rows are kept");
    assert_eq!(keys(&*log, Some(more_before), 30).await, ["new-b", "new-a"]);
    assert_eq!(keys(&*log, None, 30).await, ["new-b", "new-a"]);
}

/// A Redis log an earlier version wrote, a stream entry per delivery, reads on beside the
/// batches written after; trimming counts a batch's entries, removes their members from
/// the sorted set, and by count leaves the earlier entries until a batch after them goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_log_of_an_earlier_version_reads_on() {
    use dedupe_proxy::store::redis::RedisStore;

    if !support::service_available("Redis", 6379).await {
        return;
    }
    let prefix = "dedupe-log-upgrade:";
    let stream = format!("{prefix}deliveries");
    let client = redis::Client::open(support::REDIS_URL).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let batches = format!("{prefix}deliveries_batches{{{stream}}}");
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .arg(&batches)
        .query_async(&mut redis)
        .await
        .unwrap();
    for key in ["old-a", "old-b"] {
        old_entry(&mut redis, &stream, key).await;
    }

    let config = dedupe_proxy::config::RedisConfig {
        prefix: prefix.into(),
        ..support::plain_redis_config()
    };
    let store = RedisStore::connect(&config, None).await.unwrap();
    let log = dedupe_proxy::store::ClaimStore::delivery_log(&store).unwrap();
    let first = log
        .append(&[entry("new-a"), entry("new-b"), entry("new-c")])
        .await
        .unwrap();
    assert_eq!(first[0].0, first[2].0, "one stream entry for the batch");
    let stream_length: u64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(stream_length, 3, "two entries of before, one batch");
    let second = log.append(&[entry("new-d")]).await.unwrap();
    assert_eq!(
        keys(&*log, None, 10).await,
        ["new-d", "new-c", "new-b", "new-a", "old-b", "old-a"]
    );
    assert_eq!(keys(&*log, Some(first[1]), 2).await, ["new-a", "old-b"]);
    let read = log.read(None, 10).await.unwrap().entries;
    let old_b = read[4].0;
    assert_eq!(
        log.get(old_b).await.unwrap().unwrap().key.as_deref(),
        Some("old-b")
    );
    assert_eq!(log.get(LogId(old_b.0, old_b.1 + 1)).await.unwrap(), None);
    assert_eq!(
        log.get(first[2]).await.unwrap().unwrap().key.as_deref(),
        Some("new-c")
    );

    // Batches go whole: the newest two are in the last two batches, so all stay.
    assert_eq!(log.trim(0, 6).await.unwrap(), 0);
    assert_eq!(log.trim(0, 2).await.unwrap(), 0);
    assert_eq!(keys(&*log, None, 10).await.len(), 6);
    // The newest one: the batch of three goes with what came before it (five entries).
    assert_eq!(log.trim(0, 1).await.unwrap(), 5);
    assert_eq!(keys(&*log, None, 10).await, ["new-d"]);
    assert_eq!(
        log.get(second[0]).await.unwrap().unwrap().key.as_deref(),
        Some("new-d")
    );

    // An earlier version's replica still logging between batches (a rolling upgrade):
    // read in the order stored, and trimmed by age, counted one each.
    log.append(&[entry("late-a"), entry("late-b")])
        .await
        .unwrap();
    old_entry(&mut redis, &stream, "old-c").await;
    log.append(&[entry("late-c")]).await.unwrap();
    assert_eq!(
        keys(&*log, None, 10).await,
        ["late-c", "old-c", "late-b", "late-a", "new-d"]
    );
    assert_eq!(members(&mut redis, &batches).await, 3);
    // Half way by time: what was stored before goes, counted, members too.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let cutoff = now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    log.append(&[entry("later")]).await.unwrap();
    assert_eq!(log.trim(cutoff, 100).await.unwrap(), 5);
    assert_eq!(keys(&*log, None, 10).await, ["later"]);
    assert_eq!(members(&mut redis, &batches).await, 1);
    assert_eq!(log.trim(cutoff, 100).await.unwrap(), 0, "nothing twice");

    // Many batches, trimmed by age at any point of them: the count is exact.
    let mut ids = Vec::new();
    for n in 0..150 {
        ids.push(log.append(&[entry(&format!("m{n}"))]).await.unwrap()[0]);
    }
    let cutoff = ids[117].0;
    let stored_before = ids.iter().filter(|id| id.0 < cutoff).count() as u64;
    assert_eq!(log.trim(cutoff, 1000).await.unwrap(), 1 + stored_before);
    assert_eq!(members(&mut redis, &batches).await, 150 - stored_before);

    // Stream entries that do not read (a later version's, after a rollback) are passed
    // over, and a read looks at no more of them than an entry each would take.
    for _ in 0..20 {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("x")
            .arg("not a batch")
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let short = log.read(None, 5).await.unwrap();
    assert!(short.entries.is_empty(), "six looked at");
    // Each read says where the next goes on from, until the entries past them.
    let (mut before, mut reads) = (short.more_before, 1);
    let found = loop {
        let read = log.read(before, 2).await.unwrap();
        reads += 1;
        if !read.entries.is_empty() {
            break read.entries;
        }
        before = Some(read.more_before.expect("older batches are kept"));
    };
    let found: Vec<_> = found.into_iter().map(|(_, e)| e.key.unwrap()).collect();
    assert_eq!(found, ["m149", "m148"]);
    // The first read passes 6 of the 20; each next looks again at the one it starts
    // from and passes 2 more.
    assert_eq!(reads, 9);
    assert_eq!(keys(&*log, None, 22).await, ["m149", "m148", "m147"]);

    // A member the log did not write is dropped, and trimming goes on.
    let _: () = redis::cmd("ZADD")
        .arg(&batches)
        .arg(0)
        .arg("not ours")
        .query_async(&mut redis)
        .await
        .unwrap();
    log.trim(0, 1000).await.unwrap();
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(&batches)
        .arg("not ours")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(score, None);

    let left = 150 - stored_before + 20;
    assert_eq!(log.trim(u64::MAX, 100).await.unwrap(), left);
    assert!(log.read(None, 10).await.unwrap().entries.is_empty());
    assert_eq!(members(&mut redis, &batches).await, 0);
}

/// Logs `key` as an earlier version did: a stream entry of its own, field `e`.
async fn old_entry(redis: &mut redis::aio::MultiplexedConnection, stream: &str, key: &str) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("e")
        .arg(entry(key).encode())
        .query_async(redis)
        .await
        .unwrap();
}

async fn members(redis: &mut redis::aio::MultiplexedConnection, batches: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(batches)
        .query_async(redis)
        .await
        .unwrap()
}
