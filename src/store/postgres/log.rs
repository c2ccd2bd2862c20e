//! The delivery log on PostgreSQL: one row per logged delivery in `<table>_deliveries`,
//! shared by every replica, named by its `bigserial` id (so the order is the order the
//! rows were numbered). A batch is one `INSERT ... SELECT FROM unnest(...)`. Trimming
//! deletes the rows logged before the retention (by an index on `at`), then those beyond
//! the newest `keep` (by the primary key). The log has a connection of its own
//! ([`LOG_POOL`]), so that neither claims nor queued deliveries wait behind it.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio_postgres::types::{ToSql, Type};

use super::connection::{self, Sending, Sql};
use super::statements::beside;
use crate::config::{LOG_POOL, PostgresConfig};
use crate::store::log::{DeliveryLog, LogId, LoggedDelivery};
use crate::store::{Millis, StoreError, within};

/// The log's table and its index, beside the claims table.
pub(super) fn create_table(table: &str) -> String {
    let deliveries = beside(table, "_deliveries");
    let by_time = beside(table, "_deliveries_at");
    format!(
        "CREATE TABLE IF NOT EXISTS {deliveries} (
           id bigserial PRIMARY KEY,
           at bigint NOT NULL,
           entry bytea NOT NULL
         );
         CREATE INDEX IF NOT EXISTS {by_time} ON {deliveries} (at);"
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
                &[T::INT8_ARRAY, T::BYTEA_ARRAY],
                format!(
                    "INSERT INTO {deliveries} (at, entry)
                     SELECT at, entry FROM unnest($1::bigint[], $2::bytea[]) AS given(at, entry)
                     RETURNING id"
                ),
            ),
            read: sql(
                &[T::INT8, T::INT8],
                format!(
                    "SELECT id, entry FROM {deliveries} WHERE id < $1 ORDER BY id DESC LIMIT $2"
                ),
            ),
            get: sql(
                &[T::INT8],
                format!("SELECT entry FROM {deliveries} WHERE id = $1"),
            ),
            trim_aged: sql(
                &[T::INT8],
                format!("DELETE FROM {deliveries} WHERE at < $1"),
            ),
            trim_counted: sql(
                &[T::INT8],
                format!(
                    "DELETE FROM {deliveries} WHERE id <= (SELECT id FROM {deliveries}
                       ORDER BY id DESC OFFSET $1 LIMIT 1)"
                ),
            ),
        }
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
    pub(super) fn new(config: &PostgresConfig) -> Result<PostgresLog, StoreError> {
        Ok(PostgresLog {
            pool: connection::pool(config, LOG_POOL)?,
            timeout: config.timeout.0,
            statements: Statements::for_table(&config.table.0, Sending::of(config)),
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
}

#[async_trait]
impl DeliveryLog for PostgresLog {
    async fn append(&self, entries: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let times: Vec<i64> = entries.iter().map(|entry| signed(entry.at)).collect();
        let encoded: Vec<Vec<u8>> = entries.iter().map(LoggedDelivery::encode).collect();
        let rows = self
            .query(&self.statements.append, &[&times, &encoded])
            .await?;
        // Numbered in the order given; sorted, in case the rows come back in another.
        let mut ids: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
        ids.sort_unstable();
        Ok(ids
            .into_iter()
            .map(|id| LogId(u64::try_from(id).unwrap_or(0), 0))
            .collect())
    }

    async fn read(
        &self,
        before: Option<LogId>,
        limit: usize,
    ) -> Result<Vec<(LogId, LoggedDelivery)>, StoreError> {
        // A row's id is the first number; an id past it (`n-1`) reads from `n` on down.
        let before = before.map_or(i64::MAX, |id| {
            signed(id.0).saturating_add(i64::from(id.1 > 0))
        });
        let rows = self
            .query(&self.statements.read, &[&before, &signed(limit as u64)])
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id: i64 = row.get(0);
                let entry: Vec<u8> = row.get(1);
                Some((
                    LogId(u64::try_from(id).ok()?, 0),
                    LoggedDelivery::decode(&entry)?,
                ))
            })
            .collect())
    }

    async fn get(&self, id: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
        if id.1 != 0 {
            return Ok(None);
        }
        let rows = self.query(&self.statements.get, &[&signed(id.0)]).await?;
        Ok(rows.first().and_then(|row| {
            let entry: Vec<u8> = row.get(0);
            LoggedDelivery::decode(&entry)
        }))
    }

    async fn trim(&self, older_than: Millis, keep: u64) -> Result<u64, StoreError> {
        let aged = self
            .execute(&self.statements.trim_aged, &[&signed(older_than)])
            .await?;
        let counted = self
            .execute(&self.statements.trim_counted, &[&signed(keep)])
            .await?;
        Ok(aged + counted)
    }
}
