//! What the embedded store promises the disk, seen from below: under `strace`, every
//! acknowledgment that promises durability (a done mark with `durability: fsync`, a queued
//! job's `202`, an operator's change, a job's move to dead letters) leaves only after an
//! `fsync` or `fdatasync` of the store's log, begun after the write it covers, has
//! returned; a blob file (a large value) and its directory are synced before the log
//! can name it; one sync serves many acknowledgments; a failing sync acknowledges nothing;
//! a log write wakes one of sled's I/O threads.
//! The power-loss runs that show what this buys are in `faults.rs`.

use crate::support;
use crate::support::power_cut;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use power_cut::PowerCutMount;
use support::*;

/// Routes on one sled store with `durability: fsync` (sled's own sync pushed out of the
/// test): `hooks` direct, `queued` queued, `doomed` queued to an app that always fails,
/// after which its job goes to dead letters.
fn write_routes(dir: &Path, data: &Path, upstream: &Upstream, failing: &Upstream) -> PathBuf {
    let text = format!(
        "listen: 127.0.0.1:0
upstream: http://{}
admin: {{ listen: 127.0.0.1:0 }}
store: {{ sled: {{ path: \"{}\", durability: fsync, flush_every: 1h }} }}
routes:
  - name: hooks
    match: {{ method: POST, path: /hooks }}
    key: \"{{json:/id}}\"
  - name: queued
    match: {{ method: POST, path: /queued }}
    key: \"{{json:/id}}\"
    delivery: queued
  - name: doomed
    match: {{ method: POST, path: /doomed }}
    key: \"{{json:/id}}\"
    upstream: http://{}
    delivery: queued
    queue: {{ max_attempts: 1 }}
",
        upstream.addr,
        data.display(),
        failing.addr
    );
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// One system call as `strace -f -ttt -T -yy` wrote it.
#[derive(Debug, Clone)]
struct Call {
    /// The thread that made it.
    thread: String,
    name: String,
    /// The first argument's file descriptor as `-yy` describes it: a path, or
    /// `TCP:[local->remote]`.
    fd: String,
    start: f64,
    end: f64,
    returned: i64,
    /// The arguments as printed (a buffer's first bytes).
    text: String,
}

/// The calls of a trace, each with when it began and returned (a call another thread
/// interrupted is joined with its `resumed` line).
fn parse_trace(trace: &str) -> Vec<Call> {
    /// `7</d/db>` or `9<TCP:[127.0.0.1:80->127.0.0.1:5000]>`: up to the `>` that ends
    /// the argument (not the arrow's).
    fn descriptor(arguments: &str) -> String {
        let Some((_, rest)) = arguments.split_once('<') else {
            return String::new();
        };
        let bytes = rest.as_bytes();
        let end = (0..bytes.len())
            .find(|&i| {
                bytes[i] == b'>' && matches!(bytes.get(i + 1), None | Some(b',' | b')' | b' '))
            })
            .unwrap_or(rest.len());
        rest[..end].to_owned()
    }
    fn result(tail: &str) -> Option<(i64, f64)> {
        let (_, after) = tail.rsplit_once(") = ")?;
        let returned = after.split_whitespace().next()?.parse().ok()?;
        let duration = after
            .rsplit_once('<')?
            .1
            .trim_end_matches('>')
            .parse()
            .ok()?;
        Some((returned, duration))
    }
    let mut calls = Vec::new();
    let mut pending: HashMap<&str, (String, String, f64, String)> = HashMap::new();
    for line in trace.lines() {
        // strace pads a short pid with spaces.
        let Some((pid, rest)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let Some((time, rest)) = rest.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(time) = time.parse::<f64>() else {
            continue;
        };
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let Some((name, tail)) = resumed.split_once(" resumed>") else {
                continue;
            };
            let (Some((_, fd, start, text)), Some((returned, _))) =
                (pending.remove(pid), result(tail))
            else {
                continue;
            };
            calls.push(Call {
                thread: pid.to_owned(),
                name: name.to_owned(),
                fd,
                start,
                end: time,
                returned,
                text: format!("{text}{tail}"),
            });
        } else if let Some((name, arguments)) = rest.split_once('(')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            if arguments.ends_with("<unfinished ...>") {
                let entry = (
                    name.to_owned(),
                    descriptor(arguments),
                    time,
                    arguments.to_owned(),
                );
                pending.insert(pid, entry);
            } else if let Some((returned, duration)) = result(rest) {
                calls.push(Call {
                    thread: pid.to_owned(),
                    name: name.to_owned(),
                    fd: descriptor(arguments),
                    start: time,
                    end: time + duration,
                    returned,
                    text: arguments.to_owned(),
                });
            }
        }
    }
    calls.sort_by(|a, b| a.start.total_cmp(&b.start));
    calls
}

const WRITES: [&str; 4] = ["write", "writev", "sendto", "sendmsg"];
const READS: [&str; 2] = ["read", "recvfrom"];

/// Why an acknowledgment sent at `ack` for what was read by `from` is not covered: the
/// store's log was not written between them, or a file of the store's directory `data`
/// written between them (the log, a blob) was not synced after its last write there and
/// before `ack`, or a blob was, but not the directory that names it. `None` when covered.
fn uncovered(calls: &[Call], data: &str, from: f64, ack: f64) -> Option<String> {
    let log = format!("{data}/db");
    let blobs = format!("{data}/blobs");
    let between = |call: &&Call| call.start > from && call.start < ack;
    let written: Vec<&Call> = (calls.iter())
        .filter(between)
        .filter(|call| matches!(call.name.as_str(), "pwrite64" | "write"))
        .filter(|call| call.fd == log || call.fd.starts_with(&format!("{blobs}/")))
        .collect();
    if !written.iter().any(|call| call.fd == log) {
        return Some("no write of the store's log before it".into());
    }
    let synced_after = |path: &str, after: f64| {
        calls.iter().any(|call| {
            matches!(call.name.as_str(), "fsync" | "fdatasync")
                && call.fd == path
                && call.returned == 0
                && call.start >= after
                && call.end <= ack
        })
    };
    for write in &written {
        let last = (written.iter())
            .filter(|other| other.fd == write.fd)
            .map(|other| other.end)
            .fold(0.0, f64::max);
        if !synced_after(&write.fd, last) {
            return Some(format!(
                "{} written at {last:.6} was not synced before it",
                write.fd
            ));
        }
        if write.fd != log && !synced_after(&blobs, last) {
            return Some(format!(
                "the directory naming {} was not synced before it",
                write.fd
            ));
        }
    }
    None
}

/// An answered connection to the proxy: its request's first line, when the request was
/// last read before the answer's first byte, and that byte's time.
struct Answered {
    request: String,
    read: f64,
    answer: f64,
}

/// Each connection to `port` that answered.
fn answered(calls: &[Call], port: u16) -> Vec<Answered> {
    let local = format!("TCP:[127.0.0.1:{port}->");
    let mut connections: Vec<&str> = calls
        .iter()
        .filter(|call| call.fd.starts_with(&local))
        .map(|call| call.fd.as_str())
        .collect();
    connections.sort_unstable();
    connections.dedup();
    connections
        .into_iter()
        .filter_map(|connection| {
            let on = |names: &[&str], call: &&Call| {
                call.fd == connection && names.contains(&call.name.as_str()) && call.returned > 0
            };
            let answer = calls.iter().find(|call| on(&WRITES, call))?;
            let reads: Vec<&Call> = (calls.iter())
                .filter(|call| on(&READS, call) && call.end <= answer.start)
                .collect();
            let read = reads.last()?;
            // Each read's buffer as strace escapes it: `9<TCP:[...]>, "POST /pa", 24, ...`.
            let received: String = (reads.iter())
                .filter_map(|call| {
                    call.text
                        .split_once('"')?
                        .1
                        .split_once("\",")
                        .map(|(text, _)| text)
                })
                .collect();
            let request = received.split("\\r\\n").next().unwrap_or_default();
            Some(Answered {
                request: request.to_owned(),
                read: read.end,
                answer: answer.start,
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledgment_leaves_after_a_sync_of_what_it_promises() {
    if !installed("strace", "strace", &["-V"]) {
        return;
    }
    let (upstream, failing) = (Upstream::start().await, Upstream::start().await);
    failing.script((0..10).map(|_| Answer::status(500)));
    // The trace is kept apart from the configuration, whose directory the proxy watches.
    let (dir, traces) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = dir.path().join("data");
    let config = write_routes(dir.path(), &data, &upstream, &failing);
    let trace = traces.path().join("trace");
    let trace_file = trace.display().to_string();
    let wrapper = [
        "strace",
        "-f",
        "-ttt",
        "-T",
        "-yy",
        "-s",
        "200",
        "-e",
        "trace=pwrite64,fsync,fdatasync,read,recvfrom,write,writev,sendto,sendmsg",
        "-o",
        &trace_file,
    ];
    let args = [
        "run",
        "-c",
        config.to_str().unwrap(),
        "--log-format",
        "json",
    ];
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let mut proxy = tokio::task::block_in_place(|| Binary::spawn_wrapped(&wrapper, &args, &[]));
    let (proxy_port, admin_port) = (proxy.addr.port(), proxy.admin.port());
    // One at a time, with a pause after each: whatever the store writes next is theirs.
    let pause = || tokio::time::sleep(Duration::from_millis(200));
    for n in 0..4 {
        let reply = post_json(proxy.addr, "/hooks", &format!(r#"{{"id":"evt_{n}"}}"#)).await;
        assert_eq!((reply.status, reply.dedupe()), (200, "forwarded"));
        pause().await;
    }
    // The queued route is paused meanwhile: no take writes between a job's sync and its
    // answer. One job is large enough for sled to keep it in a blob file of its own.
    let paused = admin_post(proxy.admin, "/v1/queue/queued/pause", "").await;
    assert_eq!(paused.status / 100, 2, "{}", paused.body);
    pause().await;
    let large = "x".repeat(200 << 10);
    for n in 0..5 {
        let pad = if n == 4 { large.as_str() } else { "" };
        let body = format!(r#"{{"id":"job_{n}","pad":"{pad}"}}"#);
        let reply = post_json(proxy.addr, "/queued", &body).await;
        assert_eq!((reply.status, reply.dedupe()), (202, "queued"));
        pause().await;
    }
    let resumed = admin_post(proxy.admin, "/v1/queue/queued/resume", "").await;
    assert_eq!(resumed.status / 100, 2, "{}", resumed.body);
    upstream.wait_for_requests(9).await;
    pause().await;
    let forgotten = send(proxy.admin, "DELETE", "/v1/keys/hooks/evt_0", &[], "").await;
    assert_eq!(forgotten.status, 204, "{}", forgotten.body);
    pause().await;
    let doomed = post_json(proxy.addr, "/doomed", r#"{"id":"doomed_1"}"#).await;
    assert_eq!(doomed.status, 202);
    let dead = proxy.log_entry("queued event put in dead letters");
    assert!(dead.is_some(), "log:\n{}", proxy.log_text());
    pause().await;
    // The proxy is strace's child: stopped, it ends the trace.
    let stopped = std::process::Command::new("pkill")
        .args(["-TERM", "-P", &proxy.child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let exit = tokio::task::spawn_blocking(move || proxy.wait(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(exit.success());

    let calls = parse_trace(&std::fs::read_to_string(&trace).unwrap());
    let mut acknowledgments = answered(&calls, proxy_port);
    acknowledgments.extend(answered(&calls, admin_port));
    // Resuming wakes the route's workers, and the doomed route's take its job at once:
    // their takes may write before those answers leave (the queued jobs' answers are
    // checked with their route paused).
    acknowledgments.retain(|answered| {
        !answered.request.contains("/resume") && !answered.request.contains("/doomed")
    });
    let requests: Vec<&str> = acknowledgments.iter().map(|a| a.request.as_str()).collect();
    assert_eq!(
        acknowledgments.len(),
        11,
        "4 done marks, a pause, 5 queued jobs, a key forgotten: {requests:?}"
    );
    // The dead letter's report: its log line, after the app's refusal was read.
    let upstream_side = format!("->127.0.0.1:{}]", failing.addr.port());
    let reported = calls
        .iter()
        .find(|call| {
            WRITES.contains(&call.name.as_str()) && call.text.contains("put in dead letters")
        })
        .expect("the dead letter's log line is traced");
    let refused = calls
        .iter()
        .rev()
        .find(|call| {
            call.fd.ends_with(&upstream_side)
                && READS.contains(&call.name.as_str())
                && call.end <= reported.start
        })
        .expect("the app's refusal was read");
    acknowledgments.push(Answered {
        request: "a dead letter's report".into(),
        read: refused.end,
        answer: reported.start,
    });
    let data = data.display().to_string();
    let failures: Vec<String> = acknowledgments
        .iter()
        .filter_map(|answered| {
            let why = uncovered(&calls, &data, answered.read, answered.answer)?;
            Some(format!(
                "{} at {:.6}: {why}",
                answered.request, answered.answer
            ))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "acknowledged before a sync:\n{}",
        failures.join("\n")
    );
    let blobs = format!("{data}/blobs");
    let blob_writes: Vec<&Call> = (calls.iter())
        .filter(|call| call.name == "write" && call.fd.starts_with(&format!("{blobs}/")))
        .collect();
    assert!(!blob_writes.is_empty(), "the large job went to a blob file");
    for write in blob_writes {
        let last = (calls.iter())
            .filter(|call| call.fd == write.fd && call.name == "write")
            .map(|call| call.end)
            .fold(0.0, f64::max);
        if write.end < last {
            continue;
        }
        // Its file and its directory are synced before the thread goes on: the log
        // message naming the blob cannot reach the disk before them. (The trace leaves
        // out `openat` and `close`, which come between the two.)
        let next: Vec<(&str, &str)> = (calls.iter())
            .filter(|call| call.thread == write.thread && call.start >= write.end)
            .take(2)
            .map(|call| (call.name.as_str(), call.fd.as_str()))
            .collect();
        assert_eq!(
            next,
            [("fsync", write.fd.as_str()), ("fsync", blobs.as_str())],
            "what followed the last write of {}",
            write.fd
        );
    }
}

/// The routes' proxy with its data on the power-loss simulator, and what it runs with.
struct Simulated {
    /// Dropped last: the simulator is unmounted before the directory goes.
    _dir: tempfile::TempDir,
    disk: PowerCutMount,
    config: PathBuf,
    upstream: Upstream,
}

impl Simulated {
    async fn new() -> Simulated {
        let (upstream, failing) = (Upstream::start().await, Upstream::start().await);
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).unwrap();
        let disk = PowerCutMount::new(&mount).unwrap();
        let config = write_routes(dir.path(), &mount.join("data"), &upstream, &failing);
        Simulated {
            _dir: dir,
            disk,
            config,
            upstream,
        }
    }

    /// Starts the binary, and waits until it is ready.
    async fn start(&self) -> Binary {
        let config = self.config.clone();
        tokio::task::spawn_blocking(move || Binary::start(&config))
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sync_serves_every_acknowledgment_that_waits_for_it() {
    if !PowerCutMount::usable() {
        return;
    }
    let simulated = Simulated::new().await;
    let (disk, proxy) = (&simulated.disk, simulated.start().await);
    // A device that takes 50 ms to flush its cache: 32 deliveries arrive meanwhile.
    disk.slow_syncs(Duration::from_millis(50));
    let before = disk.syncs();
    let sends = (0..32).map(|n| async move {
        post_json(proxy.addr, "/hooks", &format!(r#"{{"id":"evt_{n}"}}"#)).await
    });
    for reply in futures_util::future::join_all(sends).await {
        assert_eq!((reply.status, reply.dedupe()), (200, "forwarded"));
    }
    let syncs = disk.syncs() - before;
    let metrics = scrape(proxy.admin).await;
    let (waited, synced) = (
        series_value(&metrics, "dedupe_store_sync_waiters_total"),
        series_value(&metrics, "dedupe_store_syncs_total"),
    );
    assert!(waited >= 32.0, "{metrics}");
    assert!(
        syncs <= 8 && synced <= 8.0,
        "32 done marks took {syncs} syncs of the file ({synced} counted): not shared"
    );
    assert!(series_value(&metrics, "dedupe_store_sync_seconds_total") > 0.0);
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_fails_acknowledges_nothing_and_the_store_recovers() {
    if !PowerCutMount::usable() {
        return;
    }
    let mut simulated = Simulated::new().await;
    let mut proxy = simulated.start().await;
    let disk = &simulated.disk;
    let done = post_json(proxy.addr, "/hooks", r#"{"id":"evt_0"}"#).await;
    assert_eq!(done.dedupe(), "forwarded");
    // The queued route holds its jobs, so that the store alone keeps them.
    let paused = admin_post(proxy.admin, "/v1/queue/queued/pause", "").await;
    assert_eq!(paused.status / 100, 2, "{}", paused.body);

    // A job whose sync fails is not acknowledged; the sender's retry is, once the disk
    // heals and the store has reopened by itself, reading the disk rather than what the
    // failed sync left in the kernel's cache.
    disk.fail_syncs(true);
    let refused = post_json(proxy.addr, "/queued", r#"{"id":"job_1"}"#).await;
    assert_eq!(
        (refused.status, refused.dedupe()),
        (503, "unavailable"),
        "a job that is not on disk is not acknowledged: {}",
        refused.body
    );
    let metrics = scrape(proxy.admin).await;
    assert!(
        series_value(&metrics, "dedupe_store_sync_failures_total") >= 1.0,
        "{metrics}"
    );
    disk.fail_syncs(false);
    until_acknowledged(&proxy, "/queued", "job_1").await;

    // A large job (sled keeps it in a blob file, synced as it is written) whose blob
    // cannot be synced: refused, and the store recovers as from any failed sync, rather
    // than every later write waiting for good on the log buffer the blob was named in.
    disk.fail_syncs(true);
    let large = format!(r#"{{"id":"job_large","pad":"{}"}}"#, "x".repeat(200 << 10));
    let refused = post_json(proxy.addr, "/queued", &large).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    disk.fail_syncs(false);
    until_acknowledged(&proxy, "/queued", "job_large").await;

    // An operator's change whose sync fails is not said saved.
    disk.fail_syncs(true);
    let change = send(proxy.admin, "DELETE", "/v1/keys/hooks/evt_0", &[], "").await;
    assert_eq!(change.status, 503, "{}", change.body);
    assert_eq!(change.json()["error"], "store_unavailable");
    disk.fail_syncs(false);
    until_acknowledged(&proxy, "/hooks", "evt_9").await;

    // A done mark whose sync fails: the app's success is still relayed (the work is done),
    // and the log says the mark is missing.
    disk.fail_syncs(true);
    let relayed = post_json(proxy.addr, "/hooks", r#"{"id":"evt_1"}"#).await;
    assert_eq!((relayed.status, relayed.dedupe()), (200, "forwarded"));
    let missing = "the done mark was not recorded; a redelivery of this event would run again";
    assert!(proxy.log_entry(missing).is_some(), "{}", proxy.log_text());
    disk.fail_syncs(false);
    until_acknowledged(&proxy, "/hooks", "evt_2").await;
    // sled's own sync as it closes the failed database fails too: said plainly, in the log.
    let log = proxy.log_text();
    assert!(
        log.contains("sled could not sync its log while closing"),
        "{log}"
    );
    let unreadable: Vec<&str> = (log.lines())
        .filter(|line| serde_json::from_str::<serde_json::Value>(line).is_err())
        .collect();
    assert!(
        unreadable.is_empty(),
        "every line of the log is JSON: {unreadable:?}"
    );

    // The acknowledged job is on the disk: the power goes, and it is delivered once.
    proxy.kill9();
    simulated.disk.cut_power();
    let proxy = simulated.start().await;
    let upstream = &simulated.upstream;
    let resumed = admin_post(proxy.admin, "/v1/queue/queued/resume", "").await;
    assert_eq!(resumed.status / 100, 2, "{}", resumed.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    while upstream.executions("job_1") == 0 {
        assert!(Instant::now() < deadline, "the acknowledged job was lost");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(upstream.executions("job_1"), 1);
}

/// Sends `id` to `path` until it is acknowledged (a 2xx), while the store reopens (503).
async fn until_acknowledged(proxy: &Binary, path: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = post_json(proxy.addr, path, &format!(r#"{{"id":"{id}"}}"#)).await;
        if reply.status / 100 == 2 {
            return;
        }
        assert_eq!(reply.status, 503, "{}", reply.body);
        assert!(
            Instant::now() < deadline,
            "the store did not recover: {}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn the_trace_reader_joins_interrupted_calls_and_reads_descriptors() {
    let trace = "\
11  100.000100 recvfrom(9<TCP:[127.0.0.1:80->127.0.0.1:5000]>,  <unfinished ...>
12 100.000200 pwrite64(7</d/db>, \"x\", 1, 0) = 1 <0.000010>
11 100.000300 <... recvfrom resumed>\"POST\", 4, 0, NULL, NULL) = 4 <0.000200>
12 100.000400 fsync(7</d/db> <unfinished ...>
12 100.000900 <... fsync resumed>) = 0 <0.000500>
11 100.001000 writev(9<TCP:[127.0.0.1:80->127.0.0.1:5000]>, [{iov_base=\"HTTP/1.1 200\", iov_len=12}], 1) = 12 <0.000010>
11 100.002000 --- SIGCHLD {si_signo=SIGCHLD} ---
";
    let calls = parse_trace(trace);
    assert_eq!(calls.len(), 4, "{calls:?}");
    let acks = answered(&calls, 80);
    assert_eq!(acks.len(), 1);
    let Answered {
        request,
        read,
        answer,
    } = &acks[0];
    assert_eq!(request, "POST");
    assert!((read - 100.0003).abs() < 1e-9 && (answer - 100.001).abs() < 1e-9);
    // The write began before the request was read: it covers nothing.
    assert!(uncovered(&calls, "/d", *read, *answer).is_some());
    assert!(uncovered(&calls, "/d", 100.0001, *answer).is_none());
    assert!(
        uncovered(&calls, "/d", 100.0001, 100.0008).is_some(),
        "the sync had not returned"
    );
}

/// How many times each of the process's threads named `sled-io-*` went to sleep and was
/// woken (its voluntary context switches), by thread id.
fn sled_io_wakeups(pid: u32) -> HashMap<String, u64> {
    let mut wakeups = HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let Ok(name) = std::fs::read_to_string(task.join("comm")) else {
            continue;
        };
        if !name.starts_with("sled-io-") {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let switches = (status.lines())
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|count| count.trim().parse().ok());
        if let Some(switches) = switches {
            wakeups.insert(task.display().to_string(), switches);
        }
    }
    wakeups
}

/// A log buffer write wakes one of sled's waiting I/O threads, not all of them (the
/// `notify_one` in `vendor/sled/src/threadpool.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_buffer_write_wakes_one_of_sleds_io_threads() {
    let upstream = Upstream::start().await;
    // In memory where there is a tmpfs, so that no thread sleeps on the disk (a switch
    // that is not a wakeup), and sled's own flush put off: each write is an acceptance's.
    let dir = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let config = dir.path().join("dedupe.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0
upstream: http://{}
admin: {{ listen: 127.0.0.1:0 }}
store: {{ sled: {{ path: \"{}\", flush_every: 1h }} }}
routes:
  - name: queued
    match: {{ method: POST, path: /queued }}
    key: \"{{json:/id}}\"
    delivery: queued
",
            upstream.addr,
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let proxy = tokio::task::spawn_blocking(move || Binary::start(&config))
        .await
        .unwrap();
    let paused = admin_post(proxy.admin, "/v1/queue/queued/pause", "").await;
    assert_eq!(paused.status / 100, 2, "{}", paused.body);
    // The first acceptance starts sled's I/O threads; then each waits for work.
    let first = post_json(proxy.addr, "/queued", r#"{"id":"job_first"}"#).await;
    assert_eq!(first.status, 202, "{}", first.body);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = proxy.child.id();
    let before = sled_io_wakeups(pid);
    assert!(before.len() >= 7, "sled's I/O threads, by name: {before:?}");

    // One at a time: each acceptance waits for a sync of its own, which seals and writes
    // a log buffer.
    const JOBS: u64 = 200;
    for n in 0..JOBS {
        let reply = post_json(proxy.addr, "/queued", &format!(r#"{{"id":"job_{n}"}}"#)).await;
        assert_eq!(reply.status, 202, "{}", reply.body);
    }
    let after = sled_io_wakeups(pid);
    let woken: u64 = (after.iter())
        .map(|(task, count)| count.saturating_sub(before.get(task).copied().unwrap_or(0)))
        .sum();
    // Counting the wrong threads would pass the bound below for nothing.
    assert!(
        woken >= JOBS / 4,
        "{JOBS} acceptances woke sled's I/O threads {woken} times: the writes went elsewhere"
    );
    // About two wakeups an acceptance with one thread woken a write, about eight with
    // every waiting thread woken (docs/performance.md): four sits between, with room for
    // the scheduler either way.
    assert!(
        woken <= 4 * JOBS,
        "{JOBS} acceptances woke sled's I/O threads {woken} times: as if every waiting thread were woken for each write"
    );
}
