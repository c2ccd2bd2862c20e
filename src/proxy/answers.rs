//! The answers a delivery ends with when its key is not forwarded (in flight, held, the
//! store failing), and what a failed forward means: why its claims are released, what
//! the sender is told, and whether the application may have done the work.

use http::Response;

use crate::body::ProxyBody;
use crate::metrics::ReleaseReason;
use crate::response::{DedupeStatus, Refusal};
use crate::route::Route;
use crate::store::Ambiguity;
use crate::upstream::UpstreamError;

/// What a delivery ends with: its `Dedupe-Status` and the answer.
pub(super) type Answer = (DedupeStatus, Response<ProxyBody>);

/// The answer to a delivery whose key another delivery holds.
pub(super) fn in_flight(route: &Route) -> Answer {
    let refusal = Refusal::InFlight {
        status: route.policy.in_flight_status,
        retry_after: route.policy.retry_after,
    };
    (DedupeStatus::InFlight, refusal.into_response())
}

/// The answer to a delivery refused because the store failed (`on_store_error: reject`).
pub(super) fn unavailable(route: &Route) -> Answer {
    let refusal = Refusal::StoreUnavailable {
        retry_after: route.policy.retry_after,
    };
    (DedupeStatus::Unavailable, refusal.into_response())
}

/// The answer to a delivery whose key is held.
pub(super) fn held(route: &Route) -> Answer {
    let refusal = Refusal::Held {
        status: route.policy.in_flight_status,
        retry_after: route.policy.retry_after,
    };
    (DedupeStatus::Held, refusal.into_response())
}

/// Why a forward got no answer, as a release reason and the sender's answer.
pub(super) fn failure(error: UpstreamError) -> (ReleaseReason, Refusal) {
    let reason = match &error {
        UpstreamError::Unreachable(_) => ReleaseReason::UpstreamUnreachable,
        UpstreamError::Dropped(_) => ReleaseReason::UpstreamDropped,
        UpstreamError::SenderBody(_) => ReleaseReason::Abandoned,
        UpstreamError::Timeout(_) => ReleaseReason::UpstreamTimeout,
    };
    (reason, Refusal::from(error))
}

/// Whether a failed forward may have reached the application: a refused connection did
/// not; a timeout, or a connection lost after the request went out, may have.
pub(super) fn ambiguity(error: &UpstreamError) -> Option<Ambiguity> {
    match error {
        UpstreamError::Unreachable(_) => None,
        UpstreamError::Timeout(_) => Some(Ambiguity::UpstreamTimeout),
        // Part of the request may have reached the app.
        UpstreamError::Dropped(_) | UpstreamError::SenderBody(_) => {
            Some(Ambiguity::UpstreamDropped)
        }
    }
}
