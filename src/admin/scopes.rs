//! Scopes on the admin port: the stores of keys that routes keep (a route's own, or a
//! `scope:` several routes share), each with its keys counted by state; and a scope
//! cleared, whole or by key prefix, within the rules that keep events from running twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::{Response, StatusCode};

use super::answers::{self, ScopeCount, Scopes, StateCounts, answer_json};
use super::extract::{Live, PathNames, WithBody};
use super::keys::{Change, Listing, checked_prefix};
use crate::body::ProxyBody;
use crate::proxy::Proxy;
use crate::proxy::operator::{self, Resolving};
use crate::response::AdminRefusal;
use crate::route::Route;
use crate::store::{Forgotten, KeyState, Resolution, StateFilter, store_key};

/// How long `GET /v1/scopes` counts keys, over every scope, before it answers with the
/// counts so far (`counted_all: false`).
const COUNTING_BUDGET: Duration = Duration::from_secs(3);

/// How long one clearing request works before it answers `complete: false`, for the
/// caller to ask again: a request is never held longer than a proxy or client waits.
const CLEARING_BUDGET: Duration = Duration::from_secs(20);

/// Keys read per page while counting or clearing.
const PAGE: usize = 1000;

/// `GET /v1/scopes`: each scope, the routes that keep keys in it, and its live keys
/// counted by state.
pub(super) async fn list(Live(serving): Live) -> Response<ProxyBody> {
    let proxy: &Proxy = &serving.proxy;
    let routing = proxy.routing();
    let mut scopes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for route in routing.table.routes() {
        scopes
            .entry(route.namespace.as_str())
            .or_default()
            .push(&route.name);
    }
    let store = proxy.store();
    let deadline = Instant::now() + COUNTING_BUDGET;
    let mut listed = Vec::new();
    for (scope, routes) in scopes {
        let (mut in_flight, mut done, mut held) = (0u64, 0u64, 0u64);
        let listing = Listing {
            scope,
            prefix: "",
            state: None,
        };
        let mut after = None;
        let counted_all = loop {
            if Instant::now() >= deadline {
                break false;
            }
            let page = match listing.page(store.as_ref(), after.as_deref(), PAGE).await {
                Ok(page) => page,
                Err(refusal) => return refusal.into_response(),
            };
            for (_, state) in &page.keys {
                match state {
                    KeyState::InFlight { .. } => in_flight += 1,
                    KeyState::Done(_) => done += 1,
                    KeyState::Held(_) => held += 1,
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break true,
            }
        };
        listed.push(ScopeCount {
            scope: scope.to_owned(),
            routes: routes.into_iter().map(str::to_owned).collect(),
            keys: StateCounts {
                in_flight,
                done,
                held,
            },
            counted_all,
        });
    }
    answer_json(StatusCode::OK, &Scopes { scopes: listed })
}

/// What a clearing asks for.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Clearing {
    /// Only the keys starting with it; all of the scope's without it.
    #[serde(default)]
    prefix: String,
    /// Clear though keys are in flight (they stay), and release held keys too.
    #[serde(default)]
    force: bool,
    /// Go on from where an earlier answer of the same clearing stopped (its `next`).
    #[serde(default)]
    after: Option<String>,
}

/// What a clearing did.
#[derive(Default)]
struct Cleared {
    removed: u64,
    released: u64,
    held_left: u64,
    in_flight_left: u64,
}

/// `POST /v1/scopes/{scope}/clear` with `{"prefix":"...","force":false}` (both optional):
/// forgets the scope's done keys that start with the prefix (their recorded bodies too),
/// never another scope's. Refused while such keys are in flight unless forced; held keys
/// are left for an operator to resolve unless forced, when they are released.
pub(super) async fn clear(
    Live(serving): Live,
    PathNames(scope): PathNames<String>,
    WithBody(request): WithBody,
) -> Response<ProxyBody> {
    let proxy: &Proxy = &serving.proxy;
    let routing = proxy.routing();
    let Some(route) = routing
        .table
        .routes()
        .find(|route| route.namespace == scope)
    else {
        return AdminRefusal::NoSuchScope(scope).into_response();
    };
    let change = Change::of(&request);
    let shape = r#"the body must be {} or {"prefix":"evt_","force":true,"after":"<next>"}, each field optional"#;
    let asked = match super::extract::json_object::<Clearing>(request.body()) {
        Ok(asked) => asked,
        Err(_) if request.body().is_empty() => Clearing {
            prefix: String::new(),
            force: false,
            after: None,
        },
        Err(_) => return AdminRefusal::BadRequest(shape.into()).into_response(),
    };
    if let Err(reason) = checked_prefix(&asked.prefix) {
        return AdminRefusal::BadRequest(reason).into_response();
    }
    let deadline = Instant::now() + CLEARING_BUDGET;
    // Forced, the keys in flight are counted as the sweep passes them, not first; a
    // clearing that goes on was counted when it started.
    if !asked.force && asked.after.is_none() {
        match count(proxy, route, &asked.prefix, StateFilter::InFlight, deadline).await {
            Ok((0, true)) => {}
            Ok((in_flight, counted_all)) => {
                return AdminRefusal::ScopeInFlight(in_flight, counted_all).into_response();
            }
            Err(refusal) => return refusal.into_response(),
        }
    }
    let mut cleared = Cleared::default();
    let swept = sweep(proxy, route, &asked, deadline, &mut cleared).await;
    // A clearing the store broke off after it removed keys is logged too, with the
    // failure's status. The entry names no key: the body it records holds the prefix.
    let status = swept
        .as_ref()
        .map_or_else(AdminRefusal::status, |_| StatusCode::OK);
    if swept.is_ok() || cleared.removed + cleared.released > 0 {
        change.log_in(proxy, (None, &scope), None, status);
    }
    let next = match swept {
        Ok(next) => next,
        Err(refusal) => return refusal.into_response(),
    };
    let complete = next.is_none();
    tracing::info!(scope = %scope, prefix = %asked.prefix, removed = cleared.removed, released = cleared.released, complete, "scope cleared through the admin API");
    let answer = answers::Cleared {
        scope,
        prefix: asked.prefix,
        removed: cleared.removed,
        released: cleared.released,
        held_left: cleared.held_left,
        in_flight_left: cleared.in_flight_left,
        complete,
        next,
    };
    answer_json(StatusCode::OK, &answer)
}

/// How many of the scope's keys starting with `prefix` are in `state`, as far as the
/// deadline lets the count go, and whether it went to the end.
async fn count(
    proxy: &Proxy,
    route: &Route,
    prefix: &str,
    state: StateFilter,
    deadline: Instant,
) -> Result<(u64, bool), AdminRefusal> {
    let listing = Listing {
        scope: &route.namespace,
        prefix,
        state: Some(state),
    };
    let (mut counted, mut after) = (0, None);
    while Instant::now() < deadline {
        let page = listing.page(proxy.store().as_ref(), after.as_deref(), PAGE);
        let page = page.await?;
        counted += page.keys.len() as u64;
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok((counted, true)),
        }
    }
    Ok((counted, false))
}

/// Forgets the done keys the clearing takes, and releases the held ones if forced, from
/// where it was asked to go on, until none is left (`None`) or the deadline passes (the
/// cursor to go on from). At least one page is read, so each request moves on.
async fn sweep(
    proxy: &Proxy,
    route: &Route,
    asked: &Clearing,
    deadline: Instant,
    cleared: &mut Cleared,
) -> Result<Option<String>, AdminRefusal> {
    let (store, routing) = (proxy.store(), proxy.routing());
    let listing = Listing {
        scope: &route.namespace,
        prefix: &asked.prefix,
        state: None,
    };
    let mut after = asked.after.clone();
    loop {
        let page = listing.page(store.as_ref(), after.as_deref(), PAGE).await?;
        for (full_key, state) in &page.keys {
            debug_assert!(full_key.starts_with(&store_key(&route.namespace, &asked.prefix)));
            match state {
                KeyState::Done(_) => {
                    let forgotten = operator::forget(store.as_ref(), &routing, route, full_key);
                    if forgotten.await? == Forgotten::Removed {
                        cleared.removed += 1;
                    }
                }
                KeyState::Held(_) if asked.force => {
                    let release = Resolution::Release;
                    let resolved = operator::resolve(
                        store.as_ref(),
                        &routing,
                        route,
                        full_key,
                        release,
                        |_| true,
                    );
                    if matches!(resolved.await?, Resolving::Resolved) {
                        cleared.released += 1;
                    }
                }
                KeyState::Held(_) => cleared.held_left += 1,
                KeyState::InFlight { .. } => cleared.in_flight_left += 1,
            }
        }
        match page.next {
            Some(next) if Instant::now() >= deadline => return Ok(Some(next)),
            Some(next) => after = Some(next),
            None => return Ok(None),
        }
    }
}
