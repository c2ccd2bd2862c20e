//! The delivery log's contract: one entry per request a route took (and per queued
//! attempt), kept beside the claims (on sled in files of the data directory, on Redis
//! and PostgreSQL in the shared store, so that every replica's deliveries are in one
//! log), newest first, until its retention ends or newer entries push it out.
//!
//! An entry is named by a [`LogId`], two numbers the backend gives it when it stores it:
//! ids grow in the order entries are stored, on every store.

pub(crate) mod chunk;

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::Millis;

/// Where an entry stands in its log: sled's chunk and place in it, Redis's stream ID
/// (milliseconds, and sequence and place in its batch), PostgreSQL's row and place in its
/// chunk (0 for a row of an earlier version). Ordered as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogId(pub u64, pub u64);

impl fmt::Display for LogId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

impl FromStr for LogId {
    type Err = StoreError;

    fn from_str(text: &str) -> Result<LogId, StoreError> {
        let bad = || StoreError::BadRequest(format!("`{text}` is not a delivery's id"));
        let (first, second) = text.split_once('-').ok_or_else(bad)?;
        let number = |part: &str| {
            (!part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()))
                .then(|| part.parse::<u64>().ok())
                .flatten()
        };
        Ok(LogId(
            number(first).ok_or_else(bad)?,
            number(second).ok_or_else(bad)?,
        ))
    }
}

/// What became of a request, as the log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Forwarded; the app succeeded; the key is done.
    Forwarded,
    /// The key was done: answered without forwarding.
    Duplicate,
    /// Another delivery of the key was under way.
    InFlight,
    /// The key is held (its forward may have run), or this delivery's forward was
    /// ambiguous and held it.
    Held,
    /// Older than its entity's newest done version, skipped.
    Stale,
    /// Stored for queued delivery and acknowledged.
    Queued,
    /// Forwarded; the app failed or could not be reached; the claim was released.
    UpstreamError,
    /// The store could not be used; nothing was forwarded.
    StoreError,
    /// Forwarded without a claim (no key, or the store failing with `forward`).
    Unkeyed,
    /// Refused: a signature missing, malformed, stale or wrong.
    SignatureRefused,
    /// Refused before anything was stored, for another reason (no key, a body too large
    /// or too slow, a changed body under the same key).
    BadRequest,
    /// No route took it (logged only with `delivery_log.unmatched`).
    Unmatched,
    /// A queued job's attempt the app accepted.
    Delivered,
    /// A queued job's attempt that failed, tried again later.
    Retrying,
    /// A queued job's attempt after which it went to dead letters.
    Dead,
    /// An operator changed the key through the admin API: `by` says who, the method,
    /// path and body what.
    Changed,
}

impl Fate {
    pub const ALL: [Fate; 16] = [
        Fate::Forwarded,
        Fate::Duplicate,
        Fate::InFlight,
        Fate::Held,
        Fate::Stale,
        Fate::Queued,
        Fate::UpstreamError,
        Fate::StoreError,
        Fate::Unkeyed,
        Fate::SignatureRefused,
        Fate::BadRequest,
        Fate::Unmatched,
        Fate::Delivered,
        Fate::Retrying,
        Fate::Dead,
        Fate::Changed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Fate::Forwarded => "forwarded",
            Fate::Duplicate => "duplicate",
            Fate::InFlight => "in_flight",
            Fate::Held => "held",
            Fate::Stale => "stale",
            Fate::Queued => "queued",
            Fate::UpstreamError => "upstream_error",
            Fate::StoreError => "store_error",
            Fate::Unkeyed => "unkeyed",
            Fate::SignatureRefused => "signature_refused",
            Fate::BadRequest => "bad_request",
            Fate::Unmatched => "unmatched",
            Fate::Delivered => "delivered",
            Fate::Retrying => "retrying",
            Fate::Dead => "dead",
            Fate::Changed => "changed",
        }
    }

    pub fn parse(text: &str) -> Option<Fate> {
        Fate::ALL.into_iter().find(|fate| fate.as_str() == text)
    }
}

/// One request's fate, as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedDelivery {
    /// When it was answered (an attempt: when it started).
    pub at: Millis,
    /// None for a request no route took.
    pub route: Option<String>,
    /// The route's key namespace: its `scope`, else its name.
    pub scope: Option<String>,
    pub key: Option<String>,
    pub fate: Fate,
    /// The code of the proxy's own refusal, if it refused.
    pub refusal: Option<String>,
    /// It waited for another delivery of its key (`on_in_flight: wait`).
    pub waited: bool,
    /// It was answered with the app's recorded answer (`duplicate_response.replay`).
    pub replayed: bool,
    /// A queued job's attempt: its number.
    pub attempt: Option<u32>,
    /// What the sender was answered; 0 for a queued attempt (no sender waits).
    pub status: u16,
    pub upstream_status: Option<u16>,
    pub upstream_ms: Option<u32>,
    pub duration_ms: u32,
    /// The request body's size in bytes, when known.
    pub size: Option<u64>,
    pub method: String,
    /// The request's path, without its query.
    pub path: String,
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
    /// The sender's address, as the connection came.
    pub client: Option<String>,
    /// The replica that logged it (its host name), when known.
    pub replica: Option<String>,
    /// The headers the route's `log.headers` names.
    pub headers: Vec<(String, String)>,
    /// The body, up to `log.max_body_bytes`, with `log.bodies`.
    pub body: Option<Bytes>,
    pub body_truncated: bool,
    /// Who changed the key, for a `changed` entry: the way in and the credential
    /// (`api:token`, `mcp:loopback`).
    pub by: Option<String>,
}

/// The version of the entries' encoding, written before each.
const ENCODING: u8 = 1;

impl LoggedDelivery {
    /// About how many bytes of memory the entry holds: its body, headers and texts, and
    /// the rest as a constant.
    pub fn weight(&self) -> usize {
        let texts = [
            &self.key,
            &self.request_id,
            &self.trace_id,
            &self.refusal,
            &self.client,
        ]
        .iter()
        .map(|text| text.as_ref().map_or(0, String::len))
        .sum::<usize>();
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len() + 48)
            .sum();
        256 + texts + self.path.len() + headers + self.body.as_ref().map_or(0, Bytes::len)
    }

    /// The entry without its headers and body, as a listing or a live tail shows it:
    /// `body_recorded` still reads true when it had one.
    pub fn summary(&self) -> LoggedDelivery {
        LoggedDelivery {
            headers: Vec::new(),
            body: self.body.as_ref().map(|_| Bytes::new()),
            ..self.clone()
        }
    }

    /// The entry as stored: its encoding's version, then postcard.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_into(Vec::with_capacity(256))
    }

    /// `out` with the entry as stored added at its end.
    pub fn encode_into(&self, mut out: Vec<u8>) -> Vec<u8> {
        out.push(ENCODING);
        postcard::to_extend(self, out).expect("an entry always serializes")
    }

    /// A forwarded POST to `/` under `key`, at `at`, with a body of `body` zero bytes:
    /// for the log's own tests.
    #[cfg(test)]
    pub(crate) fn sample(key: &str, at: Millis, body: usize) -> LoggedDelivery {
        LoggedDelivery {
            at,
            route: None,
            scope: None,
            key: Some(key.to_owned()),
            fate: Fate::Forwarded,
            refusal: None,
            waited: false,
            replayed: false,
            attempt: None,
            status: 200,
            upstream_status: None,
            upstream_ms: None,
            duration_ms: 0,
            size: None,
            method: "POST".into(),
            path: "/".into(),
            request_id: None,
            trace_id: None,
            client: None,
            replica: None,
            headers: Vec::new(),
            body: Some(vec![0; body].into()),
            body_truncated: false,
            by: None,
        }
    }

    /// An entry as stored; `None` for one of another version or unreadable.
    pub fn decode(bytes: &[u8]) -> Option<LoggedDelivery> {
        match bytes.split_first() {
            Some((&ENCODING, rest)) => postcard::from_bytes(rest).ok(),
            _ => None,
        }
    }
}

/// What one read of the log found: entries, newest first, and the `before` of the next
/// read. A read looks at a bounded number of batches, so it may hold fewer entries than
/// asked (past batches that do not read) while older ones are still kept.
#[derive(Debug, Default, PartialEq)]
pub struct LogRead {
    pub entries: Vec<(LogId, LoggedDelivery)>,
    /// None once nothing older is kept.
    pub more_before: Option<LogId>,
}

/// The log kept by a store.
#[async_trait]
pub trait DeliveryLog: Send + Sync + 'static {
    /// Stores `entries`, in order; returns their ids, in the same order.
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError>;

    /// Up to `limit` entries stored before `before` (from the newest when none), newest
    /// first, and where to read on from. Entries that do not read are passed over.
    async fn read(&self, before: Option<LogId>, limit: usize) -> Result<LogRead, StoreError>;

    /// The entry `id`, if it is still kept.
    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError>;

    /// Removes the entries stored before `older_than`, then the oldest beyond the newest
    /// `keep` (whole batches, so a few more may stay). Returns how many were removed,
    /// where the store tells.
    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back_as_written_and_nothing_else_reads() {
        for id in [LogId(0, 0), LogId(1_733_160_000_000, 7), LogId(u64::MAX, 1)] {
            assert_eq!(id.to_string().parse::<LogId>().unwrap(), id);
        }
        for bad in [
            "",
            "1",
            "-1",
            "1-",
            "a-1",
            "1-+2",
            "1-2-3",
            "99999999999999999999-0",
            " 1-2",
        ] {
            assert!(bad.parse::<LogId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_fate_reads_back_by_its_name() {
        for fate in Fate::ALL {
            assert_eq!(Fate::parse(fate.as_str()), Some(fate));
        }
        assert_eq!(Fate::parse("waited"), None);
    }
}
