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

/// Reads a request's head, then as many bytes of body as its `Content-Length` says; the
/// head, or `None` if the connection ended first.
pub async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let head = read_head(stream).await?;
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(head)
}

/// The HTTP/2 connection preface, and a client SETTINGS frame (empty) after it.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const EMPTY_SETTINGS: &[u8] = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// An HTTP/2 frame: its 9-byte head, then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A POST of `{"id":"<id>"}` to `/hooks` on `stream`, written as frames by hand (HPACK:
/// `:method POST`, `:scheme http` from the static table, `:path` and `:authority` as
/// literals).
pub fn raw_h2_post(stream: u32, id: &str) -> Vec<u8> {
    let mut headers = vec![0x83, 0x86, 0x04, 6];
    headers.extend_from_slice(b"/hooks");
    headers.extend_from_slice(&[0x01, 1, b'x']);
    let body = format!(r#"{{"id":"{id}"}}"#);
    [
        frame(1, 0x4, stream, &headers),
        frame(0, 0x1, stream, body.as_bytes()),
    ]
    .concat()
}
