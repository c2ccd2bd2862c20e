//! The embedded store's database: opened with its trees (done records by expiry, held
//! keys, entity records, the delivery queue's trees), reopened in the background after a
//! failure (sled keeps its first I/O error), and synced to stable storage in groups
//! (`durable.rs`).

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use sled::Tree;

use super::durable::{SyncCounters, SyncGroup, forget_cached, missing_directories};
use super::epochs::{Epochs, RecordKey};
use crate::store::minutes::{MinuteFigures, READ_MAX};
use crate::store::settings::{Durability, SledConfig};
use crate::store::{
    DoneRecord, EntityRecord, HeldRecord, Millis, StoreError, Swept, Version, millis,
};

/// The delivery queue's trees (see `queue/mod.rs`).
pub(super) struct QueueTrees {
    /// The jobs' records, each under its seq: a number from `ids`, big-endian.
    pub(super) jobs: Tree,
    pub(super) paused: Tree,
    /// Numbers the jobs, and the lanes' jobs, in the order they were stored (sled's ids
    /// only grow, also across restarts).
    pub(super) ids: sled::Db,
}

/// The trees where an earlier version indexed the queue, now indexed in memory.
const FORMER_QUEUE_TREES: [&str; 4] = ["jobs_due", "jobs_received", "jobs_dead", "jobs_lanes"];

/// The tree where an earlier version kept the jobs' records, under their store keys.
const FORMER_JOBS_TREE: &str = "jobs";

impl QueueTrees {
    /// The queue's trees, with the records of an earlier version's tree `jobs` copied
    /// over (see [`QueueTrees::copy_former_jobs`]).
    pub(super) fn open(db: &sled::Db) -> Result<QueueTrees, StoreError> {
        for name in FORMER_QUEUE_TREES {
            db.drop_tree(name)?;
        }
        let trees = QueueTrees {
            jobs: db.open_tree("jobs_by_seq")?,
            paused: db.open_tree("jobs_paused")?,
            ids: db.clone(),
        };
        trees.copy_former_jobs()?;
        Ok(trees)
    }

    fn former_jobs(&self) -> Result<Option<Tree>, StoreError> {
        let names = self.ids.tree_names();
        if !names
            .iter()
            .any(|name| &**name == FORMER_JOBS_TREE.as_bytes())
        {
            return Ok(None);
        }
        Ok(Some(self.ids.open_tree(FORMER_JOBS_TREE)?))
    }

    /// Copies each record of an earlier version's tree `jobs` byte for byte to the next
    /// seq, in the order of their keys, unless a record of the same bytes is there (a
    /// copy cut short by a failed open). Runs as the database opens, before the sync that
    /// makes what opening wrote stable; [`QueueTrees::drop_former_jobs`] drops the tree
    /// after it. Byte for byte, so that a record this version does not read is kept too.
    fn copy_former_jobs(&self) -> Result<(), StoreError> {
        let Some(former) = self.former_jobs()? else {
            return Ok(());
        };
        let digest = |bytes: &[u8]| <[u8; 32]>::from(Sha256::digest(bytes));
        let mut copied = HashSet::new();
        for stored in self.jobs.iter().values() {
            copied.insert(digest(&stored?));
        }
        for stored in former.iter().values() {
            let stored = stored?;
            if copied.insert(digest(&stored)) {
                self.jobs
                    .insert(self.ids.generate_id()?.to_be_bytes(), stored)?;
            }
        }
        Ok(())
    }

    /// Drops an earlier version's tree `jobs`, once its records' copies are stable.
    fn drop_former_jobs(&self) -> Result<(), StoreError> {
        if self.former_jobs()?.is_some() {
            self.ids.drop_tree(FORMER_JOBS_TREE)?;
        }
        Ok(())
    }
}

impl From<sled::Error> for StoreError {
    fn from(error: sled::Error) -> StoreError {
        StoreError::of("sled", error)
    }
}

/// An open database: its done records, its held keys, its entity records, the delivery
/// queue's trees, and the syncs that make them stable.
pub(super) struct OpenDatabase {
    pub(super) db: sled::Db,
    pub(super) epochs: Epochs,
    pub(super) held: sled::Tree,
    pub(super) entities: sled::Tree,
    pub(super) entity_expiry: sled::Tree,
    pub(super) queue: QueueTrees,
    /// The figures of each minute (`store::minutes`), under the minute (big-endian) and
    /// the replica's id.
    pub(super) minutes: sled::Tree,
    /// Makes queued jobs and operators' changes stable always, and settlements (done
    /// marks, holds, entities' versions) with `durability: fsync`.
    pub(super) syncs: SyncGroup,
    pub(super) sync_settlements: bool,
}

impl OpenDatabase {
    /// Opens (or creates) the database at `config.path`, and syncs what opening it wrote.
    /// Blocks on disk I/O.
    pub(super) fn open(
        config: &SledConfig,
        counters: Arc<SyncCounters>,
    ) -> Result<OpenDatabase, StoreError> {
        let path = config.path.display();
        // Before sled makes them.
        let created = missing_directories(&config.path);
        let db = sled::Config::new()
            .path(&config.path)
            .cache_capacity(config.cache.0)
            .flush_every_ms(Some(millis(config.flush_every.0).max(1)))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|error| match error.to_string() {
                text if text.contains("could not acquire lock") => StoreError::Backend(format!(
                    "data directory {path} is in use by another process (is another dedupe-proxy running on it?): {text}"
                )),
                text => StoreError::Backend(format!("cannot open data directory {path}: {text}")),
            })?;
        let (epochs, indexing) = Epochs::open(&db).map_err(|error| match error {
            StoreError::Backend(text) => {
                StoreError::Backend(format!("data directory {path}: {text}"))
            }
            other => other,
        })?;
        indexing.start().map_err(|error| {
            StoreError::Backend(format!("cannot start indexing the done records: {error}"))
        })?;
        let held = db.open_tree("held")?;
        let entities = db.open_tree("entities")?;
        let entity_expiry = db.open_tree("entity_expiry")?;
        let queue = QueueTrees::open(&db)?;
        let minutes = db.open_tree("minutes")?;
        let syncs = SyncGroup::start(db.clone(), &config.path, &created, counters)
            .map_err(|error| error.context(&format!("data directory {path}")))?;
        queue.drop_former_jobs()?;
        Ok(OpenDatabase {
            db,
            epochs,
            held,
            entities,
            entity_expiry,
            queue,
            minutes,
            syncs,
            sync_settlements: config.durability == Durability::Fsync,
        })
    }

    /// The live record of `entity`; an unreadable one reads as none.
    pub(super) fn live_entity(
        &self,
        entity: &str,
        now: Millis,
    ) -> Result<Option<EntityRecord>, StoreError> {
        Ok(self
            .entities
            .get(entity.as_bytes())?
            .and_then(|bytes| postcard::from_bytes::<EntityRecord>(&bytes).ok())
            .filter(|record| record.expires_at > now))
    }

    /// Records `version` unless a live record is as new, swapping the record only if it is
    /// still the one read, so that of racing calls the largest version stays.
    pub(super) fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let record = EntityRecord {
            newest: version.clone(),
            recorded_at: now,
            expires_at: now.saturating_add(retention),
        };
        let encoded =
            postcard::to_stdvec(&record).map_err(|error| StoreError::of("sled", error))?;
        loop {
            let current = self.entities.get(entity.as_bytes())?;
            let as_new = current
                .as_ref()
                .and_then(|bytes| postcard::from_bytes::<EntityRecord>(bytes).ok())
                .is_some_and(|live| {
                    live.expires_at > now && live.newest.sort_key >= version.sort_key
                });
            if as_new {
                return Ok(false);
            }
            // The index entry first: a record the sweep cannot find would never go.
            self.entity_expiry
                .insert(entity_expiry_key(record.expires_at, entity), &[])?;
            if self
                .entities
                .compare_and_swap(entity.as_bytes(), current, Some(encoded.as_slice()))?
                .is_ok()
            {
                return Ok(true);
            }
        }
    }

    /// Removes entity records that expired by `now`, reading up to `limit` index entries.
    pub(super) fn sweep_entities(&self, now: Millis, limit: usize) -> Result<Swept, StoreError> {
        let mut swept = Swept::default();
        let end = now.saturating_add(1).to_be_bytes();
        for entry in self.entity_expiry.range(..end.as_slice()).take(limit) {
            let (index_key, _) = entry?;
            swept.examined += 1;
            let entity = &index_key[index_key.len().min(8)..];
            if let Some(bytes) = self.entities.get(entity)? {
                let expired = postcard::from_bytes::<EntityRecord>(&bytes)
                    .map_or(true, |record| record.expires_at <= now);
                // Unless a newer version replaced it meanwhile.
                if expired
                    && self
                        .entities
                        .compare_and_swap(entity, Some(bytes), None::<&[u8]>)?
                        .is_ok()
                {
                    swept.removed += 1;
                }
            }
            self.entity_expiry.remove(index_key)?;
        }
        Ok(swept)
    }

    /// Records a replica's minute, and drops the minutes before `kept_from`.
    pub(super) fn record_minute(
        &self,
        figures: &MinuteFigures,
        kept_from: Millis,
    ) -> Result<(), StoreError> {
        let mut key = figures.minute.to_be_bytes().to_vec();
        key.extend_from_slice(figures.replica.as_bytes());
        self.minutes.insert(key, figures.encode().as_bytes())?;
        let old: Vec<sled::IVec> =
            (self.minutes.range(..kept_from.to_be_bytes()).keys()).collect::<Result<_, _>>()?;
        for key in old {
            self.minutes.remove(key)?;
        }
        Ok(())
    }

    /// The minutes from `since` on that read, the newest [`READ_MAX`].
    pub(super) fn minutes(&self, since: Millis) -> Result<Vec<MinuteFigures>, StoreError> {
        let mut read = Vec::new();
        let newest_first = self.minutes.range(since.to_be_bytes()..).values().rev();
        for stored in newest_first.take(READ_MAX) {
            read.extend(MinuteFigures::decode(&stored?).ok());
        }
        Ok(read)
    }

    /// The held keys on disk that have not expired; the expired ones are removed.
    pub(super) fn held_keys(&self, now: Millis) -> Result<Vec<(String, HeldRecord)>, StoreError> {
        let mut live = Vec::new();
        for entry in &self.held {
            let (key, value) = entry?;
            let (Ok(text), Ok(record)) = (
                String::from_utf8(key.to_vec()),
                postcard::from_bytes::<HeldRecord>(&value),
            ) else {
                tracing::error!("an unreadable held key in the store is ignored");
                continue;
            };
            if record.expires_at > now {
                live.push((text, record));
            } else {
                self.held.remove(key)?;
            }
        }
        Ok(live)
    }

    /// Makes a settlement (a done mark, a hold, an entity's version) and what was written
    /// before it stable, with `durability: fsync`.
    pub(super) async fn sync_settlement(&self) -> Result<(), StoreError> {
        if self.sync_settlements {
            self.syncs.sync().await
        } else {
            Ok(())
        }
    }

    /// The done record stored under `key`, if it has one that has not expired.
    pub(super) fn live_done(
        &self,
        key: &RecordKey,
        now: Millis,
    ) -> Result<Option<DoneRecord>, StoreError> {
        Ok(self.epochs.get(key, now)?)
    }

    /// Files `done`, the done record of the store key `key`, with the others, in the
    /// window of its expiry.
    pub(super) fn file_done(&self, key: &str, done: &DoneRecord) -> Result<(), StoreError> {
        let retention = done.expires_at.saturating_sub(done.completed_at).max(1);
        let record_key = self.epochs.record_key(key);
        Ok(self.epochs.put(&record_key, done, retention, key)?)
    }
}

/// Where an entity record is filed by its expiry: the time, big-endian, so that the index
/// sorts by it, then the entity's store key.
fn entity_expiry_key(expires_at: Millis, entity: &str) -> Vec<u8> {
    let mut key = expires_at.to_be_bytes().to_vec();
    key.extend_from_slice(entity.as_bytes());
    key
}

/// The open database, or none while it is being reopened after a failure.
pub(super) type Slot = RwLock<Option<Arc<OpenDatabase>>>;

/// The database as the store and its queue reach it: open, or being reopened.
#[derive(Clone)]
pub(super) struct Database {
    pub(super) slot: Arc<Slot>,
    pub(super) config: SledConfig,
    /// What the syncs have done, across reopenings.
    pub(super) syncs: Arc<SyncCounters>,
}

impl Database {
    /// The open database, or an error while it is being reopened.
    pub(super) fn open(&self) -> Result<Arc<OpenDatabase>, StoreError> {
        let slot = self.slot.read();
        slot.clone()
            .ok_or_else(|| StoreError::Backend("the store is reopening after a failure".into()))
    }

    /// Passes `result` through; a backend failure drops `failed` and starts reopening.
    pub(super) fn reopen_if_failed<T>(
        &self,
        failed: &Arc<OpenDatabase>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Err(StoreError::Backend(error)) = &result {
            let mut slot = self.slot.write();
            if slot
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, failed))
            {
                tracing::error!(%error, "the store failed; reopening it in the background");
                *slot = None;
                reopen_in_background(
                    Arc::downgrade(&self.slot),
                    self.config.clone(),
                    Arc::clone(&self.syncs),
                );
            }
        }
        result
    }
}

/// Reopens the data directory until it succeeds, backing off up to 5 s between tries,
/// then puts the new database in `slot`. Gives up when the store is dropped.
pub(super) fn reopen_in_background(
    slot: Weak<Slot>,
    config: SledConfig,
    counters: Arc<SyncCounters>,
) {
    let spawned = std::thread::Builder::new()
        .name("sled-reopen".into())
        .spawn(move || {
            let mut backoff = Duration::from_millis(50);
            loop {
                std::thread::sleep(backoff);
                let Some(slot) = slot.upgrade() else {
                    return;
                };
                // What the failure left in the page cache is not read as if on disk.
                forget_cached(&config.path);
                match OpenDatabase::open(&config, Arc::clone(&counters)) {
                    Ok(database) => {
                        *slot.write() = Some(Arc::new(database));
                        tracing::info!("the store is open again");
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "reopening the store failed; trying again");
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the thread that reopens the store");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_versions_records_are_copied_once_however_often_the_copy_runs() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let former = db.open_tree(FORMER_JOBS_TREE).unwrap();
        for key in ["r:b", "r:a"] {
            former
                .insert(key, format!("the record of {key}").as_bytes())
                .unwrap();
        }
        // An open that stopped after the copy, before the drop, and the next one.
        QueueTrees::open(&db).unwrap();
        let trees = QueueTrees::open(&db).unwrap();
        let copied: Vec<sled::IVec> = trees.jobs.iter().values().map(Result::unwrap).collect();
        assert_eq!(
            copied,
            [&b"the record of r:a"[..], &b"the record of r:b"[..]]
        );
        trees.drop_former_jobs().unwrap();
        assert!(trees.former_jobs().unwrap().is_none());
    }
}
