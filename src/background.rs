//! The proxy's background tasks while it runs: the sweeper that removes expired records,
//! and the count of held keys behind `dedupe_keys_held`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::store::ClaimStore;

/// How often the sweeper looks for expired records, and how many one sweep call reads
/// before yielding.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const SWEEP_BATCH: usize = 1000;

/// Removes expired records in the background, a batch at a time.
pub(crate) async fn sweep_forever(store: Arc<dyn ClaimStore>, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(SWEEP_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        loop {
            let started = Instant::now();
            match store.sweep(SWEEP_BATCH).await {
                Ok(swept) => {
                    if swept.removed > 0 {
                        metrics.swept(swept.removed);
                        tracing::debug!(removed = swept.removed, "swept expired keys");
                    }
                    if swept.examined < SWEEP_BATCH {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default();
                        metrics.sweep_succeeded(now.as_secs());
                        break;
                    }
                }
                Err(error) => {
                    metrics.store_error();
                    tracing::warn!(%error, "sweep failed");
                    break;
                }
            }
            // A large backlog (a million keys expiring together) is swept at half of one
            // core at most, so that deliveries keep their latency meanwhile.
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

/// How often `dedupe_keys_held` is counted again.
const COUNT_HELD_EVERY: Duration = Duration::from_secs(5);

/// Keeps `dedupe_keys_held` current: counts the store's held keys every
/// [`COUNT_HELD_EVERY`], for each route by its namespace.
pub(crate) async fn count_held_forever(proxy: Arc<Proxy>, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(COUNT_HELD_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match proxy.store().count_held().await {
            Ok(counts) => {
                let counts: std::collections::HashMap<String, u64> = counts.into_iter().collect();
                for route in proxy.routing().table.routes() {
                    let held = counts.get(&route.namespace).copied().unwrap_or(0);
                    metrics.keys_held(&route.name, held);
                }
            }
            Err(error) => {
                metrics.store_error();
                tracing::warn!(%error, "counting the held keys failed");
            }
        }
    }
}
