//! Finding the value at a JSON pointer in one pass over the body, keeping nothing else.
//!
//! serde_json still reads and checks the whole document, but every value off the
//! pointer's path is skipped (`IgnoredAny`) instead of built. Building a
//! `serde_json::Value` first would cost memory many times the body's size for a body of
//! many small values (a 1 MiB array of zeros is half a million `Value`s), and a sender
//! chooses the body. The answer is the one `Value::pointer` gives: with a key repeated in
//! an object the last one counts, and an array index is `0` or has no leading zero.
//!
//! The value found is read from its own text ([`RawValue`]): a number keeps its exact
//! value, which going through `u64`, `i64` or `f64` would not (`12345678901234567890123`
//! and `12345678901234567890124` are one `f64`, so two events would share a key).

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// What a pointer found.
#[derive(Debug, PartialEq)]
pub enum Found {
    Text(String),
    /// A number, as its text in the document.
    Number(String),
    /// `null`, a boolean, an object or an array.
    Other,
}

impl Found {
    /// Reads a value from its text, which serde_json has checked.
    fn from_raw(raw: &RawValue) -> Result<Found, serde_json::Error> {
        let text = raw.get();
        Ok(match text.as_bytes().first() {
            Some(b'"') => Found::Text(serde_json::from_str(text)?),
            Some(b'-' | b'0'..=b'9') => Found::Number(text.to_owned()),
            _ => Found::Other,
        })
    }
}

/// Splits an RFC 6901 pointer (it starts with `/`) into its reference tokens.
pub(crate) fn tokens(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// The value at `tokens` in `body`, `None` when the pointer leads nowhere, or an error
/// when the body is not one valid JSON document.
pub fn find(body: &[u8], tokens: &[String]) -> Result<Option<Found>, ()> {
    // Checked as a whole first, as a full parse would: serde_json does not check the
    // UTF-8 of the strings it skips.
    let text = std::str::from_utf8(body).map_err(drop)?;
    let mut document = serde_json::Deserializer::from_str(text);
    let found = At { tokens }.deserialize(&mut document).map_err(drop)?;
    document.end().map_err(drop)?;
    Ok(found)
}

/// The value at `tokens` below the value about to be read.
struct At<'t> {
    tokens: &'t [String],
}

impl<'de> DeserializeSeed<'de> for At<'_> {
    type Value = Option<Found>;

    fn deserialize<D: Deserializer<'de>>(self, value: D) -> Result<Self::Value, D::Error> {
        match self.tokens.split_first() {
            None => {
                let raw = <&RawValue>::deserialize(value)?;
                Found::from_raw(raw)
                    .map(Some)
                    .map_err(serde::de::Error::custom)
            }
            Some((token, rest)) => value.deserialize_any(Step { token, rest }),
        }
    }
}

/// One step down the pointer: into the member named `token`, or the element at index
/// `token`. A scalar has nothing below it.
struct Step<'t> {
    token: &'t str,
    rest: &'t [String],
}

impl Step<'_> {
    /// The array index `token` names, as `Value::pointer` reads it.
    fn index(&self) -> Option<usize> {
        if self.token.starts_with('+') || (self.token.starts_with('0') && self.token.len() > 1) {
            return None;
        }
        self.token.parse().ok()
    }
}

impl<'de> Visitor<'de> for Step<'_> {
    type Value = Option<Found>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(named) = members.next_key_seed(Named(self.token))? {
            if named {
                found = members.next_value_seed(At { tokens: self.rest })?;
            } else {
                members.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut elements: A) -> Result<Self::Value, A::Error> {
        let wanted = self.index();
        let mut found = None;
        for index in 0.. {
            if Some(index) == wanted {
                match elements.next_element_seed(At { tokens: self.rest })? {
                    Some(value) => found = value,
                    None => break,
                }
            } else if elements.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
        }
        Ok(found)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Whether an object member's name is the token, compared without copying the name.
struct Named<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for Named<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, name: D) -> Result<bool, D::Error> {
        name.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Named<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, name: &str) -> Result<bool, E> {
        Ok(name == self.0)
    }
}

/// The one way the key writes a JSON number's exact value: digits with no leading zeros,
/// the exponent applied, a fraction without trailing zeros, no sign on zero (`1.50`,
/// `15e-1` and `0.15E1` are all `1.5`; `1e3` is `1000`). `text` is a number as JSON
/// writes them. Fails with the form's length when it would be longer than `limit` bytes,
/// without writing it.
pub(crate) fn canonical_number(text: &str, limit: usize) -> Result<String, usize> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: Vec<u8> = whole.bytes().chain(fraction.bytes()).collect();
    let Some(first) = digits.iter().position(|&digit| digit != b'0') else {
        return Ok("0".to_owned());
    };
    let last = digits
        .iter()
        .rposition(|&digit| digit != b'0')
        .unwrap_or(first);
    let significant = &digits[first..=last];
    // value = significant × 10^scale; an exponent too large for i64 saturates, and its
    // form is then over any limit.
    let exponent: i64 = exponent.parse().unwrap_or(if exponent.starts_with('-') {
        i64::MIN / 2
    } else {
        i64::MAX / 2
    });
    let trailing_zeros = (digits.len() - 1 - last) as i64;
    let scale = exponent
        .saturating_sub(fraction.len() as i64)
        .saturating_add(trailing_zeros);
    let count = significant.len() as i64;
    let digits_length = if scale >= 0 {
        count.saturating_add(scale)
    } else if count + scale > 0 {
        count + 1
    } else {
        // "0." then zeros, then the digits.
        2i64.saturating_add(scale.saturating_neg())
    };
    let length = i64::from(negative).saturating_add(digits_length);
    let length = usize::try_from(length).unwrap_or(usize::MAX);
    if length > limit {
        return Err(length);
    }
    let mut number = String::with_capacity(length);
    if negative {
        number.push('-');
    }
    let significant = std::str::from_utf8(significant).unwrap_or_default();
    if scale >= 0 {
        number.push_str(significant);
        number.extend(std::iter::repeat_n('0', scale as usize));
    } else if count + scale > 0 {
        let point = (count + scale) as usize;
        number.push_str(&significant[..point]);
        number.push('.');
        number.push_str(&significant[point..]);
    } else {
        number.push_str("0.");
        number.extend(std::iter::repeat_n('0', (-(count + scale)) as usize));
        number.push_str(significant);
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn canonical(number: &str) -> String {
        canonical_number(number, usize::MAX).unwrap()
    }

    /// `find`, with a number in its canonical form (what a key holds).
    fn find_canonical(body: &[u8], tokens: &[String]) -> Result<Option<Found>, ()> {
        find(body, tokens).map(|found| match found {
            Some(Found::Number(text)) => Some(Found::Number(canonical(&text))),
            other => other,
        })
    }

    /// The answer `Value::pointer` gives on a fully parsed document.
    fn by_value(body: &str, pointer: &str) -> Result<Option<Found>, ()> {
        let document: Value = serde_json::from_str(body).map_err(drop)?;
        Ok(document.pointer(pointer).map(|value| match value {
            Value::String(text) => Found::Text(text.clone()),
            Value::Number(number) => Found::Number(canonical(&number.to_string())),
            _ => Found::Other,
        }))
    }

    #[test]
    fn finds_what_a_full_parse_finds() {
        let bodies = [
            r#"{"id":"evt_1","data":{"object":{"id":"in_1","n":[10,20,{"x":"y"}]}}}"#,
            r#"{"id":"first","id":"last"}"#,
            r#"{"id":{"deep":"x"},"id":7}"#,
            r#"{"a/b":"slash","m~n":"tilde","":"empty name","e\u0301":"escaped"}"#,
            r#"{"n":-12,"f":1.5,"e":1e3,"big":18446744073709551615,"t":true,"z":null}"#,
            r#"[0,1,2,[3,4]]"#,
            r#""just a string""#,
            r#"{"id":"evt_1"} trailing"#,
            r#"{"id":"evt_1""#,
            "",
        ];
        let pointers = [
            "/id",
            "/data/object/id",
            "/data/object/n/1",
            "/data/object/n/2/x",
            "/data/object/n/3",
            "/data/object/n/01",
            "/data/object/n/-",
            "/data/object/n/+1",
            "/id/deep",
            "/a~1b",
            "/m~0n",
            "/",
            "/e\u{301}",
            "/n",
            "/f",
            "/e",
            "/big",
            "/t",
            "/z",
            "/0",
            "/3/1",
            "/3/1/0",
            "/missing",
            "/data",
        ];
        for body in bodies {
            for pointer in pointers {
                assert_eq!(
                    find_canonical(body.as_bytes(), &tokens(pointer)),
                    by_value(body, pointer),
                    "{pointer} in {body}"
                );
            }
        }
    }

    /// Any JSON document, with member names drawn from a few so that pointers hit them
    /// and names repeat.
    fn documents() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            // Only floats serde_json reads back exactly (without its `float_roundtrip`
            // feature it may miss by one unit in the last place): the oracle parses them.
            (-1e6f64..1e6)
                .prop_filter("serde_json reads it exactly", |f| {
                    serde_json::from_str::<f64>(&f.to_string()).ok() == Some(*f)
                })
                .prop_map(|f| f.to_string()),
            "[a-c/~é\\\\\"]{0,3}".prop_map(|t| serde_json::to_string(&t).unwrap()),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec(("[a-c/~]{0,2}", inner), 0..4).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(name, value)| {
                            format!("{}:{value}", serde_json::to_string(&name).unwrap())
                        })
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn finds_what_a_full_parse_finds_in_any_document(
            body in documents(),
            pointer in prop::collection::vec("[a-c0-3~/]|~0|~1|0|1|01|-", 1..4)
                .prop_map(|tokens| format!("/{}", tokens.join("/"))),
        ) {
            prop_assert_eq!(find_canonical(body.as_bytes(), &tokens(&pointer)), by_value(&body, &pointer));
        }
    }

    #[test]
    fn numbers_keep_their_exact_value_in_one_form() {
        for (text, expected) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("42", "42"),
            ("-42", "-42"),
            ("12345678901234567890123", "12345678901234567890123"),
            ("12345678901234567890124", "12345678901234567890124"),
            ("1.5", "1.5"),
            ("1.50", "1.5"),
            ("15e-1", "1.5"),
            ("0.15E1", "1.5"),
            ("1e3", "1000"),
            ("1E+3", "1000"),
            ("100", "100"),
            ("1.0", "1"),
            ("0.001", "0.001"),
            ("1e-3", "0.001"),
            ("-12.3400e-4", "-0.001234"),
            ("123.456e1", "1234.56"),
        ] {
            assert_eq!(
                canonical_number(text, 512).as_deref(),
                Ok(expected),
                "{text}"
            );
        }
    }

    #[test]
    fn a_number_too_long_to_write_is_measured_not_written() {
        assert_eq!(canonical_number("1e600", 512), Err(601));
        assert_eq!(canonical_number("-1e-600", 512), Err(603));
        assert!(canonical_number("1e99999999999999999999999", 512).is_err());
        assert!(canonical_number("1e-99999999999999999999999", 512).is_err());
        // Exponents at the ends of i64, with a sign: measured without overflow.
        for text in [
            "-1e9223372036854775807",
            "-1e-9223372036854775808",
            "-9.9e9223372036854775807",
            "1e9223372036854775807",
        ] {
            assert!(canonical_number(text, 512).is_err(), "{text}");
        }
        assert_eq!(
            canonical_number("0e99999999999999999999999", 512).as_deref(),
            Ok("0")
        );
        assert_eq!(
            canonical_number(&"9".repeat(512), 512).map(|n| n.len()),
            Ok(512)
        );
        assert_eq!(canonical_number(&"9".repeat(513), 512), Err(513));
    }

    #[test]
    fn numbers_are_found_as_written() {
        let body = br#"{"id":12345678901234567890123,"f":1.50,"s":"a\u0041"}"#;
        assert_eq!(
            find(body, &tokens("/id")),
            Ok(Some(Found::Number("12345678901234567890123".into())))
        );
        assert_eq!(
            find(body, &tokens("/f")),
            Ok(Some(Found::Number("1.50".into())))
        );
        assert_eq!(
            find(body, &tokens("/s")),
            Ok(Some(Found::Text("aA".into())))
        );
    }

    #[test]
    fn a_body_that_is_not_utf8_is_not_json() {
        assert_eq!(
            find(b"{\"pad\":\"\xff\",\"id\":\"x\"}", &tokens("/id")),
            Err(())
        );
    }
}
