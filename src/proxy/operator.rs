//! What an operator does to a key through the admin API, with the record the replay guard
//! keeps of a delivery's body beside it (which only the proxy's claims make): forgetting a
//! done key forgets its body, moving its expiry moves its body's, and resolving a held key
//! resolves its body first.

use crate::route::{Route, Routing};
use crate::store::{
    ClaimStore, Expiry, Forgotten, HeldRecord, KeyState, Millis, Resolution, StoreError, body_key,
};

/// Forgets a done key and, where a route of its scope guards against replays, the body it
/// recorded: else a redelivery would still be that body's duplicate.
pub(crate) async fn forget(
    store: &dyn ClaimStore,
    routing: &Routing,
    route: &Route,
    full_key: &str,
) -> Result<Forgotten, StoreError> {
    if routing.table.guards_bodies(&route.namespace)
        && let Some(KeyState::Done(record)) = store.inspect(full_key).await?
    {
        store
            .forget(&body_key(&route.namespace, &record.fingerprint))
            .await?;
    }
    store.forget(full_key).await
}

/// Moves a done key's expiry to `expires_at` and, where a route of its scope guards
/// against replays, its body's: else the body would outlive the key, or go before it.
pub(crate) async fn set_expiry(
    store: &dyn ClaimStore,
    routing: &Routing,
    route: &Route,
    full_key: &str,
    expires_at: Millis,
) -> Result<Expiry, StoreError> {
    if routing.table.guards_bodies(&route.namespace)
        && let Some(KeyState::Done(record)) = store.inspect(full_key).await?
    {
        let body = body_key(&route.namespace, &record.fingerprint);
        store.set_expiry(&body, expires_at).await?;
    }
    store.set_expiry(full_key, expires_at).await
}

/// What a resolution did.
pub(crate) enum Resolving {
    Resolved,
    NotHeld,
    /// Held, but not by the hold the operator named.
    HeldAgain,
}

/// Resolves a held key, if `is_the_hold` says it is held by the hold the operator looked
/// into; where a route of its scope guards against replays, the body it held first
/// (resolved alone, it could not be reached again through its key).
pub(crate) async fn resolve(
    store: &dyn ClaimStore,
    routing: &Routing,
    route: &Route,
    full_key: &str,
    resolution: Resolution,
    is_the_hold: impl Fn(&HeldRecord) -> bool,
) -> Result<Resolving, StoreError> {
    let Some(KeyState::Held(held)) = store.inspect(full_key).await? else {
        return Ok(Resolving::NotHeld);
    };
    if !is_the_hold(&held) {
        return Ok(Resolving::HeldAgain);
    }
    if routing.table.guards_bodies(&route.namespace) {
        let body = body_key(&route.namespace, &held.fingerprint);
        store.resolve(&body, resolution).await?;
    }
    Ok(if store.resolve(full_key, resolution).await? {
        Resolving::Resolved
    } else {
        Resolving::NotHeld
    })
}
