//! What a request is addressed to, read the way the application behind the proxy reads it:
//! its host, checked as RFC 9112 section 3.2 asks, and its path in the normal form that
//! routes are matched on; and a name written as one segment of a path (`path_segment`).
//!
//! Frameworks fold many spellings of a path into one handler: Express ignores case and a
//! trailing slash, Rails folds repeated slashes, WSGI servers and Go decode `%2F`, Spring
//! drops `;` parameters, and every URL resolver removes dot segments. If a route matched
//! only the path as written, `/hooks//stripe` or `/Hooks/%73tripe` would reach the
//! application's webhook handler with no signature check and no claim. So routes match on
//! the normal form below, the loosest of those readings, and the request goes on with its
//! path as it was sent.

use std::borrow::Cow;

use http::header::{HOST, HeaderName};
use http::uri::Authority;
use http::{HeaderMap, Method, Uri, Version};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::method_override;

/// Why a request's target is refused (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the request has {0} Host header lines; it must have one")]
    HostCount(usize),
    #[error("the Host header is not a valid host")]
    BadHost,
    #[error("the Host header differs from the request's authority")]
    HostMismatch,
    /// A `..` segment, written or escaped: applications disagree on what it climbs out of
    /// (a framework that mounts a handler on a prefix would run `/hooks/stripe/..` as
    /// `/hooks/stripe`), so no reading of it is safe to route on.
    #[error("the path has a `..` segment")]
    ParentSegment,
    /// The authority form (`CONNECT host:port`): there is no path to route or forward.
    #[error("the request target has no path")]
    NoPath,
    /// An `X-Original-URL` or `X-Rewrite-URL` that is not a request target.
    #[error("a path override header is not a request target")]
    BadOverride,
    /// A control character in the path, written or escaped (`%00`): servers written in C
    /// may end the path there. Bidi and invisible format characters too: no route has
    /// them, and they would make the path read differently in a log or the console.
    #[error("the path has a control or formatting character")]
    ControlCharacter,
    /// An overlong UTF-8 spelling (`%C0%AF` for `/`, `%C0%AE` for `.`): decoders that
    /// accept them read a separator or a dot the route does not see.
    #[error("the path has an overlong UTF-8 spelling")]
    Overlong,
    /// No host named, where routes are limited to hosts: the app may serve the request as
    /// any of its hosts.
    #[error("the request names no host, and routes here are limited to hosts")]
    NoHost,
    /// More readings of one part than anyone sends (override headers, forwarded hosts).
    #[error(
        "the request names its method, host or path in more ways than are read ({MAX_READINGS})"
    )]
    TooManyReadings,
    /// Its readings lead to two routes: the app could run it as either, so no one route's
    /// check covers it.
    #[error(
        "the request reads as two different routes (through a method override, a rewritten URL or a forwarded host)"
    )]
    TwoRoutes,
    /// A POST whose body may name another method (`_method`), to a path a route takes
    /// under one, in a form not read for it ([`crate::method_override::Unreadable`]).
    #[error(
        "the body may name another method (`_method`) in a form the proxy does not read (encoded, multipart, JSON that does not parse, a charset other than UTF-8) for a path a route takes under another method"
    )]
    UnreadableOverride,
}

/// The host a request is for: its `Host` header, or an HTTP/2 request's `:authority`.
/// `None` only for an HTTP/1.0 request without a `Host`. A request that names its host
/// twice (an absolute-form target, or HTTP/2's `:authority`, beside a `Host`) must name
/// the same one: RFC 9112 has a server read the target's and ignore `Host`, while an
/// application behind a proxy reads `Host`, so two names would be two readings.
pub fn host<'a>(
    version: Version,
    uri: &'a Uri,
    headers: &'a HeaderMap,
) -> Result<Option<&'a str>, TargetError> {
    let mut lines = headers.get_all(HOST).iter();
    let header = match (lines.next(), lines.next()) {
        (None, _) => None,
        (Some(value), None) => Some(value.to_str().map_err(|_| TargetError::BadHost)?),
        (Some(_), Some(_)) => {
            return Err(TargetError::HostCount(headers.get_all(HOST).iter().count()));
        }
    };
    let authority = uri.authority().map(Authority::as_str);
    if authority.is_some_and(|authority| authority.contains('@')) {
        return Err(TargetError::BadHost);
    }
    match (header, authority) {
        (Some(header), _) if !is_valid_host(header) => Err(TargetError::BadHost),
        (Some(header), Some(authority)) if !same_authority(header, authority, uri.scheme_str()) => {
            Err(TargetError::HostMismatch)
        }
        (Some(header), _) => Ok(Some(header)),
        (None, Some(authority)) => Ok(Some(authority)),
        (None, None) if version == Version::HTTP_11 => Err(TargetError::HostCount(0)),
        (None, None) => Ok(None),
    }
}

/// Whether two spellings of `host[:port]` name one host: case and a trailing dot aside, a
/// port left out is the scheme's own.
fn same_authority(a: &str, b: &str, scheme: Option<&str>) -> bool {
    let default_port = match scheme {
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => "443",
        _ => "80",
    };
    let with_port = |host: &str| match split_port(host) {
        (name, Some(port)) => (
            name.trim_end_matches('.').to_ascii_lowercase(),
            port.to_owned(),
        ),
        (name, None) => (
            name.trim_end_matches('.').to_ascii_lowercase(),
            default_port.to_owned(),
        ),
    };
    with_port(a) == with_port(b)
}

/// The most readings of a request's method, host or path (its own and those of headers
/// and the query): a sender with more is refused rather than tried against every route
/// in every combination.
pub(crate) const MAX_READINGS: usize = 8;

/// Headers that IIS rewriting, Symfony and Zend Framework read a request's path from.
static PATH_OVERRIDES: [HeaderName; 2] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
];

/// Everything an application behind the proxy may read a request as addressed to: the
/// method, host and path the request states, and the others that common frameworks take
/// from its headers or query instead. A route takes the request if it takes any of these
/// readings, so that no reading reaches the route's handler unchecked.
#[derive(Debug)]
pub struct Addressed<'a> {
    pub method: &'a Method,
    /// The host the request states ([`host`]).
    pub host: Option<&'a str>,
    /// The path's normal form ([`normal_path`]).
    pub path: Cow<'a, [u8]>,
    /// Methods named by override headers or a `_method` query parameter (and, once its
    /// body is read, a POST's `_method` field: [`method_override::body_methods`]).
    pub other_methods: Vec<Cow<'a, str>>,
    /// Hosts named by `X-Forwarded-Host` or `Forwarded: host=`.
    pub other_hosts: Vec<&'a str>,
    /// Normal paths named by `X-Original-URL` or `X-Rewrite-URL`.
    pub other_paths: Vec<Vec<u8>>,
}

/// How `request`'s target reads; `forwarded_hosts` says whether the hosts matter (some
/// route is limited to a host), and with them those of forwarding headers. Refuses what
/// [`host`] and [`normal_path`] refuse, in any reading; a request that names no host where
/// hosts matter; and more than [`MAX_READINGS`] readings of one part.
pub fn addressed<'a>(
    version: Version,
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    forwarded_hosts: bool,
) -> Result<Addressed<'a>, TargetError> {
    let host = host(version, uri, headers)?;
    if forwarded_hosts && host.is_none() {
        return Err(TargetError::NoHost);
    }
    let path = normal_path(uri.path())?;
    let mut other_methods: Vec<Cow<'a, str>> = method_override::header_methods(headers).collect();
    if let Some(query) = uri.query() {
        other_methods.extend(method_override::query_methods(query));
    }
    let other_hosts = if forwarded_hosts {
        forwarded_host_names(headers)
    } else {
        Vec::new()
    };
    let mut other_paths = Vec::new();
    for value in PATH_OVERRIDES.iter().flat_map(|name| headers.get_all(name)) {
        let text = value.to_str().map_err(|_| TargetError::BadOverride)?;
        let uri: Uri = text.parse().map_err(|_| TargetError::BadOverride)?;
        other_paths.push(normal_path(uri.path())?.into_owned());
    }
    if [other_methods.len(), other_hosts.len(), other_paths.len()]
        .iter()
        .any(|others| others + 1 > MAX_READINGS)
    {
        return Err(TargetError::TooManyReadings);
    }
    Ok(Addressed {
        method,
        host,
        path,
        other_methods,
        other_hosts,
        other_paths,
    })
}

impl Addressed<'_> {
    /// The same request, also read as `methods` (a POST body's `_method`), within
    /// [`MAX_READINGS`].
    pub fn with_methods(mut self, methods: Vec<String>) -> Result<Self, TargetError> {
        self.other_methods
            .extend(methods.into_iter().map(Cow::Owned));
        if self.other_methods.len() + 1 > MAX_READINGS {
            return Err(TargetError::TooManyReadings);
        }
        Ok(self)
    }

    /// Every method it may be read with: its own, then the overrides'.
    pub fn methods(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.method.as_str()).chain(self.other_methods.iter().map(|m| m.as_ref()))
    }

    /// Every host it may be read with.
    pub fn hosts(&self) -> impl Iterator<Item = Option<&str>> {
        std::iter::once(self.host).chain(self.other_hosts.iter().map(|host| Some(*host)))
    }

    /// Every normal path it may be read with.
    pub fn paths(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.path.as_ref()).chain(self.other_paths.iter().map(Vec::as_slice))
    }

    /// Whether it has no reading but its own.
    pub(crate) fn is_plain(&self) -> bool {
        self.other_methods.is_empty() && self.other_hosts.is_empty() && self.other_paths.is_empty()
    }
}

/// The hosts in `X-Forwarded-Host` (every line, every entry) and in `Forwarded`'s
/// `host=` parameters.
fn forwarded_host_names(headers: &HeaderMap) -> Vec<&str> {
    let listed = |name: &'static str| {
        headers
            .get_all(name)
            .into_iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
    };
    let forwarded = listed("forwarded")
        .flat_map(|element| element.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("host")
                .then(|| value.trim().trim_matches('"'))
        });
    listed("x-forwarded-host")
        .map(str::trim)
        .chain(forwarded)
        .filter(|host| !host.is_empty())
        .collect()
}

/// `host[:port]`, without user information; an empty host is allowed (RFC 9112 permits an
/// empty `Host` for a target without one).
fn is_valid_host(value: &str) -> bool {
    value.is_empty() || (!value.contains('@') && value.parse::<Authority>().is_ok())
}

/// The normal form of a path that routes are matched on: percent escapes decoded (again
/// while escapes remain, for servers that decode twice), `;` parameters dropped from each
/// segment, `\` read as `/`, trailing dots and spaces dropped from each segment (Windows
/// servers do), fullwidth ASCII read as ASCII, empty and `.` segments removed, ASCII letters lowercased, the last
/// segment's extension dropped (`/hooks/stripe.json` is Rails' `/hooks/stripe` with a
/// format), no trailing slash; always starts with `/`. A segment of dots only (`..`) is
/// refused, as is a control or formatting character, an overlong UTF-8 spelling, or a target without a path (`*` is the path `/*`).
/// Borrows the path when it is already in that form, as almost every real path is.
pub fn normal_path(path: &str) -> Result<Cow<'_, [u8]>, TargetError> {
    if !path.starts_with('/') && path != "*" {
        return Err(TargetError::NoPath);
    }
    if is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path.as_bytes()));
    }
    let mut segments = segments(path)?;
    // What the extension leaves may end in a space or a dot (`e .json`), trimmed as any
    // segment's are; a segment left empty goes, and the one before is the last.
    while let Some(last) = segments.last_mut() {
        strip_extension(last);
        last.truncate(untrimmed(last));
        if !last.is_empty() {
            break;
        }
        segments.pop();
    }
    Ok(Cow::Owned(joined(&segments)))
}

/// The normal form of a route's path with its last segment's extension kept
/// (`/webhook.php`, `/api/v1.2`), for the paths below it: a script's, which Apache, IIS
/// and PHP run with a PATH_INFO (`/webhook.php/anything`), and a prefix's, whose last
/// segment is no format. `None` where it would be the normal form itself.
pub fn with_extension(path: &str) -> Option<Vec<u8>> {
    let segments = segments(path).ok()?;
    let last = segments.last()?;
    let mut stripped = last.clone();
    strip_extension(&mut stripped);
    (stripped != *last).then(|| joined(&segments))
}

/// A host's name and its port, if it has one: `a.example:80`, `[::1]:80`. An IPv6 literal
/// keeps its brackets; only a port after them is split off.
pub(crate) fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => {
            (name, Some(port))
        }
        _ => (host, None),
    }
}

/// Whether `host` names the host `wanted` names: case aside, a trailing dot aside (a
/// resolver and the frameworks that check hosts read `example.com.` as `example.com`),
/// and a port that `wanted` leaves out aside.
pub(crate) fn same_host(wanted: &str, host: &str) -> bool {
    let (wanted_name, wanted_port) = split_port(wanted);
    let (name, port) = split_port(host);
    name.trim_end_matches('.')
        .eq_ignore_ascii_case(wanted_name.trim_end_matches('.'))
        && (wanted_port.is_none() || port == wanted_port)
}

/// The path's segments, each decoded and folded as [`normal_path`] says, the last one with
/// its extension.
fn segments(path: &str) -> Result<Vec<Vec<u8>>, TargetError> {
    let mut segments: Vec<Vec<u8>> = Vec::new();
    for written in path.split('/') {
        let written = written.split(';').next().unwrap_or_default();
        let mut decoded = halfwidth(decode_fully(written));
        if has_overlong(&decoded) {
            return Err(TargetError::Overlong);
        }
        let misleading = match std::str::from_utf8(&decoded) {
            Ok(text) => text.chars().any(crate::misleading::is_misleading),
            Err(_) => decoded.iter().any(u8::is_ascii_control),
        };
        if misleading {
            return Err(TargetError::ControlCharacter);
        }
        // A server that decodes before it splits off the query ends the path at an escaped
        // `?` (or `#`).
        let ends = decoded
            .iter()
            .position(|&byte| byte == b'?' || byte == b'#');
        if let Some(at) = ends {
            decoded.truncate(at);
        }
        for segment in decoded.split(|&byte| byte == b'/' || byte == b'\\') {
            let segment = segment
                .split(|&byte| byte == b';')
                .next()
                .unwrap_or_default();
            if segment.len() >= 2 && segment.iter().all(|&byte| byte == b'.') {
                return Err(TargetError::ParentSegment);
            }
            let segment = &segment[..untrimmed(segment)];
            if !segment.is_empty() {
                segments.push(fold_case(segment));
            }
        }
        if ends.is_some() {
            break;
        }
    }
    Ok(segments)
}

/// Whether `bytes` hold an overlong UTF-8 sequence's start: C0 and C1 can only start
/// one, E0 followed by 80-9F spells a 3-byte form of a 2-byte character, F0 followed by
/// 80-8F a 4-byte form of a 3-byte one.
fn has_overlong(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().any(|(at, &byte)| {
        let next = bytes.get(at + 1).copied().unwrap_or(0);
        matches!(byte, 0xC0 | 0xC1)
            || (byte == 0xE0 && (0x80..=0x9F).contains(&next))
            || (byte == 0xF0 && (0x80..=0x8F).contains(&next))
    })
}

/// Fullwidth ASCII (U+FF01 to U+FF5E: `／`, `．`, `Ｓ`) read as the ASCII it stands for, as
/// servers that normalize Unicode (NFKC) or map "best fit" read it.
fn halfwidth(decoded: Vec<u8>) -> Vec<u8> {
    let fullwidth = |c: char| ('\u{FF01}'..='\u{FF5E}').contains(&c);
    match std::str::from_utf8(&decoded) {
        Ok(text) if text.chars().any(fullwidth) => text
            .chars()
            .map(|c| {
                if fullwidth(c) {
                    char::from_u32(c as u32 - 0xFEE0).unwrap_or(c)
                } else {
                    c
                }
            })
            .collect::<String>()
            .into_bytes(),
        _ => decoded,
    }
}

/// How much of a segment is left once its trailing dots and spaces go (Windows and IIS
/// drop them).
fn untrimmed(segment: &[u8]) -> usize {
    segment.len()
        - segment
            .iter()
            .rev()
            .take_while(|&&byte| byte == b'.' || byte == b' ')
            .count()
}

/// How many times an escape is decoded at most: a server that decodes twice reads
/// `%2573` as `s`; a third round costs nothing and covers one more.
const DECODE_ROUNDS: usize = 3;

/// `written` percent-decoded until no escape is left, or [`DECODE_ROUNDS`] times.
fn decode_fully(written: &str) -> Vec<u8> {
    let written = decode_percent_u(written);
    let mut decoded: Vec<u8> = percent_encoding::percent_decode_str(&written).collect();
    for _ in 1..DECODE_ROUNDS {
        let again: Vec<u8> = percent_encoding::percent_decode(&decoded).collect();
        if again == decoded {
            break;
        }
        decoded = again;
    }
    decoded
}

/// `%uXXXX` escapes (a UTF-16 code unit), which IIS decodes by default, as the character.
fn decode_percent_u(written: &str) -> Cow<'_, str> {
    if !written.contains("%u") && !written.contains("%U") {
        return Cow::Borrowed(written);
    }
    let mut decoded = String::with_capacity(written.len());
    let mut rest = written;
    while let Some(at) = rest.find(['%']) {
        decoded.push_str(&rest[..at]);
        let escape = &rest[at..];
        let unit = escape
            .get(2..6)
            .filter(|_| escape[1..].starts_with(['u', 'U']))
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .and_then(char::from_u32);
        match unit {
            Some(character) => {
                decoded.push(character);
                rest = &escape[6..];
            }
            None => {
                decoded.push('%');
                rest = &escape[1..];
            }
        }
    }
    decoded.push_str(rest);
    Cow::Owned(decoded)
}

/// Drops a segment's extension: all from its first dot that follows another character
/// than a dot (`.well-known` and `..c` have none).
fn strip_extension(segment: &mut Vec<u8>) {
    if let Some(dot) = extension_at(segment) {
        segment.truncate(dot);
    }
}

fn extension_at(segment: &[u8]) -> Option<usize> {
    (1..segment.len()).find(|&at| segment[at] == b'.' && segment[at - 1] != b'.')
}

fn joined(segments: &[Vec<u8>]) -> Vec<u8> {
    let mut normal = Vec::with_capacity(segments.iter().map(|s| s.len() + 1).sum::<usize>());
    for segment in segments {
        normal.push(b'/');
        normal.extend_from_slice(segment);
    }
    if normal.is_empty() {
        normal.push(b'/');
    }
    normal
}

/// A segment with ASCII letters lowercased, and the few other letters whose case folds to
/// an ASCII one in Java and .NET (the Kelvin sign is `k`, the long s `s`, the dotless and
/// dotted I `i`), so that a case-insensitive framework cannot read a spelling the route
/// does not take.
fn fold_case(segment: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(segment) {
        Ok(text) if !text.is_ascii() => text
            .chars()
            .map(|c| match c {
                '\u{212A}' => 'k',
                '\u{017F}' => 's',
                '\u{0130}' | '\u{0131}' => 'i',
                c => c.to_ascii_lowercase(),
            })
            .collect::<String>()
            .into_bytes(),
        _ => segment.to_ascii_lowercase(),
    }
}

/// Whether `path` is its own normal form: plain lowercase ASCII, no empty, dot-only or
/// dot-ended segment, and no extension on the last one.
fn is_normal(path: &[u8]) -> bool {
    let plain =
        |byte: &u8| byte.is_ascii_graphic() && !matches!(byte, b'%' | b';' | b'\\' | b'A'..=b'Z');
    if path == b"/" {
        return true;
    }
    if path.first() != Some(&b'/') || !path.iter().all(plain) {
        return false;
    }
    let mut segments = path[1..].split(|&byte| byte == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        let bad = segment.is_empty()
            || segment.ends_with(b".")
            || (last && extension_at(segment).is_some());
        if bad {
            return false;
        }
    }
    true
}

/// Whether a normal path falls under a normal prefix: the prefix itself, or below it
/// segment by segment (`/hooks` takes `/hooks/a`, not `/hooksa`).
pub fn under(path: &[u8], prefix: &[u8]) -> bool {
    prefix == b"/"
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b'/'))
}

/// What a path segment escapes: all but RFC 3986's unreserved characters, and dots too,
/// so that no intermediary reads a key `..` as a dot segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');

/// `text` as one segment of a path, as the admin API takes it (a route's name, a key), as the API reads
/// it back once percent-decoded.
pub(crate) fn path_segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(path: &str) -> String {
        String::from_utf8(normal_path(path).unwrap().into_owned()).unwrap()
    }

    #[test]
    fn the_spellings_frameworks_fold_have_one_normal_form() {
        for variant in [
            "/hooks/sig",
            "/hooks/sig/",
            "//hooks/sig",
            "/hooks//sig",
            "/hooks/./sig",
            "/hooks/%73ig",
            "/hooks%2Fsig",
            "/hooks%2fsig",
            "/hooks/%2e/sig",
            "/Hooks/SIG",
            "/hooks/sig;jsessionid=1",
            "/hooks;a=b/sig",
            "/hooks%5Csig",
            "/hooks/sig/.",
            "/hoo%E2%84%AAs/%C5%BFig",
            "/hooks/s%C4%B1g",
            "/hooks/sig.json",
            "/hooks/SIG.XML",
            "/hooks/sig.",
            "/hooks/sig%20",
            "/hooks/sig.%20.",
            "/hooks./sig",
            "/hooks/sig.json/",
            "/hooks/%2573ig",
            "/hooks/%25%37%33ig",
            "/hooks/sig%3Bx",
            "/hooks/sig;a%2Fb",
            "/hooks/%u0073ig",
            "/hooks/%U0053IG",
            "/hooks/sig%3F",
            "/hooks/sig%3Fa=1/more",
            "/hooks/sig%23x",
        ] {
            assert_eq!(normal(variant), "/hooks/sig", "{variant}");
        }
    }

    #[test]
    fn parent_segments_are_refused_however_they_are_written() {
        for climbing in [
            "/hooks/stripe/..",
            "/hooks/stripe/%2e%2e",
            "/hooks/stripe/.%2E/",
            "/hooks/x/../stripe",
            "/..",
            "/a%2F..%2Fb",
            "/a%5C..",
            "/a/..;x",
            "/a/...",
            "/a/%252e%252e",
            "/a/%2e%2e%3Bx",
        ] {
            assert_eq!(
                normal_path(climbing),
                Err(TargetError::ParentSegment),
                "{climbing}"
            );
        }
        assert_eq!(normal("/a/...b/..c"), "/a/...b/..c");
    }

    #[test]
    fn control_characters_are_refused_however_they_are_written() {
        for path in [
            "/hooks/sig%00.png",
            "/a%09b",
            "/a%0d%0a",
            "/a%7F",
            "/a%2500",
            "/a%C2%85",
            "/a%E2%80%AEb",
            "/a%u202Eb",
            "/a%E2%80%8Bb",
            "/a%EF%BB%BF",
        ] {
            assert_eq!(
                normal_path(path),
                Err(TargetError::ControlCharacter),
                "{path}"
            );
        }
    }

    #[test]
    fn overlong_spellings_are_refused() {
        for path in [
            "/hooks%C0%AFstripe",
            "/hooks/%C0%AE%C0%AE/admin",
            "/a%C1%81",
            "/a%E0%80%AF",
            "/a%F0%80%80%AF",
            "/a%25C0%25AF",
        ] {
            assert_eq!(normal_path(path), Err(TargetError::Overlong), "{path}");
        }
    }

    #[test]
    fn fullwidth_spellings_read_as_the_ascii_they_stand_for() {
        assert_eq!(normal("/hooks%EF%BC%8Fstripe"), "/hooks/stripe");
        assert_eq!(normal("/%EF%BC%A8ooks/%EF%BD%93tripe"), "/hooks/stripe");
        assert_eq!(normal("/hooks/stripe%EF%BC%8Ejson"), "/hooks/stripe");
        assert_eq!(
            normal_path("/hooks/%EF%BC%8E%EF%BC%8E/admin"),
            Err(TargetError::ParentSegment)
        );
        // A character that is not fullwidth ASCII stays as it is.
        assert_eq!(normal("/caf%C3%A9"), "/caf\u{e9}");
    }

    #[test]
    fn extensions_leave_the_last_segment_only() {
        assert_eq!(normal("/v1.2/hooks"), "/v1.2/hooks");
        assert_eq!(normal("/.well-known/x.json"), "/.well-known/x");
        assert_eq!(normal("/a/.hidden"), "/a/.hidden");
        assert_eq!(normal("/a/.hidden.json"), "/a/.hidden");
        assert_eq!(
            with_extension("/webhook.php"),
            Some(b"/webhook.php".to_vec())
        );
        assert_eq!(
            with_extension("/Hooks/Run.CGI"),
            Some(b"/hooks/run.cgi".to_vec())
        );
        assert_eq!(with_extension("/hooks/stripe"), None);
        assert_eq!(with_extension("/.well-known"), None);
        assert_eq!(with_extension("/api/v1.2"), Some(b"/api/v1.2".to_vec()));
    }

    #[test]
    fn normal_paths_are_borrowed_and_others_are_not() {
        let borrowed = |path| matches!(normal_path(path), Ok(Cow::Borrowed(_)));
        assert!(borrowed("/hooks/stripe"));
        assert!(borrowed("/"));
        assert!(borrowed("/a-b_c.d~e/f:g@h"));
        for odd in [
            "*", "/a/", "/A", "/a//b", "/a/./b", "/%61", "/a;b", "/a.json", "/a./b",
        ] {
            assert!(matches!(normal_path(odd), Ok(Cow::Owned(_))), "{odd}");
        }
        assert_eq!(normal("*"), "/*");
        assert_eq!(normal_path(""), Err(TargetError::NoPath));
        assert_eq!(normal_path("a/b"), Err(TargetError::NoPath));
    }

    #[test]
    fn what_an_extension_leaves_is_trimmed_so_the_form_is_its_own() {
        // Found by fuzz/request_head: `e .` lost its extension and kept its space.
        for (path, normal_form) in [
            ("/e%20%2e%2%%0%2e%0%2eid=7", "/e"),
            ("/a/e%20.json", "/a/e"),
            ("/a/%20.json", "/a"),
            ("/%20.json", "/"),
        ] {
            let once = normal_path(path).unwrap();
            assert_eq!(once.as_ref(), normal_form.as_bytes(), "{path}");
            let text = std::str::from_utf8(&once).unwrap();
            assert_eq!(normal_path(text).unwrap().as_ref(), once.as_ref(), "{path}");
        }
    }

    #[test]
    fn escapes_that_are_not_utf8_stay_bytes() {
        assert_eq!(normal_path("/a%FFb").unwrap().as_ref(), b"/a\xffb");
        assert_eq!(normal_path("/a%zz").unwrap().as_ref(), b"/a%zz");
        assert_eq!(normal_path("/a%2").unwrap().as_ref(), b"/a%2");
    }

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(under(b"/hooks", b"/hooks"));
        assert!(under(b"/hooks/a", b"/hooks"));
        assert!(!under(b"/hooksa", b"/hooks"));
        assert!(!under(b"/hook", b"/hooks"));
        assert!(under(b"/anything", b"/"));
    }

    fn head(version: Version, uri: &str, hosts: &[&str]) -> (Version, Uri, HeaderMap) {
        let mut headers = HeaderMap::new();
        for value in hosts {
            headers.append(HOST, value.parse().unwrap());
        }
        (version, uri.parse().unwrap(), headers)
    }

    fn host_of(version: Version, uri: &str, hosts: &[&str]) -> Result<Option<String>, TargetError> {
        let (version, uri, headers) = head(version, uri, hosts);
        host(version, &uri, &headers).map(|host| host.map(str::to_owned))
    }

    #[test]
    fn hosts_are_checked_as_rfc_9112_asks() {
        use Version as V;
        assert_eq!(
            host_of(V::HTTP_11, "/a", &["x.example:81"]),
            Ok(Some("x.example:81".into()))
        );
        assert_eq!(
            host_of(V::HTTP_11, "/a", &["a", "b"]),
            Err(TargetError::HostCount(2))
        );
        assert_eq!(
            host_of(V::HTTP_11, "/a", &["a", "a"]),
            Err(TargetError::HostCount(2))
        );
        assert_eq!(
            host_of(V::HTTP_11, "/a", &[]),
            Err(TargetError::HostCount(0))
        );
        assert_eq!(host_of(V::HTTP_10, "/a", &[]), Ok(None));
        assert_eq!(
            host_of(V::HTTP_11, "/a", &["user@x"]),
            Err(TargetError::BadHost)
        );
        assert_eq!(
            host_of(V::HTTP_11, "/a", &["a b"]),
            Err(TargetError::BadHost)
        );
        assert_eq!(host_of(V::HTTP_11, "/a", &[""]), Ok(Some(String::new())));
        assert_eq!(
            host_of(V::HTTP_11, "http://u.example/a", &[]),
            Ok(Some("u.example".into()))
        );
        assert_eq!(
            host_of(V::HTTP_2, "http://u.example/a", &[]),
            Ok(Some("u.example".into()))
        );
        assert_eq!(
            host_of(V::HTTP_2, "http://u.example/a", &["U.example"]),
            Ok(Some("U.example".into()))
        );
        assert_eq!(
            host_of(V::HTTP_2, "http://u.example/a", &["other"]),
            Err(TargetError::HostMismatch)
        );
        assert_eq!(
            host_of(V::HTTP_2, "http://x@u.example/a", &[]),
            Err(TargetError::BadHost)
        );
        // An absolute-form target names its host again, in any version.
        assert_eq!(
            host_of(V::HTTP_11, "http://other.example/a", &["u.example"]),
            Err(TargetError::HostMismatch)
        );
        assert_eq!(
            host_of(V::HTTP_11, "http://U.example:80/a", &["u.example"]),
            Ok(Some("u.example".into()))
        );
        assert_eq!(
            host_of(V::HTTP_11, "https://u.example/a", &["u.example:443"]),
            Ok(Some("u.example:443".into()))
        );
        assert_eq!(
            host_of(V::HTTP_11, "https://u.example/a", &["u.example:80"]),
            Err(TargetError::HostMismatch)
        );
    }

    fn addressed_by(uri: &str, headers: &[(&str, &str)]) -> Result<Vec<String>, TargetError> {
        let uri: Uri = uri.parse().unwrap();
        let mut map = HeaderMap::new();
        map.insert(HOST, "h.example".parse().unwrap());
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let read = addressed(Version::HTTP_11, &Method::POST, &uri, &map, true)?;
        let mut readings: Vec<String> = read
            .other_methods
            .iter()
            .map(|method| format!("method {method}"))
            .collect();
        readings.extend(read.other_hosts.iter().map(|host| format!("host {host}")));
        readings.extend(
            read.other_paths
                .iter()
                .map(|path| format!("path {}", String::from_utf8_lossy(path))),
        );
        Ok(readings)
    }

    #[test]
    fn the_readings_frameworks_take_from_headers_and_query_are_kept() {
        assert_eq!(addressed_by("/a", &[]), Ok(vec![]));
        assert_eq!(
            addressed_by(
                "/a?_method=put&x=1",
                &[
                    ("x-http-method-override", " patch "),
                    ("X-HTTP-Method", "delete")
                ]
            ),
            Ok(vec![
                "method patch".to_owned(),
                "method delete".into(),
                "method put".into()
            ])
        );
        assert_eq!(
            addressed_by(
                "/a",
                &[
                    ("x-forwarded-host", "a.example, b.example"),
                    ("x-forwarded-host", "c.example"),
                    (
                        "forwarded",
                        "for=1.2.3.4;host=\"d.example\", host=e.example;proto=https"
                    ),
                ]
            ),
            Ok(vec![
                "host a.example".to_owned(),
                "host b.example".into(),
                "host c.example".into(),
                "host d.example".into(),
                "host e.example".into()
            ])
        );
        assert_eq!(
            addressed_by(
                "/a",
                &[
                    ("x-original-url", "/Hooks/Stripe.json?x=1"),
                    ("x-rewrite-url", "http://h/b/")
                ]
            ),
            Ok(vec!["path /hooks/stripe".to_owned(), "path /b".into()])
        );
        assert_eq!(
            addressed_by("/a", &[("x-original-url", "/hooks/../stripe")]),
            Err(TargetError::ParentSegment)
        );
        assert_eq!(
            addressed_by("/a", &[("x-rewrite-url", "not a target")]),
            Err(TargetError::BadOverride)
        );
    }
}
