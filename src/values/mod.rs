//! The typed values of the configuration, shared with the code that uses them: durations,
//! sizes, status sets, methods, names, upstream URLs and secrets. Each parses inside
//! serde's visitor, so serde_yaml attaches the line and column of the offending scalar to
//! any error; each serializes back to the form a user would write, for `dedupe-proxy
//! check`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode, Uri};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

mod secret;
mod string_value;

pub use secret::{EnvSecret, Secret, StandIns, with_given_secrets, without_secrets};
pub(crate) use string_value::FromStrVisitor;
use string_value::string_value;

/// Status codes print as numbers.
macro_rules! serialize_status {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_u16(self.0.as_u16())
            }
        }
    };
}

/// Serializers for the plain values a resolved setting holds, each in the form a user
/// writes it, for `dedupe-proxy check` and `GET /v1/routes`.
pub mod as_written {
    use std::time::Duration;

    use http::{HeaderValue, StatusCode};
    use serde::Serializer;

    use super::{HeaderText, HumanDuration, Size};

    pub fn duration<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&HumanDuration(*value))
    }

    pub(crate) fn text<S: Serializer>(
        body: &bytes::Bytes,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&String::from_utf8_lossy(body))
    }

    pub fn size<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&Size(*value))
    }

    pub fn status<S: Serializer>(value: &StatusCode, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u16(value.as_u16())
    }

    pub fn header<S: Serializer>(value: &HeaderValue, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&HeaderText(value.clone()))
    }

    pub(crate) fn header_names<S: Serializer>(
        names: &[http::HeaderName],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(names.iter().map(http::HeaderName::as_str))
    }
}

/// A duration written like `500ms`, `30s`, `5m`, `72h` or `7d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let duration = humantime::parse_duration(text).map_err(|error| {
            format!("invalid duration `{text}` ({error}); write it like 500ms, 30s, 5m, 72h or 7d")
        })?;
        // Deadlines are instants in the future: a duration no clock can add is a mistake.
        if duration > MAX_DURATION {
            return Err(format!("duration `{text}` is over the limit of 100 years"));
        }
        Ok(HumanDuration(duration))
    }
}

/// The longest duration a setting may have.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The units a duration is printed in, largest first, with their length in nanoseconds.
const DURATION_UNITS: [(&str, u128); 7] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// Printed in the short units a configuration is written in, largest first: `7d`,
/// `1h30m`, `250ms` (humantime's own form spells some out: `7days` beside `5m`).
impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0.as_nanos();
        if rest == 0 {
            return f.write_str("0s");
        }
        for (unit, length) in DURATION_UNITS {
            if rest >= length {
                write!(f, "{}{unit}", rest / length)?;
                rest %= length;
            }
        }
        Ok(())
    }
}

string_value!(
    HumanDuration,
    "a duration like 30s",
    or_zero,
    pattern r"^\s*(0|([0-9]+(\.[0-9]+)?\s*[a-zA-Zµ]+\s*)+)\s*$"
);

/// A size in bytes, written as a number of bytes or like `64KiB`, `1MiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        bytesize::ByteSize::from_str(text.trim())
            .map(|size| Size(size.as_u64()))
            .map_err(|_| format!("invalid size `{text}`; write bytes or a size like 64KiB or 1MiB"))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        bytesize::ByteSize::b(self.0).display().iec().fmt(f)
    }
}

string_value!(
    Size,
    "a size like 1MiB",
    or_number,
    pattern r"^\s*\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]+)?\s*$"
);

/// One entry of `success_status`: a class like `2xx` or a single code like `409`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusPattern {
    Class(u16),
    Code(StatusCode),
}

impl FromStr for StatusPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.as_bytes() {
            [digit @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                Ok(StatusPattern::Class(u16::from(digit - b'0')))
            }
            _ => text
                .parse::<StatusValue>()
                .map(|code| StatusPattern::Code(code.0)),
        }
    }
}

impl fmt::Display for StatusPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusPattern::Class(class) => write!(f, "{class}xx"),
            StatusPattern::Code(code) => write!(f, "{}", code.as_u16()),
        }
    }
}

string_value!(
    StatusPattern,
    "a status class like \"2xx\" or a code like 200",
    or_number,
    pattern "^([1-5][xX][xX]|\\+?0*[1-5][0-9][0-9])$"
);

impl StatusPattern {
    pub fn matches(&self, status: StatusCode) -> bool {
        match self {
            StatusPattern::Class(class) => status.as_u16() / 100 == *class,
            StatusPattern::Code(code) => *code == status,
        }
    }
}

/// An HTTP status code from 100 to 599.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StatusValue(pub StatusCode);

impl FromStr for StatusValue {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.parse::<u16>()
            .ok()
            .filter(|code| (100..600).contains(code))
            .and_then(|code| StatusCode::from_u16(code).ok())
            .map(StatusValue)
            .ok_or_else(|| format!("invalid status `{text}`; expected a code from 100 to 599"))
    }
}

impl fmt::Display for StatusValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.as_u16())
    }
}

string_value!(StatusValue, "an HTTP status code", number);
serialize_status!(StatusValue);

/// A listener's address (`listen`, `admin.listen`), with a message that says what is
/// wrong with one that is not.
pub(crate) fn socket_address<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<std::net::SocketAddr, D::Error> {
    struct Address;

    impl Visitor<'_> for Address {
        type Value = std::net::SocketAddr;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an address and port like 0.0.0.0:8080")
        }

        // Inside the visitor, so that the error carries the value's line and column.
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            parse_listen(text).map_err(E::custom)
        }
    }

    deserializer.deserialize_str(Address)
}

/// A listening address, or a message that says what is wrong with it: a port out of
/// range, a name where an address goes, no port.
pub(crate) fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        let port = text.rsplit_once(':').map(|(_, port)| port);
        let reason = match port.map(str::parse::<u64>) {
            None => "it needs a port: `ADDRESS:PORT`, like `0.0.0.0:8080`".to_owned(),
            Some(Ok(port)) if port > u64::from(u16::MAX) => {
                format!("port {port} is out of range (0 to 65535)")
            }
            Some(Ok(_)) => "the part before the port is not an IP address (a name is not taken; IPv6 goes in brackets, like `[::]:8080`)".to_owned(),
            Some(Err(_)) => "the port is not a number".to_owned(),
        };
        format!("`{text}` is not a listening address: {reason}")
    })
}

/// An HTTP method name: one HTTP defines (RFC 9110 and PATCH), since no webhook sender
/// uses another, and a misspelt one would match nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodValue(pub Method);

/// The methods a route may name.
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
];

impl FromStr for MethodValue {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let upper = text.to_ascii_uppercase();
        if METHODS.contains(&upper.as_str()) {
            return Ok(MethodValue(
                Method::from_bytes(upper.as_bytes()).expect("a standard method"),
            ));
        }
        let mut message = format!("`{text}` is not an HTTP method ({})", METHODS.join(", "));
        if let Some(near) = closest(&upper, METHODS) {
            message.push_str(&format!("; did you mean `{near}`?"));
        }
        Err(message)
    }
}

/// The one of `candidates` nearest to `written` (a misspelling's likely intent), if one is
/// near enough: at most a third of its letters changed, or two letters swapped.
pub fn closest<'a>(
    written: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::osa_distance(written, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= (candidate.len() / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

impl fmt::Display for MethodValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

string_value!(MethodValue, "an HTTP method");

/// `method:` takes one method or a list of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Methods(pub Vec<MethodValue>);

impl schemars::JsonSchema for Methods {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Methods".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let method = generator.subschema_for::<MethodValue>();
        schemars::json_schema!({
            "description": "a method like POST, or a list of them; any method when left out",
            "anyOf": [method, { "type": "array", "items": method }],
        })
    }
}

impl<'de> Deserialize<'de> for Methods {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OneOrMany;

        impl<'de> Visitor<'de> for OneOrMany {
            type Value = Methods;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a method like POST or a list of methods")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Methods, E> {
                Ok(Methods(vec![text.parse().map_err(E::custom)?]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Methods, A::Error> {
                let mut methods = Vec::new();
                while let Some(method) = seq.next_element()? {
                    methods.push(method);
                }
                Ok(Methods(methods))
            }
        }

        deserializer.deserialize_any(OneOrMany)
    }
}

/// A route or scope name: `[a-z0-9_-]+`. Names appear in store keys, metrics and URLs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Name(pub String);

impl FromStr for Name {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let valid = !text.is_empty()
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if valid {
            Ok(Name(text.to_owned()))
        } else {
            Err(format!(
                "invalid name `{text}`; use lowercase letters, digits, `_` and `-`"
            ))
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

string_value!(
    Name,
    "a name of lowercase letters, digits, `_` and `-`",
    pattern "^[a-z0-9_-]+$"
);

/// Where the application listens: `http://host:port`, optionally with a base path that
/// is put in front of every forwarded path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `host:port` as written (the port may be left out), the `Host` of a request that
    /// arrived without one.
    pub authority: String,
    /// `host:port` to connect to, with port 80 when none is written.
    pub address: Arc<str>,
    /// The base path without a trailing slash; empty for none.
    pub base_path: String,
}

impl FromStr for UpstreamUrl {
    type Err = String;

    fn from_str(written: &str) -> Result<Self, String> {
        // A password in the URL is never quoted back, nor accepted: the app would get it
        // in `Host` when a sender sent none.
        let text = &*crate::dsn::masked(written);
        if text != written {
            return Err(format!(
                "upstream `{text}` must not hold a user or password"
            ));
        }
        let uri: Uri = text
            .parse()
            .map_err(|error| format!("invalid upstream URL `{text}`: {error}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "upstream `{text}`: https upstreams are not supported; the proxy speaks plain HTTP to the application beside it"
                ));
            }
            _ => return Err(format!("upstream `{text}` must be an http:// URL")),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("upstream `{text}` has no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "upstream `{text}` must not hold a user or password"
            ));
        }
        if uri.query().is_some() {
            return Err(format!("upstream `{text}` must not have a query"));
        }
        Ok(UpstreamUrl {
            authority: authority.to_string(),
            address: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            )
            .into(),
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.base_path)
    }
}

string_value!(UpstreamUrl, "an upstream URL like http://127.0.0.1:8080");

string_value!(
    crate::key::KeyTemplate,
    "a key template like \"{json:/id}\": text and {json:/pointer}, {header:Name}, {sf-string:Name}, {header-hash:Name}, {query:name} or {form:field} parts",
    pattern r"\{(json|header|sf-string|header-hash|query|form):[^}]+\}"
);

/// The plain `http://` URL of an OTLP collector: one beside the proxy (a sidecar or a
/// node's agent), which carries the spans on over TLS itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint(pub String);

impl FromStr for OtlpEndpoint {
    type Err = String;

    fn from_str(written: &str) -> Result<Self, String> {
        let text = &*crate::dsn::masked(written);
        let uri: http::Uri = text
            .parse()
            .map_err(|error| format!("invalid OTLP endpoint `{text}`: {error}"))?;
        match (uri.scheme_str(), uri.authority()) {
            (_, Some(authority)) if authority.as_str().contains('@') => Err(format!(
                "OTLP endpoint `{text}` must not hold a user or password (a collector beside the proxy needs none)"
            )),
            (Some("http"), Some(_)) => Ok(OtlpEndpoint(text.trim_end_matches('/').to_owned())),
            _ => Err(format!(
                "OTLP endpoint `{text}` must be a plain http:// URL with a host (a collector beside the proxy; TLS is the collector's)"
            )),
        }
    }
}

impl fmt::Display for OtlpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A share of traces to keep, `0` to `1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRatio(pub f64);

impl FromStr for SampleRatio {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(SampleRatio(ratio)),
            _ => Err(format!(
                "sample_ratio `{text}` must be a number from 0 to 1"
            )),
        }
    }
}

impl fmt::Display for SampleRatio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

string_value!(OtlpEndpoint, "an http:// URL");
string_value!(SampleRatio, "a number from 0 to 1", number);

impl Serialize for SampleRatio {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.0)
    }
}

/// A status the proxy answers with to refuse a delivery for now: 4xx or 5xx, never a
/// success, which would tell the provider to stop retrying an event that may yet fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RefusalStatus(pub StatusCode);

impl FromStr for RefusalStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let StatusValue(code) = text.parse()?;
        if code.is_client_error() || code.is_server_error() {
            Ok(RefusalStatus(code))
        } else {
            Err(format!(
                "status {text} would tell the provider the event was handled; use a 4xx or 5xx such as 409 or 429"
            ))
        }
    }
}

impl fmt::Display for RefusalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.as_u16())
    }
}

string_value!(RefusalStatus, "a 4xx or 5xx status code", number);
serialize_status!(RefusalStatus);

/// A header value such as a content type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HeaderText(pub http::HeaderValue);

impl FromStr for HeaderText {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        http::HeaderValue::from_str(text)
            .map(HeaderText)
            .map_err(|_| format!("`{text}` is not a valid header value"))
    }
}

impl fmt::Display for HeaderText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.to_str().unwrap_or("<binary>"))
    }
}

string_value!(HeaderText, "a header value");

/// A header `duplicate_response.replay_headers` names: a valid name, kept lowercase. The
/// headers that describe one connection, `content-length` (the proxy writes the body's),
/// and the proxy's own headers cannot be replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplayHeader(pub http::HeaderName);

impl FromStr for ReplayHeader {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let name = http::HeaderName::from_str(text)
            .map_err(|_| format!("`{text}` is not a valid header name"))?;
        const NEVER: [&str; 11] = [
            "connection",
            "proxy-connection",
            "keep-alive",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "content-length",
            "dedupe-status",
            "dedupe-key",
            "idempotent-replayed",
        ];
        if NEVER.contains(&name.as_str()) {
            return Err(format!(
                "`{text}` cannot be replayed: it describes one connection or message, or the proxy writes it"
            ));
        }
        Ok(ReplayHeader(name))
    }
}

impl fmt::Display for ReplayHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

string_value!(ReplayHeader, "a header name");

/// A PEM file named in the configuration (a CA, a client certificate or its key), read as
/// the file is parsed, so that a missing or unreadable one is reported at its line. It
/// prints as its path, never its contents.
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    pub path: std::path::PathBuf,
    pub pem: Vec<u8>,
}

impl FromStr for PemFile {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        // A certificate bundle is kilobytes; a bound keeps a wrong path (a device, a log)
        // from being read for ever.
        let mut pem = Vec::new();
        std::fs::File::open(text)
            .and_then(|file| {
                std::io::Read::read_to_end(&mut std::io::Read::take(file, 1 << 20), &mut pem)
            })
            .map_err(|error| format!("cannot read `{text}`: {error}"))?;
        if pem.len() >= 1 << 20 {
            return Err(format!(
                "`{text}` is 1 MiB or more; a PEM file is far smaller"
            ));
        }
        if !pem.windows(11).any(|window| window == b"-----BEGIN ") {
            return Err(format!("`{text}` holds no PEM block"));
        }
        Ok(PemFile {
            path: text.into(),
            pem,
        })
    }
}

impl fmt::Display for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.path.display().fmt(f)
    }
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PemFile({})", self.path.display())
    }
}

string_value!(PemFile, "a path to a PEM file");

/// A host name or address the admin port may be reached by (`admin.hosts`): lowercase,
/// without a trailing dot or a port; an address in its usual form (IPv6 without brackets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostName(pub String);

impl FromStr for HostName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        // An address, in the form the admin port compares it in.
        if let Ok(ip) = text
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
        {
            return Ok(HostName(ip.to_canonical().to_string()));
        }
        let name = text.trim_end_matches('.').to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_'));
        if valid {
            Ok(HostName(name))
        } else {
            Err(format!(
                "`{text}` is not a host name (letters, digits, `-`, `.`; no port)"
            ))
        }
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

string_value!(HostName, "a host name");

/// An HTTP header's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HeaderNameValue(pub http::header::HeaderName);

impl FromStr for HeaderNameValue {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        http::header::HeaderName::from_str(text)
            .map(HeaderNameValue)
            .map_err(|_| format!("`{text}` is not a valid header name"))
    }
}

impl fmt::Display for HeaderNameValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

string_value!(HeaderNameValue, "a header name");

/// A PostgreSQL table name: `[a-z_][a-z0-9_]*`, at most 52 bytes, so that it can go into
/// SQL as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName(pub String);

/// The longest table name: PostgreSQL cuts names at 63 bytes, and a cut index name could
/// be another relation's (`<table>_held` the table's own).
const TABLE_NAME_MAX: usize = 52;

impl FromStr for TableName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut bytes = text.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
        let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if first_ok && rest_ok && text.len() > TABLE_NAME_MAX {
            Err(format!(
                "table name `{text}` is longer than {TABLE_NAME_MAX} bytes: the names of its indexes (`<table>_expires_at`) must fit PostgreSQL's 63"
            ))
        } else if first_ok && rest_ok {
            Ok(TableName(text.to_owned()))
        } else {
            Err(format!(
                "invalid table name `{text}`; use lowercase letters, digits and `_`, not starting with a digit"
            ))
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

string_value!(TableName, "a table name");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_leave_room_for_their_indexes_names() {
        assert!("t".repeat(52).parse::<TableName>().is_ok());
        let error = "t".repeat(53).parse::<TableName>().unwrap_err();
        assert!(error.contains("longer than 52 bytes"), "{error}");
    }

    #[test]
    fn durations_no_clock_can_add_are_refused() {
        assert!("36500d".parse::<HumanDuration>().is_ok());
        assert!("36501d".parse::<HumanDuration>().is_err());
        let error = "300000000000y".parse::<HumanDuration>().unwrap_err();
        assert!(error.contains("100 years"), "{error}");
    }

    #[test]
    fn durations() {
        assert_eq!(
            "500ms".parse::<HumanDuration>().unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!(
            "7d".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(7 * 86400)
        );
        assert_eq!("72h".parse::<HumanDuration>().unwrap().to_string(), "3d");
        for written in [
            "0s",
            "5m",
            "7d",
            "1h30m",
            "1m5ms",
            "2d3h4m5s6ms7us8ns",
            "250ms",
        ] {
            let duration: HumanDuration = written.parse().unwrap();
            assert_eq!(duration.to_string(), written, "printed as written");
        }
        assert!("5 parsecs".parse::<HumanDuration>().is_err());
        assert!("30".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!("64KiB".parse::<Size>().unwrap().0, 65536);
        assert_eq!("1MiB".parse::<Size>().unwrap().0, 1 << 20);
        assert_eq!("1000".parse::<Size>().unwrap().0, 1000);
        assert_eq!(Size(1 << 20).to_string(), "1.0 MiB");
        assert!("lots".parse::<Size>().is_err());
    }

    #[test]
    fn status_patterns() {
        let class: StatusPattern = "2xx".parse().unwrap();
        assert!(class.matches(StatusCode::NO_CONTENT));
        assert!(!class.matches(StatusCode::MULTIPLE_CHOICES));
        let code: StatusPattern = "409".parse().unwrap();
        assert!(code.matches(StatusCode::CONFLICT));
        assert!(!code.matches(StatusCode::OK));
        assert!("6xx".parse::<StatusPattern>().is_err());
        assert!("99".parse::<StatusPattern>().is_err());
        assert!("600".parse::<StatusPattern>().is_err());
    }

    #[test]
    fn names() {
        assert!("stripe-v2_x".parse::<Name>().is_ok());
        assert!("Stripe".parse::<Name>().is_err());
        assert!("a:b".parse::<Name>().is_err());
        assert!("".parse::<Name>().is_err());
    }

    #[test]
    fn upstream_urls() {
        let url: UpstreamUrl = "http://127.0.0.1:8080/".parse().unwrap();
        assert_eq!(
            (
                url.authority.as_str(),
                &*url.address,
                url.base_path.as_str()
            ),
            ("127.0.0.1:8080", "127.0.0.1:8080", "")
        );
        assert_eq!(url.to_string(), "http://127.0.0.1:8080");
        let url: UpstreamUrl = "http://app:3000/base/".parse().unwrap();
        assert_eq!(url.base_path, "/base");
        assert_eq!(url.to_string(), "http://app:3000/base");
        let url: UpstreamUrl = "http://app/".parse().unwrap();
        assert_eq!((url.authority.as_str(), &*url.address), ("app", "app:80"));
        let url: UpstreamUrl = "http://[::1]:9000".parse().unwrap();
        assert_eq!(&*url.address, "[::1]:9000");
        assert!(
            "https://app"
                .parse::<UpstreamUrl>()
                .unwrap_err()
                .contains("https")
        );
        assert!("app:3000".parse::<UpstreamUrl>().is_err());
        assert!("http://app/?q=1".parse::<UpstreamUrl>().is_err());
    }

    #[test]
    fn secrets_never_print() {
        assert_eq!(
            format!("{:?}", Secret::new("hunter2".into())),
            "Secret(***)"
        );
    }
}
