//! The delivery log on PostgreSQL: one row per batch the writer stores, a [`chunk`] of
//! its entries, in `<table>_deliveries`, shared by every replica, numbered by its
//! `bigserial` id (so the order is the order the rows were numbered). An entry's id is
//! its row's and its place in the chunk. A row per entry cost the writer an encoded
//! parameter and a returned id per entry (`docs/performance.md`). Rows that earlier
//! versions wrote hold one entry each (`entries` 0) and are read alike. Trimming deletes
//! the rows whose newest entry is older than the retention (by an index on `at`), then
//! those whose every entry is beyond the newest `keep`. The log has a pool of its own
//! ([`LOG_POOL`]), so that neither claims nor queued deliveries wait behind it.
//!
//! [`chunk`]: crate::store::log::chunk

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio_postgres::types::{ToSql, Type};

use super::connection::{self, Sending, Sql};
use super::statements::beside;
use crate::store::log::chunk::{
    ChunkVersion, decode_chunk, encode_chunk, entry_at, read_batches, summary,
};
use crate::store::log::{DeliveryLog, LogId, LogRead, LoggedDelivery};
use crate::store::settings::{LOG_POOL, PostgresConfig};
use crate::store::{Millis, StoreError, within};

/// How many rows a read asks for at a time, at most: a row may hold a batch of bodies.
const ROWS_READ: usize = 4;

/// The log's table and its index, beside the claims table; a table of an earlier version
/// gets its `entries` column. `entry` keeps its name though it holds a chunk now: an
/// earlier version's inserts still work (their rows read as one entry each). A chunk is
/// stored out of line without compression (`STORAGE EXTERNAL`): compressing each batch
/// cost the server more than it saved (`docs/performance.md`).
pub(super) fn create_table(table: &str) -> String {
    let deliveries = beside(table, "_deliveries");
    let by_time = beside(table, "_deliveries_at");
    format!(
        "CREATE TABLE IF NOT EXISTS {deliveries} (
           id bigserial PRIMARY KEY,
           at bigint NOT NULL,
           entry bytea NOT NULL,
           entries integer NOT NULL DEFAULT 0
         );
         CREATE INDEX IF NOT EXISTS {by_time} ON {deliveries} (at);
         DO $$
         BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = '{deliveries}'::regclass
                            AND attname = 'entries' AND NOT attisdropped) THEN
             ALTER TABLE {deliveries} ADD COLUMN entries integer NOT NULL DEFAULT 0;
           END IF;
           IF (SELECT attstorage FROM pg_attribute
               WHERE attrelid = '{deliveries}'::regclass AND attname = 'entry') <> 'e' THEN
             ALTER TABLE {deliveries} ALTER COLUMN entry SET STORAGE EXTERNAL;
           END IF;
         END $$;"
    )
}

/// The log's statements, with the table's name filled in once.
struct Statements {
    append: Sql,
    read: Sql,
    get: Sql,
    trim_aged: Sql,
    trim_counted: Sql,
}

impl Statements {
    fn for_table(table: &str, sending: Sending) -> Statements {
        let deliveries = beside(table, "_deliveries");
        let sql = |types: &'static [Type], text: String| Sql {
            text,
            types,
            sending,
        };
        use Type as T;
        Statements {
            append: sql(
                &[T::INT8, T::INT4, T::BYTEA],
                format!(
                    "INSERT INTO {deliveries} (at, entries, entry) VALUES ($1, $2, $3)
                     RETURNING id"
                ),
            ),
            read: sql(
                &[T::INT8, T::INT8],
                format!(
                    "SELECT id, entries, entry FROM {deliveries} WHERE id <= $1
                     ORDER BY id DESC LIMIT $2"
                ),
            ),
            get: sql(
                &[T::INT8],
                format!("SELECT entries, entry FROM {deliveries} WHERE id = $1"),
            ),
            trim_aged: sql(
                &[T::INT8],
                format!(
                    "WITH gone AS (DELETE FROM {deliveries} WHERE at < $1 RETURNING entries)
                     SELECT coalesce(sum(greatest(entries, 1)), 0)::bigint FROM gone"
                ),
            ),
            // The newest row whose every entry is beyond the newest $1, found by a
            // running count from the newest row down (it stops there), and every row
            // up to it.
            trim_counted: sql(
                &[T::INT8],
                format!(
                    "WITH gone AS (
                       DELETE FROM {deliveries} WHERE id <= (
                         SELECT id FROM (
                           SELECT id, sum(greatest(entries, 1)) OVER (ORDER BY id DESC)
                                        - greatest(entries, 1) AS newer
                           FROM {deliveries}) AS counted
                         WHERE newer >= $1 ORDER BY id DESC LIMIT 1)
                       RETURNING entries)
                     SELECT coalesce(sum(greatest(entries, 1)), 0)::bigint FROM gone"
                ),
            ),
        }
    }
}

/// A row's entries, each with its place; one that does not read is `None`.
fn entries_of(row: &tokio_postgres::Row) -> Vec<Option<LoggedDelivery>> {
    let entries: i32 = row.get("entries");
    let stored: &[u8] = row.get("entry");
    match entries {
        0 => vec![LoggedDelivery::decode(stored)],
        _ => decode_chunk(stored),
    }
}

/// The PostgreSQL store's log.
pub(super) struct PostgresLog {
    pool: Pool,
    timeout: Duration,
    statements: Statements,
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl PostgresLog {
    pub(super) fn new(
        config: &PostgresConfig,
        sending: Sending,
    ) -> Result<PostgresLog, StoreError> {
        Ok(PostgresLog {
            pool: connection::pool(config, LOG_POOL, sending)?,
            timeout: config.timeout.0,
            statements: Statements::for_table(&config.table.0, sending),
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
}

#[async_trait]
impl DeliveryLog for PostgresLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let chunk = encode_chunk(ChunkVersion::Batches, entries);
        let (count, newest_at) = summary(&chunk);
        let count = i32::try_from(count).unwrap_or(i32::MAX);
        let rows = self
            .query(
                &self.statements.append,
                &[&signed(newest_at), &count, &chunk],
            )
            .await?;
        let id: i64 = rows
            .first()
            .ok_or_else(|| StoreError::of("postgres", "the log's insert returned no id"))?
            .get(0);
        let id = u64::try_from(id).unwrap_or(0);
        Ok((0..entries.len() as u64)
            .map(|place| LogId(id, place))
            .collect())
    }

    async fn read(&self, before: Option<LogId>, limit: usize) -> Result<LogRead, StoreError> {
        read_batches(before, limit, ROWS_READ, |after, asked| async move {
            let end = match after {
                None => before.map_or(i64::MAX, |id| signed(id.0)),
                Some(first) => signed(first.0) - 1,
            };
            let rows = self
                .query(&self.statements.read, &[&end, &signed(asked as u64)])
                .await?;
            Ok(rows
                .iter()
                .map(|row| {
                    let id = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
                    (LogId(id, 0), entries_of(row))
                })
                .collect())
        })
        .await
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        let rows = self.query(&self.statements.get, &[&signed(id.0)]).await?;
        Ok(rows.first().and_then(|row| {
            let stored: &[u8] = row.get("entry");
            match row.get::<_, i32>("entries") {
                0 => (id.1 == 0)
                    .then(|| LoggedDelivery::decode(stored))
                    .flatten(),
                _ => entry_at(stored, id.1),
            }
        }))
    }

    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError> {
        let mut removed = 0;
        for (statement, bound) in [
            (&self.statements.trim_aged, older_than),
            (&self.statements.trim_counted, keep),
        ] {
            let rows = self.query(statement, &[&signed(bound)]).await?;
            let count: i64 = rows.first().map_or(0, |row| row.get(0));
            removed += u64::try_from(count).unwrap_or(0);
        }
        Ok(removed)
    }
}
