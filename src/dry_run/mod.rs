//! A dry run: what the proxy would do with one request, step by step, without contacting
//! the app or the store. The route that takes it (or why none does), the signature's
//! check, the key and the parts it came from, the store key, what `order` reads, and what
//! a first delivery, a duplicate and a delivery in flight would get. The steps are the
//! proxy's own (the route table, the signature schemes, the key templates, the refusals),
//! taken in the order `proxy::Proxy::check` takes them, so a dry run tells the story a
//! delivery would live. `dedupe-proxy try` runs one on a file's routes (`cli::trial`);
//! `POST /v1/try` on the running ones.

pub mod message;
mod report;

use bytes::Bytes;
use http::Request;

pub use report::{
    Answered, Asked, KeyRead, NotTaken, OrderRead, PartRead, Report, RouteTaken, Signature, Verdict,
};

use crate::key::{Delivery, KeyError};
use crate::order::Guard;
use crate::response::Refusal;
use crate::route::{OnMissingKey, Route, Routing, Unmatched};
use crate::store::keys::store_key;
use crate::verify::Verify;

/// What `routing` would do with `request`, judging a signature's timestamp as of `now`
/// (Unix seconds).
pub fn judge(routing: &Routing, request: &Request<Bytes>, now: i64) -> Report {
    let report = Report::of(request);
    let headers = request.headers();
    let target = match crate::target::addressed(
        request.version(),
        request.method(),
        request.uri(),
        headers,
        routing.table.limits_hosts(),
    ) {
        Ok(target) => target,
        Err(error) => return report.refused(error.into()),
    };
    let route = match routing.table.find(&target) {
        Ok(Some(route)) => route,
        Ok(None) => return unmatched(report, routing, &target),
        Err(error) => return report.refused(error.into()),
    };
    on_route(report, route, request, now)
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
                .unwrap_or_else(|| {
                    "it takes another reading of the request (a method override or a rewritten URL)"
                        .into()
                }),
        })
        .collect();
    match routing.unmatched {
        Unmatched::Reject => report.refused(Refusal::NoRoute),
        Unmatched::Forward => {
            report.verdict = Verdict::Unmatched;
            report.first_delivery = Some(format!(
                "forwarded to {} as it is: no signature check, no key, no deduplication",
                routing.fallback_upstream
            ));
            report
        }
    }
}

/// The steps of a delivery on `route` that need no store.
fn on_route(mut report: Report, route: &Route, request: &Request<Bytes>, now: i64) -> Report {
    let policy = &route.policy;
    report.route = Some(RouteTaken {
        name: route.name.clone(),
        scope: route.namespace.clone(),
        delivery: policy.delivery,
        upstream: route.upstream.to_string(),
    });
    let body = request.body();
    if body.len() as u64 > policy.max_body {
        return report.refused(Refusal::BodyTooLarge {
            limit: policy.max_body,
        });
    }
    let (signature, refused) = signature(route.verify.as_ref(), request, now);
    report.signature = Some(signature);
    if let Some(refusal) = refused {
        return report.refused(refusal);
    }
    let delivery = Delivery {
        headers: request.headers(),
        query: request.uri().query(),
        body,
    };
    let (key, extracted) = key_read(route, &delivery);
    report.key = Some(key);
    match extracted {
        Ok(_) => {}
        Err(KeyError::Missing { .. }) if policy.on_missing_key == OnMissingKey::Forward => {
            report.first_delivery = Some(format!(
                "forwarded to {} without a claim (on_missing_key: forward): not deduplicated",
                route.upstream
            ));
            return report;
        }
        Err(error) => return report.refused(error.into()),
    }
    report.order =
        route
            .order
            .as_ref()
            .map(|order| match order.read(&route.namespace, &delivery) {
                Guard::Versioned(ordered) => OrderRead {
                    entity: Some(ordered.entity),
                    version: Some(ordered.version.text),
                    unusable: None,
                },
                Guard::Unversioned(why) => OrderRead {
                    entity: None,
                    version: None,
                    unusable: Some(why),
                },
                Guard::Off => OrderRead {
                    entity: None,
                    version: None,
                    unusable: None,
                },
            });
    report::answers(&mut report, route, request);
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
        let none = Signature {
            result: "none",
            scheme: None,
            secrets: Vec::new(),
            detail: None,
        };
        return (none, None);
    };
    let secrets = &verify.secrets().0;
    let mut signature = Signature {
        result: "verified",
        scheme: Some(verify.scheme_name()),
        secrets: secrets.iter().map(|env| env.variable.clone()).collect(),
        detail: None,
    };
    let unset: Vec<&str> = secrets
        .iter()
        .filter(|env| env.secret.is_stand_in())
        .map(|env| env.variable.as_str())
        .collect();
    if !unset.is_empty() {
        signature.result = "not_checked";
        signature.detail = Some(format!(
            "{} not set here: set it to the route's secret to check the signature",
            unset.join(", ")
        ));
        return (signature, None);
    }
    let checked = verify
        .prepare(request.headers(), now)
        .and_then(|pending| pending.check(request.body()));
    match checked {
        Ok(()) => (signature, None),
        Err(failure) => {
            signature.result = "refused";
            signature.detail = Some(report::why_refused(&failure));
            (signature, Some(failure.into()))
        }
    }
}
