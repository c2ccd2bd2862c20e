//! The stale-event guard (`order:`): providers do not deliver in order, so a route may
//! name what its events are about (the entity) and how new each is (the version). The
//! store keeps, per entity, the largest version whose event was done; an event whose
//! version is lower is stale, and is forwarded marked with `Dedupe-Stale` or skipped.
//!
//! This module owns the setting, reading an event's entity and version, and the version's
//! order. A version is a non-negative decimal number (`1767225600`, `"1355517523.000005"`)
//! or an RFC 3339 time, which counts as its Unix time in seconds, so that the two kinds
//! compare with each other. Each becomes a sort key of [`SORT_KEY_DIGITS`] digits (20
//! before the point, 9 after), which every store compares byte by byte: the same order
//! in Lua, SQL and Rust, and no floating point anywhere.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::key::{Delivery, KeyTemplate};
use crate::store::keys::{Version, entity_key};

/// How many digits a sort key has: 20 whole (any `u64` and more), 9 fractional
/// (nanoseconds). Digits past the ninth fractional one are not compared.
pub const SORT_KEY_DIGITS: usize = WHOLE_DIGITS + FRACTION_DIGITS;
const WHOLE_DIGITS: usize = 20;
const FRACTION_DIGITS: usize = 9;

/// A route's `order:` setting.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Order {
    /// What the events are about, as a key template: `{json:/data/object/id}`.
    pub entity: KeyTemplate,
    /// How new an event is: a number or an RFC 3339 time; larger is newer.
    pub version: KeyTemplate,
    /// `mark` (forwarded with `Dedupe-Stale`) or `skip` (answered 200, not forwarded).
    #[serde(default)]
    pub on_stale: OnStale,
}

/// `on_stale:`: what becomes of an event older than one already done for its entity.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnStale {
    /// Forwarded with `Dedupe-Stale: <newest done version>`: the app decides.
    #[default]
    Mark,
    /// Answered `200` with `Dedupe-Status: stale`, and recorded as done, unforwarded.
    Skip,
}

/// What a delivery carries for the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// The route has no `order:`.
    Off,
    /// The event has no usable entity or version (why, for the log): it goes unguarded.
    Unversioned(String),
    Versioned(Ordered),
}

/// An event's entity and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    /// As the event named it.
    pub entity: String,
    /// Where the store keeps the entity's record ([`entity_key`]).
    pub store_key: String,
    pub version: Version,
}

impl Order {
    /// The entity and version of a delivery on a route whose keys live in `namespace`, or
    /// why it has none the guard can use.
    pub fn read(&self, namespace: &str, delivery: &Delivery<'_>) -> Guard {
        let read = || {
            let entity = self
                .entity
                .extract(delivery)
                .map_err(|error| format!("entity: {error}"))?;
            let text = self
                .version
                .extract(delivery)
                .map_err(|error| format!("version: {error}"))?;
            let version = parse_version(&text).ok_or_else(|| {
                format!("version: `{text}` is not a non-negative number or an RFC 3339 time")
            })?;
            Ok(Ordered {
                store_key: entity_key(namespace, &entity),
                entity,
                version,
            })
        };
        read().map_or_else(Guard::Unversioned, Guard::Versioned)
    }

    /// Whether the entity or version reads a part of the request that a body signature
    /// does not cover (see [`KeyTemplate::reads_unsigned_parts`]).
    pub(crate) fn reads_unsigned_parts(&self, signed: &[&str]) -> bool {
        self.entity.reads_unsigned_parts(signed) || self.version.reads_unsigned_parts(signed)
    }
}

/// A version, if `text` is one: a non-negative decimal number with at most 20 digits
/// before its point, or an RFC 3339 time from 1970 on.
pub fn parse_version(text: &str) -> Option<Version> {
    let sort_key = decimal_sort_key(text).or_else(|| time_sort_key(text))?;
    debug_assert_eq!(
        sort_key.len(),
        SORT_KEY_DIGITS,
        "the stores compare keys byte by byte"
    );
    Some(Version {
        sort_key,
        text: text.to_owned(),
    })
}

/// `whole[.fraction]`, digits only.
fn decimal_sort_key(text: &str) -> Option<String> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return None,
        None => (text, ""),
    };
    let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    if whole.len() > WHOLE_DIGITS {
        return None;
    }
    let fraction = &fraction[..fraction.len().min(FRACTION_DIGITS)];
    Some(format!(
        "{whole:0>WHOLE_DIGITS$}{fraction:0<FRACTION_DIGITS$}"
    ))
}

fn time_sort_key(text: &str) -> Option<String> {
    let time = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    let seconds = u64::try_from(time.unix_timestamp()).ok()?;
    Some(format!(
        "{seconds:0>WHOLE_DIGITS$}{:0>FRACTION_DIGITS$}",
        time.nanosecond()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> String {
        parse_version(text).expect(text).sort_key
    }

    #[test]
    fn numbers_and_times_share_one_order() {
        let ascending = [
            "0",
            "0.5",
            "9",
            "10",
            "1767225599.999999999",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00.000000001Z",
            "1767225601",
            "2025-12-31T19:00:02-05:00",
            "18446744073709551615",
            "99999999999999999999",
        ];
        for pair in ascending.windows(2) {
            assert!(key(pair[0]) < key(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        for text in ascending {
            assert_eq!(key(text).len(), SORT_KEY_DIGITS, "{text}");
        }
        assert_eq!(key("1767225600"), key("2026-01-01T00:00:00Z"));
        assert_eq!(
            key("2026-01-01T01:00:00+01:00"),
            key("2026-01-01T00:00:00Z")
        );
        assert_eq!(key("007"), key("7"));
        // Compared to the nanosecond.
        assert_eq!(key("1.0000000001"), key("1.0000000002"));
    }

    #[test]
    fn what_is_not_a_version() {
        for text in [
            "",
            "-1",
            "1.",
            ".5",
            "1e3",
            "0x10",
            " 1",
            "1 ",
            "+1",
            "1.2.3",
            "100000000000000000000",
            "1969-12-31T23:59:59Z",
            "2026-01-01",
            "2026-01-01T00:00:00",
            "yesterday",
            "١٢",
        ] {
            assert_eq!(parse_version(text), None, "{text:?}");
        }
    }
}
