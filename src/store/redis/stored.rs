//! A key's value as Redis holds it: a tag byte and postcard fields (in flight, done, held;
//! an entity's record), encoded and read back.

use serde::{Deserialize, Serialize};

use crate::store::{
    Ambiguity, DoneRecord, EntityRecord, Fingerprint, HeldRecord, KeyState, Millis,
    RecordedResponse, StoreError,
};

/// The tag and owner token that open an in-flight value: `f` and 16 bytes.
pub(super) const OWNER_LEN: usize = 17;

/// What a claim writes, kept once the key is done.
#[derive(Serialize, Deserialize)]
pub(super) struct Started {
    pub(super) claimed_at: Millis,
    pub(super) lease_until: Millis,
    pub(super) fingerprint: Fingerprint,
}

/// What a finish adds.
#[derive(Serialize, Deserialize)]
pub(super) struct Finished {
    pub(super) completed_at: Millis,
    pub(super) expires_at: Millis,
    pub(super) upstream_status: u16,
    #[serde(with = "crate::store::recorded_response")]
    pub(super) response: Option<RecordedResponse>,
}

/// What a hold adds.
#[derive(Serialize, Deserialize)]
pub(super) struct Holding {
    pub(super) held_at: Millis,
    pub(super) expires_at: Millis,
    pub(super) reason: Ambiguity,
}

/// A value as read back.
pub(super) enum Stored {
    InFlight(Started),
    Done(DoneRecord),
    /// A held key, and the claim's fields as they are encoded.
    Held(HeldRecord, Vec<u8>),
}

impl Stored {
    pub(super) fn state(self) -> KeyState {
        match self {
            Stored::InFlight(started) => KeyState::InFlight {
                claimed_at: started.claimed_at,
                lease_until: started.lease_until,
                fingerprint: started.fingerprint,
            },
            Stored::Done(record) => KeyState::Done(record),
            Stored::Held(record, _) => KeyState::Held(record),
        }
    }

    pub(super) fn decode(value: &[u8]) -> Result<Stored, StoreError> {
        fn unreadable<E>(_: E) -> StoreError {
            malformed("a claim record is cut short or cannot be read")
        }
        match value.split_first() {
            Some((b'f', rest)) => {
                let started = rest.get(OWNER_LEN - 1..).ok_or_else(|| unreadable(()))?;
                Ok(Stored::InFlight(
                    postcard::from_bytes(started).map_err(unreadable)?,
                ))
            }
            Some((b'd', rest)) => {
                let (finished, rest): (Finished, _) =
                    postcard::take_from_bytes(rest).map_err(unreadable)?;
                let started: Started = postcard::from_bytes(rest).map_err(unreadable)?;
                Ok(Stored::Done(DoneRecord {
                    claimed_at: started.claimed_at,
                    completed_at: finished.completed_at,
                    expires_at: finished.expires_at,
                    upstream_status: finished.upstream_status,
                    fingerprint: started.fingerprint,
                    response: finished.response,
                }))
            }
            Some((b'h', rest)) => {
                let (holding, claim): (Holding, _) =
                    postcard::take_from_bytes(rest).map_err(unreadable)?;
                let started: Started = postcard::from_bytes(claim).map_err(unreadable)?;
                let record = HeldRecord {
                    claimed_at: started.claimed_at,
                    held_at: holding.held_at,
                    expires_at: holding.expires_at,
                    fingerprint: started.fingerprint,
                    reason: holding.reason,
                };
                Ok(Stored::Held(record, claim.to_vec()))
            }
            _ => Err(malformed("a claim record has an unknown tag")),
        }
    }
}

/// A done value with its expiry moved to `expires_at`, the rest as it was; `None` for
/// another value.
pub(super) fn with_expiry(value: &[u8], expires_at: Millis) -> Option<Vec<u8>> {
    let rest = value.strip_prefix(b"d")?;
    let (mut finished, started): (Finished, _) = postcard::take_from_bytes(rest).ok()?;
    finished.expires_at = expires_at;
    let mut moved = encode(&finished, vec![b'd']);
    moved.extend_from_slice(started);
    Some(moved)
}

/// An entity's record as stored: `v`, the sort key, `:`, the record.
pub(super) fn encode_entity(record: &EntityRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + record.newest.text.len());
    out.push(b'v');
    out.extend_from_slice(record.newest.sort_key.as_bytes());
    out.push(b':');
    encode(record, out)
}

pub(super) fn decode_entity(value: &[u8]) -> Option<EntityRecord> {
    let rest = value.strip_prefix(b"v")?;
    let colon = rest.iter().position(|&byte| byte == b':')?;
    postcard::from_bytes(&rest[colon + 1..]).ok()
}

/// The opening of an in-flight value: the tag and the owner's token.
pub(super) fn owner_prefix(token: u128) -> Vec<u8> {
    let mut prefix = Vec::with_capacity(OWNER_LEN);
    prefix.push(b'f');
    prefix.extend_from_slice(&token.to_be_bytes());
    prefix
}

/// Serializes into `out`; the types here always serialize.
pub(super) fn encode(value: &impl Serialize, out: Vec<u8>) -> Vec<u8> {
    postcard::to_extend(value, out).expect("a claim record always serializes")
}

/// A value that cannot be read as a record.
pub(super) fn malformed(what: &str) -> StoreError {
    StoreError::of("redis", what)
}
