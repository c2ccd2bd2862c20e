//! How fast an HTTP/2 peer may make a port work. A connection that opens with HTTP/2's
//! preface has a budget of frames (every frame but a DATA frame of 1 KiB or more, or one
//! that ends its stream: those cost what their bytes cost, which flow control bounds),
//! refilled at a steady rate;
//! once it is spent, the connection is read no further until the budget refills. A flood
//! of SETTINGS or PINGs (each asks for an answer), resets, empty frames or refused streams
//! then costs the flooder time, not the other connections, while a peer within the budget
//! never notices. hyper and h2 bound what such frames hold in memory, but not how fast a
//! peer may send them; this bounds that, without parsing more than each frame's head.
//! An HTTP/1 connection is passed through after its first bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Frames a connection may send per second: far above what a client or a load balancer
/// sends on one connection besides its requests' data.
pub const FRAMES_PER_SECOND: f64 = 1000.0;

/// Frames a connection may send at once after a quiet spell (a new connection too), so
/// that opening one and its streams costs little more than a steady stream of them.
pub const BURST: f64 = 16.0;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A DATA frame shorter than this (padding included) counts against the budget, unless
/// it ends its stream: a body sent a byte a frame costs what a flood of empty frames does.
const SMALL_DATA: u32 = 1024;
const END_STREAM: u8 = 0x1;

/// A connection's stream, read within its frame budget.
pub struct FrameBudget<S> {
    inner: S,
    reading: Reading,
    tokens: f64,
    refilled: Instant,
    wait: Option<Pin<Box<Sleep>>>,
}

/// Where the reading of the connection's bytes is.
#[derive(Debug, PartialEq)]
enum Reading {
    /// This many bytes of the preface seen so far.
    Preface(usize),
    /// Not HTTP/2: passed through.
    Plain,
    /// HTTP/2 frames: `have` bytes of the next frame's 9-byte head, or the rest of a
    /// payload to pass over.
    Frames {
        head: [u8; 9],
        have: usize,
        payload_left: u32,
    },
}

impl Reading {
    /// Reads `bytes`, the next ones of the connection, and says how many frames that
    /// count against the budget began in them.
    fn scan(&mut self, mut bytes: &[u8]) -> u32 {
        let mut counted = 0;
        loop {
            match self {
                Reading::Plain => return counted,
                Reading::Preface(seen) => {
                    let n = (PREFACE.len() - *seen).min(bytes.len());
                    if bytes[..n] != PREFACE[*seen..*seen + n] {
                        *self = Reading::Plain;
                        return counted;
                    }
                    *seen += n;
                    bytes = &bytes[n..];
                    if *seen < PREFACE.len() {
                        return counted;
                    }
                    *self = Reading::Frames {
                        head: [0; 9],
                        have: 0,
                        payload_left: 0,
                    };
                }
                Reading::Frames {
                    head,
                    have,
                    payload_left,
                } => {
                    if *payload_left > 0 {
                        let n = (*payload_left as usize).min(bytes.len());
                        *payload_left -= n as u32;
                        bytes = &bytes[n..];
                    }
                    if bytes.is_empty() {
                        return counted;
                    }
                    let n = (9 - *have).min(bytes.len());
                    head[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have < 9 {
                        return counted;
                    }
                    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]);
                    let (kind, flags) = (head[3], head[4]);
                    // A DATA frame is free when it carries a share of data worth its head
                    // (or ends its stream); padding is not data.
                    let carries = kind == 0 && (length >= SMALL_DATA || flags & END_STREAM != 0);
                    if !carries {
                        counted += 1;
                    }
                    *have = 0;
                    *payload_left = length;
                }
            }
        }
    }
}

impl<S> FrameBudget<S> {
    pub fn new(inner: S) -> FrameBudget<S> {
        FrameBudget {
            inner,
            reading: Reading::Preface(0),
            tokens: BURST,
            refilled: Instant::now(),
            wait: None,
        }
    }

    /// Takes `frames` from the budget; one spent waits until a frame's worth is back.
    fn spend(&mut self, frames: u32) {
        let now = Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * FRAMES_PER_SECOND;
        self.tokens = (self.tokens + refill).min(BURST) - f64::from(frames);
        self.refilled = now;
        if self.tokens < 0.0 {
            let owed = Duration::from_secs_f64((1.0 - self.tokens) / FRAMES_PER_SECOND);
            self.wait = Some(Box::pin(tokio::time::sleep(owed)));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameBudget<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.reading == Reading::Plain {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        if let Some(wait) = &mut this.wait {
            ready!(wait.as_mut().poll(cx));
            this.wait = None;
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let frames = this.reading.scan(&buf.filled()[before..]);
        if frames > 0 {
            this.spend(frames);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameBudget<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let length = (payload.len() as u32).to_be_bytes();
        let mut frame = vec![length[1], length[2], length[3], kind, 0, 0, 0, 0, 1];
        frame.extend_from_slice(payload);
        frame
    }

    #[test]
    fn frames_are_counted_across_reads_and_data_is_passed_over() {
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(4, &[]));
        stream.extend(frame(0, &[7; 2000]));
        stream.extend(frame(0, &[]));
        stream.extend(frame(0, &[7; 100]));
        stream.extend(frame(6, &[0; 8]));
        for split in [1, 5, 9, 24, 40, stream.len()] {
            let mut reading = Reading::Preface(0);
            let counted: u32 = stream.chunks(split).map(|bytes| reading.scan(bytes)).sum();
            assert_eq!(counted, 4, "read {split} bytes at a time");
        }
    }

    #[test]
    fn http1_is_passed_through_after_its_first_bytes() {
        let mut reading = Reading::Preface(0);
        assert_eq!(reading.scan(b"POST /hooks HTTP/1.1\r\n"), 0);
        assert_eq!(reading, Reading::Plain);
        let mut reading = Reading::Preface(0);
        assert_eq!(reading.scan(b"PRI * HTTP/1.1\r\n"), 0);
        assert_eq!(reading, Reading::Plain);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_holds_the_next_read_until_it_refills() {
        let mut budget = FrameBudget::new(tokio::io::empty());
        budget.spend(BURST as u32 + 500);
        let wait = budget.wait.take().expect("spent");
        let started = Instant::now();
        wait.await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(500), "{waited:?}");
        assert!(waited <= Duration::from_millis(502), "{waited:?}");
    }
}
