//! The store: the one place that decides, atomically, whether a delivery may be
//! forwarded, that keeps each entity's newest done version for the stale-event guard
//! (`order:`), and that keeps the queued jobs (`delivery: queued`, [`queue`]).
//! [`ClaimStore`] is the contract every backend keeps: `sled` is the embedded backend,
//! `redis` and `postgres` the shared ones (with `tls` toward them); each keeps a
//! [`queue::DeliveryQueue`] and a [`log::DeliveryLog`] beside its claims. `error.rs` says why an operation failed,
//! `time.rs` where the time comes from, `keys.rs` how store keys are named, `settings.rs`
//! the settings each backend takes (the configuration fills them).
//!
//! A key is absent, `in_flight` (an owner holds it until its lease ends), `done` (until
//! its retention ends) or `held` (its forward's outcome is unknown: until an operator
//! resolves it, or its retention ends). Transitions:
//!
//! ```text
//!                     ┌─renew (owner)┐
//!   absent ──claim──▶ in_flight ◀────┘ ──finish (owner, upstream success)──▶ done
//!     ▲                 │  │  │                                        │ ▲
//!     └──release (owner)┘  │  └─hold (owner, outcome unknown)─▶ held ──┼─┘ resolve: done
//!     ▲                    └─lease expired: the next claim takes over  │ │
//!     ├──────────────────────── resolve: release ◀─────────────────────┼─┘
//!     └──────────────────────── retention expired ─────────────────────┘
//! ```
//!
//! Only the owner named by a [`Claim`]'s token can finish, release or hold it, so a late
//! owner whose lease was taken over cannot overwrite the new owner's claim. Only an
//! operator resolves a held key. On a queued route a claim is finished (done, with
//! [`QUEUED_STATUS`]) once its job is stored, before the app has seen it: the job, not
//! the key, says how its delivery went.

mod error;
pub(crate) mod keys;
pub mod log;
pub mod minutes;
pub mod postgres;
pub mod queue;
pub mod redis;
pub mod replicas;
pub mod settings;
pub mod sled;
mod time;
mod tls;

pub use error::StoreError;
pub(crate) use error::within;
#[cfg(any(test, feature = "testing"))]
pub use time::ManualClock;
pub use time::{Clock, millis};
pub(crate) use time::{Millis, SystemClock, parse_rfc3339, rfc3339};

pub use keys::{Fingerprint, Version, entity_key};
pub(crate) use keys::{body_key, store_key};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// What a store keeps of an entity: the newest version whose event was done, until the
/// retention of that event's route ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityRecord {
    pub newest: Version,
    pub recorded_at: Millis,
    pub expires_at: Millis,
}

/// Proof of ownership of an in-flight key, returned by a successful claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub key: String,
    pub token: u128,
    /// Whether a shared store tells the other replicas when this claim is finished,
    /// released or held (for their waiting duplicates, `on_in_flight: wait`). Off unless the
    /// caller turns it on: announcing costs the store work on every delivery.
    pub announce: bool,
}

impl Claim {
    fn new(key: &str, token: u128) -> Claim {
        Claim {
            key: key.to_owned(),
            token,
            announce: false,
        }
    }
}

/// Told the store key of each outcome another process announced (see [`Claim::announce`]).
pub(crate) type Heard = Arc<dyn Fn(&str) + Send + Sync>;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller owns the key now and must forward, then finish or release.
    Claimed(Claim),
    /// Another delivery holds the key until `lease_until`.
    InFlight { lease_until: Millis },
    /// The key was handled already.
    Done(DoneRecord),
    /// The key's forward may have run; nothing runs it again until an operator resolves it.
    Held(HeldRecord),
}

/// Why a forward's outcome is unknown: the application may or may not have done the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ambiguity {
    /// No answer within `upstream_timeout`.
    UpstreamTimeout,
    /// The connection closed after the request went out, before an answer.
    UpstreamDropped,
    /// The proxy shut down while the forward was under way.
    Shutdown,
    /// The forward's task failed (a panic) after the request went out. Last: the stores
    /// encode a reason by its place.
    ForwardFailed,
}

impl Ambiguity {
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguity::UpstreamTimeout => "upstream_timeout",
            Ambiguity::UpstreamDropped => "upstream_dropped",
            Ambiguity::Shutdown => "shutdown",
            Ambiguity::ForwardFailed => "forward_failed",
        }
    }

    fn parse(text: &str) -> Option<Ambiguity> {
        [
            Ambiguity::UpstreamTimeout,
            Ambiguity::UpstreamDropped,
            Ambiguity::Shutdown,
            Ambiguity::ForwardFailed,
        ]
        .into_iter()
        .find(|reason| reason.as_str() == text)
    }
}

/// The record of a held key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldRecord {
    pub claimed_at: Millis,
    pub held_at: Millis,
    pub expires_at: Millis,
    pub fingerprint: Fingerprint,
    pub reason: Ambiguity,
}

/// How an operator resolves a held key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The work happened: the key is done for `retention`, with no recorded answer and
    /// [`RESOLVED_STATUS`] as the app's status.
    Done { retention: Duration },
    /// The work did not happen: the key is absent, and the next delivery runs it.
    Release,
}

/// The app's status in the done record of a key an operator resolved as done: no answer
/// from the app was seen.
pub const RESOLVED_STATUS: u16 = 0;

/// The app's status in the done record of a stale event skipped unforwarded
/// (`on_stale: skip`): the app never saw it.
pub(crate) const STALE_SKIPPED_STATUS: u16 = 1;

/// The app's status in the done record of an event accepted for queued delivery
/// (`delivery: queued`): its job, not the key, says how the delivery went.
pub const QUEUED_STATUS: u16 = 2;

/// Which keys a listing shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    InFlight,
    Done,
    Held,
}

impl StateFilter {
    /// The names a listing's `state` takes, in the order of [`StateFilter::ALL`].
    pub const NAMES: [&str; 3] = ["in_flight", "done", "held"];
    const ALL: [StateFilter; 3] = [StateFilter::InFlight, StateFilter::Done, StateFilter::Held];

    pub fn parse(text: &str) -> Option<StateFilter> {
        let at = StateFilter::NAMES.iter().position(|name| *name == text)?;
        Some(StateFilter::ALL[at])
    }

    pub fn admits(self, state: &KeyState) -> bool {
        matches!(
            (self, state),
            (StateFilter::InFlight, KeyState::InFlight { .. })
                | (StateFilter::Done, KeyState::Done(_))
                | (StateFilter::Held, KeyState::Held(_))
        )
    }
}

/// One page of a listing: live keys of a namespace, in the store's order, and where the
/// next page starts (none after the last).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Store keys and their states.
    pub keys: Vec<(String, KeyState)>,
    pub next: Option<String>,
}

/// The record of a key whose upstream answered success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoneRecord {
    pub claimed_at: Millis,
    pub completed_at: Millis,
    pub expires_at: Millis,
    pub upstream_status: u16,
    pub fingerprint: Fingerprint,
    /// The upstream's answer, kept for `duplicate_response.replay`.
    #[serde(with = "recorded_response")]
    pub response: Option<RecordedResponse>,
}

/// An upstream answer kept to replay to duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedResponse {
    pub status: u16,
    /// The headers `duplicate_response.replay_headers` names, with lowercase names, in the
    /// order the app sent them (a name may come more than once).
    pub headers: Vec<(String, Bytes)>,
    pub body: Bytes,
}

impl RecordedResponse {
    /// An answer as a shared store gives it back: a status it cannot have written reads
    /// as 200; without recorded headers, the content type alone (a record of an earlier
    /// version), an empty one as none.
    fn read_back(
        status: impl TryInto<u16>,
        headers: Option<Vec<u8>>,
        content_type: Option<String>,
        body: Option<Vec<u8>>,
    ) -> RecordedResponse {
        let body: Bytes = body.unwrap_or_default().into();
        let headers = match headers.map(|bytes| postcard::from_bytes::<(u64, _)>(&bytes)) {
            Some(Ok((length, headers))) if length == body.len() as u64 => headers,
            _ => content_type_only(content_type),
        };
        RecordedResponse {
            status: status.try_into().unwrap_or(200),
            headers,
            body,
        }
    }

    /// The recorded headers, encoded as PostgreSQL keeps them: with the body's length,
    /// so that headers left in a row by an earlier version (which does not clear them when
    /// it writes another answer) are not replayed with another answer's body.
    fn encoded_headers(&self) -> Vec<u8> {
        let length = self.body.len() as u64;
        postcard::to_stdvec(&(length, &self.headers)).expect("headers always serialize")
    }

    /// Its content type, for the stores' older readers.
    fn content_type(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(name, _)| name == "content-type")
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }
}

fn content_type_only(content_type: Option<String>) -> Vec<(String, Bytes)> {
    content_type
        .filter(|text| !text.is_empty())
        .map(|text| ("content-type".to_owned(), Bytes::from(text)))
        .into_iter()
        .collect()
}

/// How a record's `Option<RecordedResponse>` is written with postcard: as the `Option`
/// earlier versions wrote (0: none; 1: status, content type, body) when the answer kept
/// no header but its content type, so that those versions still read it, else as 2:
/// status, headers, body. Every earlier record reads.
pub mod recorded_response {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{RecordedResponse, content_type_only};

    #[derive(Serialize, Deserialize)]
    enum StoredAnswer {
        None,
        WithContentType {
            status: u16,
            content_type: Option<String>,
            body: Bytes,
        },
        WithHeaders {
            status: u16,
            headers: Vec<(String, Bytes)>,
            body: Bytes,
        },
    }

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<RecordedResponse>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let written = match value {
            None => StoredAnswer::None,
            Some(recorded)
                if recorded.headers.is_empty()
                    || (recorded.headers.len() == 1 && recorded.content_type().is_some()) =>
            {
                StoredAnswer::WithContentType {
                    status: recorded.status,
                    content_type: recorded.content_type().map(str::to_owned),
                    body: recorded.body.clone(),
                }
            }
            Some(recorded) => StoredAnswer::WithHeaders {
                status: recorded.status,
                headers: recorded.headers.clone(),
                body: recorded.body.clone(),
            },
        };
        written.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<RecordedResponse>, D::Error> {
        Ok(match StoredAnswer::deserialize(deserializer)? {
            StoredAnswer::None => None,
            StoredAnswer::WithContentType {
                status,
                content_type,
                body,
            } => Some(RecordedResponse {
                status,
                headers: content_type_only(content_type),
                body,
            }),
            StoredAnswer::WithHeaders {
                status,
                headers,
                body,
            } => Some(RecordedResponse {
                status,
                headers,
                body,
            }),
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The record of an answer as versions before `replay_headers` wrote it.
        #[derive(Serialize)]
        struct Earlier {
            status: u16,
            content_type: Option<String>,
            body: Bytes,
        }

        /// A record with a field after its answer, which must still read.
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Record {
            #[serde(with = "super")]
            response: Option<RecordedResponse>,
            after: u8,
        }

        #[derive(Serialize)]
        struct EarlierRecord {
            response: Option<Earlier>,
            after: u8,
        }

        fn answer(headers: &[(&str, &str)]) -> RecordedResponse {
            RecordedResponse {
                status: 201,
                headers: headers
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), Bytes::from(value.to_string())))
                    .collect(),
                body: Bytes::from_static(b"{}"),
            }
        }

        #[test]
        fn records_of_earlier_versions_still_read() {
            for (response, expected) in [
                (None, None),
                (
                    Some(Earlier {
                        status: 201,
                        content_type: Some("application/json".into()),
                        body: Bytes::from_static(b"{}"),
                    }),
                    Some(answer(&[("content-type", "application/json")])),
                ),
                (
                    Some(Earlier {
                        status: 201,
                        content_type: None,
                        body: Bytes::from_static(b"{}"),
                    }),
                    Some(answer(&[])),
                ),
            ] {
                let bytes = postcard::to_stdvec(&EarlierRecord { response, after: 7 }).unwrap();
                let read: Record = postcard::from_bytes(&bytes).unwrap();
                assert_eq!(
                    read,
                    Record {
                        response: expected,
                        after: 7
                    }
                );
            }
        }

        #[test]
        fn headers_a_row_kept_from_another_answer_are_not_replayed() {
            let answer = answer(&[("location", "/orders/1")]);
            let blob = answer.encoded_headers();
            let read = |body: &[u8]| {
                RecordedResponse::read_back(
                    201,
                    Some(blob.clone()),
                    Some("text/plain".into()),
                    Some(body.to_vec()),
                )
            };
            assert_eq!(read(b"{}").headers, answer.headers, "its own body");
            assert_eq!(
                read(b"another answer").headers,
                [("content-type".to_owned(), Bytes::from_static(b"text/plain"))],
                "another body: the row's content type alone"
            );
        }

        #[test]
        fn an_answer_with_its_content_type_alone_is_written_as_earlier_versions_wrote_it() {
            let plain = Record {
                response: Some(answer(&[("content-type", "text/plain")])),
                after: 7,
            };
            let earlier = EarlierRecord {
                response: Some(Earlier {
                    status: 201,
                    content_type: Some("text/plain".into()),
                    body: Bytes::from_static(b"{}"),
                }),
                after: 7,
            };
            assert_eq!(
                postcard::to_stdvec(&plain).unwrap(),
                postcard::to_stdvec(&earlier).unwrap()
            );
            let full = Record {
                response: Some(answer(&[
                    ("content-type", "text/plain"),
                    ("set-cookie", "a=1"),
                    ("set-cookie", "b=2"),
                ])),
                after: 7,
            };
            let bytes = postcard::to_stdvec(&full).unwrap();
            assert_eq!(postcard::from_bytes::<Record>(&bytes).unwrap(), full);
        }
    }
}

/// What the admin API shows of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    InFlight {
        claimed_at: Millis,
        lease_until: Millis,
        fingerprint: Fingerprint,
    },
    Done(DoneRecord),
    Held(HeldRecord),
}

/// How a finished claim is recorded.
#[derive(Debug, Clone)]
pub struct Completion {
    pub upstream_status: u16,
    pub retention: Duration,
    pub response: Option<RecordedResponse>,
}

/// The contract every claim-store backend keeps. Every transition is atomic: two
/// concurrent claims of one absent key give exactly one `Claimed`.
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Claims `key` for `lease`, taking over an expired lease; reports a live claim or
    /// a done record instead when there is one.
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Marks the claimed key done. Returns once the mark is as durable as configured.
    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError>;

    /// Gives up the claim, so that the next delivery is forwarded.
    async fn release(&self, claim: &Claim) -> Result<(), StoreError>;

    /// Extends the claim's lease to `lease` from now, while its delivery is still being
    /// handled. `NotOwner` if the claim was settled, or taken over after its lease ended.
    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), StoreError>;

    /// Holds the claimed key for `retention`: its forward may have run, so no delivery
    /// runs it again until [`ClaimStore::resolve`]. As durable as a finish.
    async fn hold(
        &self,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Resolves a held key. Returns whether it was held (and is now resolved); any other
    /// key is left alone.
    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError>;

    /// Up to `limit` live keys of `namespace` whose key starts with `prefix` (store keys
    /// `<namespace>:<prefix>...`), in `state` if given, starting after the cursor `after`
    /// (a page's `next`). A page may hold fewer keys than `limit` (even none) and still
    /// have a next one: each page looks at a bounded part of the store.
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError>;

    /// How many live held keys each namespace has (those with none left out), for
    /// `dedupe_keys_held`. Body keys (`replay_guard`) are not counted.
    async fn count_held(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// The live state of a key; expired records read as absent.
    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError>;

    /// Forgets a done key so that a replay runs the work again. Returns whether a done
    /// record was removed; an in-flight or held key is left alone.
    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError>;

    /// Moves a done key's expiry to `expires_at` (sooner or later), keeping the rest of
    /// its record; an in-flight or held key is left alone.
    async fn set_expiry(&self, key: &str, expires_at: Millis) -> Result<Expiry, StoreError>;

    /// The newest version done for `entity` (an [`entity_key`]), unless none was or its
    /// record has expired.
    async fn newest_version(&self, entity: &str) -> Result<Option<EntityRecord>, StoreError>;

    /// Records `version` as the newest done for `entity`, for `retention`, unless its live
    /// record holds a version as new or newer. Atomic: whatever calls race, the largest
    /// version stays. Returns whether `version` was recorded.
    async fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Duration,
    ) -> Result<bool, StoreError>;

    /// Forgets an entity's record (an operator's reset). Returns whether a live one was
    /// there.
    async fn forget_entity(&self, entity: &str) -> Result<bool, StoreError>;

    /// Removes expired records (done, held, in flight, and entities'), looking at up to
    /// `limit` of them (or of their index entries).
    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError>;

    /// From now until the store is dropped, passes to `heard` the store key of every
    /// outcome that another process announces through this store. Best effort: one missed
    /// while the store is unreachable is not heard again. The embedded store is never
    /// shared, so it hears nothing.
    fn hear_outcomes(&self, heard: Heard) {
        drop(heard);
    }

    /// Records `report` as its replica's latest, in a shared store (nothing elsewhere),
    /// and drops reports older than [`replicas::FORGOTTEN_AFTER`].
    async fn report_replica(&self, report: &replicas::ReplicaReport) -> Result<(), StoreError> {
        let _ = report;
        Ok(())
    }

    /// Every replica's latest report, in a shared store; `None` where nothing is shared.
    async fn replicas(&self) -> Result<Option<Vec<replicas::ReplicaReport>>, StoreError> {
        Ok(None)
    }

    /// Records one replica's figures of a minute; figures more than
    /// [`minutes::KEPT_FOR`] older are dropped meanwhile. A minute written twice with the
    /// same figures (a write retried) is kept once.
    async fn record_minute(&self, figures: &minutes::MinuteFigures) -> Result<(), StoreError>;

    /// Every replica's figures of the minutes from `since` on, in no set order; records
    /// that do not read are left out, and past [`minutes::READ_MAX`] the oldest.
    async fn minutes(&self, since: Millis) -> Result<Vec<minutes::MinuteFigures>, StoreError>;

    /// On a shared store, whether [`ClaimStore::hear_outcomes`] hears other processes'
    /// outcomes at all (not behind a pooler without a session of the store's own): else
    /// waiters learn them by looking at the store again. `None` where nothing is shared.
    fn announces_outcomes(&self) -> Option<bool> {
        None
    }

    /// The delivery queue kept beside the claims (`delivery: queued`), if this store has
    /// one.
    fn queue(&self) -> Option<Arc<dyn queue::DeliveryQueue>> {
        None
    }

    /// Stores `job`, the delivery of `claim`'s key, in the store's queue with the key's
    /// done record (`completion`, from now) kept in it, on stable storage, then ends the
    /// claim: the queue answers for the key until the job leaves, when the done record is
    /// filed with the others. One write for both. `None` from a store whose queue does
    /// not keep done records: the caller enqueues, then marks the key done.
    async fn enqueue_done(
        &self,
        claim: &Claim,
        job: &queue::Job,
        completion: &Completion,
    ) -> Result<Option<queue::Enqueued>, StoreError> {
        let _ = (claim, job, completion);
        Ok(None)
    }

    /// The delivery log kept beside the claims, if this store keeps one.
    fn delivery_log(&self) -> Option<Arc<dyn log::DeliveryLog>> {
        None
    }

    /// Puts everything written so far on stable storage: at shutdown, and before the admin
    /// API answers an operator's change (`forget`, `set_expiry`, `resolve`, the queue's
    /// `revive`, `discard` and `set_paused` do not sync by themselves).
    async fn flush(&self) -> Result<(), StoreError>;

    /// How many done records the store holds, for `dedupe_store_keys{state="done"}`, if
    /// it can tell cheaply (sled counts its records when it opens; the shared stores would
    /// need a scan).
    fn done_keys(&self) -> Option<u64>;

    /// What the store's syncs to stable storage have done since it opened, for
    /// `dedupe_store_syncs_total` and its siblings: the embedded store's only (the shared
    /// stores' servers sync their own files).
    fn disk_syncs(&self) -> Option<DiskSyncs> {
        None
    }
}

/// The embedded store's syncs to stable storage since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DiskSyncs {
    /// Syncs run: each an `fdatasync` (or `fsync`) of every file written since the last.
    pub syncs: u64,
    /// Writes that waited for one (acknowledgments and operators' changes); over `syncs`,
    /// how many one sync served on average.
    pub waiters: u64,
    /// Time spent in them.
    pub seconds: f64,
    /// Syncs that failed (their waiters were told; the store reopens).
    pub failures: u64,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Records (or index entries) looked at; fewer than the limit means nothing more
    /// has expired.
    pub examined: usize,
    /// Records removed.
    pub removed: usize,
}

/// The namespace of an event's store key; `None` for a body key.
fn event_namespace(store_key: &str) -> Option<&str> {
    let (namespace, _) = store_key.split_once(':')?;
    (!namespace.contains('#')).then_some(namespace)
}

/// Counts by namespace, from the store keys of held keys.
fn count_by_namespace<'k>(held: impl IntoIterator<Item = &'k str>) -> Vec<(String, u64)> {
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for namespace in held.into_iter().filter_map(event_namespace) {
        *counts.entry(namespace.to_owned()).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// The first `limit` of `found` (sorted by store key) as a page, the next one starting
/// after its last key when more remain.
fn page(mut found: Vec<(String, KeyState)>, limit: usize) -> Page {
    let next = (found.len() > limit).then(|| {
        found.truncate(limit);
        found.last().map(|(key, _)| key.clone())
    });
    Page {
        keys: found,
        next: next.flatten(),
    }
}

/// `Ok` when an owner-guarded change took effect, `NotOwner` when it matched nothing
/// (the claim was taken over, released or forgotten meanwhile).
fn owned(changed: bool) -> Result<(), StoreError> {
    if changed {
        Ok(())
    } else {
        Err(StoreError::NotOwner)
    }
}

/// What `set_expiry` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Set,
    Absent,
    InFlight,
    Held,
}

/// What `forget` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgotten {
    Removed,
    Absent,
    /// The key is in flight; forgetting it would let a second delivery run alongside.
    InFlight,
    /// The key is held: an operator resolves it instead.
    Held,
}
