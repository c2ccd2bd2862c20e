//! A real hyper upstream with scripted answers that counts the work it does, and addresses
//! where nothing answers.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

/// One scripted answer of the test upstream.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub delay: Duration,
    pub body: String,
    pub headers: Vec<(String, String)>,
    /// Drop the connection instead of answering.
    pub abort: bool,
    /// Answer only once this is cancelled (after `delay`), so a test decides when.
    pub gate: Option<CancellationToken>,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            delay: Duration::ZERO,
            body: format!("upstream answered {status}"),
            headers: Vec::new(),
            abort: false,
            gate: None,
        }
    }

    pub fn ok() -> Answer {
        Answer::status(200)
    }

    pub fn after(mut self, delay: Duration) -> Answer {
        self.delay = delay;
        self
    }

    /// Holds the answer until `gate` is cancelled: for a test that must see the delivery in
    /// flight however slowly the machine runs.
    pub fn until(mut self, gate: &CancellationToken) -> Answer {
        self.gate = Some(gate.clone());
        self
    }

    pub fn body(mut self, body: &str) -> Answer {
        self.body = body.to_owned();
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Answer {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn abort() -> Answer {
        Answer {
            abort: true,
            ..Answer::ok()
        }
    }
}

/// A request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct UpstreamState {
    script: Mutex<VecDeque<Answer>>,
    received: Mutex<Vec<Received>>,
    /// Work done: 2xx answers completed, by `Dedupe-Key` (or `-` without one).
    executions: Mutex<HashMap<String, usize>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

/// A real HTTP upstream on port 0. Answers the scripted answers in order, then 200.
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
    stop: CancellationToken,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Upstream::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState::default());
        let stop = CancellationToken::new();
        let (loop_state, loop_stop) = (Arc::clone(&state), stop.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    accepted = listener.accept() => accepted.unwrap(),
                    () = loop_stop.cancelled() => return,
                };
                let state = Arc::clone(&loop_state);
                let service =
                    hyper::service::service_fn(move |request| answer(Arc::clone(&state), request));
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, state, stop }
    }

    /// Queues answers for the next requests.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state.script.lock().unwrap().extend(answers);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn requests(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }

    /// Waits (up to 5 s) until `count` requests have arrived.
    pub async fn wait_for_requests(&self, count: usize) {
        eventually(
            Duration::from_secs(5),
            &format!("{count} request(s) at the upstream"),
            || async { self.requests() >= count },
        )
        .await;
    }

    /// 2xx answers completed for requests carrying this `Dedupe-Key`.
    pub fn executions(&self, key: &str) -> usize {
        self.state
            .executions
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn total_executions(&self) -> usize {
        self.state.executions.lock().unwrap().values().sum()
    }

    /// The most requests the upstream was working on at the same moment.
    pub fn most_running(&self) -> usize {
        self.state.most_running.load(Ordering::SeqCst)
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(
    state: Arc<UpstreamState>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (head, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let key = head
        .headers
        .get("dedupe-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    state.received.lock().unwrap().push(Received {
        method: head.method.clone(),
        uri: head.uri.to_string(),
        headers: head.headers.clone(),
        body,
    });
    let scripted = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(Answer::ok);
    let running = state.running.fetch_add(1, Ordering::SeqCst) + 1;
    state.most_running.fetch_max(running, Ordering::SeqCst);
    tokio::time::sleep(scripted.delay).await;
    if let Some(gate) = &scripted.gate {
        gate.cancelled().await;
    }
    state.running.fetch_sub(1, Ordering::SeqCst);
    if scripted.abort {
        return Err(std::io::Error::other("scripted abort"));
    }
    if (200..300).contains(&scripted.status) {
        *state.executions.lock().unwrap().entry(key).or_default() += 1;
    }
    let mut response = Response::new(Full::new(Bytes::from(scripted.body)));
    *response.status_mut() = StatusCode::from_u16(scripted.status).unwrap();
    for (name, value) in scripted.headers {
        response.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    Ok(response)
}

/// An address where nothing listens.
pub async fn dead_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// An address where a connection is never made: a listener whose one-place backlog a
/// first connection fills, so that the kernel drops later handshakes. Keep the guard.
pub async fn unanswering_address() -> (SocketAddr, (TcpListener, tokio::net::TcpStream)) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let filler = tokio::net::TcpStream::connect(addr).await.unwrap();
    (addr, (listener, filler))
}
