//! Key templates: parsing `"{header:X-Shop}:{json:/id}"` once at configuration time, and
//! extracting an event's key from a delivery at request time.
//!
//! A template is literal text plus parts in braces. `{{` and `}}` stand for literal braces.
//! Extraction is pure: it reads the request head and the buffered body and never touches
//! the network or the store. The body is read only when a part needs it (`json` or
//! `form`), so a header-keyed route never parses its body; a `json` part reads it in one
//! pass that keeps only the value it points at ([`json`]).

mod json;

use std::fmt;
use std::str::FromStr;

use http::HeaderMap;
use http::header::HeaderName;
use sha2::{Digest, Sha256};

/// The longest key the proxy accepts, in bytes, after the template is filled in.
pub const MAX_KEY_BYTES: usize = 512;

/// A parsed key template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    /// An RFC 6901 JSON pointer into the body, and its reference tokens.
    Json {
        pointer: String,
        tokens: Vec<String>,
    },
    Header(HeaderName),
    /// A header whose value is a Structured Field string (RFC 9651), such as
    /// `Idempotency-Key: "abc"`: the string inside the quotes.
    SfString(HeaderName),
    /// A header's value hashed (the first 16 bytes of its SHA-256, in hex): who sent the
    /// request (`Authorization`), in the key without the credential itself.
    HeaderHash(HeaderName),
    Query(String),
    /// A field of an `application/x-www-form-urlencoded` body.
    Form(String),
}

impl Part {
    fn describe(&self) -> String {
        match self {
            Part::Literal(text) => text.clone(),
            Part::Json { pointer, .. } => format!("{{json:{pointer}}}"),
            Part::Header(name) => format!("{{header:{name}}}"),
            Part::SfString(name) => format!("{{sf-string:{name}}}"),
            Part::HeaderHash(name) => format!("{{header-hash:{name}}}"),
            Part::Query(name) => format!("{{query:{name}}}"),
            Part::Form(name) => format!("{{form:{name}}}"),
        }
    }
}

/// Why a template is invalid.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unclosed `{{` in key template")]
    Unclosed,
    #[error("unmatched `}}` in key template (write `}}}}` for a literal brace)")]
    UnmatchedClose,
    #[error(
        "`{{{0}}}` is not a key part: use json:, header:, sf-string:, header-hash:, query: or form:{meant}",
        meant = meant_kind(.0)
    )]
    UnknownKind(String),
    #[error("`{{{0}:}}` needs a name after the colon")]
    EmptyName(String),
    #[error("JSON pointer `{0}` must start with `/` (RFC 6901)")]
    BadPointer(String),
    #[error("`{0}` is not a valid header name")]
    BadHeader(String),
    #[error(
        "a key template needs at least one {{json:..}}, {{header:..}}, {{sf-string:..}}, {{header-hash:..}}, {{query:..}} or {{form:..}} part; literal text alone would give every event the same key"
    )]
    NoParts,
}

impl FromStr for KeyTemplate {
    type Err = TemplateError;

    fn from_str(source: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::UnmatchedClose),
                '{' => {
                    let mut inner = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => inner.push(c),
                            None => return Err(TemplateError::Unclosed),
                        }
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(parse_part(&inner)?);
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if parts.iter().all(|part| matches!(part, Part::Literal(_))) {
            return Err(TemplateError::NoParts);
        }
        Ok(KeyTemplate {
            source: source.to_owned(),
            parts,
        })
    }
}

/// The kinds of part a template takes.
const KINDS: [&str; 6] = [
    "json",
    "header",
    "sf-string",
    "header-hash",
    "query",
    "form",
];

/// `; did you mean json:?` for a part whose kind is one letter from one.
fn meant_kind(inner: &str) -> String {
    let kind = inner.split_once(':').map_or(inner, |(kind, _)| kind);
    nearest(kind, KINDS.into_iter())
        .map(|near| format!("; did you mean {near}:?"))
        .unwrap_or_default()
}

fn parse_part(inner: &str) -> Result<Part, TemplateError> {
    let Some((kind, name)) = inner.split_once(':') else {
        return Err(TemplateError::UnknownKind(inner.to_owned()));
    };
    if name.is_empty() {
        return Err(TemplateError::EmptyName(kind.to_owned()));
    }
    match kind {
        "json" if name.starts_with('/') => Ok(Part::Json {
            pointer: name.to_owned(),
            tokens: json::tokens(name),
        }),
        "json" => Err(TemplateError::BadPointer(name.to_owned())),
        "header" => HeaderName::from_str(name)
            .map(Part::Header)
            .map_err(|_| TemplateError::BadHeader(name.to_owned())),
        "sf-string" => HeaderName::from_str(name)
            .map(Part::SfString)
            .map_err(|_| TemplateError::BadHeader(name.to_owned())),
        "header-hash" => HeaderName::from_str(name)
            .map(Part::HeaderHash)
            .map_err(|_| TemplateError::BadHeader(name.to_owned())),
        "query" => Ok(Part::Query(name.to_owned())),
        "form" => Ok(Part::Form(name.to_owned())),
        _ => Err(TemplateError::UnknownKind(inner.to_owned())),
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Why a delivery has no usable key.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A part is absent, empty, null, an object, an array or a boolean, holds a control
    /// character or invalid UTF-8, or the body is not the JSON or form it should be.
    /// `on_missing_key` decides what happens.
    #[error("{part}: {reason}")]
    Missing { part: String, reason: &'static str },
    /// The key exceeds [`MAX_KEY_BYTES`]; always rejected.
    #[error("key is {0} bytes, over the limit of {MAX_KEY_BYTES}")]
    TooLong(usize),
}

/// What a template reads from: the request head and its buffered body.
pub struct Delivery<'a> {
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    pub body: &'a [u8],
}

impl KeyTemplate {
    /// Whether the key reads a header other than `signed` ones, or the query: parts of the
    /// request that no body signature covers.
    pub(crate) fn reads_unsigned_parts(&self, signed: &[&str]) -> bool {
        self.parts.iter().any(|part| match part {
            Part::Header(name) | Part::SfString(name) | Part::HeaderHash(name) => {
                !signed.contains(&name.as_str())
            }
            Part::Query(_) => true,
            Part::Literal(_) | Part::Json { .. } | Part::Form(_) => false,
        })
    }

    /// Each part that reads the delivery, as written, with what it read or why it read
    /// nothing: a dry run's account of where a key came from.
    pub fn readings(&self, delivery: &Delivery<'_>) -> Vec<(String, Result<String, KeyError>)> {
        self.parts
            .iter()
            .filter(|part| !matches!(part, Part::Literal(_)))
            .map(|part| {
                let mut value = String::new();
                let read = part.extract_into(delivery, &mut value).map(|()| value);
                (part.describe(), read)
            })
            .collect()
    }

    /// The parts that read nothing from `sample` (a provider's own delivery) where it has
    /// a name one letter away (added, dropped, changed or two swapped; case aside): each
    /// part as written, and as it was likely meant. A name further off may be a field of
    /// another event type: it is left alone. `json` says whether the sample's body has the
    /// shape of every delivery (an envelope), so that its fields can be compared.
    pub fn near_misses(&self, sample: &Delivery<'_>, json: bool) -> Vec<(String, String)> {
        let body: Option<serde_json::Value> = json
            .then(|| serde_json::from_slice(sample.body).ok())
            .flatten();
        let header = |name: &HeaderName| -> Option<String> {
            if sample.headers.contains_key(name) {
                return None;
            }
            nearest(name.as_str(), sample.headers.keys().map(HeaderName::as_str))
        };
        self.parts
            .iter()
            .filter_map(|part| {
                let meant = match part {
                    Part::Json { tokens, .. } => json_near_miss(body.as_ref()?, tokens)
                        .map(|pointer| format!("{{json:{pointer}}}")),
                    Part::Header(name) => header(name).map(|near| format!("{{header:{near}}}")),
                    Part::SfString(name) => {
                        header(name).map(|near| format!("{{sf-string:{near}}}"))
                    }
                    Part::HeaderHash(name) => {
                        header(name).map(|near| format!("{{header-hash:{near}}}"))
                    }
                    Part::Form(name) => {
                        let fields: Vec<String> = form_urlencoded::parse(sample.body)
                            .map(|(name, _)| name.into_owned())
                            .collect();
                        if fields.iter().any(|field| field == name) {
                            None
                        } else {
                            nearest(name, fields.iter().map(String::as_str))
                                .map(|near| format!("{{form:{near}}}"))
                        }
                    }
                    Part::Literal(_) | Part::Query(_) => None,
                }?;
                Some((part.describe(), meant))
            })
            .collect()
    }

    /// The headers the template reads.
    pub fn header_names(&self) -> impl Iterator<Item = &HeaderName> {
        self.parts.iter().filter_map(|part| match part {
            Part::Header(name) | Part::SfString(name) | Part::HeaderHash(name) => Some(name),
            Part::Literal(_) | Part::Json { .. } | Part::Query(_) | Part::Form(_) => None,
        })
    }

    /// Fills in the template from a delivery.
    pub fn extract(&self, delivery: &Delivery<'_>) -> Result<String, KeyError> {
        let mut key = String::new();
        for part in &self.parts {
            part.extract_into(delivery, &mut key)?;
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(KeyError::TooLong(key.len()));
        }
        Ok(key)
    }
}

impl Part {
    /// Adds this part's value in `delivery` to `key`.
    fn extract_into(&self, delivery: &Delivery<'_>, key: &mut String) -> Result<(), KeyError> {
        let missing = |reason| KeyError::Missing {
            part: self.describe(),
            reason,
        };
        match self {
            Part::Literal(text) => key.push_str(text),
            Part::Header(name) => {
                let value = delivery
                    .headers
                    .get(name)
                    .ok_or_else(|| missing("header absent"))?;
                let value = value
                    .to_str()
                    .map_err(|_| missing("header is not visible ASCII"))?;
                key.push_str(usable(value).map_err(missing)?);
            }
            Part::SfString(name) => {
                let text = sf_string(delivery.headers, name).map_err(missing)?;
                key.push_str(usable(&text).map_err(missing)?);
            }
            Part::HeaderHash(name) => {
                key.push_str(&header_hash(delivery.headers, name).map_err(missing)?);
            }
            Part::Query(name) => {
                let query = delivery.query.unwrap_or("").as_bytes();
                let value = first_pair(query, name).ok_or_else(|| missing("query absent"))?;
                key.push_str(usable(&value.map_err(missing)?).map_err(missing)?);
            }
            Part::Form(name) => {
                let value =
                    first_pair(delivery.body, name).ok_or_else(|| missing("form field absent"))?;
                key.push_str(usable(&value.map_err(missing)?).map_err(missing)?);
            }
            Part::Json { tokens, .. } => {
                let found = json::find(delivery.body, tokens)
                    .map_err(|()| missing("body is not valid JSON"))?;
                match found {
                    Some(json::Found::Text(text)) => key.push_str(usable(&text).map_err(missing)?),
                    Some(json::Found::Number(text)) => {
                        let room = MAX_KEY_BYTES.saturating_sub(key.len());
                        let number = json::canonical_number(&text, room).map_err(|length| {
                            KeyError::TooLong(key.len().saturating_add(length))
                        })?;
                        key.push_str(&number);
                    }
                    Some(json::Found::Other) => {
                        return Err(missing("JSON value is not a string or number"));
                    }
                    None => return Err(missing("JSON value absent")),
                }
            }
        }
        Ok(())
    }
}

/// The pointer `tokens` likely meant in `body`: the first token `body` lacks replaced by
/// the name beside it one letter away, or none.
fn json_near_miss(body: &serde_json::Value, tokens: &[String]) -> Option<String> {
    let mut at = body;
    for (index, token) in tokens.iter().enumerate() {
        at = match at {
            serde_json::Value::Object(fields) => match fields.get(token) {
                Some(next) => next,
                None => {
                    let near = nearest(token, fields.keys().map(String::as_str))?;
                    let mut meant = tokens.to_vec();
                    meant[index] = near;
                    let escaped = meant
                        .iter()
                        .map(|token| token.replace('~', "~0").replace('/', "~1"));
                    return Some(escaped.map(|token| format!("/{token}")).collect());
                }
            },
            serde_json::Value::Array(items) => items.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    None
}

/// The one of `names` that `written` misspells by one letter (added, dropped, changed or
/// two swapped), compared without regard to case.
fn nearest<'a>(written: &str, mut names: impl Iterator<Item = &'a str>) -> Option<String> {
    let written = written.to_ascii_lowercase();
    names
        .find(|name| strsim::osa_distance(&written, &name.to_ascii_lowercase()) <= 1)
        .map(str::to_owned)
}

/// The quoted Structured Field string of the header `name`. Several lines of one field
/// are one value, joined by commas: two keys are not a string, as the application would
/// see.
fn sf_string(headers: &HeaderMap, name: &HeaderName) -> Result<String, &'static str> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next().ok_or("header absent")?;
    if lines.next().is_some() {
        return Err("header appears more than once");
    }
    let item = sfv::Parser::new(first.as_bytes())
        .parse::<sfv::Item>()
        .map_err(|_| "header is not a Structured Field string")?;
    let text = item
        .bare_item
        .as_string()
        .ok_or("header is not a quoted Structured Field string")?;
    Ok(text.as_str().to_owned())
}

/// The first 16 bytes of a SHA-256 over every line of the header `name`, in hex.
fn header_hash(headers: &HeaderMap, name: &HeaderName) -> Result<String, &'static str> {
    let mut hash = Sha256::new();
    let mut lines = headers.get_all(name).iter().peekable();
    if lines.peek().is_none() {
        return Err("header absent");
    }
    for line in lines {
        hash.update((line.len() as u64).to_be_bytes());
        hash.update(line.as_bytes());
    }
    Ok(hex::encode(&hash.finalize()[..16]))
}

/// A part's value, if a key can hold it: not empty, and without control characters (which
/// PostgreSQL's `text` cannot store: NUL) or characters that would break, reorder or hide
/// part of a log line or an admin listing ([`crate::misleading`]); none has a place in an
/// event ID.
fn usable(value: &str) -> Result<&str, &'static str> {
    if value.is_empty() {
        Err("value is empty")
    } else if value.chars().any(crate::misleading::is_misleading) {
        Err("value contains a control or formatting character")
    } else {
        Ok(value)
    }
}

/// The first value of `name` in URL-encoded `pairs` (a query string or a form body), or an
/// error when it is not UTF-8 once decoded. Split here rather than with `form_urlencoded`,
/// which replaces invalid UTF-8 with U+FFFD: two different event IDs would then share a key.
fn first_pair(pairs: &[u8], name: &str) -> Option<Result<String, &'static str>> {
    let decode = |encoded: &[u8]| -> Vec<u8> {
        let spaced: Vec<u8> = encoded
            .iter()
            .map(|&byte| if byte == b'+' { b' ' } else { byte })
            .collect();
        percent_encoding::percent_decode(&spaced).collect()
    };
    pairs
        .split(|&byte| byte == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.iter().position(|&byte| byte == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &[][..]),
        })
        .find(|(field, _)| decode(field) == name.as_bytes())
        .map(|(_, value)| String::from_utf8(decode(value)).map_err(|_| "value is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn template(text: &str) -> KeyTemplate {
        text.parse().unwrap()
    }

    #[test]
    fn two_lines_of_a_structured_field_are_no_string() {
        let key = extract(
            "{sf-string:Idempotency-Key}",
            &[("idempotency-key", "\"a\""), ("idempotency-key", "\"b\"")],
            None,
            "",
        );
        assert!(matches!(key, Err(KeyError::Missing { .. })), "{key:?}");
    }

    #[test]
    fn a_hashed_header_tells_senders_apart_without_showing_the_value() {
        let key = |auth: &str| {
            extract(
                "{header-hash:Authorization}:k",
                &[("authorization", auth)],
                None,
                "",
            )
            .unwrap()
        };
        let alice = key("Bearer alice-secret");
        assert_eq!(alice.len(), 32 + 2);
        assert!(!alice.contains("alice"));
        assert_eq!(alice, key("Bearer alice-secret"), "stable");
        assert_ne!(alice, key("Bearer bob-secret"));
        let absent = extract("{header-hash:Authorization}", &[], None, "");
        assert!(matches!(absent, Err(KeyError::Missing { .. })));
    }

    #[test]
    fn a_structured_field_string_is_read_from_inside_its_quotes() {
        let key = |value: &str| {
            extract(
                "{sf-string:Idempotency-Key}",
                &[("idempotency-key", value)],
                None,
                "",
            )
        };
        assert_eq!(key(r#""8e03978e-40d5""#), Ok("8e03978e-40d5".into()));
        assert_eq!(key(r#""say \"hi\"""#), Ok(r#"say "hi""#.into()));
        assert_eq!(
            key(r#""abc";p=1"#),
            Ok("abc".into()),
            "parameters are allowed"
        );
        for bad in ["abc", r#""abc"#, "1", "?1", r#""""#, r#""a" "b""#, ":YWJj:"] {
            assert!(
                matches!(key(bad), Err(KeyError::Missing { .. })),
                "{bad}: {:?}",
                key(bad)
            );
        }
        let absent = extract("{sf-string:Idempotency-Key}", &[], None, "");
        assert!(matches!(absent, Err(KeyError::Missing { .. })));
    }

    fn extract(
        text: &str,
        headers: &[(&str, &str)],
        query: Option<&str>,
        body: &str,
    ) -> Result<String, KeyError> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_str(name).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        template(text).extract(&Delivery {
            headers: &map,
            query,
            body: body.as_bytes(),
        })
    }

    #[test]
    fn parses_every_part_kind_and_literals() {
        let parsed = template("a{{b}}:{json:/id}-{header:X-Id}{query:q}{form:f}");
        assert_eq!(
            parsed.parts,
            vec![
                Part::Literal("a{b}:".into()),
                Part::Json {
                    pointer: "/id".into(),
                    tokens: vec!["id".into()],
                },
                Part::Literal("-".into()),
                Part::Header(HeaderName::from_static("x-id")),
                Part::Query("q".into()),
                Part::Form("f".into()),
            ]
        );
        assert_eq!(
            parsed.to_string(),
            "a{{b}}:{json:/id}-{header:X-Id}{query:q}{form:f}"
        );
    }

    #[test]
    fn rejects_bad_templates() {
        let error = |text: &str| text.parse::<KeyTemplate>().unwrap_err();
        assert_eq!(error("{json:/id"), TemplateError::Unclosed);
        assert_eq!(error("id}"), TemplateError::UnmatchedClose);
        assert_eq!(
            error("{body:/id}"),
            TemplateError::UnknownKind("body:/id".into())
        );
        assert_eq!(error("{id}"), TemplateError::UnknownKind("id".into()));
        assert_eq!(
            error("{header:}"),
            TemplateError::EmptyName("header".into())
        );
        assert_eq!(error("{json:id}"), TemplateError::BadPointer("id".into()));
        assert_eq!(
            error("{header:bad name}"),
            TemplateError::BadHeader("bad name".into())
        );
        assert_eq!(error("constant"), TemplateError::NoParts);
        assert_eq!(error(""), TemplateError::NoParts);
    }

    #[test]
    fn json_strings_and_numbers() {
        assert_eq!(
            extract("{json:/id}", &[], None, r#"{"id":"evt_1"}"#).unwrap(),
            "evt_1"
        );
        assert_eq!(
            extract("{json:/n}", &[], None, r#"{"n":42}"#).unwrap(),
            "42"
        );
        assert_eq!(
            extract("{json:/n}", &[], None, r#"{"n":-1.5}"#).unwrap(),
            "-1.5"
        );
        assert_eq!(
            extract("{json:/n}", &[], None, r#"{"n":1.50}"#).unwrap(),
            "1.5"
        );
        assert_eq!(
            extract("{json:/a~1b/0}", &[], None, r#"{"a/b":["x"]}"#).unwrap(),
            "x"
        );
    }

    #[test]
    fn unusable_json_values_are_missing() {
        for body in [
            r#"{"id":null}"#,
            r#"{"id":""}"#,
            r#"{"id":{}}"#,
            r#"{"id":[1]}"#,
            r#"{"id":true}"#,
            r#"{"other":1}"#,
            "not json",
            "",
        ] {
            let result = extract("{json:/id}", &[], None, body);
            assert!(
                matches!(result, Err(KeyError::Missing { .. })),
                "{body}: {result:?}"
            );
        }
    }

    #[test]
    fn headers_query_and_form() {
        assert_eq!(
            extract(
                "{header:x-shop}:{header:X-Event}",
                &[("X-Shop", "s.example"), ("x-event", "7")],
                None,
                ""
            )
            .unwrap(),
            "s.example:7"
        );
        assert_eq!(
            extract("{query:event_id}", &[], Some("a=1&event_id=e%201"), "").unwrap(),
            "e 1"
        );
        assert_eq!(
            extract(
                "{form:MessageSid}",
                &[],
                None,
                "To=%2B1&MessageSid=SM123&MessageSid=SM9"
            )
            .unwrap(),
            "SM123"
        );
        assert!(extract("{header:x-id}", &[("x-id", "")], None, "").is_err());
        assert!(extract("{header:x-id}", &[], None, "").is_err());
        assert!(extract("{query:id}", &[], None, "").is_err());
        assert!(extract("{query:id}", &[], Some("id="), "").is_err());
        assert!(extract("{form:id}", &[], None, "other=1").is_err());
    }

    #[test]
    fn large_numbers_keep_every_digit() {
        let first = extract("{json:/id}", &[], None, r#"{"id":12345678901234567890123}"#);
        let second = extract("{json:/id}", &[], None, r#"{"id":12345678901234567890124}"#);
        assert_eq!(first.unwrap(), "12345678901234567890123");
        assert_eq!(second.unwrap(), "12345678901234567890124");
        assert_eq!(
            extract("{json:/n}", &[], None, r#"{"n":1e3}"#).unwrap(),
            "1000"
        );
        assert_eq!(
            extract("x{json:/n}", &[], None, r#"{"n":1e600}"#),
            Err(KeyError::TooLong(602))
        );
    }

    #[test]
    fn control_characters_make_a_key_unusable_wherever_they_come_from() {
        for body in [
            r#"{"id":"nul\u0000key"}"#,
            r#"{"id":"line\nbreak"}"#,
            r#"{"id":"\u007f"}"#,
            r#"{"id":"evt\u2028"}"#,
            r#"{"id":"evt\u202emoc"}"#,
        ] {
            let result = extract("{json:/id}", &[], None, body);
            assert!(
                matches!(result, Err(KeyError::Missing { .. })),
                "{body}: {result:?}"
            );
        }
        assert!(extract("{query:id}", &[], Some("id=a%00b"), "").is_err());
        assert!(extract("{form:id}", &[], None, "id=a%0Ab").is_err());
        assert_eq!(
            extract("{json:/id}", &[], None, r#"{"id":"caf\u00e9 \u2603"}"#).unwrap(),
            "café ☃"
        );
    }

    #[test]
    fn query_and_form_values_that_are_not_utf8_are_not_keys() {
        // Replacing invalid bytes would give these two one key.
        assert!(extract("{query:id}", &[], Some("id=a%FF"), "").is_err());
        assert!(extract("{form:id}", &[], None, "id=a%FE").is_err());
        assert_eq!(
            extract("{query:id}", &[], Some("x&id=a+b%20c&id=2"), "").unwrap(),
            "a b c"
        );
        assert_eq!(extract("{query:a b}", &[], Some("a+b=1"), "").unwrap(), "1");
    }

    #[test]
    fn non_ascii_header_is_missing() {
        let mut headers = HeaderMap::new();
        headers.insert("x-id", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let result = template("{header:x-id}").extract(&Delivery {
            headers: &headers,
            query: None,
            body: b"",
        });
        assert!(matches!(result, Err(KeyError::Missing { .. })));
    }

    #[test]
    fn key_length_limit_is_512_bytes() {
        let at_limit = "a".repeat(MAX_KEY_BYTES);
        assert_eq!(
            extract("{query:k}", &[], Some(&format!("k={at_limit}")), "")
                .unwrap()
                .len(),
            512
        );
        let over = "a".repeat(MAX_KEY_BYTES - 1);
        assert_eq!(
            extract("x{query:k}y", &[], Some(&format!("k={over}")), ""),
            Err(KeyError::TooLong(513))
        );
    }
}
