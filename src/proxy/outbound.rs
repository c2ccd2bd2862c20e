//! A keyed delivery's request on its way to the application: its target checked before
//! the claim (what cannot be forwarded claims nothing), the request built once the key is
//! claimed (a duplicate never needs one).

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;

use crate::body::{self, ProxyBody};
use crate::order::Guard;
use crate::route::Route;
use crate::upstream;

/// A keyed delivery's request, checked and not yet built for the application.
pub(super) struct CheckedRequest {
    pub(super) forwardable: upstream::Forwardable,
    pub(super) guard: Guard,
    pub(super) body: Bytes,
    pub(super) peer: SocketAddr,
}

impl CheckedRequest {
    /// The request for the route's application, telling it `key_header`.
    pub(super) fn build(self, route: &Route, key_header: Option<&str>) -> Outbound {
        let CheckedRequest {
            forwardable,
            guard,
            body,
            peer,
        } = self;
        let full = body::full(body.clone());
        Outbound {
            request: forwardable.build(full, &route.upstream, peer, key_header),
            guard,
            body,
        }
    }
}

/// A keyed delivery's request for the application, and what it carries for the order
/// guard.
pub(super) struct Outbound {
    pub(super) request: Request<ProxyBody>,
    pub(super) guard: Guard,
    pub(super) body: Bytes,
}
