//! Finding the value at a JSON pointer in one pass over the body, keeping nothing else.
//!
//! serde_json still reads and checks the whole document, but every value off the
//! pointer's path is skipped (`IgnoredAny`) instead of built. Building a
//! `serde_json::Value` first would cost memory many times the body's size for a body of
//! many small values (a 1 MiB array of zeros is half a million `Value`s), and a sender
//! chooses the body. The answer is the one `Value::pointer` gives: with a key repeated in
//! an object the last one counts, and an array index is `0` or has no leading zero.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a pointer found.
#[derive(Debug, PartialEq)]
pub enum Found {
    Text(String),
    Number(serde_json::Number),
    /// `null`, a boolean, an object or an array.
    Other,
}

/// Splits an RFC 6901 pointer (it starts with `/`) into its reference tokens.
pub fn tokens(pointer: &str) -> Vec<String> {
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
            None => value.deserialize_any(Target).map(Some),
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

/// The value the pointer ends at.
struct Target;

impl<'de> Visitor<'de> for Target {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, text: &str) -> Result<Found, E> {
        Ok(Found::Text(text.to_owned()))
    }

    fn visit_i64<E>(self, number: i64) -> Result<Found, E> {
        Ok(Found::Number(number.into()))
    }

    fn visit_u64<E>(self, number: u64) -> Result<Found, E> {
        Ok(Found::Number(number.into()))
    }

    fn visit_f64<E>(self, number: f64) -> Result<Found, E> {
        // JSON has no NaN or infinity, so this is always a number.
        Ok(serde_json::Number::from_f64(number).map_or(Found::Other, Found::Number))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Found, E> {
        Ok(Found::Other)
    }

    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Found, A::Error> {
        while members.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Found::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut elements: A) -> Result<Found, A::Error> {
        while elements.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Found::Other)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    /// The answer `Value::pointer` gives on a fully parsed document.
    fn by_value(body: &str, pointer: &str) -> Result<Option<Found>, ()> {
        let document: Value = serde_json::from_str(body).map_err(drop)?;
        Ok(document.pointer(pointer).map(|value| match value {
            Value::String(text) => Found::Text(text.clone()),
            Value::Number(number) => Found::Number(number.clone()),
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
                    find(body.as_bytes(), &tokens(pointer)),
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
            (-1e6f64..1e6).prop_map(|f| f.to_string()),
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
            prop_assert_eq!(find(body.as_bytes(), &tokens(&pointer)), by_value(&body, &pointer));
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_not_json() {
        assert_eq!(
            find(b"{\"pad\":\"\xff\",\"id\":\"x\"}", &tokens("/id")),
            Err(())
        );
    }
}
