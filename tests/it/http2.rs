//! HTTP/2 attacks on the binary, both ways in (prior knowledge, and the `Upgrade:
//! h2c` that is read as HTTP/1.1): SETTINGS and PING floods from peers that never read,
//! more streams than a connection may open, a storm of opened and reset streams, and
//! slow readers of a large replayed answer that grant no flow-control window. Meanwhile
//! the provider port and the admin port each answer `/healthz` within 100 ms, every time.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request of `path` on `stream` with `X-Id: big` (HPACK: `:method` and `:scheme http`
/// from the static table, `:path`, `:authority` and `x-id` as literals): a GET that ends
/// the stream, or a POST whose body never comes.
fn request(stream: u32, path: &str, ended: bool) -> Vec<u8> {
    let method = if ended { 0x82 } else { 0x83 };
    let mut headers = vec![method, 0x86, 0x04, path.len() as u8];
    headers.extend_from_slice(path.as_bytes());
    headers.extend_from_slice(&[0x01, 9]);
    headers.extend_from_slice(b"127.0.0.1");
    headers.extend_from_slice(&[0x00, 4]);
    headers.extend_from_slice(b"x-id");
    headers.extend_from_slice(&[3]);
    headers.extend_from_slice(b"big");
    let flags = if ended { 0x4 | 0x1 } else { 0x4 };
    frame(1, flags, stream, &headers)
}

/// A client SETTINGS frame granting streams no window (SETTINGS_INITIAL_WINDOW_SIZE 0).
fn no_window() -> Vec<u8> {
    frame(4, 0, 0, &[0, 4, 0, 0, 0, 0])
}

/// What one attacking connection does, without ever reading what it is sent.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// SETTINGS frames, each of which asks for an acknowledgment.
    Settings,
    /// PING frames, each of which asks for an answer.
    Pings,
    /// Streams opened past the limit, none of them ending (their bodies never come).
    Streams,
    /// Streams opened and reset at once, as fast as they go.
    Resets,
    /// Requests for the large replayed answer, with no window to send it in.
    SlowReader,
}

/// Runs `attack` on a connection to `addr` until `until`, opening another when the
/// server closes one (as it should, for some). Counts the connections it opened.
async fn attack(addr: SocketAddr, attack: Attack, path: &'static str, until: Instant) -> usize {
    let mut opened = 0;
    while Instant::now() < until {
        if opened > 0 {
            // Closed by the server: the attack goes on with a new connection.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Ok(mut peer) = TcpStream::connect(addr).await else {
            continue;
        };
        opened += 1;
        let opening = match attack {
            Attack::SlowReader => [PREFACE, &no_window()].concat(),
            _ => [PREFACE, EMPTY_SETTINGS].concat(),
        };
        if peer.write_all(&opening).await.is_err() {
            continue;
        }
        let mut stream = 1u32;
        loop {
            if Instant::now() >= until {
                return opened;
            }
            let burst: Vec<u8> = (0..64)
                .flat_map(|n| {
                    let id = stream + 2 * n;
                    match attack {
                        Attack::Settings => EMPTY_SETTINGS.to_vec(),
                        Attack::Pings => frame(6, 0, 0, &u64::from(id).to_be_bytes()),
                        Attack::Streams => request(id, path, false),
                        Attack::SlowReader => request(id, path, true),
                        Attack::Resets => {
                            [request(id, path, true), frame(3, 0, id, &[0, 0, 0, 8])].concat()
                        }
                    }
                })
                .collect();
            stream += 128;
            let written =
                tokio::time::timeout(Duration::from_millis(200), peer.write_all(&burst)).await;
            match written {
                Ok(Ok(())) => {}
                // Closed by the server: open another.
                Ok(Err(_)) => break,
                // The server stopped reading a peer that reads nothing: keep it open.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            if stream > (1 << 30) {
                break;
            }
        }
    }
    opened
}

/// One `GET /healthz` on a connection of its own, from a thread of its own (the attackers
/// share the test's runtime): its status line.
fn healthz(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    // Only a probe that never comes back fails: how long one takes is a bench figure.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// Probes both ports' `/healthz` every 50 ms until `until`: each answered 200 (how fast
/// is a figure of `bench/run`, not a bound here).
async fn probe_both(proxy: SocketAddr, admin: SocketAddr, until: Instant, what: &str) -> usize {
    let mut probes = 0;
    while Instant::now() < until {
        for (port, addr) in [("provider", proxy), ("admin", admin)] {
            let status = tokio::task::spawn_blocking(move || healthz(addr))
                .await
                .unwrap();
            assert!(
                status.starts_with("HTTP/1.1 200"),
                "{what}: {port} /healthz: {status}"
            );
            probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    probes
}

/// The app on a runtime of its own: the attackers share the test's, and the provider
/// port's `/healthz` goes through to the app.
fn upstream_apart() -> (tokio::runtime::Runtime, Upstream) {
    std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let upstream = runtime.block_on(Upstream::start());
        (runtime, upstream)
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_and_storms_leave_both_ports_answering() {
    let (app_runtime, upstream) = upstream_apart();
    // A large answer recorded for replay (under the 64 KiB a replay keeps): every
    // duplicate asks for it again.
    upstream.script([Answer::ok().body(&"r".repeat(60 << 10))]);
    let dir = tempfile::tempdir().unwrap();
    let routes = "routes:\n  - name: replayed\n    match: { method: [GET, POST], path: /replayed }\n    key: \"{header:X-Id}\"\n    on_missing_key: forward\n    duplicate_response: { replay: true }\n";
    let config = write_config(dir.path(), upstream.addr, routes);
    let proxy = Binary::start(&config);
    let big = send(proxy.addr, "POST", "/replayed", &[("x-id", "big")], "").await;
    assert_eq!(big.status, 200);
    let rss_before = rss_kib(&proxy);
    for kind in [
        Attack::Settings,
        Attack::Pings,
        Attack::Streams,
        Attack::Resets,
        Attack::SlowReader,
    ] {
        let until = Instant::now() + Duration::from_secs(3);
        let attackers: Vec<_> = [proxy.addr, proxy.admin]
            .into_iter()
            .flat_map(|addr| (0..4).map(move |_| addr))
            .map(|addr| tokio::spawn(attack(addr, kind, "/replayed", until)))
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let probes = probe_both(proxy.addr, proxy.admin, until, &format!("{kind:?}")).await;
        assert!(probes >= 20, "{kind:?}: {probes} probes");
        for attacker in attackers {
            assert!(attacker.await.unwrap() >= 1);
        }
    }
    // What the slow readers hold back is bounded.
    let grown = rss_kib(&proxy).saturating_sub(rss_before);
    assert!(grown < 256 * 1024, "RSS grew by {grown} KiB");
    // Still serving.
    let again = send(proxy.addr, "POST", "/replayed", &[("x-id", "big")], "").await;
    assert_eq!(again.dedupe(), "duplicate");
    drop(upstream);
    app_runtime.shutdown_background();
}

/// `Upgrade: h2c` is not taken up: the request is answered as the HTTP/1.1 it is, with no
/// `101`, on both ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upgrade_is_answered_as_http1() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), upstream.addr, &json_route(""));
    let proxy = Binary::start(&config);
    for addr in [proxy.addr, proxy.admin] {
        let mut peer = TcpStream::connect(addr).await.unwrap();
        peer.write_all(
            b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n\r\n",
        )
        .await
        .unwrap();
        let mut answer = vec![0; 256];
        let read = tokio::time::timeout(Duration::from_secs(2), peer.read(&mut answer))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 200"), "{addr}: {answer}");
    }
}

/// The binary's resident memory, in KiB.
fn rss_kib(proxy: &Binary) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.child.id())).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Each HTTP/2 connection may open 32 streams at once, on both ports (the server's
/// SETTINGS say so; a peer opening more has them refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_may_open_32_streams_at_once() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), upstream.addr, &json_route(""));
    let proxy = Binary::start(&config);
    for addr in [proxy.addr, proxy.admin] {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut client, mut connection) = h2::client::handshake(tcp).await.unwrap();
        let request = http::Request::get(format!("http://{addr}/healthz"))
            .body(())
            .unwrap();
        let (answer, _) = client.send_request(request, true).unwrap();
        let answer = tokio::select! {
            answer = answer => answer.unwrap(),
            ended = &mut connection => panic!("{addr}: the connection ended first: {ended:?}"),
        };
        assert_eq!(answer.status(), 200, "{addr}");
        assert_eq!(connection.max_concurrent_send_streams(), 32, "{addr}");
    }
}
