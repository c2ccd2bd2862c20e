//! Which route a request goes to: the first that takes it in any reading an application
//! may take of it ([`crate::target::addressed`]), and, for a POST whose body could name
//! another method, whether the body does once it is read.

use std::sync::Arc;

use http::Request;
use hyper::body::Incoming;

use crate::method_override;
use crate::route::{Route, Routing};
use crate::target::{self, TargetError};

/// The route a request goes to, if any, once its host and target are found sound: the
/// first that takes it in any reading an application may take of it; and whether a
/// `_method` in its body could take it to another ([`body_stays_on`]).
pub(super) fn find_route<'r>(
    routing: &'r Routing,
    request: &Request<Incoming>,
) -> Result<(Option<&'r Arc<Route>>, bool), TargetError> {
    let target = target::addressed(
        request.version(),
        request.method(),
        request.uri(),
        request.headers(),
        routing.table.limits_hosts(),
    )?;
    let route = routing.table.find(&target)?;
    Ok((route, routing.table.body_may_reroute(&target, route)))
}

/// Refuses a POST whose body names a method (`_method`) that the application would run
/// as a request of a route other than `route` (none: no route), so that no override in a
/// body reaches a route's handler without the route's check.
pub(super) fn body_stays_on(
    routing: &Routing,
    head: &http::request::Parts,
    body: &[u8],
    route: Option<&Route>,
) -> Result<(), TargetError> {
    let methods = method_override::body_methods(&head.method, &head.headers, body)
        .map_err(|_| TargetError::UnreadableOverride)?;
    if methods.is_empty() {
        return Ok(());
    }
    let target = target::addressed(
        head.version,
        &head.method,
        &head.uri,
        &head.headers,
        routing.table.limits_hosts(),
    )?
    .with_methods(methods)?;
    let found = routing.table.find(&target)?;
    if found.map(|found| found.name.as_str()) == route.map(|route| route.name.as_str()) {
        Ok(())
    } else {
        Err(TargetError::TwoRoutes)
    }
}
