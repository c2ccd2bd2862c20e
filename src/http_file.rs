//! A request written down: a plain HTTP message (a request line, headers, a blank line,
//! the body), as `.http` files and captured deliveries are written, with `#` comment lines
//! before it; and the sample delivery shipped for each provider preset. Dry runs read
//! them (`dry_run`), and the configuration checks templates against the samples.
//!
//! Two comments mean something: `# signed-at: <RFC 3339 time>` is when the request was
//! signed (a dry run judges a signature's age as of then), and `# secret: NAME=value`
//! is the test secret a sample was signed with. The head is read as strictly as the proxy's
//! HTTP server reads one, so that a dry run does not take what a delivery could not carry.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::preset::Preset;
use crate::values::Secret;

/// The most bytes of a request a dry run reads.
pub const MESSAGE_MAX: usize = 4 << 20;

/// The most header lines a written request may have, as many as the proxy's server reads.
pub const HEADERS_MAX: usize = 100;

/// The latest time a `# signed-at:` or `--at` may name: the end of the year 9999.
const LATEST: i64 = 253_402_300_799;

/// A request as written, with what its comments say.
#[derive(Debug)]
pub struct Written {
    pub request: Request<Bytes>,
    /// `# signed-at:`, in Unix seconds.
    pub signed_at: Option<i64>,
    /// `# secret:` lines: a variable and its value.
    pub secrets: Vec<(String, Secret)>,
}

/// A preset's sample delivery (`examples/deliveries/`), or a message naming the samples
/// there are.
pub fn sample(name: &str) -> Result<&'static str, String> {
    Preset::samples()
        .find(|(sample, _)| *sample == name)
        .map(|(_, text)| text)
        .ok_or_else(|| {
            let names: Vec<&str> = Preset::samples().map(|(sample, _)| sample).collect();
            format!("no sample `{name}`; the samples are {}", names.join(", "))
        })
}

/// Reads a written request. The body is everything after the blank line: exactly
/// `Content-Length` bytes where the head gives one, else the rest without the file's
/// final line ending. The target and version are kept as written; no `Host` is added.
pub fn parse(text: &[u8]) -> Result<Written, String> {
    if text.len() > MESSAGE_MAX {
        return Err(format!("the request is over {} MiB", MESSAGE_MAX >> 20));
    }
    let mut rest = text;
    let mut signed_at = None;
    let mut secrets = Vec::new();
    let mut request_line = None;
    while let Some((line, after)) = next_line(rest) {
        rest = after;
        let line = std::str::from_utf8(line).map_err(|_| "the head is not UTF-8".to_owned())?;
        if let Some(comment) = line.strip_prefix('#') {
            read_comment(comment.trim(), &mut signed_at, &mut secrets)?;
        } else if !line.trim().is_empty() {
            request_line = Some(line.to_owned());
            break;
        }
    }
    let request_line = request_line.ok_or("no request line (like `POST /webhooks HTTP/1.1`)")?;
    let (method, uri, version) = parse_request_line(&request_line)?;
    let mut headers = HeaderMap::new();
    loop {
        let (line, after) = next_line(rest).unwrap_or((rest, &[][..]));
        rest = after;
        if line.is_empty() {
            break;
        }
        if headers.len() >= HEADERS_MAX {
            return Err(format!("more than {HEADERS_MAX} header lines"));
        }
        let line = std::str::from_utf8(line).map_err(|_| "a header is not UTF-8".to_owned())?;
        if line.starts_with([' ', '\t']) {
            return Err(
                "a header line folded onto the next (obsolete, refused by HTTP/1.1 servers)".into(),
            );
        }
        let (name, value) = header(line)?;
        headers.append(name, value);
    }
    let body = body(&headers, rest)?;
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Ok(Written {
        request,
        signed_at,
        secrets,
    })
}

/// A request made from its parts (`try -X POST --path /x -H ... -d ...`): a `Host` is
/// added where the headers name none (from the target's authority, else `localhost`), and
/// a `Content-Type` for a body that has none (JSON where it looks like JSON, else a form).
pub fn build(
    method: Method,
    target: &str,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<Request<Bytes>, String> {
    let uri: Uri = target
        .parse()
        .map_err(|_| format!("`{target}` is not a request target"))?;
    if !headers.contains_key(HOST) {
        let host = uri
            .authority()
            .map_or("localhost", |authority| authority.as_str());
        let host = HeaderValue::from_str(host).map_err(|_| "the target's host is not valid")?;
        headers.insert(HOST, host);
    }
    if !body.is_empty() && !headers.contains_key(CONTENT_TYPE) {
        let json = body
            .first()
            .is_some_and(|first| matches!(first, b'{' | b'['));
        let kind = if json {
            "application/json"
        } else {
            "application/x-www-form-urlencoded"
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    }
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// A header line, `Name: value`, as strictly as an HTTP/1.1 server reads one: no space
/// before the colon.
pub fn header(line: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| format!("`{line}` is not a header (`Name: value`)"))?;
    let name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("`{name}` is not a header name"))?;
    let value = HeaderValue::from_str(value.trim_matches([' ', '\t']))
        .map_err(|_| format!("the value of {name} is not a header value"))?;
    Ok((name, value))
}

/// An RFC 3339 time or Unix seconds, from 1970 to the end of 9999, as Unix seconds.
pub fn parse_time(text: &str) -> Result<i64, String> {
    let seconds = match text.parse::<i64>() {
        Ok(seconds) => seconds,
        Err(_) => OffsetDateTime::parse(text, &Rfc3339)
            .map(OffsetDateTime::unix_timestamp)
            .map_err(|_| format!("`{text}` is not an RFC 3339 time or Unix seconds"))?,
    };
    if !(0..=LATEST).contains(&seconds) {
        return Err(format!("`{text}` is not between 1970 and 9999"));
    }
    Ok(seconds)
}

impl Written {
    /// When a dry run judges the request's timestamps: `at` when given (RFC 3339 or Unix
    /// seconds), else when it says it was signed, else now.
    pub fn judged_at(&self, at: Option<&str>) -> Result<i64, String> {
        match at {
            Some(at) => parse_time(at),
            None => Ok(self.signed_at.unwrap_or_else(crate::verify::unix_now)),
        }
    }
}

/// The line up to `\n` (without it or a `\r` before it), and what follows.
fn next_line(text: &[u8]) -> Option<(&[u8], &[u8])> {
    if text.is_empty() {
        return None;
    }
    let (line, rest) = match text.iter().position(|&byte| byte == b'\n') {
        Some(end) => (&text[..end], &text[end + 1..]),
        None => (text, &[][..]),
    };
    Some((line.strip_suffix(b"\r").unwrap_or(line), rest))
}

fn read_comment(
    comment: &str,
    signed_at: &mut Option<i64>,
    secrets: &mut Vec<(String, Secret)>,
) -> Result<(), String> {
    if let Some(at) = comment.strip_prefix("signed-at:") {
        *signed_at = Some(parse_time(at.trim())?);
    } else if let Some(secret) = comment.strip_prefix("secret:") {
        let (name, value) = secret
            .trim()
            .split_once('=')
            .ok_or("a `# secret:` line is `# secret: NAME=value`")?;
        secrets.push((name.trim().to_owned(), Secret::new(value.trim().to_owned())));
    }
    Ok(())
}

/// `METHOD target [HTTP/version]`: the target as written (origin or absolute form).
fn parse_request_line(line: &str) -> Result<(Method, Uri, Version), String> {
    let mut words = line.split_whitespace();
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return Err(format!(
            "`{line}` is not a request line (like `POST /webhooks HTTP/1.1`)"
        ));
    };
    let version = match words.next() {
        None | Some("HTTP/1.1") => Version::HTTP_11,
        Some("HTTP/1.0") => Version::HTTP_10,
        Some("HTTP/2" | "HTTP/2.0") => Version::HTTP_2,
        Some(other) => return Err(format!("`{other}` is not an HTTP version this proxy reads")),
    };
    if words.next().is_some() {
        return Err(format!(
            "`{line}` has more than a method, a target and a version"
        ));
    }
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| format!("`{method}` is not a method"))?;
    let uri = target
        .parse()
        .map_err(|_| format!("`{target}` is not a request target"))?;
    Ok((method, uri, version))
}

fn body(headers: &HeaderMap, rest: &[u8]) -> Result<Bytes, String> {
    if headers.contains_key(TRANSFER_ENCODING) {
        return Err(
            "a Transfer-Encoding body is not read: write the body whole with Content-Length".into(),
        );
    }
    let mut lengths = headers.get_all(CONTENT_LENGTH).iter();
    let Some(length) = lengths.next() else {
        let rest = rest.strip_suffix(b"\n").unwrap_or(rest);
        let rest = rest.strip_suffix(b"\r").unwrap_or(rest);
        return Ok(Bytes::copy_from_slice(rest));
    };
    if lengths.next().is_some() {
        return Err("more than one Content-Length".into());
    }
    let length: usize = length
        .to_str()
        .ok()
        .filter(|length| !length.is_empty() && length.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|length| length.parse().ok())
        .ok_or("Content-Length is not a number of bytes")?;
    let body = rest.get(..length).ok_or_else(|| {
        format!(
            "Content-Length says {length} bytes, and the body has {}",
            rest.len()
        )
    })?;
    Ok(Bytes::copy_from_slice(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_with_comments_crlf_and_a_content_length_is_read_exactly() {
        let text = b"# signed-at: 2026-12-04T00:00:00Z\r\n# secret: S=abc\r\nPOST /hooks?x=1 HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\n\r\n{}\n\n";
        let written = parse(text).unwrap();
        assert_eq!(written.signed_at, Some(1_796_342_400));
        assert_eq!(written.secrets[0].0, "S");
        assert_eq!(written.secrets[0].1.expose(), "abc");
        assert!(!format!("{written:?}").contains("abc"), "a secret in Debug");
        assert_eq!(written.request.method(), Method::POST);
        assert_eq!(written.request.uri(), "/hooks?x=1");
        assert_eq!(written.request.headers()[HOST], "a.example");
        assert_eq!(written.request.body().as_ref(), b"{}\n");
    }

    #[test]
    fn without_a_content_length_the_body_loses_the_files_last_line_ending() {
        let written = parse(b"POST /h HTTP/1.0\n\n{\"id\":1}\n").unwrap();
        assert_eq!(written.request.body().as_ref(), b"{\"id\":1}");
        assert_eq!(written.request.version(), Version::HTTP_10);
        assert!(
            written.request.headers().get(HOST).is_none(),
            "no Host made up"
        );
        let written = parse(b"POST http://a.example/h\n\n").unwrap();
        assert_eq!(
            written.request.uri(),
            "http://a.example/h",
            "kept as written"
        );
    }

    #[test]
    fn malformed_messages_are_refused_with_a_reason() {
        let many: String = (0..=HEADERS_MAX).map(|n| format!("h{n}: v\n")).collect();
        let many = format!("POST /h\n{many}\n");
        for (text, reason) in [
            (&b""[..], "no request line"),
            (b"POST\n\n", "not a request line"),
            (b"POST /h HTTP/1.1\nno colon\n\n", "is not a header"),
            (b"POST /h HTTP/1.1\nName : v\n\n", "is not a header name"),
            (b"POST /h HTTP/1.1\nA: b\n c\n\n", "folded"),
            (b"POST /h\nContent-Length: 9\n\n{}", "says 9 bytes"),
            (
                b"POST /h\nContent-Length: +2\n\n{}",
                "not a number of bytes",
            ),
            (
                b"POST /h\nContent-Length: 2\nContent-Length: 2\n\n{}",
                "more than one",
            ),
            (
                b"POST /h\nTransfer-Encoding: chunked\n\n2\r\n{}\r\n0\r\n\r\n",
                "Transfer-Encoding",
            ),
            (b"# signed-at: yesterday\nPOST /h\n\n", "not an RFC 3339"),
            (
                b"# signed-at: 300000000000\nPOST /h\n\n",
                "between 1970 and 9999",
            ),
            (b"POST /h SMTP\n\n", "HTTP version"),
            (many.as_bytes(), "more than 100 header lines"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
        assert!(parse(&vec![b'a'; MESSAGE_MAX + 1]).is_err());
    }

    #[test]
    fn every_sample_reads() {
        for (name, text) in Preset::samples() {
            let written = parse(text.as_bytes()).unwrap_or_else(|error| panic!("{name}: {error}"));
            assert!(!written.request.body().is_empty(), "{name}");
        }
        assert!(sample("strip").unwrap_err().contains("stripe, github"));
    }
}
