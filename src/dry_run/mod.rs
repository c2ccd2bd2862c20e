//! A dry run: what the proxy would do with one request, step by step, without contacting
//! the app or the store. The route that takes it (or why none does), the signature's
//! check, the key and the parts it came from, the store key, what `order` reads, and what
//! a first delivery, a duplicate and a delivery in flight would get.
//!
//! The steps call the proxy's own parts (hop-by-hop headers stripped as `Proxy::handle`
//! strips them, the route table and its readings, the body limit, the signature schemes,
//! the key templates, the refusals), in the order `Proxy::check` takes them; the store's
//! steps are described, not taken. `tests/it/dry_run.rs` holds the two to the same key and
//! refusals. `dedupe-proxy try` runs one on a file's routes (`cli::dry_run`); `POST /v1/try`
//! on the running ones (`admin::dry_run`).

mod report;

use bytes::Bytes;
use http::Request;

pub use report::{
    Checked, KeyRead, NotTaken, OrderRead, PartRead, Report, RouteTaken, Signature, Verdict,
};

use crate::key::{Delivery, KeyError};
use crate::response::Refusal;
use crate::route::{OnMissingKey, Route, Routing, Unmatched};
use crate::store::keys::store_key;
use crate::verify::Verify;

/// What `routing` would do with `request`, judging a signature's timestamp as of `now`
/// (Unix seconds).
pub fn judge(routing: &Routing, request: &Request<Bytes>, now: i64) -> Report {
    let request = &without_hop_by_hop(request);
    let report = Report::of(request);
    let target = match crate::target::addressed(
        request.version(),
        request.method(),
        request.uri(),
        request.headers(),
        routing.table.limits_hosts(),
    ) {
        Ok(target) => target,
        Err(error) => return report.refused(error.into()),
    };
    match routing.table.find(&target) {
        Ok(Some(route)) => on_route(report, route, request, now),
        Ok(None) => unmatched(report, routing, &target),
        Err(error) => report.refused(error.into()),
    }
}

/// The request as the proxy reads it: without the headers a hop consumes, and those its
/// `Connection` names (the app never sees them, so they must not choose anything).
fn without_hop_by_hop(request: &Request<Bytes>) -> Request<Bytes> {
    let mut stripped = Request::new(request.body().clone());
    *stripped.method_mut() = request.method().clone();
    *stripped.uri_mut() = request.uri().clone();
    *stripped.version_mut() = request.version();
    *stripped.headers_mut() = request.headers().clone();
    crate::upstream::strip_hop_by_hop(stripped.headers_mut());
    stripped
}

/// No route takes the request: why not, route by route, and what happens to it.
fn unmatched(
    mut report: Report,
    routing: &Routing,
    target: &crate::target::Addressed<'_>,
) -> Report {
    report.not_taken_by = routing
        .table
        .routes()
        .map(|route| NotTaken {
            route: route.name.clone(),
            because: route
                .matcher
                .refuses(target.method.as_str(), target.host, &target.path)
                .unwrap_or_else(report::another_reading),
        })
        .collect();
    match routing.unmatched {
        Unmatched::Reject => report.refused(Refusal::NoRoute),
        Unmatched::Forward => report.forwarded_unmatched(&routing.fallback_upstream),
    }
}

/// The steps of a delivery on `route` that need no store. After a refused signature the
/// key is still read (a rule can be checked without the sender's secret), and the verdict
/// stays refused.
fn on_route(mut report: Report, route: &Route, request: &Request<Bytes>, now: i64) -> Report {
    let policy = &route.policy;
    report.route = Some(RouteTaken::of(route));
    let body = request.body();
    if body.len() as u64 > policy.max_body {
        return report.refused(Refusal::BodyTooLarge {
            limit: policy.max_body,
        });
    }
    let (signature, refused) = signature(route.verify.as_ref(), request, now);
    report.signature = Some(signature);
    if let Some(refusal) = refused {
        report = report.refused(refusal);
    }
    let delivery = Delivery {
        headers: request.headers(),
        query: request.uri().query(),
        body,
    };
    let (key, extracted) = key_read(route, &delivery);
    report.key = Some(key);
    if report.refusal.is_some() {
        return report;
    }
    match extracted {
        Ok(_) => {}
        Err(KeyError::Missing { .. }) if policy.on_missing_key == OnMissingKey::Forward => {
            return report.forwarded_unkeyed(route);
        }
        Err(error) => return report.refused(error.into()),
    }
    report.order = route
        .order
        .as_ref()
        .map(|order| OrderRead::of(order.read(&route.namespace, &delivery)));
    report.answers(route, request);
    report
}

/// The key `route` reads from `delivery`, with what each part read, and the key or why
/// there is none.
fn key_read(route: &Route, delivery: &Delivery<'_>) -> (KeyRead, Result<String, KeyError>) {
    let parts = route
        .key
        .readings(delivery)
        .into_iter()
        .map(|(part, read)| {
            let (value, missing) = match read {
                Ok(value) => (Some(value), None),
                Err(KeyError::Missing { reason, .. }) => (None, Some(reason.to_owned())),
                Err(error) => (None, Some(error.to_string())),
            };
            PartRead {
                part,
                value,
                missing,
            }
        })
        .collect();
    let extracted = route.key.extract(delivery);
    let key = KeyRead {
        template: route.key.to_string(),
        value: extracted.as_ref().ok().cloned(),
        parts,
        store_key: extracted
            .as_ref()
            .ok()
            .map(|key| store_key(&route.namespace, key)),
    };
    (key, extracted)
}

/// The signature's check, and the refusal it makes, if any.
fn signature(
    verify: Option<&Verify>,
    request: &Request<Bytes>,
    now: i64,
) -> (Signature, Option<Refusal>) {
    let Some(verify) = verify else {
        return (Signature::none(request.headers()), None);
    };
    let secrets = &verify.secrets().0;
    let mut signature = Signature {
        result: Checked::Verified,
        scheme: Some(verify.scheme_name()),
        secrets: secrets.iter().map(|env| env.variable.clone()).collect(),
        judged_at: verify
            .is_timestamped()
            .then(|| crate::store::rfc3339(u64::try_from(now).unwrap_or(0).saturating_mul(1000))),
        detail: None,
    };
    let unset: Vec<&str> = secrets
        .iter()
        .filter(|env| env.secret.is_stand_in())
        .map(|env| env.variable.as_str())
        .collect();
    // The checks that need no secret (the header's presence and form, the timestamp's
    // age) run first: they refuse whatever the secret.
    let delivery = crate::verify::Signed {
        headers: request.headers(),
        body: request.body(),
    };
    let checked = verify.prepare(delivery, now).and_then(|pending| {
        if unset.is_empty() {
            pending.check(request.body())
        } else {
            pending.judge_body_timestamp(request.body())
        }
    });
    if checked.is_ok() && !unset.is_empty() {
        signature.result = Checked::NotChecked;
        signature.detail = Some(format!(
            "{} not set here: its header and timestamp pass; set the variable to the route's secret to check the signature itself",
            unset.join(", ")
        ));
        return (signature, None);
    }
    match checked {
        Ok(()) => (signature, None),
        Err(failure) => {
            signature.result = Checked::Refused;
            signature.detail = Some(report::why_refused(
                &failure,
                signature.judged_at.as_deref(),
            ));
            (signature, Some(failure.into()))
        }
    }
}
