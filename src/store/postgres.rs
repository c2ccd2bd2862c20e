//! The shared claim store on PostgreSQL: every replica's proxy claims in one table.
//!
//! One row per key. A claim is a single `INSERT ... ON CONFLICT DO UPDATE ... WHERE
//! <the existing row has expired>`: it inserts a new key, takes over an expired lease
//! or an expired done record, and leaves a live one alone, atomically. Finish and
//! release are guarded by the owner token. `expires_at` is the lease's end while in
//! flight and the retention's end once done; an index on it lets the sweeper delete only
//! what has expired. Times come from the database's clock, which all replicas share.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Pool, PoolConfig, Runtime, Timeouts};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls;
use super::{
    Claim, ClaimOutcome, ClaimStore, Completion, DoneRecord, Fingerprint, Forgotten, KeyState,
    Millis, RecordedResponse, StoreError, Swept, millis, owned, within,
};
use crate::config::{PostgresConfig, SslMode, driver_url};
use crate::workers::{PerWorker, Workers};

/// The database's time in milliseconds since the Unix epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The statements, with the table name filled in once.
struct Statements {
    claim: String,
    current: String,
    finish: String,
    release: String,
    forget_done: String,
    in_flight: String,
    sweep: String,
}

impl Statements {
    fn for_table(table: &str) -> Statements {
        Statements {
            claim: format!(
                "WITH now AS (SELECT {NOW_MS} AS ms)
                 INSERT INTO {table} AS c (key, state, owner, claimed_at, expires_at, body_sha256)
                 SELECT $1, 'in_flight', $2, now.ms, now.ms + $3, $4 FROM now
                 ON CONFLICT (key) DO UPDATE SET
                   state = 'in_flight', owner = EXCLUDED.owner, claimed_at = EXCLUDED.claimed_at,
                   expires_at = EXCLUDED.expires_at, body_sha256 = EXCLUDED.body_sha256,
                   completed_at = NULL, upstream_status = NULL, response_status = NULL,
                   response_content_type = NULL, response_body = NULL
                 WHERE c.expires_at <= EXCLUDED.claimed_at
                 RETURNING 1"
            ),
            current: format!(
                "SELECT state, claimed_at, expires_at, completed_at, upstream_status, body_sha256,
                        response_status, response_content_type, response_body, {NOW_MS} AS now
                 FROM {table} WHERE key = $1"
            ),
            finish: format!(
                "UPDATE {table} SET state = 'done', completed_at = {NOW_MS}, expires_at = {NOW_MS} + $3,
                        upstream_status = $4, response_status = $5, response_content_type = $6,
                        response_body = $7, owner = NULL
                 WHERE key = $1 AND owner = $2 AND state = 'in_flight'"
            ),
            release: format!("DELETE FROM {table} WHERE key = $1 AND owner = $2 AND state = 'in_flight'"),
            forget_done: format!("DELETE FROM {table} WHERE key = $1 AND state = 'done' AND expires_at > {NOW_MS}"),
            in_flight: format!(
                "SELECT 1 FROM {table} WHERE key = $1 AND state = 'in_flight' AND expires_at > {NOW_MS}"
            ),
            sweep: format!(
                "DELETE FROM {table} WHERE key IN (
                   SELECT key FROM {table} WHERE expires_at <= {NOW_MS}
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// The PostgreSQL store.
pub struct PostgresStore {
    /// A pool for callers outside the workers (the sweeper), then one per worker, each
    /// with its share of `pool_size`: a connection's task runs on the runtime that opened
    /// it, so a worker that only ever uses its own pool never wakes another thread for a
    /// reply.
    pools: PerWorker<Pool>,
    timeout: Duration,
    statements: Statements,
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> StoreError {
        StoreError::caused("postgres", &error)
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> StoreError {
        StoreError::caused("postgres", &error)
    }
}

/// A pool of at most `size` connections, opened when first needed, with TLS as `sslmode`
/// says.
fn pool(config: &PostgresConfig, size: usize) -> Result<Pool, StoreError> {
    let mut pool_config = deadpool_postgres::Config::new();
    pool_config.url = Some(driver_url(config.url.expose()));
    let mut limits = PoolConfig::new(size);
    limits.timeouts = Timeouts {
        wait: Some(config.timeout.0),
        create: Some(config.timeout.0),
        recycle: Some(config.timeout.0),
    };
    pool_config.pool = Some(limits);
    let created = match config.ssl_mode {
        SslMode::Disable => {
            pool_config.ssl_mode = Some(deadpool_postgres::SslMode::Disable);
            pool_config.create_pool(Some(Runtime::Tokio1), NoTls)
        }
        mode => {
            // Never `prefer`: a server that will not speak TLS is refused, not used plain.
            pool_config.ssl_mode = Some(deadpool_postgres::SslMode::Require);
            let rustls = tls::postgres_config(mode, config.tls.as_ref())?;
            pool_config.create_pool(Some(Runtime::Tokio1), MakeRustlsConnect::new(rustls))
        }
    };
    created.map_err(|error| {
        StoreError::Backend(format!("postgres URL {}: {error}", config.url.masked()))
    })
}

/// A time in milliseconds, as PostgreSQL's `bigint` holds it.
fn signed(ms: Millis) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn unsigned(ms: i64) -> Millis {
    u64::try_from(ms).unwrap_or(0)
}

impl PostgresStore {
    /// Connects, and creates the claims table and its expiry index if they are missing.
    /// With `workers`, deliveries on each worker draw from a pool of their own.
    pub async fn connect(
        config: &PostgresConfig,
        workers: Option<&Workers>,
    ) -> Result<PostgresStore, StoreError> {
        let url = config.url.masked();
        let pools = match workers.map(Workers::count) {
            None => PerWorker::new(pool(config, config.pool_size)?, Vec::new()),
            Some(count) => {
                let share = config.pool_size.div_ceil(count).max(1);
                let each = (0..count)
                    .map(|_| pool(config, share))
                    .collect::<Result<_, _>>()?;
                PerWorker::new(pool(config, 1)?, each)
            }
        };
        let store = PostgresStore {
            pools,
            timeout: config.timeout.0,
            statements: Statements::for_table(&config.table.0),
        };
        store
            .create_table(&config.table.0)
            .await
            .map_err(|error| error.context(&format!("cannot prepare postgres at {url}")))?;
        Ok(store)
    }

    async fn create_table(&self, table: &str) -> Result<(), StoreError> {
        let mut client = self.pools.get().get().await?;
        let transaction = client.transaction().await?;
        // Replicas starting together would race on CREATE TABLE: one at a time.
        transaction
            .execute(
                "SELECT pg_advisory_xact_lock(hashtext('dedupe-proxy schema'))",
                &[],
            )
            .await?;
        transaction
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                   key text PRIMARY KEY,
                   state text NOT NULL CHECK (state IN ('in_flight', 'done')),
                   owner text,
                   claimed_at bigint NOT NULL,
                   expires_at bigint NOT NULL,
                   completed_at bigint,
                   upstream_status integer,
                   body_sha256 bytea NOT NULL,
                   response_status integer,
                   response_content_type text,
                   response_body bytea
                 );
                 CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at);"
            ))
            .await?;
        Ok(transaction.commit().await?)
    }

    /// Runs `statement` with `params` (a cached prepared statement) within the timeout,
    /// returning its rows.
    async fn query(
        &self,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        self.bounded(async {
            let (client, prepared) = self.prepared(statement).await?;
            Ok(client.query(&prepared, params).await?)
        })
        .await
    }

    /// Like [`PostgresStore::query`], returning how many rows it changed.
    async fn execute(
        &self,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        self.bounded(async {
            let (client, prepared) = self.prepared(statement).await?;
            Ok(client.execute(&prepared, params).await?)
        })
        .await
    }

    async fn prepared(
        &self,
        statement: &str,
    ) -> Result<(deadpool_postgres::Object, tokio_postgres::Statement), StoreError> {
        let client = self.pools.get().get().await?;
        let prepared = client.prepare_cached(statement).await?;
        Ok((client, prepared))
    }

    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        within("postgres", self.timeout, work).await
    }

    /// The live state of a key, read with the database's clock.
    async fn current(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        let rows = self.query(&self.statements.current, &[&key]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let (state, expires_at, now): (String, i64, i64) =
            (row.get("state"), row.get("expires_at"), row.get("now"));
        if expires_at <= now {
            return Ok(None);
        }
        let fingerprint: Fingerprint = row
            .get::<_, Vec<u8>>("body_sha256")
            .try_into()
            .unwrap_or([0; 32]);
        let claimed_at = unsigned(row.get("claimed_at"));
        Ok(Some(match state.as_str() {
            "in_flight" => KeyState::InFlight {
                claimed_at,
                lease_until: unsigned(expires_at),
                fingerprint,
            },
            _ => {
                let response = row.get::<_, Option<i32>>("response_status").map(|status| {
                    RecordedResponse::read_back(
                        status,
                        row.get("response_content_type"),
                        row.get("response_body"),
                    )
                });
                KeyState::Done(DoneRecord {
                    claimed_at,
                    completed_at: unsigned(row.get::<_, Option<i64>>("completed_at").unwrap_or(0)),
                    expires_at: unsigned(expires_at),
                    upstream_status: u16::try_from(
                        row.get::<_, Option<i32>>("upstream_status").unwrap_or(0),
                    )
                    .unwrap_or(0),
                    fingerprint,
                    response,
                })
            }
        }))
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
        // A live record seen by the insert may be gone when read back: try again.
        for _ in 0..8 {
            let token: u128 = rand::random();
            let owner = token.to_string();
            let rows = self
                .query(
                    &self.statements.claim,
                    &[&key, &owner, &lease, &fingerprint.as_slice()],
                )
                .await?;
            if !rows.is_empty() {
                return Ok(ClaimOutcome::Claimed(Claim {
                    key: key.to_owned(),
                    token,
                }));
            }
            match self.current(key).await? {
                Some(KeyState::InFlight { lease_until, .. }) => {
                    return Ok(ClaimOutcome::InFlight { lease_until });
                }
                Some(KeyState::Done(record)) => return Ok(ClaimOutcome::Done(record)),
                None => continue,
            }
        }
        Err(StoreError::of(
            "postgres",
            "the claim kept changing under concurrent deliveries",
        ))
    }

    async fn finish(&self, claim: &Claim, completion: Completion) -> Result<(), StoreError> {
        let owner = claim.token.to_string();
        let retention = signed(millis(completion.retention).max(1));
        let status = i32::from(completion.upstream_status);
        let recorded = completion.response.as_ref();
        let response_status = recorded.map(|r| i32::from(r.status));
        let content_type = recorded.and_then(|r| r.content_type.clone());
        let body = recorded.map(|r| r.body.to_vec());
        let updated = self
            .execute(
                &self.statements.finish,
                &[
                    &claim.key,
                    &owner,
                    &retention,
                    &status,
                    &response_status,
                    &content_type,
                    &body,
                ],
            )
            .await?;
        owned(updated == 1)
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let owner = claim.token.to_string();
        let deleted = self
            .execute(&self.statements.release, &[&claim.key, &owner])
            .await?;
        owned(deleted == 1)
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        self.current(key).await
    }

    async fn forget(&self, key: &str) -> Result<Forgotten, StoreError> {
        if self.execute(&self.statements.forget_done, &[&key]).await? == 1 {
            return Ok(Forgotten::Removed);
        }
        let in_flight = !self
            .query(&self.statements.in_flight, &[&key])
            .await?
            .is_empty();
        Ok(if in_flight {
            Forgotten::InFlight
        } else {
            Forgotten::Absent
        })
    }

    async fn sweep(&self, limit: usize) -> Result<Swept, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let removed = self.execute(&self.statements.sweep, &[&limit]).await?;
        let removed = usize::try_from(removed).unwrap_or(usize::MAX);
        Ok(Swept {
            examined: removed,
            removed,
        })
    }

    /// Durability is the database's (each statement commits).
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn done_keys(&self) -> Option<u64> {
        None
    }
}
