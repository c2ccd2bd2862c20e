//! Keys on the admin port: a route's keys listed, one inspected (with the answer it
//! recorded), forgotten or given another expiry, a held one resolved; and the newest
//! version done for an entity (`order:`), inspected or forgotten.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use axum::extract::RawQuery;

use super::answers::{
    AbsentKey, DoneBecause, EntityVersion, KeyPage, KeyStateName, KeyView, RecordedAnswer,
    answer_json,
};
use super::extract::{Caller, Live, PathNames, WithBody, json_object};
use super::queue::masked_header;
use crate::body::{ProxyBody, empty};
use crate::key::MAX_KEY_BYTES;
use crate::proxy::Proxy;
use crate::proxy::operator::{self, Resolving};
use crate::response::{AdminRefusal, json_response};
use crate::route::Route;
use crate::store::log::{Fate, LoggedDelivery};
use crate::store::{
    ClaimStore, Clock, DoneRecord, Expiry, Forgotten, HeldRecord, KeyState, Millis, Page,
    QUEUED_STATUS, RESOLVED_STATUS, Resolution, STALE_SKIPPED_STATUS, StateFilter, SystemClock,
    entity_key, millis, parse_rfc3339, rfc3339, store_key,
};

/// A change an operator asked for, as the delivery log keeps it: the request (its body
/// is small and holds no secret: an expiry, a resolution) and who sent it.
pub(super) struct Change {
    method: String,
    path: String,
    body: Bytes,
    caller: Option<Caller>,
}

impl Change {
    pub(super) fn of(request: &Request<Bytes>) -> Change {
        Change {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
            body: request.body().clone(),
            caller: request.extensions().get::<Caller>().cloned(),
        }
    }

    /// Logs the change of `key` (of `route`), answered `status`, as a `changed` entry.
    fn log(self, proxy: &Proxy, route: &Route, key: &str, status: StatusCode) {
        let named = (Some(route.name.as_str()), route.namespace.as_str());
        self.log_in(proxy, named, Some(key), status);
    }

    /// Logs the change of `key`, or of the keys the request's body names, in the scope of
    /// `(route, scope)`.
    pub(super) fn log_in(
        self,
        proxy: &Proxy,
        (route, scope): (Option<&str>, &str),
        key: Option<&str>,
        status: StatusCode,
    ) {
        let (by, client) = match self.caller {
            Some(caller) => (Some(caller.by), caller.client),
            None => (None, None),
        };
        proxy.recorder().record(LoggedDelivery {
            at: SystemClock.now(),
            route: route.map(str::to_owned),
            scope: Some(scope.to_owned()),
            key: key.map(str::to_owned),
            fate: Fate::Changed,
            refusal: None,
            waited: false,
            replayed: false,
            attempt: None,
            status: status.as_u16(),
            upstream_status: None,
            upstream_ms: None,
            duration_ms: 0,
            size: Some(self.body.len() as u64),
            method: self.method,
            path: self.path,
            request_id: None,
            trace_id: None,
            client: client.map(|client| client.to_string()),
            replica: None,
            headers: Vec::new(),
            body: (!self.body.is_empty()).then_some(self.body),
            body_truncated: false,
            by,
        });
    }
}

/// `GET`, `DELETE` or `PATCH /v1/keys/{route}/{key}`; the key is percent-decoded.
pub(super) async fn one(
    Live(serving): Live,
    PathNames((route_name, key)): PathNames<(String, String)>,
    WithBody(request): WithBody,
) -> Response<ProxyBody> {
    let (proxy, route_name): (&Proxy, &str) = (&serving.proxy, &route_name);
    let routing = proxy.routing();
    let Some(route) = routing.table.by_name(route_name) else {
        return AdminRefusal::NoSuchRoute(route_name.to_owned()).into_response();
    };
    let full_key = store_key(&route.namespace, &key);
    let store = proxy.store();
    let change = Change::of(&request);
    match *request.method() {
        Method::DELETE => {
            match operator::forget(store.as_ref(), &routing, route, &full_key).await {
                Ok(Forgotten::Removed) => {
                    tracing::info!(route = route_name, key = %key, "key forgotten through the admin API");
                    change.log(proxy, route, &key, StatusCode::NO_CONTENT);
                    let mut response = Response::new(empty());
                    *response.status_mut() = StatusCode::NO_CONTENT;
                    response
                }
                Ok(Forgotten::Absent) => AdminRefusal::Absent.into_response(),
                Ok(Forgotten::InFlight) => AdminRefusal::InFlight.into_response(),
                Ok(Forgotten::Held) => AdminRefusal::Held.into_response(),
                Err(failure) => AdminRefusal::from(failure).into_response(),
            }
        }
        Method::PATCH => {
            let expires_at = match asked_expiry(request) {
                Ok(expires_at) => expires_at,
                Err(refusal) => return refusal.into_response(),
            };
            let set = operator::set_expiry(store.as_ref(), &routing, route, &full_key, expires_at);
            match set.await {
                Ok(Expiry::Set) => {
                    tracing::info!(route = route_name, key = %key, expires_at = %rfc3339(expires_at), "key's expiry set through the admin API");
                    change.log(proxy, route, &key, StatusCode::OK);
                    inspected(proxy, route_name, &key, &full_key).await
                }
                Ok(Expiry::Absent) => AdminRefusal::Absent.into_response(),
                Ok(Expiry::InFlight) => AdminRefusal::InFlight.into_response(),
                Ok(Expiry::Held) => AdminRefusal::Held.into_response(),
                Err(failure) => AdminRefusal::from(failure).into_response(),
            }
        }
        // GET, or HEAD answered as one: the endpoint takes no other.
        _ => inspected(proxy, route_name, &key, &full_key).await,
    }
}

/// A key as `GET` shows it: its state, and the answer it recorded whole.
async fn inspected(
    proxy: &Proxy,
    route_name: &str,
    key: &str,
    full_key: &str,
) -> Response<ProxyBody> {
    match proxy.store().inspect(full_key).await {
        Ok(Some(state)) => {
            let mut described = describe(route_name, key, &state);
            if let KeyState::Done(DoneRecord {
                response: Some(answer),
                ..
            }) = &state
            {
                let headers = answer
                    .headers
                    .iter()
                    .map(|(name, value)| (name.clone(), masked_header(name, value)))
                    .collect();
                described.answer = Some(RecordedAnswer {
                    status: answer.status,
                    headers,
                    body_bytes: answer.body.len(),
                });
            }
            // A configured secret that the answer echoed is masked as in the log.
            json_response(
                StatusCode::OK,
                crate::redact::text(&serde_json::to_string(&described).expect("JSON")).into_owned(),
            )
        }
        Ok(None) => AdminRefusal::Absent.into_response(),
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// The longest expiry an operator may set: far beyond any provider's retries.
const EXPIRY_MAX: Duration = Duration::from_secs(10 * 365 * 86_400);

/// A key's new expiry: one of the two.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewExpiry {
    /// When it expires (RFC 3339).
    expires_at: Option<String>,
    /// How long from now (`48h`).
    expires_in: Option<String>,
}

/// The expiry a `PATCH` body asks for: `{"expires_at":"<RFC 3339>"}` or
/// `{"expires_in":"48h"}`, in the future and at most [`EXPIRY_MAX`] away.
fn asked_expiry(request: Request<Bytes>) -> Result<Millis, AdminRefusal> {
    let bad = |reason: String| AdminRefusal::BadRequest(reason);
    let body = request.into_body();
    let shape = r#"the body must be {"expires_in":"48h"} or {"expires_at":"2030-01-01T00:00:00Z"}"#;
    let asked = json_object::<NewExpiry>(&body).map_err(|_| bad(shape.into()))?;
    let now = millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    );
    let expires_at = match (asked.expires_at, asked.expires_in) {
        (Some(at), None) => parse_rfc3339("expires_at", &at).map_err(bad)?,
        (None, Some(text)) => {
            let after = humantime::parse_duration(&text)
                .map_err(|_| bad(format!("expires_in `{text}` is not a duration like 48h")))?;
            now.saturating_add(millis(after))
        }
        _ => return Err(bad(shape.into())),
    };
    if expires_at <= now {
        return Err(bad(
            "the expiry is not in the future: DELETE the key to forget it now".into(),
        ));
    }
    if expires_at - now > millis(EXPIRY_MAX) {
        let days = EXPIRY_MAX.as_secs() / 86_400;
        return Err(bad(format!("the expiry is more than {days} days away")));
    }
    Ok(expires_at)
}

/// `GET /v1/entities/{route}/{entity}`: the newest version done for an entity of a route
/// with `order:`; `DELETE` forgets it (after a version far ahead made real events stale).
pub(super) async fn entity(
    Live(serving): Live,
    PathNames((route_name, entity)): PathNames<(String, String)>,
    WithBody(request): WithBody,
) -> Response<ProxyBody> {
    let (proxy, route_name): (&Proxy, &str) = (&serving.proxy, &route_name);
    let request = &request;
    let routing = proxy.routing();
    let Some(route) = routing.table.by_name(route_name) else {
        return AdminRefusal::NoSuchRoute(route_name.to_owned()).into_response();
    };
    if route.order.is_none() {
        return AdminRefusal::NoOrder(route_name.to_owned()).into_response();
    }
    let full_key = entity_key(&route.namespace, &entity);
    let store = proxy.store();
    match *request.method() {
        Method::DELETE => match store.forget_entity(&full_key).await {
            Ok(true) => {
                tracing::info!(route = route_name, entity = %entity, "entity's version forgotten through the admin API");
                Change::of(request).log(proxy, route, &entity, StatusCode::NO_CONTENT);
                let mut response = Response::new(empty());
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            Ok(false) => AdminRefusal::NoVersion.into_response(),
            Err(failure) => AdminRefusal::from(failure).into_response(),
        },
        // GET, or HEAD answered as one: the endpoint takes no other.
        _ => match store.newest_version(&full_key).await {
            Ok(Some(record)) => {
                let version = EntityVersion {
                    route: route_name.to_owned(),
                    entity,
                    newest_version: record.newest.text,
                    recorded_at: rfc3339(record.recorded_at),
                    expires_at: rfc3339(record.expires_at),
                };
                answer_json(StatusCode::OK, &version)
            }
            Ok(None) => AdminRefusal::NoVersion.into_response(),
            Err(failure) => AdminRefusal::from(failure).into_response(),
        },
    }
}

/// The most keys one page of `GET /v1/keys` lists, and how many without `limit`.
pub(super) const LIST_LIMIT_MAX: usize = 1000;
pub(super) const LIST_LIMIT_DEFAULT: usize = 100;

/// `GET /v1/keys?route=R[&prefix=P][&state=in_flight|done|held][&limit=N][&after=CURSOR]`:
/// a page of a route's keys starting with `P`, and the cursor of the next page (`null`
/// after the last).
pub(super) async fn list(Live(serving): Live, RawQuery(query): RawQuery) -> Response<ProxyBody> {
    let (proxy, query): (&Proxy, Option<&str>) = (&serving.proxy, query.as_deref());
    let (mut route_name, mut prefix, mut state) = (None, String::new(), None);
    let (mut limit, mut after) = (LIST_LIMIT_DEFAULT, None);
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let bad = |reason: String| AdminRefusal::BadRequest(reason).into_response();
        match &*name {
            "route" => route_name = Some(value.into_owned()),
            "prefix" => match checked_prefix(&value) {
                Ok(()) => prefix = value.into_owned(),
                Err(reason) => return bad(reason),
            },
            "state" => match StateFilter::parse(&value) {
                Some(filter) => state = Some(filter),
                None => {
                    return bad(format!(
                        "state `{value}` is not one of in_flight, done, held"
                    ));
                }
            },
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=LIST_LIMIT_MAX).contains(&n) => limit = n,
                _ => return bad(format!("limit must be a number from 1 to {LIST_LIMIT_MAX}")),
            },
            "after" => after = Some(value.into_owned()),
            other => return bad(format!("unknown query parameter `{other}`")),
        }
    }
    let Some(route_name) = route_name else {
        return AdminRefusal::BadRequest("`route` is required".into()).into_response();
    };
    let routing = proxy.routing();
    let Some(route) = routing.table.by_name(&route_name) else {
        return AdminRefusal::NoSuchRoute(route_name).into_response();
    };
    let listing = Listing {
        scope: &route.namespace,
        prefix: &prefix,
        state,
    };
    let page = match listing
        .page(proxy.store().as_ref(), after.as_deref(), limit)
        .await
    {
        Ok(page) => page,
        Err(refusal) => return refusal.into_response(),
    };
    let namespace = format!("{}:", route.namespace);
    let keys: Vec<_> = page
        .keys
        .iter()
        .map(|(full_key, state)| {
            let key = full_key.strip_prefix(&namespace).unwrap_or(full_key);
            describe(&route_name, key, state)
        })
        .collect();
    let next = page.next;
    answer_json(StatusCode::OK, &KeyPage { keys, next })
}

/// Why `prefix` cannot start keys, if it cannot: longer than a key, or with a control or
/// formatting character no extracted key holds.
pub(super) fn checked_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the prefix is {} bytes; a key is at most {MAX_KEY_BYTES}",
            prefix.len()
        ));
    }
    if prefix.chars().any(crate::misleading::is_misleading) {
        return Err("the prefix holds a control or formatting character, which no key does".into());
    }
    Ok(())
}

/// One listing of a scope's keys: which keys it shows. Its pages' cursors carry a mark
/// of it and of the store's cursor, so that a cursor from another listing, or edited, is
/// refused, not misread.
pub(super) struct Listing<'a> {
    pub(super) scope: &'a str,
    pub(super) prefix: &'a str,
    pub(super) state: Option<StateFilter>,
}

impl Listing<'_> {
    /// Up to `limit` keys after the cursor `after`, with the next page's cursor.
    pub(super) async fn page(
        &self,
        store: &dyn ClaimStore,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, AdminRefusal> {
        let inner = match after {
            None => None,
            Some(cursor) => match cursor.split_once('.') {
                Some((mark, inner)) if self.is_mark(mark, inner) => Some(inner),
                _ => {
                    return Err(AdminRefusal::BadRequest(format!(
                        "`{cursor}` is not a cursor of this listing (another route, prefix or state, or not a cursor)"
                    )));
                }
            },
        };
        let scope = self.scope;
        let mut page = store
            .list(scope, self.prefix, self.state, inner, limit)
            .await?;
        page.next = page.next.map(|next| format!("{}.{next}", self.mark(&next)));
        Ok(page)
    }

    /// The mark of the store's cursor `inner` in this listing: a cursor edited, or from
    /// another listing, does not carry it.
    fn mark(&self, inner: &str) -> String {
        crate::cursor_mark::mark(&["keys", self.scope, self.prefix, self.state_name(), inner])
    }

    fn is_mark(&self, given: &str, inner: &str) -> bool {
        let parts = ["keys", self.scope, self.prefix, self.state_name(), inner];
        crate::cursor_mark::is_mark_of(given, &parts)
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            None => "",
            Some(StateFilter::InFlight) => "in_flight",
            Some(StateFilter::Done) => "done",
            Some(StateFilter::Held) => "held",
        }
    }
}

/// `POST /v1/keys/{route}/{key}/resolve` with `{"outcome":"done"}` (the work happened:
/// duplicates get the duplicate answer) or `{"outcome":"release"}` (the next delivery runs
/// it), and `"held_at"` if wanted (the hold the operator looked into, as `GET` showed it: a
/// key held again since is left alone).
pub(super) async fn resolve(
    Live(serving): Live,
    PathNames((route_name, key)): PathNames<(String, String)>,
    WithBody(request): WithBody,
) -> Response<ProxyBody> {
    let (proxy, route_name): (&Proxy, &str) = (&serving.proxy, &route_name);
    let routing = proxy.routing();
    let Some(route) = routing.table.by_name(route_name) else {
        return AdminRefusal::NoSuchRoute(route_name.to_owned()).into_response();
    };
    let change = Change::of(&request);
    let (resolution, expected_hold) = match asked_resolution(route, request) {
        Ok(asked) => asked,
        Err(refusal) => return refusal.into_response(),
    };
    let full_key = store_key(&route.namespace, &key);
    let store = proxy.store();
    let is_the_hold = |held: &HeldRecord| {
        expected_hold
            .as_ref()
            .is_none_or(|expected| *expected == rfc3339(held.held_at))
    };
    let resolved = operator::resolve(
        store.as_ref(),
        &routing,
        route,
        &full_key,
        resolution,
        is_the_hold,
    );
    match resolved.await {
        Ok(Resolving::Resolved) => {
            let outcome = match resolution {
                Resolution::Done { .. } => "done",
                Resolution::Release => "release",
            };
            tracing::info!(route = route_name, key = %key, outcome, "held key resolved through the admin API");
            change.log(proxy, route, &key, StatusCode::OK);
            match store.inspect(&full_key).await {
                Ok(Some(state)) => answer_json(StatusCode::OK, &describe(route_name, &key, &state)),
                _ => {
                    let (route, key) = (route_name.to_owned(), key.clone());
                    let state = KeyStateName::Absent;
                    answer_json(StatusCode::OK, &AbsentKey { route, key, state })
                }
            }
        }
        Ok(Resolving::NotHeld) => AdminRefusal::NotHeld.into_response(),
        Ok(Resolving::HeldAgain) => AdminRefusal::HeldAgain.into_response(),
        Err(failure) => AdminRefusal::from(failure).into_response(),
    }
}

/// How a held key is resolved.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct HeldResolution {
    /// `done` (the work happened: duplicates get the duplicate answer) or `release` (the
    /// next delivery runs it).
    outcome: String,
    /// The hold the operator looked into, as `GET` showed it: a key held again since is
    /// left alone.
    held_at: Option<String>,
}

/// The resolution a `POST .../resolve` body asks for, and the hold it names if any.
fn asked_resolution(
    route: &Route,
    request: Request<Bytes>,
) -> Result<(Resolution, Option<String>), AdminRefusal> {
    let body = request.into_body();
    let asked = json_object::<HeldResolution>(&body).ok();
    let resolution = match asked.as_ref().map(|asked| asked.outcome.as_str()) {
        Some("done") => Resolution::Done {
            retention: route.policy.retention,
        },
        Some("release") => Resolution::Release,
        _ => {
            return Err(AdminRefusal::BadRequest(
                r#"the body must be {"outcome":"done"} or {"outcome":"release"}, with "held_at" if wanted"#.into(),
            ));
        }
    };
    Ok((resolution, asked.and_then(|asked| asked.held_at)))
}

/// The view every state starts from: a key the store does not hold.
fn absent_key(route: &str, key: &str) -> KeyView {
    KeyView {
        route: route.to_owned(),
        key: key.to_owned(),
        state: KeyStateName::Absent,
        claimed_at: None,
        held_at: None,
        completed_at: None,
        expires_at: None,
        upstream_status: None,
        done_because: None,
        held_because: None,
        body_sha256: None,
        answer_status: None,
        answer: None,
    }
}

/// The admin API's view of a key.
fn describe(route: &str, key: &str, state: &KeyState) -> KeyView {
    let mut view = absent_key(route, key);
    match state {
        KeyState::InFlight {
            claimed_at,
            lease_until,
            fingerprint,
        } => {
            view.state = KeyStateName::InFlight;
            view.claimed_at = Some(rfc3339(*claimed_at));
            view.expires_at = Some(rfc3339(*lease_until));
            view.body_sha256 = Some(hex::encode(fingerprint));
        }
        KeyState::Done(done) => {
            let (because, seen) = match done.upstream_status {
                RESOLVED_STATUS => (DoneBecause::Resolved, false),
                STALE_SKIPPED_STATUS => (DoneBecause::StaleSkipped, false),
                QUEUED_STATUS => (DoneBecause::Queued, false),
                _ => (DoneBecause::UpstreamSuccess, true),
            };
            view.state = KeyStateName::Done;
            view.claimed_at = Some(rfc3339(done.claimed_at));
            view.completed_at = Some(rfc3339(done.completed_at));
            view.expires_at = Some(rfc3339(done.expires_at));
            view.upstream_status = seen.then_some(done.upstream_status);
            view.done_because = Some(because);
            view.body_sha256 = Some(hex::encode(done.fingerprint));
            // The answer duplicates are replayed (`replay`), if one was recorded.
            view.answer_status = Some(done.response.as_ref().map(|answer| answer.status));
        }
        KeyState::Held(held) => {
            view.state = KeyStateName::Held;
            view.claimed_at = Some(rfc3339(held.claimed_at));
            view.held_at = Some(rfc3339(held.held_at));
            view.expires_at = Some(rfc3339(held.expires_at));
            view.held_because = Some(held.reason.as_str().to_owned());
            view.body_sha256 = Some(hex::encode(held.fingerprint));
        }
    }
    view
}
