//! What a request is addressed to, read the way the application behind the proxy reads it:
//! its host, checked as RFC 9112 section 3.2 asks, and its path in the normal form that
//! routes are matched on.
//!
//! Frameworks fold many spellings of a path into one handler: Express ignores case and a
//! trailing slash, Rails folds repeated slashes, WSGI servers and Go decode `%2F`, Spring
//! drops `;` parameters, and every URL resolver removes dot segments. If a route matched
//! only the path as written, `/hooks//stripe` or `/Hooks/%73tripe` would reach the
//! application's webhook handler with no signature check and no claim. So routes match on
//! the normal form below, the loosest of those readings, and the request goes on with its
//! path as it was sent.

use std::borrow::Cow;

use http::header::HOST;
use http::uri::Authority;
use http::{HeaderMap, Uri, Version};

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
}

/// The host a request is for: its `Host` header, or an HTTP/2 request's `:authority`.
/// `None` only for an HTTP/1.0 request without a `Host`.
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
        // HTTP/2 carries the host in `:authority`; a `Host` beside it must agree.
        (Some(header), Some(authority))
            if version == Version::HTTP_2 && !header.eq_ignore_ascii_case(authority) =>
        {
            Err(TargetError::HostMismatch)
        }
        (Some(header), _) => Ok(Some(header)),
        (None, Some(authority)) => Ok(Some(authority)),
        (None, None) if version == Version::HTTP_11 => Err(TargetError::HostCount(0)),
        (None, None) => Ok(None),
    }
}

/// `host[:port]`, without user information; an empty host is allowed (RFC 9112 permits an
/// empty `Host` for a target without one).
fn is_valid_host(value: &str) -> bool {
    value.is_empty() || (!value.contains('@') && value.parse::<Authority>().is_ok())
}

/// The normal form of a path that routes are matched on: percent escapes decoded, `;`
/// parameters dropped from each segment, `\` read as `/`, empty and `.` segments removed,
/// ASCII letters lowercased, no trailing slash; always starts with `/`. A `..` segment is
/// refused, as is a target without a path (`*` is the path `/*`). Borrows the path when it
/// is already in that form, as almost every real path is.
pub fn normal_path(path: &str) -> Result<Cow<'_, [u8]>, TargetError> {
    if !path.starts_with('/') && path != "*" {
        return Err(TargetError::NoPath);
    }
    if is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path.as_bytes()));
    }
    let mut segments: Vec<Vec<u8>> = Vec::new();
    for written in path.split('/') {
        let written = written.split(';').next().unwrap_or_default();
        let decoded: Vec<u8> = percent_encoding::percent_decode_str(written).collect();
        for segment in decoded.split(|&byte| byte == b'/' || byte == b'\\') {
            match segment {
                b"" | b"." => {}
                b".." => return Err(TargetError::ParentSegment),
                _ => segments.push(fold_case(segment)),
            }
        }
    }
    let mut normal = Vec::with_capacity(path.len());
    for segment in &segments {
        normal.push(b'/');
        normal.extend_from_slice(segment);
    }
    if normal.is_empty() {
        normal.push(b'/');
    }
    Ok(Cow::Owned(normal))
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

/// Whether `path` is its own normal form.
fn is_normal(path: &[u8]) -> bool {
    let plain = |byte: &u8| !matches!(byte, b'%' | b';' | b'\\' | b'A'..=b'Z');
    path == b"/"
        || path.first() == Some(&b'/')
            && path.iter().all(plain)
            && path[1..]
                .split(|&byte| byte == b'/')
                .all(|segment| !matches!(segment, b"" | b"." | b".."))
}

/// Whether a normal path falls under a normal prefix: the prefix itself, or below it
/// segment by segment (`/hooks` takes `/hooks/a`, not `/hooksa`).
pub fn under(path: &[u8], prefix: &[u8]) -> bool {
    prefix == b"/"
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b'/'))
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
    fn normal_paths_are_borrowed_and_others_are_not() {
        let borrowed = |path| matches!(normal_path(path), Ok(Cow::Borrowed(_)));
        assert!(borrowed("/hooks/stripe"));
        assert!(borrowed("/"));
        assert!(borrowed("/a-b_c.d~e/f:g@h"));
        for odd in ["*", "/a/", "/A", "/a//b", "/a/./b", "/%61", "/a;b"] {
            assert!(matches!(normal_path(odd), Ok(Cow::Owned(_))), "{odd}");
        }
        assert_eq!(normal("*"), "/*");
        assert_eq!(normal_path(""), Err(TargetError::NoPath));
        assert_eq!(normal_path("a/b"), Err(TargetError::NoPath));
    }

    #[test]
    fn escapes_that_are_not_utf8_stay_bytes() {
        assert_eq!(normal_path("/a%FF%00b").unwrap().as_ref(), b"/a\xff\x00b");
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
    }
}
