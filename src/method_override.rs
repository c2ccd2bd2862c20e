//! The methods an application may run a request as besides its own, as the frameworks that
//! honour an override read them: override headers (Express's method-override, ASP.NET
//! Core, Jersey, Google APIs), a `_method` in the query (qs, PHP), and for a POST a
//! `_method` in its body (Rails and Symfony read forms, Laravel JSON too).

use std::borrow::Cow;
use std::fmt;

use http::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderName};
use http::{HeaderMap, Method};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

/// Headers some frameworks read a request's method from, in place of its own.
static HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The methods the override headers name, item by item.
pub(crate) fn header_methods(headers: &HeaderMap) -> impl Iterator<Item = Cow<'_, str>> {
    HEADERS
        .iter()
        .flat_map(|name| headers.get_all(name))
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|method| Cow::Borrowed(method.trim()))
        .filter(|method| !method.is_empty())
}

/// The methods a query's `_method` parameters name.
pub(crate) fn query_methods(query: &str) -> Vec<Cow<'static, str>> {
    form_methods(query.as_bytes())
}

/// A POST body that may name a method in a way not read here: encoded, multipart,
/// JSON that does not parse, or in a charset other than UTF-8.
#[derive(Debug, PartialEq, Eq)]
pub struct Unreadable;

/// The methods a POST's body names in a `_method` field, as the frameworks read it: a
/// form (URL-encoded, or without a `Content-Type`, as Rack reads one), or a JSON object's
/// top-level member (Laravel reads any type holding `/json` or `+json` as JSON). What
/// cannot be read so, and may name one, is [`Unreadable`]: the frameworks' parsers
/// differ in more ways than are worth matching one by one. Only a POST is overridden.
pub fn body_methods(
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<String>, Unreadable> {
    if *method != Method::POST || body.is_empty() {
        return Ok(Vec::new());
    }
    let encoded = headers
        .get(CONTENT_ENCODING)
        .is_some_and(|value| !value.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return Err(Unreadable);
    }
    let Some(content_type) = headers.get(CONTENT_TYPE) else {
        return Ok(owned(form_methods(body)));
    };
    let content_type = String::from_utf8_lossy(content_type.as_bytes()).to_ascii_lowercase();
    // Rack and PHP end the media type at the first `;`, `,` or space.
    let media_type = content_type
        .trim_start()
        .split([';', ',', ' '])
        .next()
        .unwrap_or_default();
    let mut methods = Vec::new();
    if media_type == "application/x-www-form-urlencoded" {
        methods.extend(owned(form_methods(body)));
    }
    if media_type.starts_with("multipart/") && mentions_method(body) {
        return Err(Unreadable);
    }
    if content_type.contains("/json") || content_type.contains("+json") {
        let utf8 = content_type
            .split_once("charset=")
            .is_none_or(|(_, charset)| charset.trim_matches(['"', ' ']).starts_with("utf-8"));
        if !utf8 {
            return Err(Unreadable);
        }
        methods.extend(json_methods(body)?);
    }
    Ok(methods)
}

fn owned(methods: Vec<Cow<'static, str>>) -> Vec<String> {
    methods.into_iter().map(Cow::into_owned).collect()
}

/// Whether a field's name reads as `_method` to some framework: any case, PHP's `.` or
/// space for `_`, leading spaces and brackets and what follows a NUL dropped (PHP, Rack),
/// an array's `[]` or `[..]` after it (qs and PHP).
fn is_method_field(name: &str) -> bool {
    let name = name.split('\0').next().unwrap_or_default();
    let spelled = |name: &str| {
        let name = name.split('[').next().unwrap_or_default();
        let name = name.trim_end_matches(']');
        name.len() == 7
            && matches!(name.as_bytes()[0], b'_' | b'.' | b' ')
            && name[1..].eq_ignore_ascii_case("method")
    };
    spelled(name.trim_start_matches([']', '[']))
        || spelled(name.trim_start_matches([' ', '[', ']']))
}

/// The most methods read from a form: more than any request may be read as, so that the
/// target's bound refuses it, without collecting every item of a huge list.
const MOST_METHODS: usize = 16;

/// The methods URL-encoded `_method` fields name, escapes and `+` decoded, lists item by
/// item, [`MOST_METHODS`] at most.
fn form_methods(form: &[u8]) -> Vec<Cow<'static, str>> {
    // Most forms and queries name no method; an escape may spell one, so only a form with
    // neither is passed over unparsed.
    if !form.contains(&b'%') && !mentions_method(form) {
        return Vec::new();
    }
    form_urlencoded::parse(form)
        .filter(|(name, _)| is_method_field(name))
        .flat_map(|(_, value)| {
            value
                .split(',')
                .map(|method| Cow::<str>::Owned(method.trim().to_owned()))
                .collect::<Vec<_>>()
        })
        .filter(|method| !method.is_empty())
        .take(MOST_METHODS)
        .collect()
}

/// Whether `bytes` hold `method` in any case.
fn mentions_method(bytes: &[u8]) -> bool {
    bytes
        .windows(6)
        .any(|window| window.eq_ignore_ascii_case(b"method"))
}

/// The string values of a JSON object's top-level `_method` members (Laravel reads a JSON
/// body's members as its input); JSON that does not parse (too deep for serde_json, say,
/// which PHP reads) and may name one is [`Unreadable`].
fn json_methods(body: &[u8]) -> Result<Vec<String>, Unreadable> {
    // A member's name may be spelled with escapes; without either spelling there is none.
    let escaped = body.windows(2).any(|pair| pair == b"\\u");
    if !mentions_method(body) && !escaped {
        return Ok(Vec::new());
    }
    let mut reader = serde_json::Deserializer::from_slice(body);
    match reader.deserialize_map(TopLevelMethods) {
        Ok(methods) => Ok(methods),
        Err(error) if error.is_syntax() || error.is_eof() => Err(Unreadable),
        // Not an object (an array, a string): no member to read.
        Err(_) => Ok(Vec::new()),
    }
}

struct TopLevelMethods;

impl<'de> Visitor<'de> for TopLevelMethods {
    type Value = Vec<String>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
        let mut methods = Vec::new();
        while let Some(name) = map.next_key::<Cow<'de, str>>()? {
            if name == "_method" {
                if let serde_json::Value::String(method) = map.next_value()? {
                    let method = method.trim();
                    if !method.is_empty() {
                        methods.push(method.to_owned());
                    }
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(methods)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_with(pairs: &[(&str, &str)], body: &str) -> Result<Vec<String>, Unreadable> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        body_methods(&Method::POST, &headers, body.as_bytes())
    }

    fn read(content_type: Option<&str>, body: &str) -> Result<Vec<String>, Unreadable> {
        match content_type {
            Some(content_type) => read_with(&[("content-type", content_type)], body),
            None => read_with(&[], body),
        }
    }

    #[test]
    fn a_form_names_a_method_however_its_field_is_spelled() {
        let form = Some("application/x-www-form-urlencoded; charset=utf-8");
        assert_eq!(read(form, "a=1&_method=PUT").unwrap(), ["PUT"]);
        assert_eq!(read(form, "_%6Dethod=delete").unwrap(), ["delete"]);
        assert_eq!(
            read(form, "%5Fmethod%5B%5D=PATCH,PUT").unwrap(),
            ["PATCH", "PUT"]
        );
        assert_eq!(read(None, ".method=put").unwrap(), ["put"]);
        for spelled in [
            "+_method",
            "]_method",
            "_method]",
            "_method%00x",
            "[_method",
        ] {
            assert_eq!(
                read(form, &format!("{spelled}=PUT")).unwrap(),
                ["PUT"],
                "{spelled}"
            );
        }
        // PHP and Rack end the media type at a comma too.
        let comma = Some("application/x-www-form-urlencoded,");
        assert_eq!(read(comma, "_method=PUT").unwrap(), ["PUT"]);
        assert!(read(form, "payment_method=card").unwrap().is_empty());
        assert!(read(Some("text/plain"), "_method=PUT").unwrap().is_empty());
        let many = format!("_method={}", vec!["a"; 100_000].join(","));
        assert_eq!(read(form, &many).unwrap().len(), MOST_METHODS);
    }

    #[test]
    fn what_cannot_be_read_so_and_may_name_one_is_unreadable() {
        let multipart =
            "--b\r\nContent-Disposition: form-data;\r\n name='_method'\r\n\r\nPUT\r\n--b--\r\n";
        for content_type in [
            "multipart/form-data; boundary=b",
            "multipart/mixed; boundary=b",
        ] {
            assert_eq!(read(Some(content_type), multipart), Err(Unreadable));
        }
        assert!(
            read(
                Some("multipart/form-data; boundary=b"),
                "--b\r\n\r\nx\r\n--b--"
            )
            .unwrap()
            .is_empty()
        );
        let gzip = [
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ];
        assert_eq!(read_with(&gzip, "\u{1f}"), Err(Unreadable));
        let deep = format!(
            r#"{{"_method":"PUT","x":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        // Deeper than serde_json's limit beside it: still read (PHP reads 512 deep).
        assert_eq!(read(Some("application/json"), &deep).unwrap(), ["PUT"]);
        assert_eq!(
            read(Some("application/json; charset=utf-16"), "{}"),
            Err(Unreadable)
        );
    }

    #[test]
    fn a_json_object_names_a_method_at_its_top_level_only() {
        let json = Some("application/json");
        assert_eq!(read(json, r#"{"id":1,"_method":"PUT"}"#).unwrap(), ["PUT"]);
        assert_eq!(
            read(json, r#"{"\u005fmethod":"PATCH"}"#).unwrap(),
            ["PATCH"]
        );
        assert_eq!(
            read(
                Some("application/vnd.api+json"),
                r#"{"_method":" delete "}"#
            )
            .unwrap(),
            ["delete"]
        );
        // Laravel reads any type holding `/json` as JSON.
        assert_eq!(
            read(
                Some("application/jsonx, text/plain"),
                r#"{"_method":"PUT"}"#
            )
            .unwrap(),
            ["PUT"]
        );
        assert!(
            read(json, r#"{"data":{"_method":"PUT"},"payment_method":"x"}"#)
                .unwrap()
                .is_empty()
        );
        assert!(read(json, r#"{"_method":["PUT"]}"#).unwrap().is_empty());
        assert!(read(json, r#"[{"_method":"PUT"}]"#).unwrap().is_empty());
        assert_eq!(read(json, "{\"_method\":"), Err(Unreadable));
    }

    #[test]
    fn only_a_post_is_overridden() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, "application/json".parse().unwrap());
        let put = body_methods(&Method::PUT, &headers, br#"{"_method":"DELETE"}"#);
        assert!(put.unwrap().is_empty());
    }
}
