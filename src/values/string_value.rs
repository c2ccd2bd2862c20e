//! Values read from a string: the visitor that parses one inside serde (so that an error
//! carries the scalar's line and column), and `string_value!`, which gives a type its
//! `Deserialize`, `Serialize` and JSON Schema from its `FromStr` and `Display`.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Visitor};

/// Deserializes any string through `T::from_str`, reporting `expecting` on a non-string.
pub(crate) struct FromStrVisitor<T> {
    expecting: &'static str,
    target: PhantomData<T>,
}

impl<T> FromStrVisitor<T> {
    pub(crate) const fn new(expecting: &'static str) -> Self {
        FromStrVisitor {
            expecting,
            target: PhantomData,
        }
    }
}

impl<T> Visitor<'_> for FromStrVisitor<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        text.parse().map_err(E::custom)
    }
}

/// Implements `Deserialize` through `FromStr`, `Serialize` through `Display` unless told
/// `number`, and `JsonSchema` (the configuration's schema, for editors) as a string, or a
/// string or a bare number (`number`, `or_number`: YAML reads `409` as a number, and the
/// value takes it), with a `pattern` where one catches a typo while it is typed.
/// The module that uses it names `FromStrVisitor`.
macro_rules! string_value {
    ($type:ty, $expecting:literal) => {
        string_value!(@read $type, $expecting, { "type": "string" });
        string_value!(@display $type);
    };
    ($type:ty, $expecting:literal, pattern $pattern:literal) => {
        string_value!(@read $type, $expecting, { "type": "string", "pattern": $pattern });
        string_value!(@display $type);
    };
    ($type:ty, $expecting:literal, or_number, pattern $pattern:literal) => {
        string_value!(@read $type, $expecting, {
            "type": ["string", "integer"],
            "pattern": $pattern,
        });
        string_value!(@display $type);
    };
    ($type:ty, $expecting:literal, or_zero, pattern $pattern:literal) => {
        string_value!(@read $type, $expecting, {
            "anyOf": [{ "type": "string", "pattern": $pattern }, { "const": 0 }],
        });
        string_value!(@display $type);
    };
    ($type:ty, $expecting:literal, number) => {
        string_value!(@read $type, $expecting, { "type": ["number", "string"] });
    };
    (@display $type:ty) => {
        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
    };
    (@read $type:ty, $expecting:literal, { $($schema:tt)* }) => {
        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(FromStrVisitor::new($expecting))
            }
        }

        impl schemars::JsonSchema for $type {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($type).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "description": $expecting, $($schema)* })
            }
        }
    };
}

pub(crate) use string_value;
