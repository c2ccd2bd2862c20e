//! One worker's HTTP/1 connections to the upstreams, kept open for reuse: a forward takes
//! a connection that is free, or opens one, and a request the upstream cannot have seen
//! (its connection closed before it was written) goes out once more on a new connection.
//!
//! Built on hyper's connection API rather than hyper-util's pooled client, which spends a
//! mutex on a pool shared by all origins, a task per request to put the connection back,
//! and an absolute URI to parse: this costs less CPU per delivery.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;

use super::error::UpstreamError;
use crate::body::ProxyBody;

/// How long an idle connection is kept for reuse: shorter than the keep-alive timeouts of
/// common application servers (gunicorn 2 s, Node.js 5 s), so that the pool rarely picks a
/// connection the application is closing. A POST sent on such a connection fails with 502
/// and is never re-sent, since it may have reached the application.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long to wait for a TCP connection to the upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The connections of one worker, to every upstream. How many are busy is bounded by the
/// requests in progress (`limits.max_requests`): a connection is busy only while a request
/// that holds its place uses it, and the idle ones close within [`IDLE_TIMEOUT`].
#[derive(Default)]
pub(crate) struct Pool {
    shared: Arc<Mutex<Connections>>,
}

#[derive(Default)]
struct Connections {
    open: Vec<Connection>,
    /// Whether a task is closing idle connections (it ends once none is left).
    reaping: bool,
}

/// A connection and when a request last went out on it.
struct Connection {
    /// The upstream's `host:port`.
    address: Arc<str>,
    sender: SendRequest<ProxyBody>,
    last_sent: Instant,
}

impl Connection {
    /// Idle for longer than [`IDLE_TIMEOUT`], counted from the start of its last exchange
    /// (so never less than it has really idled).
    fn expired(&self, now: Instant) -> bool {
        self.sender.is_ready() && now.duration_since(self.last_sent) >= IDLE_TIMEOUT
    }
}

impl Connections {
    /// Drops the connections that are closed or have idled too long.
    fn prune(&mut self, now: Instant) {
        self.open
            .retain(|connection| !connection.sender.is_closed() && !connection.expired(now));
    }
}

impl Pool {
    /// Sends `request` (in origin form, with its `Host`) to the upstream at `address`.
    /// Sets `dispatched` while the request is with a connection (see `Upstream::send`).
    pub async fn send(
        &self,
        address: &Arc<str>,
        request: Request<ProxyBody>,
        dispatched: &AtomicBool,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match self.take_free(address) {
            Some(sender) => {
                self.exchange(address, sender, true, request, dispatched)
                    .await
            }
            None => {
                let sender = connect(address).await?;
                self.exchange(address, sender, false, request, dispatched)
                    .await
            }
        }
    }

    /// Sends `request` on `sender`, and once more on a new connection if `sender` was
    /// `reused` from the pool and its connection closed before the request was written.
    async fn exchange(
        &self,
        address: &Arc<str>,
        mut sender: SendRequest<ProxyBody>,
        mut reused: bool,
        mut request: Request<ProxyBody>,
        dispatched: &AtomicBool,
    ) -> Result<Response<Incoming>, UpstreamError> {
        loop {
            dispatched.store(true, Ordering::SeqCst);
            let answer = sender.try_send_request(request);
            // Back in the pool at once: it is free again when this exchange ends.
            self.put(address, sender);
            match answer.await {
                Ok(response) => return Ok(response),
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => {
                        dispatched.store(false, Ordering::SeqCst);
                        request = unsent;
                        reused = false;
                        sender = connect(address).await?;
                    }
                    Some(_) => {
                        return Err(UpstreamError::Unreachable(describe(&error.into_error())));
                    }
                    // The request's own body failed: the sender's doing.
                    None if error.error().is_user() => {
                        return Err(UpstreamError::SenderBody(describe(&error.into_error())));
                    }
                    // hyper gives the request back only when none of it was written.
                    None => return Err(UpstreamError::Dropped(describe(&error.into_error()))),
                },
            }
        }
    }

    /// A free connection to `address` that has not idled too long. One pass: the closed
    /// and expired ones are left to the reaper (a closed one is never free).
    fn take_free(&self, address: &str) -> Option<SendRequest<ProxyBody>> {
        let now = Instant::now();
        let mut connections = self.shared.lock();
        let free = connections.open.iter().position(|connection| {
            &*connection.address == address
                && connection.sender.is_ready()
                && !connection.expired(now)
        })?;
        Some(connections.open.swap_remove(free).sender)
    }

    fn put(&self, address: &Arc<str>, sender: SendRequest<ProxyBody>) {
        let mut connections = self.shared.lock();
        connections.open.push(Connection {
            address: Arc::clone(address),
            sender,
            last_sent: Instant::now(),
        });
        if !connections.reaping {
            connections.reaping = true;
            tokio::spawn(reap(Arc::downgrade(&self.shared)));
        }
    }

    /// How many connections are open (free or busy).
    #[cfg(test)]
    fn open(&self) -> usize {
        self.shared.lock().open.len()
    }
}

/// Every [`IDLE_TIMEOUT`], drops a pool's closed and idle connections, until it has none.
async fn reap(shared: Weak<Mutex<Connections>>) {
    loop {
        tokio::time::sleep(IDLE_TIMEOUT).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut connections = shared.lock();
        connections.prune(Instant::now());
        if connections.open.is_empty() {
            connections.reaping = false;
            return;
        }
    }
}

/// Opens a connection and starts the task that drives it.
async fn connect(address: &str) -> Result<SendRequest<ProxyBody>, UpstreamError> {
    let unreachable = |error: &dyn std::error::Error| {
        UpstreamError::Unreachable(format!("connecting to {address}: {}", describe(error)))
    };
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err(unreachable(&error)),
        Err(elapsed) => return Err(unreachable(&elapsed)),
    };
    stream
        .set_nodelay(true)
        .map_err(|error| unreachable(&error))?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| unreachable(&error))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream connection ended");
        }
    });
    Ok(sender)
}

/// An error with its causes, which hold the useful part ("connection refused").
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::body::empty;

    #[derive(Clone, Copy, PartialEq)]
    enum Upstream {
        /// Answers each request.
        KeepsAlive,
        /// Its answer on the first connection never ends (so that connection stays busy).
        HoldsFirst,
    }

    /// An HTTP/1 upstream that answers `200` with the number of the connection a request
    /// came on.
    async fn upstream(behaviour: Upstream) -> (Arc<str>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: Arc<str> = listener.local_addr().unwrap().to_string().into();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let number = counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while stream.read(&mut byte).await.unwrap_or(0) == 1 {
                        head.push(byte[0]);
                        if !head.ends_with(b"\r\n\r\n") {
                            continue;
                        }
                        head.clear();
                        let answer = if behaviour == Upstream::HoldsFirst && number == 0 {
                            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n0".to_owned()
                        } else {
                            format!("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{number}")
                        };
                        stream.write_all(answer.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        (address, accepted)
    }

    fn request() -> Request<ProxyBody> {
        Request::post("/x")
            .header("host", "app")
            .body(empty())
            .unwrap()
    }

    async fn connection_number(response: Response<Incoming>) -> String {
        use http_body_util::BodyExt;
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_free_connection_is_reused_and_a_busy_one_is_not() {
        let (address, accepted) = upstream(Upstream::HoldsFirst).await;
        let pool = Pool::default();
        // The first answer never ends: its connection stays busy.
        let first = pool
            .send(&address, request(), &AtomicBool::default())
            .await
            .unwrap();
        for _ in 0..5 {
            let next = pool
                .send(&address, request(), &AtomicBool::default())
                .await
                .unwrap();
            assert_eq!(connection_number(next).await, "1");
            tokio::task::yield_now().await;
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "one new connection, reused"
        );
        assert_eq!(pool.open(), 2);
        drop(first);
    }

    #[tokio::test]
    async fn connections_go_to_their_own_upstream() {
        let (one, _) = upstream(Upstream::KeepsAlive).await;
        let (two, accepted_by_two) = upstream(Upstream::KeepsAlive).await;
        let pool = Pool::default();
        connection_number(
            pool.send(&one, request(), &AtomicBool::default())
                .await
                .unwrap(),
        )
        .await;
        tokio::task::yield_now().await;
        connection_number(
            pool.send(&two, request(), &AtomicBool::default())
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            accepted_by_two.load(Ordering::SeqCst),
            1,
            "the connection to the first upstream is not used for the second"
        );
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let (address, accepted) = upstream(Upstream::KeepsAlive).await;
        let pool = Pool::default();
        connection_number(
            pool.send(&address, request(), &AtomicBool::default())
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(pool.open(), 1);
        tokio::time::sleep(IDLE_TIMEOUT * 3).await;
        assert_eq!(pool.open(), 0, "closed without a new request");
        connection_number(
            pool.send(&address, request(), &AtomicBool::default())
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection");
    }

    #[tokio::test]
    async fn a_connection_idle_too_long_is_not_reused_before_the_reaper_drops_it() {
        let (address, accepted) = upstream(Upstream::KeepsAlive).await;
        let pool = Pool::default();
        connection_number(
            pool.send(&address, request(), &AtomicBool::default())
                .await
                .unwrap(),
        )
        .await;
        tokio::task::yield_now().await;
        // As if it had idled past the timeout; the reaper's first round is a second away.
        pool.shared.lock().open[0].last_sent =
            Instant::now().checked_sub(IDLE_TIMEOUT * 2).unwrap();
        let next = pool
            .send(&address, request(), &AtomicBool::default())
            .await
            .unwrap();
        assert_eq!(
            connection_number(next).await,
            "1",
            "sent on a new connection"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_on_a_connection_closed_before_it_was_written_goes_on_a_new_one() {
        let (address, accepted) = upstream(Upstream::KeepsAlive).await;
        let pool = Pool::default();
        // A pooled connection whose task has ended: the request cannot be written on it.
        let stream = TcpStream::connect(&*address).await.unwrap();
        let (closed, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        drop(connection);
        let answer = pool
            .exchange(&address, closed, true, request(), &AtomicBool::default())
            .await
            .unwrap();
        assert_eq!(
            connection_number(answer).await,
            "1",
            "sent on a new connection"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // A connection just opened is not given a second chance.
        let stream = TcpStream::connect(&*address).await.unwrap();
        let (closed, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        drop(connection);
        let failed = pool
            .exchange(&address, closed, false, request(), &AtomicBool::default())
            .await;
        assert!(matches!(failed, Err(UpstreamError::Unreachable(_))));
    }

    #[tokio::test]
    async fn a_connection_closed_after_the_request_went_out_is_told_apart() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: Arc<str> = listener.local_addr().unwrap().to_string().into();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            // The whole request arrives; the connection closes without an answer.
            let _ = read_request_head(&mut stream).await;
        });
        let pool = Pool::default();
        let failed = pool.send(&address, request(), &AtomicBool::default()).await;
        assert!(
            matches!(failed, Err(UpstreamError::Dropped(_))),
            "{failed:?}"
        );
    }

    async fn read_request_head(stream: &mut TcpStream) -> Vec<u8> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        head
    }

    #[tokio::test]
    async fn an_unreachable_upstream_is_named_with_the_cause() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: Arc<str> = listener.local_addr().unwrap().to_string().into();
        drop(listener);
        let pool = Pool::default();
        let Err(UpstreamError::Unreachable(text)) =
            pool.send(&address, request(), &AtomicBool::default()).await
        else {
            panic!("expected an unreachable upstream");
        };
        assert!(text.contains(&*address), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }
}
