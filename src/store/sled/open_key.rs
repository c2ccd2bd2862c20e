//! The keys the embedded store holds in memory: in-flight claims (leases) and held keys.

use super::epochs::RecordKey;
use crate::store::{Completion, DoneRecord, Fingerprint, HeldRecord, KeyState, Millis, millis};

/// A key that is neither absent nor done, as the map in memory holds it.
#[derive(Debug, Clone)]
pub(super) enum OpenKey {
    InFlight(Lease),
    Held(HeldRecord),
}

impl OpenKey {
    pub(super) fn live(&self, now: Millis) -> bool {
        match self {
            OpenKey::InFlight(lease) => lease.lease_until > now,
            OpenKey::Held(held) => held.expires_at > now,
        }
    }

    pub(super) fn state(&self) -> KeyState {
        match self {
            OpenKey::InFlight(lease) => KeyState::InFlight {
                claimed_at: lease.claimed_at,
                lease_until: lease.lease_until,
                fingerprint: lease.fingerprint,
            },
            OpenKey::Held(held) => KeyState::Held(held.clone()),
        }
    }

    pub(super) fn owned_by(&self, token: u128) -> Option<&Lease> {
        match self {
            OpenKey::InFlight(lease) if lease.token == token => Some(lease),
            _ => None,
        }
    }
}

/// An in-flight claim.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) token: u128,
    /// Where the done record goes: hashed once, at the claim.
    pub(super) record_key: RecordKey,
    pub(super) claimed_at: Millis,
    pub(super) lease_until: Millis,
    pub(super) fingerprint: Fingerprint,
}

impl Lease {
    /// The done record of this claim, completed at `now` as `completion` says.
    pub(super) fn done_record(&self, now: Millis, completion: &Completion) -> DoneRecord {
        DoneRecord {
            claimed_at: self.claimed_at,
            completed_at: now,
            expires_at: now.saturating_add(millis(completion.retention)),
            upstream_status: completion.upstream_status,
            fingerprint: self.fingerprint,
            response: completion.response.clone(),
        }
    }
}
