//! Raw sockets: requests written byte by byte, and an upstream that answers by hand.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

/// Writes `request` on a fresh connection and reads until the proxy closes it (or 5 s).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// An upstream written byte by byte: `handle` gets each accepted connection, so a test
/// can misbehave in ways a well-made HTTP server cannot.
pub async fn raw_upstream<H, F>(handle: H) -> SocketAddr
where
    H: Fn(tokio::net::TcpStream) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handle(stream));
        }
    });
    addr
}

/// Reads a request head (through the blank line) from a raw connection.
pub async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}
