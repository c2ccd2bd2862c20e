//! The delivery queue on PostgreSQL: one row per job in `<table>_jobs`, shared by every
//! replica. A take is one `UPDATE ... WHERE key IN (SELECT ... FOR UPDATE SKIP LOCKED)`:
//! replicas taking at once each get other rows, and none waits for another's. A taken row
//! is due again when its visibility ends (its `due_at` moved to then) unless settled
//! first, so a job whose replica died is taken by another. Retry and bury are guarded by
//! the take's token. Partial indexes keep the due jobs by route and time, and the dead
//! letters by route and time of death; `<table>_paused` lists the paused routes.
//!
//! A job of a lane (`queue.order_by`) has its `lane` and a `lane_seq` from
//! `<table>_jobs_lane_seq`; only a lane's first job that is not dead is due, the others
//! wait at [`BEHIND`]. Each change of a lane runs in a transaction that holds
//! `pg_advisory_xact_lock(hashtext(route), hashtext(lane))` (two lanes of one hash share
//! a lock, harmlessly) and ends by making the lane's first job due.
//!
//! The queue's times are the replicas' clocks (it compares times it wrote itself), not the
//! database's. It has a pool of its own ([`QUEUE_POOL`] connections), so that deliveries
//! never wait behind claims.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio_postgres::IsolationLevel;
use tokio_postgres::types::{ToSql, Type};

use super::connection::{self, Sending, Sql};
use super::statements::beside;
use crate::store::queue::{
    BEHIND, DeadPage, DeliveryQueue, Enqueued, Job, QueueCounts, Taken, dead_cursor,
    parse_dead_cursor, revived,
};
use crate::store::settings::{PostgresConfig, QUEUE_POOL};
use crate::store::{Clock, Millis, StoreError, SystemClock, millis, within};

/// The jobs' table, its indexes, the lanes' sequence and the paused routes' table, beside
/// the claims table.
pub(super) fn create_tables(table: &str) -> String {
    let jobs = beside(table, "_jobs");
    let due = beside(table, "_jobs_due");
    let dead = beside(table, "_jobs_dl");
    let paused = beside(table, "_paused");
    let lanes = beside(table, "_jobs_lanes");
    let lane_seq = beside(table, "_jobs_lane_seq");
    format!(
        "CREATE TABLE IF NOT EXISTS {jobs} (
           key text COLLATE \"C\" PRIMARY KEY,
           route text NOT NULL,
           due_at bigint NOT NULL,
           received_at bigint NOT NULL,
           token bigint NOT NULL DEFAULT 0,
           takes integer NOT NULL DEFAULT 0,
           waiting boolean NOT NULL,
           dead_at bigint,
           job bytea NOT NULL,
           lane text,
           lane_seq bigint
         );
         ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS takes integer NOT NULL DEFAULT 0,
           ADD COLUMN IF NOT EXISTS lane text, ADD COLUMN IF NOT EXISTS lane_seq bigint;
         CREATE SEQUENCE IF NOT EXISTS {lane_seq};
         CREATE INDEX IF NOT EXISTS {lanes} ON {jobs} (route, lane, lane_seq)
           WHERE lane IS NOT NULL AND dead_at IS NULL;
         CREATE INDEX IF NOT EXISTS {due} ON {jobs} (route, due_at) WHERE dead_at IS NULL;
         CREATE INDEX IF NOT EXISTS {dead} ON {jobs} (route, dead_at, key)
           WHERE dead_at IS NOT NULL;
         CREATE TABLE IF NOT EXISTS {paused} (route text PRIMARY KEY);"
    )
}

/// The queue's statements, with the tables' names filled in once: the workers', then
/// (`Operations`) the operator's.
struct Statements {
    enqueue: Sql,
    take: Sql,
    complete: Sql,
    retry: Sql,
    release: Sql,
    bury: Sql,
    lanes: LaneStatements,
    operations: Operations,
}

/// The statements of jobs with a lane, each run in a transaction that holds the lane's
/// lock (`lock`), so that whether a job is its lane's first is decided by one
/// transaction at a time.
struct LaneStatements {
    lock: Sql,
    /// As `enqueue`, due at `$7` (never) if the lane holds a job that is not dead.
    enqueue: Sql,
    /// Makes the lane's first job due at `$3` if it is behind (`$4`).
    promote: Sql,
    /// As `revive`, due at `$7` (never) if the lane holds a job that is not dead.
    revive: Sql,
}

/// The statements of the admin API and the counts.
struct Operations {
    job: Sql,
    dead: Sql,
    revive: Sql,
    discard: Sql,
    counts: Sql,
    pause: Sql,
    resume: Sql,
    paused: Sql,
}

impl Statements {
    fn for_table(table: &str, sending: Sending) -> Statements {
        let jobs = beside(table, "_jobs");
        let sql = statement(sending);
        use Type as T;
        Statements {
            enqueue: sql(
                &[T::TEXT, T::TEXT, T::INT8, T::INT8, T::BYTEA],
                format!(
                    "INSERT INTO {jobs} (key, route, due_at, received_at, waiting, job)
                     VALUES ($1, $2, $3, $4, true, $5) ON CONFLICT (key) DO NOTHING RETURNING key"
                ),
            ),
            take: sql(
                &[T::TEXT, T::INT8, T::INT8, T::INT8, T::INT8],
                format!(
                    "UPDATE {jobs} j SET due_at = $4, token = $5, takes = j.takes + 1
                     WHERE j.key IN (SELECT key FROM {jobs}
                                     WHERE route = $1 AND dead_at IS NULL AND due_at <= $2
                                     ORDER BY due_at LIMIT $3 FOR UPDATE SKIP LOCKED)
                     RETURNING j.job, j.takes"
                ),
            ),
            complete: sql(
                &[T::TEXT, T::INT8],
                format!("DELETE FROM {jobs} WHERE key = $1 AND token = $2 AND dead_at IS NULL"),
            ),
            retry: sql(
                &[T::TEXT, T::INT8, T::INT8, T::BYTEA],
                format!(
                    "UPDATE {jobs} SET due_at = $3, token = 0, waiting = false, job = $4
                     WHERE key = $1 AND token = $2 AND dead_at IS NULL"
                ),
            ),
            release: sql(
                &[T::TEXT, T::INT8, T::INT8],
                format!(
                    "UPDATE {jobs} SET due_at = $3, token = 0, takes = GREATEST(takes - 1, 0)
                     WHERE key = $1 AND token = $2 AND dead_at IS NULL"
                ),
            ),
            bury: sql(
                &[T::TEXT, T::INT8, T::INT8, T::BYTEA],
                format!(
                    "UPDATE {jobs} SET dead_at = $3, token = 0, waiting = false, job = $4
                     WHERE key = $1 AND token = $2 AND dead_at IS NULL"
                ),
            ),
            lanes: LaneStatements::for_table(table, sending),
            operations: Operations::for_table(table, sending),
        }
    }
}

impl LaneStatements {
    fn for_table(table: &str, sending: Sending) -> LaneStatements {
        let jobs = beside(table, "_jobs");
        let lane_seq = beside(table, "_jobs_lane_seq");
        let sql = statement(sending);
        // Whether the lane holds a job that is not dead: the route is `$2` and the lane `$6`
        // in every statement that asks.
        let busy = format!(
            "EXISTS (SELECT 1 FROM {jobs} WHERE route = $2 AND lane = $6 AND dead_at IS NULL)"
        );
        use Type as T;
        LaneStatements {
            // The waits bounded first (the select list runs in order): a replica stalled
            // while it holds a lane's lock loses its session, not the lane.
            lock: sql(
                &[T::TEXT, T::TEXT, T::TEXT],
                "SELECT set_config('lock_timeout', $3, true),
                   set_config('idle_in_transaction_session_timeout', $3, true),
                   pg_advisory_xact_lock(hashtext($1), hashtext($2))"
                    .to_owned(),
            ),
            enqueue: sql(
                &[T::TEXT, T::TEXT, T::INT8, T::INT8, T::BYTEA, T::TEXT, T::INT8],
                format!(
                    "INSERT INTO {jobs} (key, route, due_at, received_at, waiting, job, lane,
                       lane_seq)
                     SELECT $1::text, $2::text, CASE WHEN {busy} THEN $7::bigint ELSE $3::bigint END,
                       $4::bigint, true, $5::bytea, $6::text, nextval('{lane_seq}')
                     ON CONFLICT (key) DO NOTHING"
                ),
            ),
            promote: sql(
                &[T::TEXT, T::TEXT, T::INT8, T::INT8],
                format!(
                    "UPDATE {jobs} SET due_at = $3
                     WHERE key = (SELECT key FROM {jobs}
                                  WHERE route = $1 AND lane = $2 AND dead_at IS NULL
                                  ORDER BY lane_seq LIMIT 1)
                       AND due_at = $4 AND token = 0"
                ),
            ),
            revive: sql(
                &[T::TEXT, T::TEXT, T::INT8, T::BYTEA, T::INT8, T::TEXT, T::INT8],
                format!(
                    "UPDATE {jobs} SET dead_at = NULL, due_at = CASE WHEN {busy} THEN $7::bigint ELSE $3::bigint END,
                       token = 0, waiting = true, job = $4, lane_seq = nextval('{lane_seq}')
                     WHERE key = $1 AND dead_at = $5 AND route = $2"
                ),
            ),
        }
    }
}

impl Operations {
    fn for_table(table: &str, sending: Sending) -> Operations {
        let jobs = beside(table, "_jobs");
        let paused = beside(table, "_paused");
        let sql = statement(sending);
        use Type as T;
        Operations {
            job: sql(
                &[T::TEXT, T::TEXT],
                format!("SELECT job FROM {jobs} WHERE key = $1 AND route = $2"),
            ),
            dead: sql(
                &[T::TEXT, T::INT8, T::TEXT, T::INT8],
                format!(
                    "SELECT job FROM {jobs}
                     WHERE route = $1 AND dead_at IS NOT NULL AND (dead_at, key) > ($2, $3)
                     ORDER BY dead_at, key LIMIT $4"
                ),
            ),
            revive: sql(
                &[T::TEXT, T::INT8, T::INT8, T::BYTEA, T::TEXT],
                format!(
                    "UPDATE {jobs} SET dead_at = NULL, due_at = $3, token = 0, waiting = true,
                       job = $4
                     WHERE key = $1 AND dead_at = $2 AND route = $5"
                ),
            ),
            discard: sql(
                &[T::TEXT, T::TEXT],
                format!("DELETE FROM {jobs} WHERE key = $1 AND route = $2 AND dead_at IS NOT NULL"),
            ),
            counts: sql(
                &[T::TEXT_ARRAY],
                format!(
                    "SELECT route,
                       count(*) FILTER (WHERE dead_at IS NULL AND waiting),
                       count(*) FILTER (WHERE dead_at IS NULL AND NOT waiting),
                       count(*) FILTER (WHERE dead_at IS NOT NULL),
                       min(received_at) FILTER (WHERE dead_at IS NULL)
                     FROM {jobs} WHERE route = ANY($1) GROUP BY route"
                ),
            ),
            pause: sql(
                &[T::TEXT],
                format!("INSERT INTO {paused} (route) VALUES ($1) ON CONFLICT DO NOTHING"),
            ),
            resume: sql(&[T::TEXT], format!("DELETE FROM {paused} WHERE route = $1")),
            paused: sql(&[], format!("SELECT route FROM {paused}")),
        }
    }
}

/// The PostgreSQL store's queue.
pub(super) struct PostgresQueue {
    pool: Pool,
    timeout: Duration,
    statements: Statements,
    clock: Arc<dyn Clock>,
}

/// Makes the queue's statements, each sent as `sending` says.
fn statement(sending: Sending) -> impl Fn(&'static [Type], String) -> Sql {
    move |types, text| Sql {
        text,
        types,
        sending,
    }
}

/// A time or count as PostgreSQL's `bigint`.
fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl PostgresQueue {
    pub(super) fn new(
        config: &PostgresConfig,
        sending: Sending,
    ) -> Result<PostgresQueue, StoreError> {
        Ok(PostgresQueue {
            pool: connection::pool(config, QUEUE_POOL, sending)?,
            timeout: config.timeout.0,
            statements: Statements::for_table(&config.table.0, sending),
            clock: Arc::new(SystemClock),
        })
    }

    async fn query(
        &self,
        statement: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        within("postgres", self.timeout, async {
            let client = self.pool.get().await?;
            Ok::<_, StoreError>(statement.query(&client, params).await?)
        })
        .await
    }

    async fn execute(
        &self,
        statement: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        within("postgres", self.timeout, async {
            let client = self.pool.get().await?;
            Ok::<_, StoreError>(statement.execute(&client, params).await?)
        })
        .await
    }

    /// Runs `statement` in a transaction that holds the lock of `job`'s lane, then makes
    /// the lane's first job due if it is behind. Returns how many rows it changed.
    async fn in_ordered_lane(
        &self,
        job: &Job,
        lane: &str,
        statement: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let lanes = &self.statements.lanes;
        let (now, behind) = (signed(self.clock.now()), signed(BEHIND));
        within("postgres", self.timeout, async {
            let mut client = self.pool.get().await?;
            // Read committed, whatever the server's default: each statement must see what
            // the lane's previous holder committed.
            let transaction = client
                .build_transaction()
                .isolation_level(IsolationLevel::ReadCommitted)
                .start()
                .await?;
            let waits = format!("{}ms", self.timeout.as_millis().max(1));
            lanes
                .lock
                .execute_in(&transaction, &[&job.route, &lane, &waits])
                .await?;
            let changed = statement.execute_in(&transaction, params).await?;
            let promote: [&(dyn ToSql + Sync); 4] = [&job.route, &lane, &now, &behind];
            lanes.promote.execute_in(&transaction, &promote).await?;
            transaction.commit().await?;
            Ok::<_, StoreError>(changed)
        })
        .await
    }

    /// Changes a taken job as `statement` says (retry or bury), if the take owns it.
    async fn change_taken(
        &self,
        statement: &Sql,
        taken: &Taken,
        job: &Job,
        at: Millis,
    ) -> Result<(), StoreError> {
        let (token, at, encoded) = (signed(taken.token), signed(at), job.encode()?);
        let params: [&(dyn ToSql + Sync); 4] = [&job.key, &token, &at, &encoded];
        // A retry leaves the lane as it is: its job stays first.
        let changed = match &job.lane {
            Some(lane) if job.dead.is_some() => {
                self.in_ordered_lane(job, lane, statement, &params).await?
            }
            _ => self.execute(statement, &params).await?,
        };
        crate::store::owned(changed == 1)
    }
}

#[async_trait]
impl DeliveryQueue for PostgresQueue {
    async fn enqueue(&self, job: &Job) -> Result<Enqueued, StoreError> {
        let (now, received, encoded) = (
            signed(self.clock.now()),
            signed(job.received_at),
            job.encode()?,
        );
        let stored = match &job.lane {
            Some(lane) => {
                let behind = signed(BEHIND);
                let params: [&(dyn ToSql + Sync); 7] = [
                    &job.key, &job.route, &now, &received, &encoded, lane, &behind,
                ];
                let enqueue = &self.statements.lanes.enqueue;
                self.in_ordered_lane(job, lane, enqueue, &params).await? == 1
            }
            None => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&job.key, &job.route, &now, &received, &encoded];
                !self
                    .query(&self.statements.enqueue, &params)
                    .await?
                    .is_empty()
            }
        };
        Ok(if stored {
            Enqueued::Stored
        } else {
            Enqueued::AlreadyQueued
        })
    }

    async fn take(
        &self,
        route: &str,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<Taken>, StoreError> {
        let now = self.clock.now();
        let token = signed(rand::random::<u64>() >> 1 | 1);
        let (now_signed, limit) = (signed(now), signed(limit as u64));
        let until = signed(now.saturating_add(millis(visibility)));
        let params: [&(dyn ToSql + Sync); 5] = [&route, &now_signed, &limit, &until, &token];
        let rows = self.query(&self.statements.take, &params).await?;
        rows.iter()
            .map(|row| {
                Ok(Taken {
                    job: Job::decode(row.get::<_, &[u8]>(0))?,
                    token: token as u64,
                    attempt: u32::try_from(row.get::<_, i32>(1)).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn complete(&self, taken: &Taken) -> Result<(), StoreError> {
        let (job, complete) = (&taken.job, &self.statements.complete);
        let token = signed(taken.token);
        let params: [&(dyn ToSql + Sync); 2] = [&job.key, &token];
        let removed = match &job.lane {
            Some(lane) => self.in_ordered_lane(job, lane, complete, &params).await?,
            None => self.execute(complete, &params).await?,
        };
        crate::store::owned(removed == 1)
    }

    async fn retry(&self, taken: &Taken, job: &Job, due_at: Millis) -> Result<(), StoreError> {
        self.change_taken(&self.statements.retry, taken, job, due_at)
            .await
    }

    async fn release(&self, taken: &Taken, due_at: Millis) -> Result<(), StoreError> {
        let (token, due_at) = (signed(taken.token), signed(due_at));
        let params: [&(dyn ToSql + Sync); 3] = [&taken.job.key, &token, &due_at];
        let changed = self.execute(&self.statements.release, &params).await?;
        crate::store::owned(changed == 1)
    }

    async fn bury(&self, taken: &Taken, job: &Job) -> Result<(), StoreError> {
        let died = job.dead.map_or(self.clock.now(), |(at, _)| at);
        self.change_taken(&self.statements.bury, taken, job, died)
            .await
    }

    async fn job(&self, route: &str, key: &str) -> Result<Option<Job>, StoreError> {
        let rows = self
            .query(&self.statements.operations.job, &[&key, &route])
            .await?;
        rows.first()
            .map(|row| Job::decode(row.get::<_, &[u8]>(0)))
            .transpose()
    }

    async fn dead(
        &self,
        route: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        let (died, key) = match after {
            Some(cursor) => parse_dead_cursor(cursor)?,
            None => (0, ""),
        };
        let (died, wanted) = (signed(died), signed(limit as u64 + 1));
        let params: [&(dyn ToSql + Sync); 4] = [&route, &died, &key, &wanted];
        let rows = self
            .query(&self.statements.operations.dead, &params)
            .await?;
        let mut jobs = rows
            .iter()
            .map(|row| Job::decode(row.get::<_, &[u8]>(0)))
            .collect::<Result<Vec<_>, _>>()?;
        let next = (jobs.len() > limit).then(|| {
            jobs.truncate(limit);
            jobs.last().map(dead_cursor)
        });
        Ok(DeadPage {
            jobs,
            next: next.flatten(),
        })
    }

    async fn revive(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let Some((died, job)) = revived(self.job(route, key).await?, now) else {
            return Ok(false);
        };
        let (died, now, encoded) = (signed(died), signed(now), job.encode()?);
        let changed = match &job.lane {
            Some(lane) => {
                let behind = signed(BEHIND);
                let params: [&(dyn ToSql + Sync); 7] =
                    [&key, &route, &now, &encoded, &died, lane, &behind];
                let revive = &self.statements.lanes.revive;
                self.in_ordered_lane(&job, lane, revive, &params).await?
            }
            None => {
                let params: [&(dyn ToSql + Sync); 5] = [&key, &died, &now, &encoded, &route];
                self.execute(&self.statements.operations.revive, &params)
                    .await?
            }
        };
        Ok(changed == 1)
    }

    async fn discard(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        Ok(self
            .execute(&self.statements.operations.discard, &[&key, &route])
            .await?
            == 1)
    }

    async fn counts(&self, routes: &[String]) -> Result<Vec<QueueCounts>, StoreError> {
        let rows = self
            .query(&self.statements.operations.counts, &[&routes])
            .await?;
        let count = |value: i64| u64::try_from(value).unwrap_or(0);
        Ok(routes
            .iter()
            .map(|route| {
                rows.iter()
                    .find(|row| row.get::<_, &str>(0) == route)
                    .map_or_else(QueueCounts::default, |row| QueueCounts {
                        waiting: count(row.get(1)),
                        retrying: count(row.get(2)),
                        dead: count(row.get(3)),
                        oldest: row.get::<_, Option<i64>>(4).map(count),
                    })
            })
            .collect())
    }

    async fn set_paused(&self, route: &str, paused: bool) -> Result<(), StoreError> {
        let statement = if paused {
            &self.statements.operations.pause
        } else {
            &self.statements.operations.resume
        };
        self.execute(statement, &[&route]).await.map(drop)
    }

    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.query(&self.statements.operations.paused, &[]).await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
