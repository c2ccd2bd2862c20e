//! Listeners: the accept loop shared by the proxy and admin ports (HTTP/1.1 and h2c on
//! one port), the limits that bound what one sender can cost (open connections, requests
//! in progress, time to send a request head, time a connection may idle or stall), the
//! hand-off of each connection to a worker, and the graceful close of connections within
//! a deadline.
//!
//! Every phase of a connection that its sender paces has a deadline, kept by one watchdog
//! per connection (it reads the connection's [`Activity`] in `Connection::watch`) rather
//! than by each protocol: hyper gives no deadline to
//! protocol detection, to the HTTP/2 preface and SETTINGS exchange, or to an idle HTTP/2
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
//! When every connection slot is taken, an idle connection (no request in progress) is
//! closed to make room, one that never sent a request first, else the one idle longest, so that keeping many connections open costs a
//! sender real requests rather than one every `header_read_timeout`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
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
pub const MAX_OVER_LIMIT: usize = 64;

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
    /// A place the handler took besides (one among the requests no route takes, say).
    other: OnceLock<OwnedSemaphorePermit>,
}

impl RequestPermit {
    fn new(request: OwnedSemaphorePermit) -> RequestPermit {
        RequestPermit(Arc::new(Places {
            _request: request,
            other: OnceLock::new(),
        }))
    }

    /// Keeps `place` as long as the request's own place. A request takes one other place
    /// at most; a second would be given back at once.
    pub fn also_hold(&self, place: OwnedSemaphorePermit) {
        let taken = self.0.other.set(place);
        debug_assert!(taken.is_ok(), "a request holds one other place at most");
    }
}

/// The two ends of the connection a request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ends {
    /// The sender's address.
    pub peer: SocketAddr,
    /// The address the sender reached: the listener's, or on a wildcard listener
    /// (`0.0.0.0`) the interface's.
    pub local: SocketAddr,
}

/// What a listener serves: the answer to a request that came on `ends`, given the
/// request's place among `max_requests`. Any such function or closure is one; each
/// connection has a clone.
pub trait Handler: Clone + Send + Sync + 'static {
    type Answer: Future<Output = Response<ProxyBody>> + Send + 'static;

    fn call(&self, request: Request<Incoming>, ends: Ends, permit: RequestPermit) -> Self::Answer;
}

impl<H, F> Handler for H
where
    H: Fn(Request<Incoming>, Ends, RequestPermit) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    type Answer = F;

    fn call(&self, request: Request<Incoming>, ends: Ends, permit: RequestPermit) -> F {
        self(request, ends, permit)
    }
}

/// Serves `handler` on `listener` until `stop` is cancelled, then stops accepting and
/// waits up to `grace` for open connections to finish their requests. Each connection
/// runs on one of `workers`, in turn.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: H,
    limits: Limits,
    stop: CancellationToken,
    grace: Duration,
    workers: Arc<Workers>,
) {
    let listener = Listener {
        builder: connection_builder(&limits),
        slots: Arc::new(Semaphore::new(limits.max_connections)),
        requests: Arc::new(Semaphore::new(limits.max_requests)),
        probes: Arc::new(Semaphore::new(limits.probe_places)),
        over_limit: Arc::new(Semaphore::new(MAX_OVER_LIMIT)),
        open: Arc::new(OpenConnections::default()),
        connections: TaskTracker::new(),
        listener,
        handler,
        limits,
        stop,
        workers,
        refusals: Arc::default(),
    };
    while let Some((stream, peer)) = listener.accept().await {
        listener.admit(stream, peer);
    }
    listener.drain(grace).await;
}

/// A listener and what every connection it accepts shares.
struct Listener<H> {
    listener: TcpListener,
    handler: H,
    limits: Limits,
    builder: auto::Builder<TokioExecutor>,
    /// A slot per open connection, `max_connections` in all.
    slots: Arc<Semaphore>,
    /// A place per request in progress, over every connection, `max_requests` in all.
    requests: Arc<Semaphore>,
    /// Places kept for health probes (`probe_places`).
    probes: Arc<Semaphore>,
    /// Connections beyond `max_connections` waiting for a slot or for their refusal.
    over_limit: Arc<Semaphore>,
    open: Arc<OpenConnections>,
    connections: TaskTracker,
    /// Cancelled when the server stops; each connection's close token is its child.
    stop: CancellationToken,
    workers: Arc<Workers>,
    refusals: Arc<Refusals>,
}

impl<H: Handler> Listener<H> {
    /// The next connection, or none once the server stops.
    async fn accept(&self) -> Option<(TcpStream, SocketAddr)> {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => return Some(accepted),
                    Err(error) => {
                        // Out of file descriptors, usually: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                () = self.stop.cancelled() => return None,
            }
        }
    }

    /// Starts serving a new connection in a free slot. With every slot taken, the
    /// connection idle longest makes room and the newcomer waits for its slot; one that
    /// finds none is refused, and beyond [`MAX_OVER_LIMIT`] of those, closed at once.
    fn admit(&self, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            peer,
            builder: self.builder.clone(),
            handler: self.handler.clone(),
            requests: Arc::clone(&self.requests),
            probes: Arc::clone(&self.probes),
            idle_limit: self.limits.header_read_timeout.0,
            stall_limit: self.limits.body_read_timeout.0,
            close: self.stop.child_token(),
            open: Arc::clone(&self.open),
        };
        if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            connection.start(stream, slot, &self.workers, &self.connections);
            return;
        }
        let Ok(over_limit) = Arc::clone(&self.over_limit).try_acquire_owned() else {
            return;
        };
        let evicted = self.open.evict_idlest();
        let (slots, workers, tracker) = (
            Arc::clone(&self.slots),
            Arc::clone(&self.workers),
            self.connections.clone(),
        );
        let limit = self.limits.max_connections;
        let refusals = Arc::clone(&self.refusals);
        let listener = self.listener.local_addr().unwrap_or(peer);
        self.connections.spawn(async move {
            let slot = match evicted {
                true => tokio::time::timeout(SLOT_WAIT, slots.acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok),
                false => None,
            };
            match slot {
                Some(slot) => connection.start(stream, slot, &workers, &tracker),
                None => {
                    refusals.refused(listener, peer, limit);
                    refuse(stream).await;
                }
            }
            drop(over_limit);
        });
    }

    /// Stops accepting and waits up to `grace` for the open connections to close.
    async fn drain(self, grace: Duration) {
        drop(self.listener);
        self.connections.close();
        if tokio::time::timeout(grace, self.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!("connections still open when the shutdown grace ended");
        }
    }
}

/// How often a refusal for want of room is logged at most: a flood of connections must
/// not become a flood of log lines.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// A listener's log of connections refused because every slot is busy: the first one at
/// once, then one line a minute at most, counting those left out.
#[derive(Default)]
struct Refusals {
    last_logged: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl Refusals {
    fn refused(&self, listener: SocketAddr, peer: SocketAddr, limit: usize) {
        let mut last = self.last_logged.lock();
        if last.is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%listener, %peer, limit, "connection refused: too many open connections, none of them idle");
            return;
        }
        *last = Some(Instant::now());
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(%listener, %peer, limit, refused_since_last_line = unlogged, "connection refused: too many open connections, none of them idle");
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
    // Streams at once per connection: one connection holds no more of `max_requests`
    // than 32 HTTP/1 ones would, and a peer opening them all at once costs little (a
    // client wanting more opens another connection, as proxies and browsers do).
    builder
        .http2()
        .max_concurrent_streams(32)
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
    /// Lists a connection until the returned guard is dropped (when the connection ends,
    /// panicking or not).
    fn add(self: &Arc<Self>, activity: &Arc<Activity>, close: &CancellationToken) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.by_id
            .lock()
            .insert(id, (Arc::clone(activity), close.clone()));
        Registered {
            open: Arc::clone(self),
            id,
        }
    }

    /// Closes the connection with no request or response in progress that has been idle
    /// longest, one that never sent a request first (a provider's kept-alive connection
    /// has). Whether there was one.
    fn evict_idlest(&self) -> bool {
        let now = Instant::now();
        let connections = self.by_id.lock();
        let idlest = connections
            .values()
            .filter(|(_, close)| !close.is_cancelled())
            .filter_map(
                |(activity, close)| match activity.state(now, Duration::MAX) {
                    State::Idle(idle) => Some(((!activity.served_any(), idle), close)),
                    State::Busy(_) | State::Stalled => None,
                },
            )
            .max_by_key(|(rank, _)| *rank);
        match idlest {
            Some(((_, idle), close)) => {
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

/// A connection's place in [`OpenConnections`], given up when dropped.
struct Registered {
    open: Arc<OpenConnections>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.by_id.lock().remove(&self.id);
    }
}

/// One accepted connection and what serving it needs.
struct Connection<H> {
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    handler: H,
    requests: Arc<Semaphore>,
    /// Places kept for health probes (`probe_places`).
    probes: Arc<Semaphore>,
    /// How long it may be quiet with nothing in progress: idle, or before its first request.
    idle_limit: Duration,
    /// How long a response body may stall on its sender.
    stall_limit: Duration,
    /// Cancelled when the server stops or this connection is evicted to make room.
    close: CancellationToken,
    open: Arc<OpenConnections>,
}

impl<H: Handler> Connection<H> {
    /// Hands the connection to the next worker, which serves it holding `slot`.
    fn start(
        self,
        stream: TcpStream,
        slot: OwnedSemaphorePermit,
        workers: &Workers,
        tracker: &TaskTracker,
    ) {
        let peer = self.peer;
        if self.close.is_cancelled() {
            // The server stopped while this connection waited for a slot.
            return;
        }
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
        let _registered = self.open.add(&activity, &self.close);
        let peer = self.peer;
        let Ok(local) = stream.local_addr() else {
            return;
        };
        let ends = Ends { peer, local };
        let (handler, requests) = (self.handler.clone(), Arc::clone(&self.requests));
        let probes = Arc::clone(&self.probes);
        let (watched, closing_token) = (Arc::clone(&activity), self.close.clone());
        let service = service_fn(move |request: Request<Incoming>| {
            let handling = Handling::start(&watched);
            let answer = place_for_request(&requests, &closing_token)
                .or_else(|refused| match is_probe(&request) {
                    true => place_for_request(&probes, &closing_token),
                    false => Err(refused),
                })
                // Boxed: the handler's state is kilobytes, and hyper moves the service's
                // future as it takes it (docs/performance.md, "The hot path, lean
                // again").
                .map(|permit| {
                    (
                        Box::pin(handler.call(request, ends, permit.clone())),
                        permit,
                    )
                });
            let watched = Arc::clone(&watched);
            async move {
                let (response, permit) = match answer {
                    Ok((answer, permit)) => (answer.await, Some(permit)),
                    Err(refusal) => (refusal.into_response(), None),
                };
                drop(handling);
                Ok::<_, Infallible>(response.map(|body| Watched::new(body, watched, permit)))
            }
        });
        let stream = TokioIo::new(crate::frame_budget::FrameBudget::new(stream));
        let connection = self.builder.serve_connection(stream, service);
        tokio::pin!(connection);
        let mut closing: Option<Closing> = None;
        let mut next_check = Instant::now() + self.idle_limit.min(CLOSE_GRACE);
        loop {
            tokio::select! {
                biased;
                () = self.close.cancelled(), if closing.is_none() => {
                    // Nothing in progress: nothing to finish, so no reason to wait for a
                    // peer that may never acknowledge a GOAWAY.
                    if matches!(activity.state(Instant::now(), Duration::MAX), State::Idle(_)) {
                        break;
                    }
                    connection.as_mut().graceful_shutdown();
                    closing = Some(Closing::Graceful(Instant::now()));
                    next_check = Instant::now() + CLOSE_GRACE;
                }
                ended = connection.as_mut() => {
                    if let Err(error) = ended {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                    break;
                }
                () = tokio::time::sleep_until(next_check.into()) => {
                    match self.watch(&activity, closing, Instant::now()) {
                        Watch::CheckAt(at) => next_check = at,
                        Watch::Close(how) => {
                            connection.as_mut().graceful_shutdown();
                            closing = Some(how);
                            next_check = Instant::now() + CLOSE_GRACE;
                        }
                        Watch::Drop => {
                            tracing::debug!(%peer, "connection dropped: it did not close when told to");
                            break;
                        }
                    }
                }
            }
        }
    }

    /// The watchdog's check at `now`: a connection told to close gets [`CLOSE_GRACE`] to
    /// do so; otherwise one quiet for `idle_limit` is closed, and one whose sender does not
    /// take its response for `stall_limit` is closed without waiting for its requests.
    fn watch(&self, activity: &Activity, closing: Option<Closing>, now: Instant) -> Watch {
        let state = activity.state(now, self.stall_limit);
        if let Some(closing) = closing {
            let (Closing::Graceful(since) | Closing::Forced(since)) = closing;
            let over = match (closing, state) {
                (_, State::Idle(idle)) => Some(idle.min(now - since)),
                (Closing::Forced(_), _) | (_, State::Stalled) => Some(now - since),
                (Closing::Graceful(_), State::Busy(_)) => None,
            };
            return match over {
                Some(over) if over >= CLOSE_GRACE => Watch::Drop,
                _ => Watch::CheckAt(now + CLOSE_GRACE.min(self.idle_limit)),
            };
        }
        match state {
            State::Busy(check_in) => Watch::CheckAt(now + check_in),
            State::Idle(idle) if idle < self.idle_limit => {
                Watch::CheckAt(now + (self.idle_limit - idle))
            }
            State::Idle(_) => {
                tracing::debug!(peer = %self.peer, "closing an idle connection");
                Watch::Close(Closing::Graceful(now))
            }
            State::Stalled => {
                tracing::debug!(peer = %self.peer, "closing a connection whose sender does not take its response");
                Watch::Close(Closing::Forced(now))
            }
        }
    }
}

/// Whether a request is a health probe (`GET` or `HEAD` of `/healthz` or `/readyz`),
/// which may take one of `probe_places` when every other place is taken.
fn is_probe(request: &Request<Incoming>) -> bool {
    matches!(*request.method(), http::Method::GET | http::Method::HEAD)
        && matches!(request.uri().path(), "/healthz" | "/readyz")
}

/// A place for a request on a connection, or the refusal to answer instead: none on a
/// connection told to close (an HTTP/2 peer may keep opening streams until it
/// acknowledges the GOAWAY), none when every place is taken. Load is shed at once rather
/// than queued: the sender retries later.
fn place_for_request(
    requests: &Arc<Semaphore>,
    closing: &CancellationToken,
) -> Result<RequestPermit, Refusal> {
    if closing.is_cancelled() {
        return Err(Refusal::Closing);
    }
    Arc::clone(requests)
        .try_acquire_owned()
        .map(RequestPermit::new)
        .map_err(|_| Refusal::Overloaded)
}

/// What the watchdog does after a check.
enum Watch {
    /// Nothing until then.
    CheckAt(Instant),
    /// Tell the connection to close.
    Close(Closing),
    /// It did not close when told to: drop it.
    Drop,
}

/// What a connection's watchdog sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A request or response is in progress; look again after this long.
    Busy(Duration),
    /// Nothing in progress, for this long.
    Idle(Duration),
    /// A response has waited on its sender past the stall limit.
    Stalled,
}

/// A connection told to close, since when: it gets [`CLOSE_GRACE`] once idle, or, when a
/// stalled stream would keep it open for ever, once told.
#[derive(Debug, Clone, Copy)]
enum Closing {
    Graceful(Instant),
    Forced(Instant),
}

/// What a connection is doing: how many of its requests are being handled, its response
/// bodies being sent, and when it last made progress.
struct Activity {
    started: Instant,
    handling: AtomicUsize,
    /// Requests it has sent, ever.
    served: AtomicU64,
    /// Milliseconds after `started`.
    last_progress: AtomicU64,
    sending: Mutex<Vec<Arc<Sending>>>,
}

/// One response body being sent.
struct Sending {
    /// Milliseconds after the connection started.
    last_progress: AtomicU64,
    /// Whether it waits for the upstream's next bytes, rather than for its sender.
    awaiting_upstream: AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
            handling: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            last_progress: AtomicU64::new(0),
            sending: Mutex::new(Vec::new()),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn served_any(&self) -> bool {
        self.served.load(Ordering::Relaxed) > 0
    }

    fn progressed(&self) {
        self.last_progress
            .store(self.elapsed_ms(), Ordering::Relaxed);
    }

    /// How long before `now` the moment `at_millis` after the start was.
    fn since(&self, now: Instant, at_millis: u64) -> Duration {
        now.saturating_duration_since(self.started + Duration::from_millis(at_millis))
    }

    fn state(&self, now: Instant, stall_limit: Duration) -> State {
        let sending = self.sending.lock();
        let longest_stall = sending
            .iter()
            .filter(|body| !body.awaiting_upstream.load(Ordering::Relaxed))
            .map(|body| self.since(now, body.last_progress.load(Ordering::Relaxed)))
            .max();
        if longest_stall.is_some_and(|stall| stall >= stall_limit) {
            return State::Stalled;
        }
        if self.handling.load(Ordering::Relaxed) > 0 || !sending.is_empty() {
            let check_in = longest_stall.map_or(CLOSE_GRACE, |stall| stall_limit - stall);
            return State::Busy(check_in.min(CLOSE_GRACE));
        }
        State::Idle(self.since(now, self.last_progress.load(Ordering::Relaxed)))
    }
}

/// A request being handled, from its head to its response's head.
struct Handling(Arc<Activity>);

impl Handling {
    fn start(activity: &Arc<Activity>) -> Handling {
        activity.handling.fetch_add(1, Ordering::Relaxed);
        activity.served.fetch_add(1, Ordering::Relaxed);
        activity.progressed();
        Handling(Arc::clone(activity))
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.progressed();
        self.0.handling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that tells its connection's watchdog how it goes (each frame handed to
/// hyper is progress; while the body itself waits for its next frame, the upstream sets the
/// pace), and keeps its request's places until it is sent.
pub struct Watched {
    body: ProxyBody,
    activity: Arc<Activity>,
    sending: Arc<Sending>,
    _permit: Option<RequestPermit>,
}

impl Watched {
    fn new(body: ProxyBody, activity: Arc<Activity>, permit: Option<RequestPermit>) -> Watched {
        let sending = Arc::new(Sending {
            last_progress: AtomicU64::new(activity.elapsed_ms()),
            awaiting_upstream: AtomicBool::new(false),
        });
        activity.sending.lock().push(Arc::clone(&sending));
        Watched {
            body,
            activity,
            sending,
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
        let sending = &this.sending;
        sending
            .awaiting_upstream
            .store(polled.is_pending(), Ordering::Relaxed);
        if polled.is_ready() {
            let now = this.activity.elapsed_ms();
            sending.last_progress.store(now, Ordering::Relaxed);
            this.activity.last_progress.store(now, Ordering::Relaxed);
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
            .sending
            .lock()
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
