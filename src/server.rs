//! Listeners: the accept loop shared by the proxy and admin ports (HTTP/1.1 and h2c on
//! one port), the limits that bound what one sender can cost (open connections, requests
//! in progress, time to send a request head, time a connection may idle or stall), the
//! hand-off of each connection to a worker, and the graceful close of connections within
//! a deadline.
//!
//! Every phase of a connection has a deadline, kept by one watchdog per connection
//! ([`Activity`]) rather than by each protocol: hyper gives no deadline to protocol
//! detection, to the HTTP/2 preface and SETTINGS exchange, or to an idle HTTP/2
//! connection, and a connection that never finishes any of them would hold its slot for
//! ever. A request being handled, and a response body waiting for the upstream's next
//! bytes, wait on the application, whose own timeouts bound them. Otherwise:
//!
//! - a connection with no request and no response in progress closes once it has been
//!   quiet for `header_read_timeout` (idle, or stuck before its first request);
//! - a response body that has not moved for `body_read_timeout` while the proxy had bytes
//!   for it (its sender does not read, or holds an HTTP/2 stream's window at zero) closes
//!   its connection, whatever the other streams on it do.
//!
//! When every connection slot is taken, the connection that has idled longest (no request
//! in progress) is closed to make room, so that keeping many connections open costs a
//! sender real requests rather than one every `header_read_timeout`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::body::{BoxError, ProxyBody};
use crate::config::Limits;
use crate::response::Refusal;
use crate::workers::Workers;

/// How long a connection told to close (idle too long, stalled, evicted, or the server
/// stopping) may take to close by itself before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How many connections over `max_connections` wait for a slot or are told why they are
/// refused at once; beyond that they are closed without a word, so that a flood of them
/// costs nothing more.
const MAX_WAITING: usize = 64;

/// How long a connection over the limit waits for the slot of an evicted one.
const SLOT_WAIT: Duration = Duration::from_secs(2);

/// How long a refused connection gets to send its request head, and then to receive its
/// 503; how much of its request is read at most.
const REFUSE_TIME: Duration = Duration::from_secs(1);
const REFUSE_DRAIN: usize = 64 << 10;

/// A request's places: one among the `max_requests` requests in progress, and any other
/// the handler takes (see [`RequestPermit::also_hold`]). Clones share them, and they are
/// given back when the last clone goes: the response being sent keeps one, and a forward
/// that outlives its sender's connection takes another along, so that the bound holds
/// whatever the sender does.
#[derive(Clone)]
pub struct RequestPermit(Arc<Places>);

struct Places {
    _request: OwnedSemaphorePermit,
    more: OnceLock<OwnedSemaphorePermit>,
}

impl RequestPermit {
    fn new(request: OwnedSemaphorePermit) -> RequestPermit {
        RequestPermit(Arc::new(Places {
            _request: request,
            more: OnceLock::new(),
        }))
    }

    /// Keeps `permit` for as long as the request's own place (once per request).
    pub fn also_hold(&self, permit: OwnedSemaphorePermit) {
        let _ = self.0.more.set(permit);
    }
}

/// Serves `handler` on `listener` until `stop` is cancelled, then stops accepting and
/// waits up to `grace` for open connections to finish their requests. Each connection
/// runs on one of `workers`, in turn.
pub async fn serve<H, F>(
    listener: TcpListener,
    handler: H,
    limits: Limits,
    stop: CancellationToken,
    grace: Duration,
    workers: Arc<Workers>,
) where
    H: Fn(Request<Incoming>, SocketAddr, RequestPermit) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let builder = connection_builder(&limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
    let waiting = Arc::new(Semaphore::new(MAX_WAITING));
    let open = Arc::new(OpenConnections::default());
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, usually: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            peer,
            builder: builder.clone(),
            handler: handler.clone(),
            requests: Arc::clone(&requests),
            idle_limit: limits.header_read_timeout.0,
            stall_limit: limits.body_read_timeout.0,
            stop: stop.child_token(),
            open: Arc::clone(&open),
        };
        let start = {
            let (workers, tracker) = (Arc::clone(&workers), connections.clone());
            move |stream, slot| connection.start(stream, slot, &workers, &tracker)
        };
        if let Ok(slot) = Arc::clone(&slots).try_acquire_owned() {
            start(stream, slot);
            continue;
        }
        let Ok(waiting) = Arc::clone(&waiting).try_acquire_owned() else {
            continue;
        };
        // Full: the connection idle longest makes room, if there is one.
        let evicted = open.evict_idlest();
        let slots = Arc::clone(&slots);
        let limit = limits.max_connections;
        tokio::spawn(async move {
            let slot = match evicted {
                true => tokio::time::timeout(SLOT_WAIT, slots.acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok),
                false => None,
            };
            match slot {
                Some(slot) => start(stream, slot),
                None => {
                    tracing::warn!(%peer, limit, "connection refused: too many open connections, none of them idle");
                    refuse(stream).await;
                }
            }
            drop(waiting);
        });
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open when the shutdown grace ended");
    }
}

/// HTTP/1.1 and HTTP/2 with the limits on request heads, and HTTP/2 keep-alive pings that
/// find a peer gone while its streams wait.
fn connection_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let head_bytes = usize::try_from(limits.max_header_bytes.0).unwrap_or(usize::MAX);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper ignores a header timeout unless it has a timer.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout.0)
        .max_buf_size(head_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.header_read_timeout.0)
        .keep_alive_timeout(limits.header_read_timeout.0)
        .max_header_list_size(u32::try_from(head_bytes).unwrap_or(u32::MAX));
    builder
}

/// The open connections of a listener, so that the idlest can make room for a new one.
#[derive(Default)]
struct OpenConnections {
    by_id: Mutex<HashMap<u64, (Arc<Activity>, CancellationToken)>>,
    next_id: AtomicU64,
}

impl OpenConnections {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, (Arc<Activity>, CancellationToken)>> {
        self.by_id
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn add(&self, activity: &Arc<Activity>, close: &CancellationToken) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .insert(id, (Arc::clone(activity), close.clone()));
        id
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Tells the connection that has been idle longest, with no request or response in
    /// progress, to close. Whether there was one.
    fn evict_idlest(&self) -> bool {
        let now = Instant::now();
        let connections = self.lock();
        let idlest = connections
            .values()
            .filter(|(_, close)| !close.is_cancelled())
            .filter_map(|(activity, close)| Some((activity.idle_for(now)?, close)))
            .max_by_key(|(idle, _)| *idle);
        match idlest {
            Some((idle, close)) => {
                tracing::debug!(
                    idle_ms = idle.as_millis() as u64,
                    "closing the idlest connection to make room"
                );
                close.cancel();
                true
            }
            None => false,
        }
    }
}

/// One accepted connection and what serving it needs.
struct Connection<H> {
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    handler: H,
    requests: Arc<Semaphore>,
    /// How long it may be quiet with nothing in progress: idle, or before its first request.
    idle_limit: Duration,
    /// How long a response body may stall on its sender.
    stall_limit: Duration,
    /// Cancelled when the server stops or this connection is evicted.
    stop: CancellationToken,
    open: Arc<OpenConnections>,
}

impl<H, F> Connection<H>
where
    H: Fn(Request<Incoming>, SocketAddr, RequestPermit) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    /// Hands the connection to the next worker, which serves it holding `slot`.
    fn start(
        self,
        stream: TcpStream,
        slot: OwnedSemaphorePermit,
        workers: &Workers,
        tracker: &TaskTracker,
    ) {
        let peer = self.peer;
        // Taken off this runtime's reactor, to be registered with the worker's own.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%peer, %error, "cannot hand the connection to a worker");
                return;
            }
        };
        workers.spawn(tracker.track_future(async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => self.serve(stream).await,
                Err(error) => tracing::debug!(%peer, %error, "cannot register the connection"),
            }
            drop(slot);
        }));
    }

    /// Serves the connection's requests until it ends, is quiet or stalled too long, is
    /// evicted, or the server stops (then its requests in progress finish first).
    async fn serve(self, stream: TcpStream) {
        let activity = Arc::new(Activity::new());
        let id = self.open.add(&activity, &self.stop);
        let (handler, requests, peer) = (self.handler, self.requests, self.peer);
        let watched = Arc::clone(&activity);
        let service = service_fn(move |request| {
            let handling = Waiting::start(&watched);
            // Shed load at once rather than queue it: the sender retries later.
            let permit = Arc::clone(&requests)
                .try_acquire_owned()
                .ok()
                .map(RequestPermit::new);
            let answer = permit.clone().map(|permit| handler(request, peer, permit));
            let watched = Arc::clone(&watched);
            async move {
                let response = match answer {
                    Some(answer) => answer.await,
                    None => Refusal::Overloaded.into_response(),
                };
                drop(handling);
                Ok::<_, Infallible>(response.map(|body| Watched::new(body, watched, permit)))
            }
        });
        let connection = self.builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        // Once told to close: when, and whether to drop it after the grace even with
        // requests in progress (a stalled stream, which would keep it open for ever).
        let mut closing: Option<(Instant, bool)> = None;
        let mut next_check = Instant::now() + self.idle_limit.min(CLOSE_GRACE);
        loop {
            tokio::select! {
                ended = connection.as_mut() => {
                    if let Err(error) = ended {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                    break;
                }
                () = self.stop.cancelled(), if closing.is_none() => {
                    connection.as_mut().graceful_shutdown();
                    closing = Some((Instant::now(), false));
                    next_check = Instant::now() + CLOSE_GRACE;
                }
                () = tokio::time::sleep_until(next_check.into()) => {
                    let now = Instant::now();
                    let state = activity.state(now, self.stall_limit);
                    if let Some((since, hard)) = closing {
                        let quiet = match state {
                            State::Quiet(quiet) => Some(quiet.min(now - since)),
                            State::Stalled => Some(now - since),
                            State::Busy(_) if hard => Some(now - since),
                            State::Busy(_) => None,
                        };
                        if quiet.is_some_and(|quiet| quiet >= CLOSE_GRACE) {
                            tracing::debug!(%peer, "connection dropped: it did not close when told to");
                            break;
                        }
                        next_check = now + CLOSE_GRACE.min(self.idle_limit);
                        continue;
                    }
                    match state {
                        State::Busy(check_in) => next_check = now + check_in,
                        State::Quiet(quiet) if quiet < self.idle_limit => {
                            next_check = now + (self.idle_limit - quiet);
                        }
                        State::Quiet(_) | State::Stalled => {
                            let hard = state == State::Stalled;
                            tracing::debug!(%peer, stalled = hard, "closing a quiet or stalled connection");
                            connection.as_mut().graceful_shutdown();
                            closing = Some((now, hard));
                            next_check = now + CLOSE_GRACE;
                        }
                    }
                }
            }
        }
        self.open.remove(id);
    }
}

/// What a connection's watchdog sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Work is in progress; look again after this long.
    Busy(Duration),
    /// Nothing in progress, for this long.
    Quiet(Duration),
    /// A response body waits on its sender, past the stall limit.
    Stalled,
}

/// What a connection is doing: how many of its requests and response bodies wait on the
/// application, its response bodies being sent, and when it last made progress.
struct Activity {
    started: Instant,
    waiting: AtomicUsize,
    /// Milliseconds after `started`.
    last_progress: AtomicU64,
    sending: Mutex<Vec<Arc<Sending>>>,
}

/// One response body being sent.
struct Sending {
    /// Milliseconds after the connection started.
    last_progress: AtomicU64,
    /// Whether it waits for the upstream's next bytes (rather than for its sender).
    waiting: AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
            waiting: AtomicUsize::new(0),
            last_progress: AtomicU64::new(0),
            sending: Mutex::new(Vec::new()),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn progressed(&self) {
        self.last_progress.store(self.now(), Ordering::Relaxed);
    }

    fn sending(&self) -> MutexGuard<'_, Vec<Arc<Sending>>> {
        self.sending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn since(&self, now: Instant, at_millis: u64) -> Duration {
        now.saturating_duration_since(self.started + Duration::from_millis(at_millis))
    }

    fn state(&self, now: Instant, stall_limit: Duration) -> State {
        let sending = self.sending();
        let longest_stall = sending
            .iter()
            .filter(|body| !body.waiting.load(Ordering::Relaxed))
            .map(|body| self.since(now, body.last_progress.load(Ordering::Relaxed)))
            .max();
        if longest_stall.is_some_and(|stall| stall >= stall_limit) {
            return State::Stalled;
        }
        if self.waiting.load(Ordering::Relaxed) > 0 || !sending.is_empty() {
            let check_in = longest_stall.map_or(CLOSE_GRACE, |stall| stall_limit - stall);
            return State::Busy(check_in.min(CLOSE_GRACE));
        }
        State::Quiet(self.since(now, self.last_progress.load(Ordering::Relaxed)))
    }

    /// How long it has had no request or response in progress, or `None` if it has one.
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.waiting.load(Ordering::Relaxed) > 0 || !self.sending().is_empty() {
            return None;
        }
        Some(self.since(now, self.last_progress.load(Ordering::Relaxed)))
    }
}

/// Counts as waiting on the application while it lives.
struct Waiting(Arc<Activity>);

impl Waiting {
    fn start(activity: &Arc<Activity>) -> Waiting {
        activity.waiting.fetch_add(1, Ordering::Relaxed);
        activity.progressed();
        Waiting(Arc::clone(activity))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.progressed();
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that tells its connection's watchdog how it goes (each frame handed to
/// hyper is progress; while the body itself waits for its next frame, the upstream sets the
/// pace), and keeps its request's places until it is sent.
pub struct Watched {
    body: ProxyBody,
    activity: Arc<Activity>,
    sending: Arc<Sending>,
    waiting: Option<Waiting>,
    _permit: Option<RequestPermit>,
}

impl Watched {
    fn new(body: ProxyBody, activity: Arc<Activity>, permit: Option<RequestPermit>) -> Watched {
        let sending = Arc::new(Sending {
            last_progress: AtomicU64::new(activity.now()),
            waiting: AtomicBool::new(false),
        });
        activity.sending().push(Arc::clone(&sending));
        Watched {
            body,
            activity,
            sending,
            waiting: None,
            _permit: permit,
        }
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if polled.is_pending() {
            if this.waiting.is_none() {
                this.waiting = Some(Waiting::start(&this.activity));
                this.sending.waiting.store(true, Ordering::Relaxed);
            }
        } else {
            this.waiting = None;
            this.sending.waiting.store(false, Ordering::Relaxed);
            this.sending
                .last_progress
                .store(this.activity.now(), Ordering::Relaxed);
            this.activity.progressed();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.activity.progressed();
        self.activity
            .sending()
            .retain(|body| !Arc::ptr_eq(body, &self.sending));
    }
}

/// Tells a connection over the limit why it is closed: reads its request head first (for
/// at most [`REFUSE_TIME`]: a client that reads eagerly would take an answer written before
/// its request for a protocol error), answers, then reads a little more before closing so
/// that the close does not reset the answer away.
async fn refuse(mut stream: TcpStream) {
    let mut sink = [0u8; 4096];
    let mut seen: Vec<u8> = Vec::new();
    let _ = tokio::time::timeout(REFUSE_TIME, async {
        while seen.len() < REFUSE_DRAIN && !seen.windows(4).any(|end| end == b"\r\n\r\n") {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(read) => seen.extend_from_slice(&sink[..read]),
            }
        }
    })
    .await;
    let answer = Refusal::TooManyConnections.into_http1_bytes();
    let _ = tokio::time::timeout(REFUSE_TIME, async {
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        let mut drained = 0;
        while drained < REFUSE_DRAIN {
            match stream.read(&mut sink).await? {
                0 => break,
                read => drained += read,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}
