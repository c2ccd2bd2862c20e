//! The admin API of queued delivery (`delivery: queued`): each queued route's counts,
//! pausing and resuming a route, dead letters listed with filters, a job inspected with
//! every attempt, a dead letter replayed or discarded, and bulk replays (`bulk.rs`).

use std::borrow::Cow;
use std::sync::Arc;

use http::{Method, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;

use axum::extract::{RawQuery, State};

use super::answers::{
    AttemptView, DeadLetterPage, DeliveredJob, JobDetail, JobSummary, Paused, QueueList,
    QueueRoute, QueuedRequestView, ReplayProgress, ReplayedJob, answer_json,
};
use super::bulk::{self, DeadFilter};
use super::extract::{Live, PathNames};
use crate::body::{ProxyBody, empty};
use crate::preset::Preset;
use crate::proxy::Proxy;
use crate::queue::Deliveries;
use crate::response::{AdminRefusal, json_response};
use crate::route::Route;
use crate::store::queue::Job;
use crate::store::{rfc3339, store_key};

/// The most dead letters one page lists, and how many without `limit`.
pub(super) const DEAD_LIMIT_MAX: usize = 100;
const DEAD_LIMIT_DEFAULT: usize = 50;

/// The queued route `name` and the deliveries, or the refusal.
pub(super) fn queued_route(
    proxy: &Proxy,
    name: &str,
) -> Result<(Arc<Route>, Arc<Deliveries>), AdminRefusal> {
    let routing = proxy.routing();
    let route = routing
        .table
        .by_name(name)
        .ok_or_else(|| AdminRefusal::NoSuchRoute(name.to_owned()))?;
    match (proxy.deliveries(), &route.policy.queue) {
        (Some(deliveries), Some(_)) => Ok((Arc::clone(route), Arc::clone(deliveries))),
        _ => Err(AdminRefusal::NotQueued(name.to_owned())),
    }
}

/// `GET /v1/queue`: each queued route's counts.
pub(super) async fn overview(Live(serving): Live) -> Response<ProxyBody> {
    let proxy: &Proxy = &serving.proxy;
    let Some(deliveries) = proxy.deliveries() else {
        return answer_json(StatusCode::OK, &QueueList { routes: Vec::new() });
    };
    match deliveries.routes().await {
        Ok(routes) => {
            let routes = routes.iter().map(described).collect();
            answer_json(StatusCode::OK, &QueueList { routes })
        }
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `POST /v1/queue/{route}/replays?<filter>`: starts replaying the dead letters the
/// filter picks (the filter of `GET .../dead`).
pub(super) async fn replay_dead(
    State(replays): State<bulk::Replays>,
    Live(serving): Live,
    PathNames(route): PathNames<String>,
    RawQuery(query): RawQuery,
) -> Response<ProxyBody> {
    let (route, deliveries) = match queued_route(&serving.proxy, &route) {
        Ok(found) => found,
        Err(refusal) => return refusal.into_response(),
    };
    let filter = match DeadFilter::parse(query.as_deref(), 1, 1) {
        Ok((filter, _, None)) => filter,
        Ok((_, _, Some(_))) => {
            return AdminRefusal::BadRequest("a replay takes no `after`".into()).into_response();
        }
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    match replays.start(deliveries, route, filter) {
        Ok(started) => answer_json(StatusCode::ACCEPTED, &started),
        Err(reason) => AdminRefusal::TooMany(reason).into_response(),
    }
}

/// `GET /v1/replays/{id}`: a bulk replay's progress.
pub(super) async fn replay_progress(
    State(replays): State<bulk::Replays>,
    PathNames(id): PathNames<String>,
) -> Response<ProxyBody> {
    replay_answer(id.parse().ok().and_then(|id| replays.get(id)))
}

/// `DELETE /v1/replays/{id}`: cancels a bulk replay; what it replayed stays replayed.
pub(super) async fn cancel_replay(
    State(replays): State<bulk::Replays>,
    PathNames(id): PathNames<String>,
) -> Response<ProxyBody> {
    replay_answer(id.parse().ok().and_then(|id| replays.cancel(id)))
}

fn replay_answer(replay: Option<ReplayProgress>) -> Response<ProxyBody> {
    match replay {
        Some(replay) => answer_json(StatusCode::OK, &replay),
        None => AdminRefusal::NotFound.into_response(),
    }
}

/// A queued route's counts, as `GET /v1/queue` and `/v1/overview` show them.
pub(super) fn described(route: &crate::queue::RouteQueue) -> QueueRoute {
    let now = crate::store::Clock::now(&crate::store::SystemClock);
    let oldest = route.counts.oldest;
    QueueRoute {
        route: route.route.clone(),
        paused: route.paused,
        waiting: route.counts.waiting,
        retrying: route.counts.retrying,
        in_flight: route.in_flight,
        dead: route.counts.dead,
        oldest_received_at: oldest.map(rfc3339),
        oldest_age_seconds: oldest.map(|oldest| now.saturating_sub(oldest) / 1000),
    }
}

/// `POST /v1/queue/{route}/pause`.
pub(super) async fn pause(
    Live(serving): Live,
    PathNames(name): PathNames<String>,
) -> Response<ProxyBody> {
    set_paused(&serving.proxy, &name, true).await
}

/// `POST /v1/queue/{route}/resume`.
pub(super) async fn resume(
    Live(serving): Live,
    PathNames(name): PathNames<String>,
) -> Response<ProxyBody> {
    set_paused(&serving.proxy, &name, false).await
}

async fn set_paused(proxy: &Proxy, name: &str, paused: bool) -> Response<ProxyBody> {
    let (_, deliveries) = match queued_route(proxy, name) {
        Ok(found) => found,
        Err(refusal) => return refusal.into_response(),
    };
    match deliveries.set_paused(name, paused).await {
        Ok(()) => {
            tracing::info!(
                route = name,
                paused,
                "queued delivery paused or resumed through the admin API"
            );
            let route = name.to_owned();
            answer_json(StatusCode::OK, &Paused { route, paused })
        }
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `GET /v1/queue/{route}/dead?...`: a page of the route's dead letters that match the
/// filter, oldest death first.
pub(super) async fn dead(
    Live(serving): Live,
    PathNames(name): PathNames<String>,
    RawQuery(query): RawQuery,
) -> Response<ProxyBody> {
    let (proxy, name, query) = (&serving.proxy, name.as_str(), query.as_deref());
    let (route, deliveries) = match queued_route(proxy, name) {
        Ok(found) => found,
        Err(refusal) => return refusal.into_response(),
    };
    let (filter, limit, after) = match DeadFilter::parse(query, DEAD_LIMIT_DEFAULT, DEAD_LIMIT_MAX)
    {
        Ok(parsed) => parsed,
        Err(reason) => return AdminRefusal::BadRequest(reason).into_response(),
    };
    match bulk::matching(deliveries.queue().as_ref(), &route, &filter, after, limit).await {
        Ok((jobs, next)) => {
            let jobs = jobs.iter().map(|job| summary(&route, job)).collect();
            answer_json(StatusCode::OK, &DeadLetterPage { jobs, next })
        }
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// `GET`, `DELETE` (a dead letter) `/v1/queue/{route}/jobs/{key}`.
pub(super) async fn job(
    Live(serving): Live,
    PathNames((name, key)): PathNames<(String, String)>,
    method: Method,
) -> Response<ProxyBody> {
    job_action(&serving.proxy, &method, &name, &key, false).await
}

/// `POST /v1/queue/{route}/jobs/{key}/replay`: a dead letter queued again.
pub(super) async fn replay(
    Live(serving): Live,
    PathNames((name, key)): PathNames<(String, String)>,
) -> Response<ProxyBody> {
    job_action(&serving.proxy, &Method::POST, &name, &key, true).await
}

async fn job_action(
    proxy: &Proxy,
    method: &Method,
    name: &str,
    key: &str,
    replay: bool,
) -> Response<ProxyBody> {
    let (route, deliveries) = match queued_route(proxy, name) {
        Ok(found) => found,
        Err(refusal) => return refusal.into_response(),
    };
    let full_key = store_key(&route.namespace, key);
    let queue = deliveries.queue();
    let found = match queue.job(&route.name, &full_key).await {
        Ok(Some(job)) if job.route == route.name => job,
        Ok(_) => return AdminRefusal::NoSuchJob.into_response(),
        Err(failure) => return AdminRefusal::from(failure).into_response(),
    };
    if !replay && *method != Method::DELETE {
        return masked_json(&detail(&route, &found));
    }
    if found.dead.is_none() {
        return AdminRefusal::NotDead.into_response();
    }
    let changed = if replay {
        queue.revive(&route.name, &full_key).await
    } else {
        queue.discard(&route.name, &full_key).await
    };
    match changed {
        Ok(true) if replay => {
            tracing::info!(route = name, key = %key, "dead letter replayed through the admin API");
            deliveries.accepted(name);
            let answer = match queue.job(&route.name, &full_key).await {
                Ok(Some(job)) => ReplayedJob::Queued(Box::new(detail(&route, &job))),
                _ => ReplayedJob::Delivered(DeliveredJob {
                    route: name.to_owned(),
                    key: key.to_owned(),
                    state: "delivered".to_owned(),
                }),
            };
            masked_json(&answer)
        }
        Ok(true) => {
            tracing::info!(route = name, key = %key, "dead letter discarded through the admin API");
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        Ok(false) => AdminRefusal::NotDead.into_response(),
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// A job's key without its route's namespace.
fn short_key<'j>(route: &Route, job: &'j Job) -> &'j str {
    job.key
        .strip_prefix(&route.namespace)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or(&job.key)
}

/// A job as a listing shows it.
fn summary(route: &Route, job: &Job) -> JobSummary {
    let (state, died, reason) = match job.dead {
        Some((at, reason)) => ("dead", Some(rfc3339(at)), Some(reason.as_str().to_owned())),
        None if job.attempts_this_round() == 0 => ("waiting", None, None),
        None => ("retrying", None, None),
    };
    JobSummary {
        route: route.name.clone(),
        key: short_key(route, job).to_owned(),
        state: state.to_owned(),
        lane: job.lane.clone(),
        received_at: rfc3339(job.received_at),
        attempts: job.attempted,
        last_status: job.last_status(),
        dead_at: died,
        dead_because: reason,
    }
}

/// A job with its request's head and every attempt kept (answered through `masked_json`).
fn detail(route: &Route, job: &Job) -> JobDetail {
    let history = job
        .history
        .iter()
        .map(|attempt| AttemptView {
            at: rfc3339(attempt.at),
            status: attempt.status,
            latency_ms: attempt.latency_ms,
            answer: String::from_utf8_lossy(&attempt.detail).into_owned(),
        })
        .collect();
    // Only headers known to carry no secret are shown: a signature or a token under a
    // name no rule foresaw stays masked. Query values are masked too.
    let headers = job
        .request
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), masked_header(name, value)))
        .collect();
    JobDetail {
        summary: summary(route, job),
        request: QueuedRequestView {
            method: job.request.method.clone(),
            target: masked_query(&job.request.target),
            headers,
            body_bytes: job.request.body.len(),
        },
        history,
        attempts_kept: job.history.len(),
    }
}

/// An answer as JSON with every configured secret masked in its strings, as in the log
/// (an app's answer or a header may echo one). Masked string by string, so that no mask
/// can break the JSON around it.
fn masked_json(answer: &impl Serialize) -> Response<ProxyBody> {
    fn mask(value: &mut Value) {
        match value {
            Value::String(text) => {
                if let Cow::Owned(masked) = crate::redact::text(text) {
                    *text = masked;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(mask),
            Value::Object(fields) => fields.values_mut().for_each(mask),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    let mut value = serde_json::to_value(answer).expect("an answer is JSON");
    mask(&mut value);
    json_response(StatusCode::OK, value.to_string())
}

/// A header's value as the admin API shows it: masked unless the header is known to
/// carry no secret (a signature or a token under a name no rule foresaw stays masked).
pub(super) fn masked_header(name: &str, value: &[u8]) -> String {
    if SHOWN_HEADERS.contains(&name) || Preset::is_id_header(name) {
        String::from_utf8_lossy(value).into_owned()
    } else {
        MASKED.into()
    }
}

/// What stands for a value not shown.
const MASKED: &str = "(masked)";

/// Headers whose values the admin API shows (lowercase), besides the providers' event
/// names and IDs (each preset's `id_headers`): a message's own, the proxy's, and what an
/// app's answer says of what it made.
const SHOWN_HEADERS: [&str; 15] = [
    "content-type",
    "content-location",
    "location",
    "etag",
    "cache-control",
    "content-length",
    "content-encoding",
    "user-agent",
    "accept",
    "host",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "dedupe-key",
    "traceparent",
];

/// A target with its query's values masked (names kept).
fn masked_query(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else {
        return target.to_owned();
    };
    let names: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) => format!("{name}={MASKED}"),
            None => pair.to_owned(),
        })
        .collect();
    format!("{path}?{}", names.join("&"))
}
