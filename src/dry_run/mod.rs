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
use serde::Serialize;

use crate::key::{Delivery, KeyError};
use crate::order::Guard;
use crate::response::Refusal;
use crate::route::{DeliveryMode, OnMissingKey, Route, Routing, Unmatched};
use crate::store::keys::store_key;
use crate::verify::Verify;

/// What the proxy would do with a request.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `taken` (a route takes it and forwards or queues it), `refused` (the sender gets
    /// an error) or `unmatched` (no route takes it; it is forwarded unchecked).
    pub verdict: Verdict,
    pub request: Asked,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteTaken>,
    /// Each route, and why it does not take the request: only when none does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_taken_by: Vec<NotTaken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyRead>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderRead>,
    /// What the first delivery of the key gets, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_delivery: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<Answered>,
    /// The answer while another delivery of the key is running, or while it is held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<Answered>,
    /// The answer a refused request gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Answered>,
    /// What the caller of the dry run adds (where a secret came from, say).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Taken,
    Refused,
    Unmatched,
}

/// The request, as the dry run read it.
#[derive(Debug, Serialize)]
pub struct Asked {
    pub method: String,
    pub target: String,
    pub host: Option<String>,
    pub body_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct RouteTaken {
    pub name: String,
    pub scope: String,
    pub delivery: DeliveryMode,
    pub upstream: String,
}

#[derive(Debug, Serialize)]
pub struct NotTaken {
    pub route: String,
    pub because: String,
}

#[derive(Debug, Serialize)]
pub struct Signature {
    /// `verified`, `refused`, `not_checked` (a secret's variable is not set) or `none`
    /// (the route checks no signature).
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Why it was refused or not checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct KeyRead {
    pub template: String,
    /// The key, or none when a part read nothing.
    pub value: Option<String>,
    /// Each part that reads the request, with its value or why it has none.
    pub parts: Vec<PartRead>,
    /// Where the store keeps it (a Redis store puts its prefix in front).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_key: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PartRead {
    pub part: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct OrderRead {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why the guard cannot use the event (it goes unguarded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

/// An answer the proxy gives itself.
#[derive(Debug, Serialize)]
pub struct Answered {
    pub status: u16,
    /// The `error` code of a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// A refusal's detail, or the body of another answer.
    pub detail: String,
}

impl Report {
    fn of(request: &Request<Bytes>) -> Report {
        let host = request.headers().get(http::header::HOST);
        Report {
            verdict: Verdict::Taken,
            request: Asked {
                method: request.method().to_string(),
                target: request.uri().to_string(),
                host: host.and_then(|host| host.to_str().ok()).map(str::to_owned),
                body_bytes: request.body().len(),
            },
            route: None,
            not_taken_by: Vec::new(),
            signature: None,
            key: None,
            order: None,
            first_delivery: None,
            duplicate: None,
            in_flight: None,
            refusal: None,
            notes: Vec::new(),
        }
    }

    fn refused(mut self, refusal: Refusal) -> Report {
        let (status, error, detail) = refusal.parts();
        self.verdict = Verdict::Refused;
        self.refusal = Some(Answered {
            status: status.as_u16(),
            error: Some(error),
            detail,
        });
        self
    }
}

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
    let parts = route
        .key
        .readings(&delivery)
        .into_iter()
        .map(|(part, read)| match read {
            Ok(value) => PartRead {
                part,
                value: Some(value),
                missing: None,
            },
            Err(error) => PartRead {
                part,
                value: None,
                missing: Some(error.to_string()),
            },
        })
        .collect();
    let extracted = route.key.extract(&delivery);
    report.key = Some(KeyRead {
        template: route.key.to_string(),
        value: extracted.as_ref().ok().cloned(),
        parts,
        store_key: extracted
            .as_ref()
            .ok()
            .map(|key| store_key(&route.namespace, key)),
    });
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
