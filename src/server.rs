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
//! ever. A connection is *waiting on the application* while a request is being handled or
//! a response body waits for the upstream's next bytes: the application's own timeouts
//! bound that. Otherwise it is quiet, and is closed once it has been quiet for
//! `header_read_timeout` with nothing to send (idle, or stuck before its first request),
//! or for `body_read_timeout` with a response the sender does not read.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// How long a connection told to close (idle too long, or the server stopping) may take to
/// close by itself, with no request in progress, before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How many connections over `max_connections` are told why at once; beyond that they
/// are closed without a word, so that a flood of them costs nothing more.
const MAX_REFUSING: usize = 64;

/// How long a connection over the limit gets to send its request head, and then to receive
/// its 503; how much of its request is read at most.
const REFUSE_TIME: Duration = Duration::from_secs(1);
const REFUSE_DRAIN: usize = 64 << 10;

/// A place among the `max_requests` requests in progress. The handler keeps it for as
/// long as the request costs anything: a forward that outlives its sender's connection
/// takes it along, so that the bound holds whatever the sender does.
pub struct RequestPermit {
    _held: OwnedSemaphorePermit,
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
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
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
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%peer, limit = limits.max_connections, "connection refused: too many open connections");
            if let Ok(telling) = Arc::clone(&refusing).try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(telling);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Taken off this runtime's reactor, to be registered with the worker's own.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%peer, %error, "cannot hand the connection to a worker");
                continue;
            }
        };
        let connection = Connection {
            peer,
            builder: builder.clone(),
            handler: handler.clone(),
            requests: Arc::clone(&requests),
            idle_limit: limits.header_read_timeout.0,
            stall_limit: limits.body_read_timeout.0,
            stop: stop.clone(),
        };
        workers.spawn(connections.track_future(async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => connection.serve(stream).await,
                Err(error) => tracing::debug!(%peer, %error, "cannot register the connection"),
            }
            drop(slot);
        }));
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

/// One accepted connection and what serving it needs.
struct Connection<H> {
    peer: SocketAddr,
    builder: auto::Builder<TokioExecutor>,
    handler: H,
    requests: Arc<Semaphore>,
    /// How long it may be quiet with nothing to send: idle, or before its first request.
    idle_limit: Duration,
    /// How long it may be quiet with a response the sender does not read.
    stall_limit: Duration,
    stop: CancellationToken,
}

impl<H, F> Connection<H>
where
    H: Fn(Request<Incoming>, SocketAddr, RequestPermit) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    /// Serves the connection's requests until it ends, is quiet for too long, or the
    /// server stops (then its requests in progress finish first).
    async fn serve(self, stream: TcpStream) {
        let activity = Arc::new(Activity::new());
        let (handler, requests, peer) = (self.handler, self.requests, self.peer);
        let watched = Arc::clone(&activity);
        let service = service_fn(move |request| {
            let handling = Waiting::start(&watched);
            // Shed load at once rather than queue it: the sender retries later.
            let answer = Arc::clone(&requests)
                .try_acquire_owned()
                .ok()
                .map(|permit| handler(request, peer, RequestPermit { _held: permit }));
            let watched = Arc::clone(&watched);
            async move {
                let response = match answer {
                    Some(answer) => answer.await,
                    None => Refusal::Overloaded.into_response(),
                };
                drop(handling);
                Ok::<_, Infallible>(response.map(|body| Watched::new(body, watched)))
            }
        });
        let connection = self.builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        let mut closing_since: Option<Instant> = None;
        let mut next_check = Instant::now() + self.idle_limit;
        loop {
            tokio::select! {
                ended = connection.as_mut() => {
                    if let Err(error) = ended {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                    return;
                }
                () = self.stop.cancelled(), if closing_since.is_none() => {
                    connection.as_mut().graceful_shutdown();
                    closing_since = Some(Instant::now());
                    next_check = Instant::now() + CLOSE_GRACE;
                }
                () = tokio::time::sleep_until(next_check.into()) => {
                    let now = Instant::now();
                    let Some(quiet) = activity.quiet_for(now) else {
                        // The application sets the pace: look again soon.
                        next_check = now + self.idle_limit.min(CLOSE_GRACE);
                        continue;
                    };
                    let (quiet, limit) = match closing_since {
                        Some(since) => (quiet.min(now - since), CLOSE_GRACE),
                        None if activity.sending() => (quiet, self.stall_limit),
                        None => (quiet, self.idle_limit),
                    };
                    if quiet < limit {
                        next_check = now + (limit - quiet);
                    } else if closing_since.is_some() {
                        tracing::debug!(%peer, "connection dropped: it did not close when told to");
                        return;
                    } else {
                        tracing::debug!(%peer, quiet_ms = quiet.as_millis() as u64, "closing a quiet connection");
                        connection.as_mut().graceful_shutdown();
                        closing_since = Some(now);
                        next_check = now + CLOSE_GRACE;
                    }
                }
            }
        }
    }
}

/// What a connection is doing, for its watchdog: how many of its requests and response
/// bodies wait on the application, how many response bodies are being sent, and when it
/// last made progress.
struct Activity {
    started: Instant,
    waiting: AtomicUsize,
    sending: AtomicUsize,
    /// Milliseconds after `started`.
    last_progress: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
            waiting: AtomicUsize::new(0),
            sending: AtomicUsize::new(0),
            last_progress: AtomicU64::new(0),
        }
    }

    fn progressed(&self) {
        let at = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_progress.store(at, Ordering::Relaxed);
    }

    /// How long the connection has been quiet, or `None` while it waits on the application.
    fn quiet_for(&self, now: Instant) -> Option<Duration> {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = self.started + Duration::from_millis(self.last_progress.load(Ordering::Relaxed));
        Some(now.saturating_duration_since(last))
    }

    /// Whether a response body is being sent.
    fn sending(&self) -> bool {
        self.sending.load(Ordering::Relaxed) > 0
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

/// A response body that tells its connection's watchdog how it goes: each frame handed to
/// hyper is progress, and while the body itself waits for its next frame (the upstream's
/// pace) the connection is not quiet.
pub struct Watched {
    body: ProxyBody,
    activity: Arc<Activity>,
    waiting: Option<Waiting>,
}

impl Watched {
    fn new(body: ProxyBody, activity: Arc<Activity>) -> Watched {
        activity.sending.fetch_add(1, Ordering::Relaxed);
        Watched {
            body,
            activity,
            waiting: None,
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
            }
        } else {
            this.waiting = None;
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
        self.activity.sending.fetch_sub(1, Ordering::Relaxed);
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
