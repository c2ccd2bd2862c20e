//! The shared claim store on PostgreSQL: every replica's proxy claims in one table.
//!
//! One row per key. A claim is a single `INSERT ... ON CONFLICT DO UPDATE ... WHERE
//! <the existing row has expired>`: it inserts a new key, takes over an expired lease
//! or an expired done (or held) record, and leaves a live one alone, atomically. Finish,
//! release and hold are guarded by the owner token; resolve changes only a live held row.
//! `expires_at` is the lease's end while in flight and the retention's end once done or
//! held; an index on it lets the sweeper delete only what has expired, and a partial one
//! finds the held keys. Entities' records (`order:`) are rows of a table of their own,
//! `<table>_entities`, whose `sort_key` compares byte by byte (`COLLATE "C"`): one
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE <the new sort key is larger, or the row
//! has expired>` keeps the largest version. Times come from the database's clock, which all replicas share.
//!
//! The files: `statements.rs` holds the SQL, `connection.rs` the pools and how a statement
//! is sent, `lane.rs` a worker's batched claims and done marks (through `batch.rs`),
//! `schema.rs` what a start makes or brings up to date, and `listener.rs` the connection
//! that hears the outcomes of claims made with `announce`, notified on `<table>_outcomes`.

mod batch;
mod connection;
mod lane;
mod listener;
mod log;
mod queue;
mod record;
mod schema;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::types::ToSql;
use tokio_util::sync::CancellationToken;

use self::connection::{Sessions, Sql};
use self::lane::{ClaimRequest, FinishRequest, Found, Lane};
use self::listener::{Listener, hear};
use self::log::PostgresLog;
use self::queue::PostgresQueue;
use self::record::{live_state, signed, unsigned};
use self::statements::Statements;
use super::minutes::{KEPT_FOR, MinuteFigures, READ_MAX};
use super::queue::DeliveryQueue;
use super::replicas::{FORGOTTEN_AFTER, ReplicaReport};
use super::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, EntityRecord, Expiry, Fingerprint,
    Forgotten, Heard, KeyState, Millis, Page, RecordedResponse, Resolution, StateFilter,
    StoreError, Swept, Version, millis, owned, page, store_key, within,
};
use crate::store::settings::PostgresConfig;
use crate::workers::{PerWorker, Workers};

/// The PostgreSQL store.
pub struct PostgresStore {
    /// A lane for callers outside the workers (the sweeper, the admin API), then one per
    /// worker, each with its share of `pool_size`: a connection's task runs on the runtime
    /// that opened it, so a worker that only ever uses its own lane never wakes another
    /// thread for a reply.
    lanes: PerWorker<Lane>,
    timeout: Duration,
    statements: Arc<Statements>,
    /// None where `LISTEN` would be left in a pooler's session (`connection::sessions`).
    listener: Option<Listener>,
    /// Ends the listening when the store is dropped.
    stop_hearing: CancellationToken,
    queue: Arc<PostgresQueue>,
    log: Arc<PostgresLog>,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.stop_hearing.cancel();
    }
}

impl PostgresStore {
    /// Connects, and creates the claims table and its expiry index if they are missing.
    /// With `workers`, deliveries on each worker draw from a pool of their own.
    pub async fn connect(
        config: &PostgresConfig,
        workers: Option<&Workers>,
    ) -> Result<PostgresStore, StoreError> {
        let url = config.url.masked();
        let cannot =
            |error: StoreError| error.context(&format!("cannot prepare postgres at {url}"));
        // The first connection runs nothing before it is known what sessions may keep.
        let decided = async {
            let direct = connection::schema_pool(config)?.get().await?;
            let sessions = connection::sessions(config, &direct).await?;
            Ok::<_, StoreError>((direct, sessions))
        };
        let (mut direct, sessions) = decided.await.map_err(cannot)?;
        let store = PostgresStore::with_pools(config, workers, sessions).await?;
        let prepared = async {
            schema::prepare(&mut direct, &config.table.0, sessions.own_session).await?;
            let client = store.lanes.get().pool.get().await?;
            if config.direct_url.is_some() {
                connection::same_server(&client, &direct).await?;
            }
            connection::warn_if_commits_unsynced(config, &client).await?;
            Ok::<_, StoreError>(())
        };
        prepared.await.map_err(cannot)?;
        Ok(store)
    }

    /// The store's pools (opened when first needed), statements sent as `sessions` says.
    async fn with_pools(
        config: &PostgresConfig,
        workers: Option<&Workers>,
        sessions: Sessions,
    ) -> Result<PostgresStore, StoreError> {
        let sending = sessions.sending;
        let statements = Arc::new(Statements::for_table(&config.table.0, sending));
        let timeout = config.timeout.0;
        let mut each = Vec::new();
        let outside_size = match workers {
            None => config.pool_size,
            Some(workers) => {
                let share = config.pool_size.div_ceil(workers.count()).max(1);
                for index in 0..workers.count() {
                    let pool = connection::pool(config, share, sending)?;
                    let statements = Arc::clone(&statements);
                    let starting = async move { Lane::start(pool, &statements, timeout) };
                    each.push(
                        workers
                            .run_on(index, starting)
                            .await
                            .map_err(|error| StoreError::of("postgres", error))?,
                    );
                }
                1
            }
        };
        let outside = Lane::start(
            connection::pool(config, outside_size, sending)?,
            &statements,
            timeout,
        );
        Ok(PostgresStore {
            lanes: PerWorker::new(outside, each),
            timeout,
            statements,
            listener: sessions
                .own_session
                .then(|| Listener::new(config))
                .transpose()?,
            stop_hearing: CancellationToken::new(),
            queue: Arc::new(PostgresQueue::new(config, sending)?),
            log: Arc::new(PostgresLog::new(config, sending)?),
        })
    }

    /// Runs `statement` with `params` within the timeout, returning its rows.
    async fn query(
        &self,
        statement: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        self.bounded(async {
            let client = self.lanes.get().pool.get().await?;
            Ok(statement.query(&client, params).await?)
        })
        .await
    }

    /// Like [`PostgresStore::query`], returning how many rows it changed.
    async fn execute(
        &self,
        statement: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        self.bounded(async {
            let client = self.lanes.get().pool.get().await?;
            Ok(statement.execute(&client, params).await?)
        })
        .await
    }

    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        within("postgres", self.timeout, work).await
    }

    /// Releases, in a task of its own, the claim of `key` by `token` if there is one.
    fn give_back_unread(&self, key: &str, token: u128) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, statements) = (self.lanes.get().pool.clone(), Arc::clone(&self.statements));
        let (key, owner, timeout) = (key.to_owned(), token.to_string(), self.timeout);
        runtime.spawn(async move {
            let released = within("postgres", timeout, async {
                let client = pool.get().await?;
                let params: [&(dyn ToSql + Sync); 3] = [&key, &owner, &false];
                Ok::<_, StoreError>(statements.release.query(&client, &params).await?)
            });
            if let Err(error) = released.await {
                tracing::debug!(%error, "giving back a claim whose caller was gone failed; it ends with its lease");
            }
        });
    }

    /// The live state of a key, read with the database's clock.
    async fn current(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        let rows = self.query(&self.statements.current, &[&key]).await?;
        Ok(rows.first().and_then(live_state))
    }
}

#[async_trait]
impl ClaimStore for PostgresStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let lease = signed(millis(lease).max(1));
        // A live record that stopped the insert may be gone, or not yet visible, when the
        // statement reads it: try again.
        for _ in 0..8 {
            let token: u128 = rand::random();
            let request = ClaimRequest {
                key: key.to_owned(),
                owner: token.to_string(),
                lease_ms: lease,
                fingerprint,
            };
            // Dropped between the batch's answer and this caller reading it (its sender hung
            // up then), the claim is given back; the batch gives back those it could not
            // answer.
            let unread = scopeguard::guard((), |()| self.give_back_unread(key, token));
            let found = self.bounded(self.lanes.get().claims.call(request)).await;
            scopeguard::ScopeGuard::into_inner(unread);
            match found? {
                Found::Claimed { .. } => {
                    return Ok(ClaimOutcome::Claimed(Claim::new(key, token)));
                }
                Found::Live(KeyState::InFlight { lease_until, .. }) => {
                    return Ok(ClaimOutcome::InFlight { lease_until });
                }
                Found::Live(KeyState::Done(record)) => return Ok(ClaimOutcome::Done(record)),
                Found::Live(KeyState::Held(record)) => return Ok(ClaimOutcome::Held(record)),
                Found::Vanished => continue,
            }
        }
        Err(StoreError::of(
            "postgres",
            "the claim kept changing under concurrent deliveries",
        ))
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let recorded = completion.response;
        let request = FinishRequest {
            key: claim.key.clone(),
            owner: claim.token.to_string(),
            retention_ms: signed(millis(completion.retention).max(1)),
            upstream_status: i32::from(completion.upstream_status),
            response_status: recorded.as_ref().map(|r| i32::from(r.status)),
            content_type: recorded
                .as_ref()
                .and_then(|r| r.content_type().map(str::to_owned)),
            headers: recorded.as_ref().map(RecordedResponse::encoded_headers),
            body: recorded.map(|r| r.body),
            announce: claim.announce,
        };
        let finished = self
            .bounded(self.lanes.get().finishes.call(request))
            .await?;
        owned(finished)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let owner = claim.token.to_string();
        let deleted = self
            .query(
                &self.statements.release,
                &[&claim.key, &owner, &claim.announce],
            )
            .await?;
        owned(deleted.len() == 1)
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), StoreError> {
        let owner = claim.token.to_string();
        let lease = signed(millis(lease).max(1));
        let renewed = self
            .query(&self.statements.renew, &[&claim.key, &owner, &lease])
            .await?;
        owned(renewed.len() == 1)
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        self.current(key).await
    }

    async fn hold(
        &self,
        claim: &Claim,
        reason: Ambiguity,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let owner = claim.token.to_string();
        let retention = signed(millis(retention).max(1));
        let params: [&(dyn ToSql + Sync); 5] = [
            &claim.key,
            &owner,
            &retention,
            &reason.as_str(),
            &claim.announce,
        ];
        let held = self.query(&self.statements.hold, &params).await?;
        owned(held.len() == 1)
    }

    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<bool, StoreError> {
        let changed = match resolution {
            Resolution::Done { retention } => {
                let retention = signed(millis(retention).max(1));
                self.execute(&self.statements.resolve_done, &[&key, &retention])
                    .await?
            }
            Resolution::Release => {
                self.execute(&self.statements.resolve_release, &[&key])
                    .await?
            }
        };
        Ok(changed == 1)
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let prefix = store_key(namespace, prefix);
        let state = state.map(|state| match state {
            StateFilter::InFlight => "in_flight",
            StateFilter::Done => "done",
            StateFilter::Held => "held",
        });
        // One more than asked for, to know whether a next page exists.
        let wanted = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let after = after.unwrap_or("");
        let in_state = match state {
            Some("held") => Some(&self.statements.list_held),
            Some("in_flight") => Some(&self.statements.list_in_flight),
            _ => None,
        };
        let rows = if let Some(statement) = in_state {
            let params: [&(dyn ToSql + Sync); 3] = [&prefix, &after, &wanted];
            self.query(statement, &params).await?
        } else {
            let params: [&(dyn ToSql + Sync); 4] = [&prefix, &after, &state, &wanted];
            self.query(&self.statements.list, &params).await?
        };
        let found = rows
            .iter()
            .filter_map(|row| Some((row.get::<_, String>("key"), live_state(row)?)))
            .collect();
        Ok(page(found, limit))
    }

    async fn count_held(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let rows = self.query(&self.statements.count_held, &[]).await?;
        Ok(rows
            .iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1)))
            // Body keys' namespaces hold `#`.
            .filter(|(namespace, _)| !namespace.contains('#'))
            .map(|(namespace, held)| (namespace, u64::try_from(held).unwrap_or(0)))
            .collect())
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        if self.execute(&self.statements.forget_done, &[&key]).await? == 1 {
            return Ok(Forgotten::Removed);
        }
        let rows = self.query(&self.statements.state_of, &[&key]).await?;
        Ok(
            match rows.first().map(|row| row.get::<_, String>(0)).as_deref() {
                Some("in_flight") => Forgotten::InFlight,
                Some("held") => Forgotten::Held,
                _ => Forgotten::Absent,
            },
        )
    }

    async fn set_expiry(&self, key: &str, expires_at: Millis) -> Result<Expiry, StoreError> {
        let expires_at = signed(expires_at);
        if self
            .execute(&self.statements.set_expiry, &[&key, &expires_at])
            .await?
            == 1
        {
            return Ok(Expiry::Set);
        }
        let rows = self.query(&self.statements.state_of, &[&key]).await?;
        Ok(
            match rows.first().map(|row| row.get::<_, String>(0)).as_deref() {
                Some("in_flight") => Expiry::InFlight,
                Some("held") => Expiry::Held,
                _ => Expiry::Absent,
            },
        )
    }

    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        let wanted = i64::try_from(limit).unwrap_or(i64::MAX);
        let claims = self.execute(&self.statements.sweep, &[&wanted]).await?;
        let claims = usize::try_from(claims).unwrap_or(usize::MAX);
        // The entities get what the claims left of the limit.
        let left = i64::try_from(limit.saturating_sub(claims)).unwrap_or(i64::MAX);
        let entities = if left > 0 {
            let removed = self
                .execute(&self.statements.sweep_entities, &[&left])
                .await?;
            usize::try_from(removed).unwrap_or(usize::MAX)
        } else {
            0
        };
        Ok(Swept {
            examined: claims + entities,
            removed: claims + entities,
        })
    }

    async fn newest_version(&self, entity: &str) -> Result<Option<EntityRecord>, StoreError> {
        let rows = self
            .query(&self.statements.newest_version, &[&entity])
            .await?;
        Ok(rows.first().map(|row| EntityRecord {
            newest: Version {
                sort_key: row.get("sort_key"),
                text: row.get("version"),
            },
            recorded_at: unsigned(row.get("recorded_at")),
            expires_at: unsigned(row.get("expires_at")),
        }))
    }

    async fn record_version(
        &self,
        entity: &str,
        version: &Version,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let retention = signed(millis(retention).max(1));
        let params: [&(dyn ToSql + Sync); 4] =
            [&entity, &version.sort_key, &version.text, &retention];
        let changed = self
            .execute(&self.statements.record_version, &params)
            .await?;
        Ok(changed == 1)
    }

    async fn forget_entity(&self, entity: &str) -> Result<bool, StoreError> {
        let rows = self
            .query(&self.statements.forget_entity, &[&entity])
            .await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, bool>("live")))
    }

    fn announces_outcomes(&self) -> Option<bool> {
        Some(self.listener.is_some())
    }

    async fn report_replica(&self, report: &ReplicaReport) -> Result<(), StoreError> {
        let (id, seen_at) = (&report.id, signed(report.seen_at));
        let (text, forgotten) = (
            report.encode(),
            signed(report.seen_at.saturating_sub(millis(FORGOTTEN_AFTER))),
        );
        self.query(&self.statements.report_replica, &[id, &seen_at, &text])
            .await?;
        self.query(&self.statements.forget_replicas, &[&forgotten])
            .await?;
        Ok(())
    }

    async fn replicas(&self) -> Result<Option<Vec<ReplicaReport>>, StoreError> {
        let rows = self.query(&self.statements.replicas, &[]).await?;
        let reports = rows.iter().filter_map(|row| {
            let text: &str = row.get("report");
            ReplicaReport::decode(text.as_bytes()).ok()
        });
        Ok(Some(reports.collect()))
    }

    async fn record_minute(&self, figures: &MinuteFigures) -> Result<(), StoreError> {
        let (replica, minute, text) = (&figures.replica, signed(figures.minute), figures.encode());
        self.query(&self.statements.record_minute, &[replica, &minute, &text])
            .await?;
        let kept_for = signed(millis(KEPT_FOR));
        self.query(&self.statements.forget_minutes, &[&kept_for])
            .await?;
        Ok(())
    }

    async fn minutes(&self, since: Millis) -> Result<Vec<MinuteFigures>, StoreError> {
        let (since, most) = (signed(since), i64::try_from(READ_MAX).unwrap_or(i64::MAX));
        let rows = self
            .query(&self.statements.minutes, &[&since, &most])
            .await?;
        let read = rows.iter().filter_map(|row| {
            let text: &str = row.get("figures");
            MinuteFigures::decode(text.as_bytes()).ok()
        });
        Ok(read.collect())
    }

    fn hear_outcomes(&self, heard: Heard) {
        // Without a session of its own, waiters look at the store from time to time.
        let Some(listener) = self.listener.clone() else {
            return;
        };
        let stop = self.stop_hearing.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = hear(listener, heard) => {}
            }
        });
    }

    /// Durability is the database's (each statement commits).
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn delivery_log(&self) -> Option<Arc<dyn crate::store::log::DeliveryLog>> {
        Some(Arc::clone(&self.log) as Arc<dyn crate::store::log::DeliveryLog>)
    }

    fn queue(&self) -> Option<Arc<dyn DeliveryQueue>> {
        Some(Arc::clone(&self.queue) as Arc<dyn DeliveryQueue>)
    }

    fn done_keys(&self) -> Option<u64> {
        None
    }
}
