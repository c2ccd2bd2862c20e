//! The stale-event guard (`order:`) on a claimed delivery: its entity's newest done
//! version read, and the verdict: forwarded as it is, in order (its version recorded on
//! success), stale (marked or skipped), or the store could not say.

use crate::metrics::{Metrics, OrderCheck};
use crate::order::{Guard, OnStale, Ordered};
use crate::route::Route;
use crate::store::{ClaimStore, StoreError, Version};

/// What the order guard found for a claimed delivery.
pub(super) enum Verdict {
    /// No `order:`, no usable version: forwarded as it is.
    Unguarded,
    /// Not older than the entity's newest done version: forwarded, and its version
    /// recorded on success.
    InOrder(Ordered),
    /// Older than `Version`, the entity's newest done.
    Stale(Version),
    /// The store could not say: `on_store_error` decides.
    StoreFailed(Ordered),
}

/// Compares a claimed event's version with the newest done for its entity, and counts
/// what it found.
pub(super) async fn verdict(
    store: &dyn ClaimStore,
    metrics: &Metrics,
    route: &Route,
    guard: Guard,
) -> Verdict {
    let (order, ordered) = match (&route.order, guard) {
        (Some(order), Guard::Versioned(ordered)) => (order, ordered),
        (_, Guard::Unversioned(reason)) => {
            tracing::debug!(%reason, "forwarded without the order check");
            metrics.order_checked(&route.name, OrderCheck::Unversioned);
            return Verdict::Unguarded;
        }
        _ => return Verdict::Unguarded,
    };
    let newest = match store.newest_version(&ordered.store_key).await {
        Ok(newest) => newest.map(|record| record.newest),
        Err(error) => {
            if matches!(error, StoreError::Backend(_)) {
                metrics.store_error();
            }
            tracing::warn!(%error, entity = %ordered.entity, "claim store failed while reading the entity's newest version");
            metrics.order_checked(&route.name, OrderCheck::StoreError);
            return Verdict::StoreFailed(ordered);
        }
    };
    match newest.filter(|newest| newest.sort_key > ordered.version.sort_key) {
        Some(newest) => {
            let (check, action) = match order.on_stale {
                OnStale::Mark => (OrderCheck::StaleMarked, "marked"),
                OnStale::Skip => (OrderCheck::StaleSkipped, "skipped"),
            };
            tracing::info!(entity = %ordered.entity, version = %ordered.version.text, newest = %newest.text, action, "stale event");
            metrics.order_checked(&route.name, check);
            Verdict::Stale(newest)
        }
        None => {
            metrics.order_checked(&route.name, OrderCheck::InOrder);
            Verdict::InOrder(ordered)
        }
    }
}
