//! Listeners: the accept loop shared by the proxy and admin ports (HTTP/1.1 and h2c on
//! one port), the limits that bound what one sender can cost (open connections, time and
//! bytes to send a request head), the hand-off of each connection to a worker, and the
//! graceful close of connections within a deadline.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::body::ProxyBody;
use crate::config::Limits;
use crate::response::Refusal;
use crate::workers::Workers;

/// The answer to a connection over `max_connections`, written before closing it.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 77\r\n\r\n\
{\"error\":\"too_many_connections\",\"detail\":\"connection limit reached; retry\"}";

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
    H: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper ignores a header timeout unless it has a timer. The timeout also bounds how
    // long an idle keep-alive connection waits for its next request.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout.0)
        .max_buf_size(usize::try_from(limits.max_header_bytes.0).unwrap_or(usize::MAX));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
    let connections = GracefulShutdown::new();
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
            tokio::spawn(refuse(stream));
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
        let (handler, requests) = (handler.clone(), Arc::clone(&requests));
        let (builder, watcher) = (builder.clone(), connections.watcher());
        let first_byte_timeout = limits.header_read_timeout.0;
        workers.spawn(async move {
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%peer, %error, "cannot register the connection");
                    return;
                }
            };
            // hyper's header timer starts with the first byte: a connection that never
            // sends one would hold its slot forever.
            let mut first = [0u8; 1];
            match tokio::time::timeout(first_byte_timeout, stream.peek(&mut first)).await {
                Ok(Ok(read)) if read > 0 => {}
                _ => return,
            }
            let service = service_fn(move |request| {
                // Shed load at once rather than queue it: the sender retries later.
                let permit = Arc::clone(&requests).try_acquire_owned();
                let answer = permit.is_ok().then(|| handler(request, peer));
                async move {
                    let response = match answer {
                        Some(answer) => answer.await,
                        None => Refusal::Overloaded.into_response(),
                    };
                    drop(permit);
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, connections.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open when the shutdown grace ended");
    }
}

/// Tells a connection over the limit why it is closed, without reading from it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(TOO_MANY_CONNECTIONS),
    )
    .await;
    let _ = stream.shutdown().await;
}
