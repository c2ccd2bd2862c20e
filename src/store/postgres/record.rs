//! A record as a row holds it: the columns that `statements.rs` reads back, and times in
//! milliseconds as PostgreSQL's `bigint` holds them.

use crate::store::{
    Ambiguity, DoneRecord, Fingerprint, HeldRecord, KeyState, Millis, RecordedResponse,
};

/// A time in milliseconds, as PostgreSQL's `bigint` holds it.
pub(super) fn signed(ms: Millis) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

pub(super) fn unsigned(ms: i64) -> Millis {
    u64::try_from(ms).unwrap_or(0)
}

/// The record in `row` (the columns `Statements::current` and `claim_many` both return),
/// unless there is none or it has expired by the row's `now`.
pub(super) fn live_state(row: &tokio_postgres::Row) -> Option<KeyState> {
    let (state, expires_at, now): (Option<String>, Option<i64>, i64) =
        (row.get("state"), row.get("expires_at"), row.get("now"));
    let (state, expires_at) = (state?, expires_at?);
    if expires_at <= now {
        return None;
    }
    let fingerprint: Fingerprint = row
        .get::<_, Vec<u8>>("body_sha256")
        .try_into()
        .unwrap_or([0; 32]);
    let claimed_at = unsigned(row.get("claimed_at"));
    Some(match state.as_str() {
        "in_flight" => KeyState::InFlight {
            claimed_at,
            lease_until: unsigned(expires_at),
            fingerprint,
        },
        "held" => KeyState::Held(HeldRecord {
            claimed_at,
            held_at: unsigned(row.get::<_, Option<i64>>("completed_at").unwrap_or(0)),
            expires_at: unsigned(expires_at),
            fingerprint,
            reason: row
                .get::<_, Option<String>>("hold_reason")
                .as_deref()
                .and_then(Ambiguity::parse)
                .unwrap_or(Ambiguity::UpstreamTimeout),
        }),
        _ => {
            let response = row.get::<_, Option<i32>>("response_status").map(|status| {
                RecordedResponse::read_back(
                    status,
                    row.get("response_headers"),
                    row.get("response_content_type"),
                    row.get("response_body"),
                )
            });
            KeyState::Done(DoneRecord {
                claimed_at,
                completed_at: unsigned(row.get::<_, Option<i64>>("completed_at").unwrap_or(0)),
                expires_at: unsigned(expires_at),
                upstream_status: u16::try_from(
                    row.get::<_, Option<i32>>("upstream_status").unwrap_or(0),
                )
                .unwrap_or(0),
                fingerprint,
                response,
            })
        }
    })
}
