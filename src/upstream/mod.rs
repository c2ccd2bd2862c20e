//! The way to the application: a pool of HTTP/1 connections per worker ([`pool`]), the
//! rewriting of a sender's request into the upstream's (hop-by-hop headers dropped,
//! `X-Forwarded-*` and `Dedupe-Key` set, a sender's `Dedupe-Key` and `Dedupe-Stale`
//! removed) and of the upstream's answer back, and the three ways a forward fails:
//! unreachable (502), connection lost after the request went out (502), or too slow (504).

mod error;
mod pool;

pub use error::UpstreamError;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::header::{CONNECTION, HOST, HeaderName};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Request, Response, Uri, Version};
use hyper::body::Incoming;

use self::pool::Pool;
use crate::body::{ProxyBody, streaming};
use crate::values::UpstreamUrl;
use crate::workers::PerWorker;

/// The header that carries the event's key to the upstream.
pub(crate) static DEDUPE_KEY: HeaderName = HeaderName::from_static("dedupe-key");

/// Told to the app with a stale event (`order:` with `on_stale: mark`): the newest version
/// done for its entity. Only the proxy sets it; a sender's is removed.
pub(crate) static DEDUPE_STALE: HeaderName = HeaderName::from_static("dedupe-stale");

/// A queued delivery's attempt number, 1 for the first: above 1, the app may have seen
/// the event. Only the proxy sets it.
pub(crate) static DEDUPE_ATTEMPT: HeaderName = HeaderName::from_static("dedupe-attempt");

/// When the proxy accepted a queued event (RFC 3339, UTC). Only the proxy sets it.
pub(crate) static DEDUPE_RECEIVED_AT: HeaderName = HeaderName::from_static("dedupe-received-at");

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Headers that describe one connection, not the message (RFC 9110 section 7.6.1), so a
/// proxy must not pass them on; headers named in `Connection` are dropped as well.
static HOP_BY_HOP: [HeaderName; 6] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("te"),
    HeaderName::from_static("transfer-encoding"),
    HeaderName::from_static("upgrade"),
];

/// The connections that carry every forward, a pool per worker: a connection is driven
/// by a task on the worker that opened it, so a pool shared by the workers would make most
/// forwards wake another thread.
pub struct Upstream {
    pools: PerWorker<Pool>,
}

impl Upstream {
    pub fn new(workers: usize) -> Upstream {
        let each = (0..workers).map(|_| Pool::default()).collect();
        Upstream {
            pools: PerWorker::new(Pool::default(), each),
        }
    }

    /// Sends `request` (made by [`outbound`]) to the upstream at `address` (its
    /// [`UpstreamUrl::address`]) and waits at most `timeout` for the answer's head.
    /// `dispatched` is set once the request is handed to a connection: from then on the
    /// application may see it, so a timeout is [`UpstreamError::Timeout`]; before, the
    /// time went in connecting, and it is [`UpstreamError::Unreachable`].
    pub async fn send(
        &self,
        address: &Arc<str>,
        request: Request<ProxyBody>,
        timeout: Duration,
        dispatched: &AtomicBool,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let pool = self.pools.get();
        match tokio::time::timeout(timeout, pool.send(address, request, dispatched)).await {
            Ok(answer) => answer,
            Err(_) if dispatched.load(Ordering::SeqCst) => Err(UpstreamError::Timeout(timeout)),
            Err(_) => Err(UpstreamError::Unreachable(format!(
                "no connection to {address} within {timeout:?}"
            ))),
        }
    }
}

/// Why a request cannot be forwarded as it is (the sender gets 400).
#[derive(Debug, thiserror::Error)]
#[error("the request target `{0}` cannot be forwarded")]
pub struct UnforwardableTarget(String);

/// Rewrites a sender's request for the upstream at `upstream`: in origin form, below the
/// upstream's base path. Fails only for a target that has no path of its own (the
/// authority form of `CONNECT`, say).
pub fn outbound(
    head: http::request::Parts,
    body: ProxyBody,
    upstream: &UpstreamUrl,
    peer: SocketAddr,
    dedupe_key: Option<&str>,
) -> Result<Request<ProxyBody>, UnforwardableTarget> {
    Ok(Forwardable::check(head, upstream)?.build(body, upstream, peer, dedupe_key))
}

/// A sender's request head whose target the upstream can be given, not yet rewritten:
/// a delivery checks its target before the claim (what cannot be forwarded claims
/// nothing) and builds the request only once claimed (a duplicate never needs it).
pub struct Forwardable {
    head: http::request::Parts,
    target: Uri,
}

impl Forwardable {
    /// Fails for a target that has no path of its own (see [`outbound`]).
    pub fn check(
        head: http::request::Parts,
        upstream: &UpstreamUrl,
    ) -> Result<Forwardable, UnforwardableTarget> {
        let target = origin_form(&head.uri, &upstream.base_path)?;
        Ok(Forwardable { head, target })
    }

    /// The request's head as the sender sent it.
    pub fn head(&self) -> &http::request::Parts {
        &self.head
    }

    /// The request for the upstream at `upstream` (the one it was checked for).
    pub fn build(
        self,
        body: ProxyBody,
        upstream: &UpstreamUrl,
        peer: SocketAddr,
        dedupe_key: Option<&str>,
    ) -> Request<ProxyBody> {
        let Forwardable { mut head, target } = self;
        let original_host = head.headers.get(HOST).cloned().or_else(|| {
            head.uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        head.uri = target;
        let headers = &mut head.headers;
        strip_hop_by_hop(headers);
        // Only the proxy may tell the upstream an event's key or staleness, under any
        // spelling a server might read as its header.
        remove_proxy_headers(headers);
        if let Some(key) = dedupe_key.and_then(|key| HeaderValue::from_str(key).ok()) {
            headers.insert(DEDUPE_KEY.clone(), key);
        }
        append_forwarded_for(headers, peer);
        if !headers.contains_key(&X_FORWARDED_PROTO) {
            headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
        }
        if let Some(host) = &original_host {
            if !headers.contains_key(&X_FORWARDED_HOST) {
                headers.insert(X_FORWARDED_HOST.clone(), host.clone());
            }
            // The application sees the Host the sender used (an HTTP/2 sender has none).
            headers.entry(HOST).or_insert_with(|| host.clone());
        } else if let Ok(upstream_host) = HeaderValue::from_str(&upstream.authority) {
            headers.insert(HOST, upstream_host);
        }
        head.version = Version::HTTP_11;
        Request::from_parts(head, body)
    }
}

/// `target` as the upstream receives it: `base_path`, then the path (`/` for an absolute
/// target that has none), then the query.
fn origin_form(target: &Uri, base_path: &str) -> Result<Uri, UnforwardableTarget> {
    let unforwardable = || UnforwardableTarget(target.to_string());
    // `path()` is `/` for an absolute target with an empty path, `*` for the asterisk form.
    let path = target.path();
    if !path.starts_with('/') && path != "*" {
        return Err(unforwardable());
    }
    let mut origin = String::with_capacity(
        base_path.len() + path.len() + 1 + target.query().map_or(0, str::len),
    );
    origin.push_str(base_path);
    origin.push_str(path);
    if let Some(query) = target.query() {
        origin.push('?');
        origin.push_str(query);
    }
    let path_and_query = PathAndQuery::try_from(origin).map_err(|_| unforwardable())?;
    Ok(Uri::from(path_and_query))
}

/// The headers only the proxy tells the application: an event's key, (`order:`) the
/// newest version done for its entity, and (`delivery: queued`) the attempt's number and
/// when the event was accepted.
static PROXY_HEADERS: [&HeaderName; 4] = [
    &DEDUPE_KEY,
    &DEDUPE_STALE,
    &DEDUPE_ATTEMPT,
    &DEDUPE_RECEIVED_AT,
];

/// Removes the proxy's own headers and every name a server would read as one: CGI-style
/// servers (Rack, older gunicorn) turn `Dedupe_Key` into the same `HTTP_DEDUPE_KEY`
/// variable as `Dedupe-Key`.
fn remove_proxy_headers(headers: &mut HeaderMap) {
    let spelled_as_ours = |name: &HeaderName| {
        let sent = name.as_str().as_bytes();
        PROXY_HEADERS.iter().any(|ours| {
            let ours = ours.as_str().as_bytes();
            sent.len() == ours.len()
                && sent
                    .iter()
                    .zip(ours)
                    .all(|(&sent, &ours)| sent == ours || (sent == b'_' && ours == b'-'))
        })
    };
    let named: Vec<HeaderName> = headers
        .keys()
        .filter(|name| spelled_as_ours(name))
        .cloned()
        .collect();
    for name in named {
        headers.remove(name);
    }
}

/// Rewrites the upstream's answer for the sender: its body streams through, and it
/// goes out in the sender's HTTP version, not the upstream's (an HTTP/1.0 application
/// must not turn the sender's keep-alive connection into a close-delimited one).
pub(crate) fn inbound(response: Response<Incoming>) -> Response<ProxyBody> {
    let (mut head, body) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    head.version = Version::default();
    Response::from_parts(head, streaming(body))
}

/// Removes the hop-by-hop headers, and the headers `Connection` names: a proxy never
/// passes them on (RFC 9110 section 7.6.1), so the app never reads them.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One look at each name finds what to remove: most messages carry none, or only
    // `Connection: keep-alive`, and each removal hashes its name.
    let mut doomed: Vec<HeaderName> = Vec::new();
    for name in headers.keys().filter(|name| HOP_BY_HOP.contains(name)) {
        doomed.push(name.clone());
    }
    if doomed.is_empty() {
        return;
    }
    // Read as bytes: one odd byte in a line must not hide the names beside it.
    let named = headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&byte| byte == b','))
        .filter_map(|name| HeaderName::from_bytes(name.trim_ascii()).ok());
    doomed.extend(named.collect::<Vec<_>>());
    for name in doomed {
        headers.remove(name);
    }
}

/// Appends the sender's address to `X-Forwarded-For`, as one line: the values of every line
/// the sender sent, in order (several lines of a header are one list, RFC 9110 section
/// 5.3), then the peer. A front proxy that added a line of its own keeps it.
fn append_forwarded_for(headers: &mut HeaderMap, peer: SocketAddr) {
    let mut list: Vec<u8> = Vec::new();
    for line in headers.get_all(&X_FORWARDED_FOR) {
        let line = line.as_bytes().trim_ascii();
        if !line.is_empty() {
            list.extend_from_slice(line);
            list.extend_from_slice(b", ");
        }
    }
    let mut ip = String::with_capacity(15);
    push_ip(&mut ip, peer.ip());
    list.extend_from_slice(ip.as_bytes());
    // From header values and an address, so it is a valid value; a failure keeps the lines.
    if let Ok(value) = HeaderValue::from_bytes(&list) {
        headers.insert(X_FORWARDED_FOR.clone(), value);
    }
}

/// Appends `ip` as `Display` writes it, without the formatting machinery for the common
/// IPv4 case: it cost more than the rest of the header's making (docs/performance.md,
/// "The hot path, lean again").
pub(crate) fn push_ip(text: &mut String, ip: std::net::IpAddr) {
    let std::net::IpAddr::V4(v4) = ip else {
        text.push_str(&ip.to_string());
        return;
    };
    let mut digits = itoa::Buffer::new();
    for (index, octet) in v4.octets().into_iter().enumerate() {
        if index > 0 {
            text.push('.');
        }
        text.push_str(digits.format(octet));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::empty;

    fn request(headers: &[(&str, &str)], uri: &str) -> http::request::Parts {
        let mut builder = Request::post(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn rewrites_headers_and_uri() {
        let head = request(
            &[
                ("host", "hooks.example.com"),
                ("connection", "keep-alive, x-private"),
                ("x-private", "1"),
                ("keep-alive", "timeout=5"),
                ("x-forwarded-for", "203.0.113.9"),
                ("dedupe-key", "forged"),
                ("stripe-signature", "t=1,v1=abc"),
            ],
            "/webhooks/stripe?x=1",
        );
        let upstream: UpstreamUrl = "http://127.0.0.1:8080/app".parse().unwrap();
        let peer: SocketAddr = "10.0.0.5:4321".parse().unwrap();
        let out = outbound(head, empty(), &upstream, peer, Some("evt_1")).unwrap();
        assert_eq!(out.uri(), "/app/webhooks/stripe?x=1");
        let h = out.headers();
        assert_eq!(h["host"], "hooks.example.com");
        assert_eq!(h["x-forwarded-host"], "hooks.example.com");
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.5");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["dedupe-key"], "evt_1");
        assert_eq!(h["stripe-signature"], "t=1,v1=abc");
        for gone in ["connection", "x-private", "keep-alive"] {
            assert!(!h.contains_key(gone), "{gone} should be dropped");
        }
    }

    #[test]
    fn every_name_connection_lists_is_dropped_even_beside_an_odd_byte() {
        let mut headers = HeaderMap::new();
        let odd = HeaderValue::from_bytes(b"x-private, \x80caf\xe9,  X-Other ").unwrap();
        headers.append(CONNECTION, odd);
        headers.append(CONNECTION, HeaderValue::from_static("upgrade"));
        for name in ["x-private", "x-other", "upgrade", "te", "x-kept"] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn an_address_reads_as_display_writes_it() {
        for ip in [
            "0.0.0.0",
            "10.20.3.4",
            "255.255.255.255",
            "::1",
            "::ffff:1.2.3.4",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut text = String::new();
            push_ip(&mut text, ip);
            assert_eq!(text, ip.to_string());
        }
    }

    /// `head` rewritten for `upstream` without a key.
    fn unkeyed(head: http::request::Parts, upstream: &str) -> Request<ProxyBody> {
        let upstream: UpstreamUrl = upstream.parse().unwrap();
        let peer = "127.0.0.1:1".parse().unwrap();
        outbound(head, empty(), &upstream, peer, None).unwrap()
    }

    #[test]
    fn a_request_without_host_gets_the_upstreams() {
        let out = unkeyed(request(&[], "/x?y=1"), "http://app:3000");
        assert_eq!(out.headers()["host"], "app:3000");
        assert!(!out.headers().contains_key("x-forwarded-host"));
        assert_eq!(out.uri(), "/x?y=1");
    }

    #[test]
    fn every_request_target_form_goes_out_in_origin_form() {
        for (target, expected) in [
            ("http://other.example/x?y=1", "/app/x?y=1"),
            // An absolute target with an empty path and a query: the path is `/`.
            ("http://x?a=1", "/app/?a=1"),
            ("http://x", "/app/"),
            ("*", "/app*"),
        ] {
            let out = unkeyed(request(&[], target), "http://127.0.0.1:1/app");
            assert_eq!(out.uri(), expected, "{target}");
        }
        let out = unkeyed(request(&[], "*"), "http://127.0.0.1:1");
        assert_eq!(out.uri(), "*");
        let out = unkeyed(request(&[], "http://x?a=1"), "http://127.0.0.1:1");
        assert_eq!(out.uri(), "/?a=1");
    }

    #[test]
    fn a_target_without_a_path_is_refused_not_a_panic() {
        let upstream: UpstreamUrl = "http://127.0.0.1:1/app".parse().unwrap();
        let peer = "127.0.0.1:1".parse().unwrap();
        let refused = outbound(
            request(&[], "example.com:443"),
            empty(),
            &upstream,
            peer,
            None,
        );
        assert!(refused.is_err());
    }

    #[test]
    fn every_forwarded_for_line_is_kept_in_order_then_the_peer() {
        let head = request(
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2, 3.3.3.3"),
                ("x-forwarded-for", " "),
            ],
            "/x",
        );
        let out = unkeyed(head, "http://127.0.0.1:1");
        let lines: Vec<_> = out.headers().get_all("x-forwarded-for").iter().collect();
        assert_eq!(lines, ["1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"]);
    }

    #[test]
    fn every_spelling_a_server_reads_as_the_proxys_headers_is_dropped() {
        let head = request(
            &[
                ("dedupe_key", "forged"),
                ("Dedupe_Key", "forged"),
                ("dedupe-key", "forged"),
                ("dedupe-stale", "forged"),
                ("Dedupe_Stale", "forged"),
                ("dedupe_status", "kept"),
                ("x-dedupe_key", "kept"),
            ],
            "/x",
        );
        let upstream: UpstreamUrl = "http://127.0.0.1:1".parse().unwrap();
        let peer = "127.0.0.1:1".parse().unwrap();
        let out = outbound(head, empty(), &upstream, peer, Some("evt_1")).unwrap();
        let h = out.headers();
        assert!(!h.contains_key("dedupe_key"));
        assert!(!h.contains_key("dedupe-stale") && !h.contains_key("dedupe_stale"));
        assert_eq!(
            h.get_all("dedupe-key").iter().collect::<Vec<_>>(),
            ["evt_1"]
        );
        assert_eq!(h["dedupe_status"], "kept");
        assert_eq!(h["x-dedupe_key"], "kept");
    }

    #[test]
    fn forged_key_header_is_dropped_without_a_key() {
        let out = unkeyed(
            request(&[("dedupe-key", "forged")], "/x"),
            "http://127.0.0.1:1",
        );
        assert!(!out.headers().contains_key("dedupe-key"));
    }
}
