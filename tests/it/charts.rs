//! `GET /v1/charts` on the binary: each minute's deliveries by outcome and the app's
//! latency, kept in the store across a restart (the last minute written at SIGTERM), of
//! every route or one; and, while the store fails, this replica's own figures with the
//! store's error.

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::*;

async fn charts(admin: std::net::SocketAddr, query: &str) -> Reply {
    send(admin, "GET", &format!("/v1/charts{query}"), &[], "").await
}

/// The range's deliveries of one group, added over its minutes.
fn total(answer: &Value, group: &str) -> u64 {
    let minutes = answer["minutes"].as_array().unwrap();
    minutes
        .iter()
        .map(|minute| minute["deliveries"][group].as_u64().unwrap())
        .sum()
}

fn answers(answer: &Value) -> u64 {
    let minutes = answer["minutes"].as_array().unwrap();
    minutes.iter().map(|m| m["answers"].as_u64().unwrap()).sum()
}

#[tokio::test]
async fn each_minutes_deliveries_and_latency_survive_a_restart() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let routes = format!(
        "{}  - name: other\n    match: {{ path: /other }}\n    key: \"{{json:/id}}\"\n",
        json_route("")
    );
    let config = write_config(dir.path(), upstream.addr, &routes);
    let mut proxy = Binary::start(&config);

    let empty = charts(proxy.admin, "").await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    let empty = empty.json();
    assert_eq!(empty["range"], "hour");
    assert_eq!(empty["minutes"].as_array().unwrap().len(), 60);
    assert_eq!((total(&empty, "forwarded"), answers(&empty)), (0, 0));
    assert_eq!(empty["minutes"][59]["p50_ms"], Value::Null);

    for id in ["evt_c1", "evt_c2", "evt_c3"] {
        assert_eq!(post_event(proxy.addr, id).await.dedupe(), "forwarded");
    }
    assert_eq!(post_event(proxy.addr, "evt_c1").await.dedupe(), "duplicate");
    upstream.script([Answer::status(500)]);
    assert_eq!(post_event(proxy.addr, "evt_c4").await.dedupe(), "released");
    let other = post_json(proxy.addr, "/other", r#"{"id":"evt_o1"}"#).await;
    assert_eq!(other.dedupe(), "forwarded");

    // The minute running, as this replica counts it so far.
    let live = charts(proxy.admin, "?route=hooks").await.json();
    assert_eq!(live["route"], "hooks");
    let counts = |answer: &Value| {
        ["forwarded", "duplicate", "released", "refused"].map(|group| total(answer, group))
    };
    assert_eq!(counts(&live), [3, 1, 1, 0]);
    assert_eq!(answers(&live), 4, "three successes and the 500");
    let with_answers: Vec<&Value> = (live["minutes"].as_array().unwrap().iter())
        .filter(|minute| minute["answers"].as_u64().unwrap() > 0)
        .collect();
    for minute in &with_answers {
        let (p50, p99) = (
            minute["p50_ms"].as_f64().unwrap(),
            minute["p99_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 < 5000.0, "{minute}");
    }
    let everything = charts(proxy.admin, "").await.json();
    assert_eq!(total(&everything, "forwarded"), 4, "both routes");

    // SIGTERM writes the minute running; the next start reads it from the store.
    proxy.signal("TERM");
    assert!(proxy.wait(Duration::from_secs(10)).success());
    let proxy = Binary::start(&config);
    let kept = charts(proxy.admin, "?route=hooks").await.json();
    assert_eq!(counts(&kept), [3, 1, 1, 0], "{kept}");
    assert_eq!(answers(&kept), 4);
    assert_eq!(kept["replicas"].as_array().unwrap().len(), 1);
    assert_eq!(kept["store_error"], Value::Null);

    let day = charts(proxy.admin, "?range=day").await.json();
    assert_eq!(day["minutes"].as_array().unwrap().len(), 1440);
    assert_eq!(total(&day, "forwarded"), 4);
}

#[tokio::test]
async fn odd_chart_queries_are_refused_as_json() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("")).await;
    for query in [
        "?range=week",
        "?range=",
        "?since=1",
        "?range=hour&range=year",
    ] {
        let refused = charts(proxy.admin, query).await;
        assert_eq!(refused.status, 400, "{query}: {}", refused.body);
        assert!(refused.json()["detail"].is_string(), "{}", refused.body);
    }
    // A route that never ran is charted empty, whatever its name.
    let strange = charts(proxy.admin, "?route=%E2%80%AE%00nope").await;
    assert_eq!(strange.status, 200, "{}", strange.body);
    assert_eq!(total(&strange.json(), "forwarded"), 0);
}

#[tokio::test]
async fn while_the_store_fails_the_charts_show_this_replicas_own_minute() {
    let upstream = Upstream::start().await;
    let failing_minutes = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (app, _data) = proxy_on_store(&upstream, &json_route(""), |inner| FailingStore {
        fail_minutes: std::sync::Arc::clone(&failing_minutes),
        ..FailingStore::new(inner)
    })
    .await;
    assert_eq!(
        post_event(app.proxy_addr, "evt_f1").await.dedupe(),
        "forwarded"
    );
    failing_minutes.store(true, std::sync::atomic::Ordering::SeqCst);
    let answer = charts(app.admin_addr, "").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = answer.json();
    let error = answer["store_error"].as_str().unwrap_or_default();
    assert!(error.contains("injected minute failure"), "{answer}");
    assert_eq!(total(&answer, "forwarded"), 1);
    failing_minutes.store(false, std::sync::atomic::Ordering::SeqCst);
    let answer = charts(app.admin_addr, "").await.json();
    assert_eq!(answer["store_error"], Value::Null);
    assert_eq!(total(&answer, "forwarded"), 1);
    app.shutdown().await.unwrap();
}

/// Two replicas on one shared store: the one still running charts both, its own minute
/// running and the other's minutes, written as it stopped.
async fn every_replicas_minutes_are_added_up(kind: &str) {
    let (server, port) = if kind == "redis" {
        ("Redis", 6379)
    } else {
        ("PostgreSQL", 5432)
    };
    if !service_available(server, port).await {
        return;
    }
    let name = "charts_replicas";
    let prefix = format!("{name}-{:x}:", rand::random::<u64>());
    let store = if kind == "redis" {
        format!("store: {{ redis: {{ url: \"{REDIS_URL}\", prefix: \"{prefix}\" }} }}")
    } else {
        drop_postgres_tables(name).await;
        format!("store: {{ postgres: {{ url: \"{POSTGRES_URL}\", table: {name} }} }}")
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for replica in ["a", "b"] {
        let path = dir.path().join(format!("{replica}.yaml"));
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: 127.0.0.1:0 }}\n{store}\n{}",
            upstream.addr,
            json_route("")
        );
        std::fs::write(&path, text).unwrap();
        replicas.push(Binary::start(&path));
    }
    for id in ["evt_r1", "evt_r2"] {
        assert_eq!(post_event(replicas[0].addr, id).await.dedupe(), "forwarded");
    }
    assert_eq!(
        post_event(replicas[1].addr, "evt_r3").await.dedupe(),
        "forwarded"
    );
    assert_eq!(
        post_event(replicas[1].addr, "evt_r1").await.dedupe(),
        "duplicate"
    );
    replicas[0].signal("TERM");
    assert!(replicas[0].wait(Duration::from_secs(10)).success());
    plant_odd_minutes(kind, &prefix, name);
    let both = charts(replicas[1].admin, "?route=hooks").await.json();
    assert_eq!(total(&both, "forwarded"), 3, "{kind}: {both}");
    assert_eq!(total(&both, "duplicate"), 1, "{kind}");
    assert_eq!(
        both["replicas"].as_array().unwrap().len(),
        2,
        "{kind}: {both}"
    );
}

#[tokio::test]
async fn redis_every_replicas_minutes_are_added_up() {
    every_replicas_minutes_are_added_up("redis").await;
}

#[tokio::test]
async fn postgres_every_replicas_minutes_are_added_up() {
    every_replicas_minutes_are_added_up("postgres").await;
}

/// A queued route's minutes carry its depth: jobs waiting while it is paused, and the
/// oldest one's age, as the queue's counts last said.
#[tokio::test]
async fn a_queued_routes_minutes_carry_its_jobs_waiting() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(upstream.addr, &json_route("    delivery: queued\n")).await;
    let paused = admin(&proxy, "POST", "/v1/queue/hooks/pause", "").await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    for id in ["evt_q1", "evt_q2", "evt_q3"] {
        assert_eq!(post_event(proxy.addr, id).await.dedupe(), "queued");
    }
    // The queue's counts are taken every few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let last = loop {
        let answer = charts(proxy.admin, "?route=hooks").await.json();
        if answer["minutes"][59]["queue_waiting"] == 3 {
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(last["queued"], true);
    assert_eq!(total(&last, "queued"), 3);
    assert!(
        last["minutes"][59]["queue_oldest_seconds"]
            .as_f64()
            .unwrap()
            >= 0.0
    );
    assert_eq!(
        last["minutes"][0]["queue_waiting"], 0,
        "no depth counted then"
    );
}

/// Writes what no replica writes into the store's minutes, as whoever else reaches the
/// store could: garbage, a minute off the minute, one ten days ahead with a large count,
/// and one over the 256 KiB a minute may take. The charts leave each out.
fn plant_odd_minutes(kind: &str, prefix: &str, table: &str) {
    use std::io::Write;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let minute = now - now % 60_000;
    let record = |at: u64, replica: &str| {
        format!(
            r#"{{"replica":"{replica}","minute":{at},"routes":{{"hooks":{{"outcomes":{{"forwarded":1000}}}}}}}}"#
        )
    };
    let planted = [
        (minute, "\u{ff}{garbage".to_owned()),
        (minute + 1, record(minute + 1, "off")),
        (
            minute + 10 * 86_400_000,
            record(minute + 10 * 86_400_000, "ahead"),
        ),
        (minute, record(minute, &"huge".repeat(70_000))),
    ];
    for (score, member) in planted {
        let done = if kind == "redis" {
            let key = format!("{prefix}minutes");
            let mut cli = std::process::Command::new("redis-cli")
                .args(["-p", "6379", "-x", "ZADD", &key, &score.to_string()])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            cli.stdin
                .take()
                .unwrap()
                .write_all(member.as_bytes())
                .unwrap();
            cli.wait().unwrap()
        } else {
            let sql = format!(
                "INSERT INTO {table}_minutes (minute, replica, figures) VALUES ({score}, 'odd-{}', $odd${member}$odd$)",
                rand::random::<u32>()
            );
            // On standard input: the large one is over an argument's 128 KiB.
            let mut psql = std::process::Command::new("psql")
                .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-q"])
                .args(["-v", "ON_ERROR_STOP=1"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let mut input = psql.stdin.take().unwrap();
            input.write_all(format!("{sql};\n").as_bytes()).unwrap();
            drop(input);
            psql.wait().unwrap()
        };
        assert!(done.success(), "{kind}: planting a minute");
    }
}
