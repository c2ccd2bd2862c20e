//! What the stores' tests write and open.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dedupe_proxy::config::{Durability, SledConfig};
use dedupe_proxy::store::sled::SledStore;
use dedupe_proxy::store::{Completion, ManualClock};

/// A done mark for an app that answered `status`, kept for `retention`, without an
/// answer to replay.
pub fn done(status: u16, retention: Duration) -> Completion {
    Completion {
        upstream_status: status,
        retention,
        response: None,
    }
}

/// The sled store at `path` (batched durability) on a clock the test moves. A store just
/// dropped lets go of its directory a moment later (sled's threads): opening waits.
pub fn open_sled(path: &Path, clock: &Arc<ManualClock>) -> SledStore {
    let config = SledConfig {
        path: path.to_owned(),
        durability: Durability::Batched,
        ..SledConfig::default()
    };
    loop {
        match SledStore::open_with_clock(&config, clock.clone()) {
            Ok(store) => return store,
            Err(error) if error.to_string().contains("in use") => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(error) => panic!("{error}"),
        }
    }
}

/// What `open` gives once the data directory's earlier user has let go of it: sled's
/// threads release its lock a moment after the store is dropped (a restarted process
/// never sees this, its predecessor being gone).
pub async fn once_unlocked<T, E: std::fmt::Display>(open: impl Fn() -> Result<T, E>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match open() {
            Ok(opened) => return opened,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
}
