//! What a route's delivery log records beyond the entry itself (`log:`, resolved): by
//! default neither bodies nor headers, which hold personal data and secrets.

use http::HeaderName;
use serde::Serialize;

use crate::values::as_written;

/// A route's `log:` settings, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogPolicy {
    /// Record each request's body, up to `max_body_bytes`.
    pub bodies: bool,
    #[serde(serialize_with = "as_written::size")]
    pub max_body_bytes: u64,
    /// The request headers recorded (never a signature, credential or cookie).
    #[serde(serialize_with = "header_names")]
    pub headers: Vec<HeaderName>,
}

/// `max_body_bytes` when the file does not say.
pub const MAX_BODY_BYTES: u64 = 4096;

impl Default for LogPolicy {
    fn default() -> Self {
        LogPolicy {
            bodies: false,
            max_body_bytes: MAX_BODY_BYTES,
            headers: Vec::new(),
        }
    }
}

fn header_names<S: serde::Serializer>(
    names: &[HeaderName],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(names.iter().map(HeaderName::as_str))
}

/// A header a route's delivery log records (`log.headers`): never one that carries a
/// secret (a signature, a credential, a cookie), whatever the provider calls it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoggedHeader(pub HeaderName);

impl std::str::FromStr for LoggedHeader {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let name = text
            .parse::<HeaderName>()
            .map_err(|_| format!("`{text}` is not a valid header name"))?;
        const SECRET_WORDS: [&str; 9] = [
            "authorization",
            "cookie",
            "signature",
            "hmac",
            "token",
            "secret",
            "api-key",
            "apikey",
            "password",
        ];
        if SECRET_WORDS.iter().any(|word| name.as_str().contains(word)) {
            return Err(format!(
                "`{text}` is not logged: signature, credential and cookie headers never are"
            ));
        }
        Ok(LoggedHeader(name))
    }
}

impl std::fmt::Display for LoggedHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_str())
    }
}

impl schemars::JsonSchema for LoggedHeader {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LoggedHeader".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "a header name; never a signature, credential or cookie header",
        })
    }
}

impl<'de> serde::Deserialize<'de> for LoggedHeader {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(crate::values::FromStrVisitor::new("a header name"))
    }
}
