//! The methods an application may run a request as besides its own, as the frameworks that
//! honour an override read them: override headers (Express's method-override, ASP.NET
//! Core, Jersey, Google APIs), a `_method` in the query (qs, PHP), and for a POST a
//! `_method` in its body (Rails and Symfony read forms, Laravel JSON too).

use std::borrow::Cow;
use std::fmt;

use http::header::{CONTENT_TYPE, HeaderName};
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

/// The methods a POST's body names in a `_method` field, read as the frameworks read it:
/// a form (URL-encoded, or without a `Content-Type`, as Rack reads one), a multipart
/// form's part, or a JSON object's top-level member. Only a POST is ever overridden.
pub fn body_methods(method: &Method, headers: &HeaderMap, body: &[u8]) -> Vec<String> {
    if *method != Method::POST || body.is_empty() {
        return Vec::new();
    }
    let content_type = headers
        .get(CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase());
    let Some(content_type) = content_type else {
        return owned(form_methods(body));
    };
    let mut parameters = content_type.split(';');
    let media_type = parameters.next().unwrap_or_default().trim();
    if media_type == "application/x-www-form-urlencoded" {
        owned(form_methods(body))
    } else if media_type == "multipart/form-data" {
        let boundary = parameters
            .filter_map(|parameter| parameter.trim().strip_prefix("boundary="))
            .map(|boundary| boundary.trim_matches('"'))
            .next();
        // The boundary is read from the lowercased header; a part's delimiter is matched
        // without regard to case for that reason.
        boundary.map_or_else(Vec::new, |boundary| multipart_methods(body, boundary))
    } else if media_type.ends_with("/json") || media_type.ends_with("+json") {
        json_methods(body)
    } else {
        Vec::new()
    }
}

fn owned(methods: Vec<Cow<'static, str>>) -> Vec<String> {
    methods.into_iter().map(Cow::into_owned).collect()
}

/// Whether a field's name reads as `_method` to some framework: any case, PHP's `.` or
/// space for `_`, an array's `[]` or `[..]` after it (qs and PHP).
fn is_method_field(name: &str) -> bool {
    let name = name.split('[').next().unwrap_or_default();
    name.len() == 7
        && matches!(name.as_bytes()[0], b'_' | b'.' | b' ')
        && name[1..].eq_ignore_ascii_case("method")
}

/// The methods URL-encoded `_method` fields name, escapes and `+` decoded, lists item by
/// item.
fn form_methods(form: &[u8]) -> Vec<Cow<'static, str>> {
    // Most forms and queries name no method; an escape may spell one, so only a form with
    // neither is passed over unparsed.
    if !form.contains(&b'%') && !contains_ignoring_case(form, b"method") {
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
        .collect()
}

fn contains_ignoring_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window.eq_ignore_ascii_case(needle))
}

/// The values of a multipart form's parts named `_method` (RFC 7578).
fn multipart_methods(body: &[u8], boundary: &str) -> Vec<String> {
    if boundary.is_empty() || !contains_ignoring_case(body, b"method") {
        return Vec::new();
    }
    let delimiter = format!("--{boundary}");
    let mut methods = Vec::new();
    for part in split_ignoring_case(body, delimiter.as_bytes()).skip(1) {
        let Some((head, value)) =
            split_once(part, b"\r\n\r\n").or_else(|| split_once(part, b"\n\n"))
        else {
            continue;
        };
        let head = String::from_utf8_lossy(head);
        let named = head.lines().any(|line| {
            let Some((field, rest)) = line.split_once(':') else {
                return false;
            };
            field.trim().eq_ignore_ascii_case("content-disposition")
                && rest.split(';').any(|parameter| {
                    parameter
                        .trim()
                        .split_once('=')
                        .is_some_and(|(name, value)| {
                            name.trim().eq_ignore_ascii_case("name")
                                && is_method_field(value.trim().trim_matches('"'))
                        })
                })
        });
        if named {
            let value = String::from_utf8_lossy(value);
            let value = value.trim();
            if !value.is_empty() {
                methods.push(value.to_owned());
            }
        }
    }
    methods
}

fn split_once<'a>(bytes: &'a [u8], separator: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    let at = bytes
        .windows(separator.len())
        .position(|window| window == separator)?;
    Some((&bytes[..at], &bytes[at + separator.len()..]))
}

/// `bytes` cut at each `separator`, matched without regard to ASCII case.
fn split_ignoring_case<'a>(
    bytes: &'a [u8],
    separator: &'a [u8],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let current = rest?;
        match current
            .windows(separator.len())
            .position(|window| window.eq_ignore_ascii_case(separator))
        {
            Some(at) => {
                rest = Some(&current[at + separator.len()..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

/// The string values of a JSON object's top-level `_method` members (Laravel reads a JSON
/// body's members as its input).
fn json_methods(body: &[u8]) -> Vec<String> {
    // A member's name may be spelled with escapes; without either spelling there is none.
    if !contains_ignoring_case(body, b"method") && !body.windows(2).any(|pair| pair == b"\\u") {
        return Vec::new();
    }
    let mut reader = serde_json::Deserializer::from_slice(body);
    reader.deserialize_map(TopLevelMethods).unwrap_or_default()
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

    fn read(content_type: Option<&str>, body: &str) -> Vec<String> {
        let mut headers = HeaderMap::new();
        if let Some(content_type) = content_type {
            headers.insert(CONTENT_TYPE, content_type.parse().unwrap());
        }
        body_methods(&Method::POST, &headers, body.as_bytes())
    }

    #[test]
    fn a_form_names_a_method_however_its_field_is_spelled() {
        let form = Some("application/x-www-form-urlencoded; charset=utf-8");
        assert_eq!(read(form, "a=1&_method=PUT"), ["PUT"]);
        assert_eq!(read(form, "_%6Dethod=delete"), ["delete"]);
        assert_eq!(read(form, "%5Fmethod%5B%5D=PATCH,PUT"), ["PATCH", "PUT"]);
        assert_eq!(read(None, ".method=put"), ["put"]);
        assert_eq!(read(form, "payment_method=card"), Vec::<String>::new());
        assert_eq!(
            read(Some("text/plain"), "_method=PUT"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_multipart_part_names_a_method() {
        let body = "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--XyZ\r\ncontent-disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n";
        assert_eq!(
            read(Some("multipart/form-data; boundary=XyZ"), body),
            ["DELETE"]
        );
        assert_eq!(
            read(Some("multipart/form-data; boundary=\"XyZ\""), body),
            ["DELETE"]
        );
        assert_eq!(
            read(Some("multipart/form-data"), body),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_json_object_names_a_method_at_its_top_level_only() {
        let json = Some("application/json");
        assert_eq!(read(json, r#"{"id":1,"_method":"PUT"}"#), ["PUT"]);
        assert_eq!(read(json, r#"{"\u005fmethod":"PATCH"}"#), ["PATCH"]);
        assert_eq!(
            read(
                Some("application/vnd.api+json"),
                r#"{"_method":" delete "}"#
            ),
            ["delete"]
        );
        assert_eq!(
            read(json, r#"{"data":{"_method":"PUT"},"payment_method":"x"}"#),
            Vec::<String>::new()
        );
        assert_eq!(read(json, r#"{"_method":["PUT"]}"#), Vec::<String>::new());
        assert_eq!(read(json, r#"[{"_method":"PUT"}]"#), Vec::<String>::new());
        assert_eq!(read(json, "{\"_method\":"), Vec::<String>::new());
    }

    #[test]
    fn only_a_post_is_overridden() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, "application/json".parse().unwrap());
        assert!(body_methods(&Method::PUT, &headers, br#"{"_method":"DELETE"}"#).is_empty());
    }
}
