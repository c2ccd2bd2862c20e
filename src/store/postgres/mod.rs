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
//! Claims and done marks travel in batches, one statement for many (`batch.rs`); the
//! table is made or brought up to date at start (`schema.rs`). The
//! outcomes of claims made with `announce` are notified on `<table>_outcomes`, on which
//! each store keeps one connection listening ([`hear`]).

mod batch;
mod schema;

use std::collections::HashSet;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Hook, HookError, Object, Pool, PoolConfig, Runtime, Timeouts};
use futures_util::StreamExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

use self::batch::{Batched, Queue};
use super::tls;
use super::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, DoneRecord, EntityRecord, Fingerprint,
    Forgotten, Heard, HeldRecord, KeyState, Millis, Page, RESOLVED_STATUS, RecordedResponse,
    Resolution, StateFilter, StoreError, Swept, Version, millis, owned, page, within,
};
use crate::config::{PostgresConfig, SslMode, driver_url};
use crate::workers::{PerWorker, Workers};

/// The database's time in milliseconds since the Unix epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The columns of a record, as [`live_state`] reads them.
const RECORD: &str = "state, claimed_at, expires_at, completed_at, upstream_status, body_sha256,
                      response_status, response_content_type, response_body, response_headers,
                      hold_reason";

/// The columns of a record as a listing reads them: without the recorded answer, which a
/// listing does not show (a page could otherwise carry 1000 answers of 64 KiB).
const LISTED: &str = "state, claimed_at, expires_at, completed_at, upstream_status, body_sha256,
                      NULL::integer AS response_status, NULL::text AS response_content_type,
                      NULL::bytea AS response_body, NULL::bytea AS response_headers, hold_reason";

/// The channel on which the outcomes (finish, release, hold) of announced claims in
/// `table` are notified, with the store key as the payload: `<table>_outcomes`, the table
/// name cut to fit PostgreSQL's 63-byte names.
fn outcomes_channel(table: &str) -> String {
    format!("{}_outcomes", &table[..table.len().min(54)])
}

/// The table of entities' records beside `table`, its name cut to fit PostgreSQL's
/// 63-byte names.
fn entities_table(table: &str) -> String {
    format!("{}_entities", &table[..table.len().min(54)])
}

/// How often the connection that listens for outcomes is checked: a connection that died
/// without a word would otherwise leave waiters to their rechecks for good.
const LISTEN_CHECK: Duration = Duration::from_secs(30);

/// How each connection plans. Every statement here finds its rows through an index, and
/// is planned once: a batch's plan does not depend on how many keys it carries, and
/// planning it again for each batch would cost more than running it. A cached plan is
/// made with the table's size at that moment: made on a new, empty table it would scan
/// the whole table, and keep doing so as the table grows, so such scans are ruled out.
const SESSION_SETTINGS: &str = "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan";

/// The statements, with the table name filled in once.
struct Statements {
    claim_many: String,
    current: String,
    finish_many: String,
    release: String,
    renew: String,
    hold: String,
    resolve_done: String,
    resolve_release: String,
    list: String,
    list_held: String,
    forget_done: String,
    count_held: String,
    state_of: String,
    sweep: String,
    newest_version: String,
    record_version: String,
    forget_entity: String,
    sweep_entities: String,
}

impl Statements {
    fn for_table(table: &str) -> Statements {
        let channel = outcomes_channel(table);
        let entities = entities_table(table);
        Statements {
            claim_many: format!(
                "WITH now AS (SELECT {NOW_MS} AS ms),
                 wanted AS (
                   SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[])
                     WITH ORDINALITY AS w(key, owner, lease, body_sha256, position)),
                 claimed AS (
                   INSERT INTO {table} AS c (key, state, owner, claimed_at, expires_at, body_sha256)
                   SELECT w.key, 'in_flight', w.owner, now.ms, now.ms + w.lease, w.body_sha256
                   FROM wanted w, now
                   ON CONFLICT (key) DO UPDATE SET
                     state = 'in_flight', owner = EXCLUDED.owner, claimed_at = EXCLUDED.claimed_at,
                     expires_at = EXCLUDED.expires_at, body_sha256 = EXCLUDED.body_sha256,
                     completed_at = NULL, upstream_status = NULL, response_status = NULL,
                     response_content_type = NULL, response_body = NULL, response_headers = NULL,
                     hold_reason = NULL
                   WHERE c.expires_at <= EXCLUDED.claimed_at
                   RETURNING c.key)
                 SELECT w.key, claimed.key IS NOT NULL AS claimed, t.state, t.claimed_at,
                        t.expires_at, t.completed_at, t.upstream_status, t.body_sha256,
                        t.response_status, t.response_content_type, t.response_body,
                        t.response_headers, t.hold_reason, now.ms AS now
                 FROM wanted w CROSS JOIN now
                 LEFT JOIN claimed ON claimed.key = w.key
                 LEFT JOIN {table} t ON t.key = w.key AND claimed.key IS NULL
                 ORDER BY w.position"
            ),
            current: format!("SELECT {RECORD}, {NOW_MS} AS now FROM {table} WHERE key = $1"),
            hold: format!(
                "WITH held AS (
                   UPDATE {table} SET state = 'held', owner = NULL, completed_at = {NOW_MS},
                          expires_at = {NOW_MS} + $3, hold_reason = $4
                   WHERE key = $1 AND owner = $2 AND state = 'in_flight'
                   RETURNING key)
                 SELECT key, CASE WHEN $5 THEN pg_notify('{channel}', key) END FROM held"
            ),
            resolve_done: format!(
                "UPDATE {table} SET state = 'done', completed_at = {NOW_MS},
                        expires_at = {NOW_MS} + $2, upstream_status = {RESOLVED_STATUS},
                        hold_reason = NULL
                 WHERE key = $1 AND state = 'held' AND expires_at > {NOW_MS}"
            ),
            resolve_release: format!(
                "DELETE FROM {table} WHERE key = $1 AND state = 'held' AND expires_at > {NOW_MS}"
            ),
            // A key that starts with the namespace's prefix sorts at or after it in any
            // collation, so the walk of the key's index begins there.
            list: format!(
                "SELECT key, {LISTED}, {NOW_MS} AS now FROM {table}
                 WHERE starts_with(key, $1) AND key >= $1 AND key > $2
                   AND expires_at > {NOW_MS} AND ($3::text IS NULL OR state = $3)
                 ORDER BY key LIMIT $4"
            ),
            // Held keys alone, through their partial index (the generic plan of `list`
            // cannot know that `$3` is 'held').
            list_held: format!(
                "SELECT key, {LISTED}, {NOW_MS} AS now FROM {table}
                 WHERE state = 'held' AND starts_with(key, $1) AND key >= $1 AND key > $2
                   AND expires_at > {NOW_MS}
                 ORDER BY key LIMIT $3"
            ),
            finish_many: format!(
                "WITH done AS (UPDATE {table} AS t SET state = 'done', completed_at = {NOW_MS},
                        expires_at = {NOW_MS} + f.retention, upstream_status = f.upstream_status,
                        response_status = f.response_status,
                        response_content_type = f.response_content_type,
                        response_body = f.response_body,
                        response_headers = f.response_headers, owner = NULL
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::int[],
                             $6::text[], $7::bytea[], $8::bool[], $9::bytea[])
                   AS f(key, owner, retention, upstream_status, response_status,
                        response_content_type, response_body, announce, response_headers)
                 WHERE t.key = f.key AND t.owner = f.owner AND t.state = 'in_flight'
                 RETURNING t.key, f.announce)
                 SELECT key, CASE WHEN announce THEN pg_notify('{channel}', key) END FROM done"
            ),
            release: format!(
                "WITH gone AS (
                   DELETE FROM {table} WHERE key = $1 AND owner = $2 AND state = 'in_flight'
                   RETURNING key)
                 SELECT key, CASE WHEN $3 THEN pg_notify('{channel}', key) END FROM gone"
            ),
            renew: format!(
                "UPDATE {table} SET expires_at = {NOW_MS} + $3
                 WHERE key = $1 AND owner = $2 AND state = 'in_flight'
                 RETURNING key"
            ),
            forget_done: format!(
                "DELETE FROM {table} WHERE key = $1 AND state = 'done' AND expires_at > {NOW_MS}"
            ),
            count_held: format!(
                "SELECT split_part(key, ':', 1) AS namespace, count(*) AS held FROM {table}
                 WHERE state = 'held' AND expires_at > {NOW_MS} GROUP BY 1"
            ),
            state_of: format!("SELECT state FROM {table} WHERE key = $1 AND expires_at > {NOW_MS}"),
            sweep: format!(
                "DELETE FROM {table} WHERE key IN (
                   SELECT key FROM {table} WHERE expires_at <= {NOW_MS}
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            newest_version: format!(
                "SELECT sort_key, version, recorded_at, expires_at FROM {entities}
                 WHERE key = $1 AND expires_at > {NOW_MS}"
            ),
            record_version: format!(
                "INSERT INTO {entities} AS e (key, sort_key, version, recorded_at, expires_at)
                 VALUES ($1, $2, $3, {NOW_MS}, {NOW_MS} + $4)
                 ON CONFLICT (key) DO UPDATE SET
                   sort_key = EXCLUDED.sort_key, version = EXCLUDED.version,
                   recorded_at = EXCLUDED.recorded_at, expires_at = EXCLUDED.expires_at
                 WHERE e.expires_at <= EXCLUDED.recorded_at OR e.sort_key < EXCLUDED.sort_key"
            ),
            forget_entity: format!(
                "DELETE FROM {entities} WHERE key = $1 RETURNING expires_at > {NOW_MS} AS live"
            ),
            sweep_entities: format!(
                "DELETE FROM {entities} WHERE key IN (
                   SELECT key FROM {entities} WHERE expires_at <= {NOW_MS}
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// The PostgreSQL store.
pub struct PostgresStore {
    /// A lane for callers outside the workers (the sweeper, the admin API), then one per
    /// worker, each with its share of `pool_size`: a connection's task runs on the runtime
    /// that opened it, so a worker that only ever uses its own lane never wakes another
    /// thread for a reply.
    lanes: PerWorker<Lane>,
    timeout: Duration,
    statements: Arc<Statements>,
    listener: Listener,
    /// Ends the listening when the store is dropped.
    stop_hearing: CancellationToken,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.stop_hearing.cancel();
    }
}

/// One worker's connections, and its queues of claims and of done marks, each sent in
/// batches (`batch.rs`).
struct Lane {
    pool: Pool,
    claims: Queue<ClaimMany>,
    finishes: Queue<FinishMany>,
}

impl Lane {
    /// Starts the lane's queues on the current runtime.
    fn start(pool: Pool, statements: &Arc<Statements>, timeout: Duration) -> Lane {
        Lane {
            claims: Queue::start(
                pool.clone(),
                ClaimMany {
                    statements: Arc::clone(statements),
                    timeout,
                },
            ),
            finishes: Queue::start(
                pool.clone(),
                FinishMany {
                    statements: Arc::clone(statements),
                    timeout,
                },
            ),
            pool,
        }
    }
}

/// A claim waiting for its batch.
struct ClaimRequest {
    key: String,
    owner: String,
    lease_ms: i64,
    fingerprint: Fingerprint,
}

/// What a claim in a batch found.
enum Found {
    /// Claimed, at the database's `now`.
    Claimed {
        now: i64,
    },
    Live(KeyState),
    /// A live record stopped the insert but was gone, or not yet visible, when read.
    Vanished,
}

/// Claims a batch of keys, and reads the live record of each key it could not claim, in
/// one statement.
struct ClaimMany {
    statements: Arc<Statements>,
    timeout: Duration,
}

#[async_trait]
impl Batched for ClaimMany {
    type Request = ClaimRequest;
    type Answer = Found;

    fn key(request: &ClaimRequest) -> &str {
        &request.key
    }

    /// A key claimed, or found live, by an earlier request of the batch is so for the
    /// repeats too.
    fn repeat(first: &ClaimRequest, answer: &Found) -> Option<Found> {
        match answer {
            Found::Claimed { now } => Some(Found::Live(KeyState::InFlight {
                claimed_at: unsigned(*now),
                lease_until: unsigned(now.saturating_add(first.lease_ms)),
                fingerprint: first.fingerprint,
            })),
            Found::Live(state) => Some(Found::Live(state.clone())),
            Found::Vanished => None,
        }
    }

    async fn run(
        &self,
        client: &Object,
        requests: Vec<&ClaimRequest>,
    ) -> Result<Vec<Found>, StoreError> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
        let owners: Vec<&str> = requests.iter().map(|r| r.owner.as_str()).collect();
        let leases: Vec<i64> = requests.iter().map(|r| r.lease_ms).collect();
        let hashes: Vec<&[u8]> = requests.iter().map(|r| r.fingerprint.as_slice()).collect();
        let params: [&(dyn ToSql + Sync); 4] = [&keys, &owners, &leases, &hashes];
        let rows = batch_query(client, &self.statements.claim_many, &params, self.timeout).await?;
        Ok(rows
            .iter()
            .map(|row| {
                if row.get("claimed") {
                    Found::Claimed {
                        now: row.get("now"),
                    }
                } else {
                    live_state(row).map_or(Found::Vanished, Found::Live)
                }
            })
            .collect())
    }
}

/// Whether `error` is the server breaking a deadlock, a serialization conflict or a lock
/// wait that ran out: another transaction was in the way, and trying again passes.
fn passes_when_tried_again(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        [
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::LOCK_NOT_AVAILABLE,
        ]
        .contains(code)
    })
}

/// How many times a batch's statement runs when the server aborts it to break a deadlock
/// or a serialization conflict.
const BATCH_ATTEMPTS: u32 = 3;

/// Runs a batch's statement (prepared once per connection) within `timeout`. Its keys
/// are in order, but the order rows are locked in is the plan's, which the batch cannot
/// choose: a statement the server aborts as a deadlock changed nothing, and runs again.
async fn batch_query(
    client: &Object,
    statement: &str,
    params: &[&(dyn ToSql + Sync)],
    timeout: Duration,
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    within("postgres", timeout, async {
        let prepared = client.prepare_cached(statement).await?;
        let mut attempt = 1;
        loop {
            match client.query(&prepared, params).await {
                Err(error) if attempt < BATCH_ATTEMPTS && passes_when_tried_again(&error) => {
                    tracing::debug!(%error, attempt, "a batch met another transaction; running it again");
                    // A moment apart, for the other transaction to take the rows the
                    // aborted one gave up: at once, the two could meet again the same way.
                    let pause = 20 * u64::from(attempt) + rand::random::<u64>() % 20;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    attempt += 1;
                }
                ran => return ran,
            }
        }
    })
    .await
}

/// A done mark waiting for its batch.
struct FinishRequest {
    key: String,
    owner: String,
    retention_ms: i64,
    upstream_status: i32,
    response_status: Option<i32>,
    content_type: Option<String>,
    body: Option<Bytes>,
    headers: Option<Vec<u8>>,
    announce: bool,
}

/// Marks a batch of owned keys done in one statement; answers whether each was still its
/// owner's.
struct FinishMany {
    statements: Arc<Statements>,
    timeout: Duration,
}

#[async_trait]
impl Batched for FinishMany {
    type Request = FinishRequest;
    type Answer = bool;

    fn key(request: &FinishRequest) -> &str {
        &request.key
    }

    /// Another owner's done mark for the same key needs its own statement.
    fn repeat(_: &FinishRequest, _: &bool) -> Option<bool> {
        None
    }

    async fn run(
        &self,
        client: &Object,
        requests: Vec<&FinishRequest>,
    ) -> Result<Vec<bool>, StoreError> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
        let owners: Vec<&str> = requests.iter().map(|r| r.owner.as_str()).collect();
        let retentions: Vec<i64> = requests.iter().map(|r| r.retention_ms).collect();
        let statuses: Vec<i32> = requests.iter().map(|r| r.upstream_status).collect();
        let response_statuses: Vec<Option<i32>> =
            requests.iter().map(|r| r.response_status).collect();
        let content_types: Vec<Option<&str>> =
            requests.iter().map(|r| r.content_type.as_deref()).collect();
        let bodies: Vec<Option<&[u8]>> = requests.iter().map(|r| r.body.as_deref()).collect();
        let announce: Vec<bool> = requests.iter().map(|r| r.announce).collect();
        let headers: Vec<Option<&[u8]>> = requests.iter().map(|r| r.headers.as_deref()).collect();
        let params: [&(dyn ToSql + Sync); 9] = [
            &keys,
            &owners,
            &retentions,
            &statuses,
            &response_statuses,
            &content_types,
            &bodies,
            &announce,
            &headers,
        ];
        let rows = batch_query(client, &self.statements.finish_many, &params, self.timeout).await?;
        // One request per key in a batch, so the key says which were finished.
        let finished: HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
        Ok(keys.iter().map(|key| finished.contains(*key)).collect())
    }
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

/// The driver's settings for `config`, and how its connections speak TLS.
fn driver(config: &PostgresConfig) -> Result<(deadpool_postgres::Config, Connector), StoreError> {
    let mut driver = deadpool_postgres::Config::new();
    driver.url = Some(driver_url(config.url.expose()));
    let connector = match config.ssl_mode {
        SslMode::Disable => {
            driver.ssl_mode = Some(deadpool_postgres::SslMode::Disable);
            Connector::Plain
        }
        mode => {
            // Never `prefer`: a server that will not speak TLS is refused, not used plain.
            driver.ssl_mode = Some(deadpool_postgres::SslMode::Require);
            let rustls = tls::postgres_config(mode, config.tls.as_ref())?;
            Connector::Tls(MakeRustlsConnect::new(rustls))
        }
    };
    Ok((driver, connector))
}

/// How connections speak to the server: as `sslmode` says.
#[derive(Clone)]
enum Connector {
    Plain,
    Tls(MakeRustlsConnect),
}

fn invalid_url(config: &PostgresConfig, error: &dyn Display) -> StoreError {
    StoreError::Backend(format!("postgres URL {}: {error}", config.url.masked()))
}

/// A pool of at most `size` connections, opened when first needed.
fn pool(config: &PostgresConfig, size: usize) -> Result<Pool, StoreError> {
    let (mut driver, connector) = driver(config)?;
    let mut limits = PoolConfig::new(size);
    limits.timeouts = Timeouts {
        wait: Some(config.timeout.0),
        create: Some(config.timeout.0),
        recycle: Some(config.timeout.0),
    };
    driver.pool = Some(limits);
    let builder = match connector {
        Connector::Plain => driver.builder(NoTls),
        Connector::Tls(tls) => driver.builder(tls),
    };
    builder
        .map_err(|error| invalid_url(config, &error))?
        .runtime(Runtime::Tokio1)
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .batch_execute(SESSION_SETTINGS)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .build()
        .map_err(|error| invalid_url(config, &error))
}

/// Where the connection that listens for announced outcomes goes, and what it listens on.
#[derive(Clone)]
struct Listener {
    server: tokio_postgres::Config,
    connector: Connector,
    channel: String,
    timeout: Duration,
}

/// Listens on the outcomes channel and passes each notified store key to `heard`, for
/// ever: a connection that fails is opened again, after a pause that grows up to 5 s
/// while the server does not answer.
async fn hear(listener: Listener, heard: Heard) {
    let mut pause = Duration::from_millis(100);
    loop {
        let server = &listener.server;
        let listened = match &listener.connector {
            Connector::Plain => listen(server.connect(NoTls), &listener, &heard, &mut pause).await,
            Connector::Tls(tls) => {
                listen(server.connect(tls.clone()), &listener, &heard, &mut pause).await
            }
        };
        if let Err(error) = listened {
            tracing::warn!(%error, "not listening for announced outcomes; waiters look at the store again from time to time");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// One connection's `LISTEN`, until it fails. A connection makes progress only while it
/// is polled, so its messages are read in the same loop that sends its statements.
async fn listen<S, T>(
    connecting: impl Future<
        Output = Result<
            (tokio_postgres::Client, tokio_postgres::Connection<S, T>),
            tokio_postgres::Error,
        >,
    >,
    listener: &Listener,
    heard: &Heard,
    pause: &mut Duration,
) -> Result<(), StoreError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let timeout = listener.timeout;
    let (client, mut connection) = within("postgres", timeout, connecting).await?;
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen = format!("LISTEN {}", listener.channel);
    let mut statement: Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> =
        Box::pin(within("postgres", timeout, client.batch_execute(&listen)));
    let mut checks = tokio::time::interval(LISTEN_CHECK);
    checks.tick().await;
    let mut listening = false;
    loop {
        tokio::select! {
            done = &mut statement => {
                done?;
                // Past a check, the connection has held for a while: a server that drops
                // it at once is not connected to again at once.
                if listening {
                    *pause = Duration::from_millis(100);
                }
                listening = true;
                // Nothing to send until the next check.
                statement = Box::pin(std::future::pending());
            }
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(notification))) => heard(notification.payload()),
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error.into()),
                None => return Err(StoreError::of("postgres", "the listening connection closed")),
            },
            _ = checks.tick() => {
                statement = Box::pin(within("postgres", timeout, client.batch_execute("")));
            }
        }
    }
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
        let statements = Arc::new(Statements::for_table(&config.table.0));
        let timeout = config.timeout.0;
        let mut each = Vec::new();
        let outside_size = match workers {
            None => config.pool_size,
            Some(workers) => {
                let share = config.pool_size.div_ceil(workers.count()).max(1);
                for index in 0..workers.count() {
                    let (pool, statements) = (pool(config, share)?, Arc::clone(&statements));
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
        let outside = Lane::start(pool(config, outside_size)?, &statements, timeout);
        let (driver, connector) = driver(config)?;
        let server = driver
            .get_pg_config()
            .map_err(|error| invalid_url(config, &error))?;
        let store = PostgresStore {
            lanes: PerWorker::new(outside, each),
            timeout,
            statements,
            listener: Listener {
                server,
                connector,
                channel: outcomes_channel(&config.table.0),
                timeout,
            },
            stop_hearing: CancellationToken::new(),
        };
        let prepared = async {
            let mut client = store.lanes.get().pool.get().await?;
            schema::prepare(&mut client, &config.table.0).await
        };
        prepared
            .await
            .map_err(|error| error.context(&format!("cannot prepare postgres at {url}")))?;
        Ok(store)
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
        let client = self.lanes.get().pool.get().await?;
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
        Ok(rows.first().and_then(live_state))
    }
}

/// The record in `row` (the columns `Statements::current` and `claim_many` both return),
/// unless there is none or it has expired by the row's `now`.
fn live_state(row: &tokio_postgres::Row) -> Option<KeyState> {
    let (state, expires_at, now): (Option<String>, Option<i64>, i64) =
        (row.get("state"), row.get("expires_at"), row.get("now"));
    let (state, expires_at) = (state?, expires_at?);
    if expires_at <= now {
        return None;
    }
    let fingerprint: Fingerprint = row
        .get::<_, Vec<u8>>("body_sha256")
        .try_into()
        .unwrap_or([0; 32]);
    let claimed_at = unsigned(row.get("claimed_at"));
    Some(match state.as_str() {
        "in_flight" => KeyState::InFlight {
            claimed_at,
            lease_until: unsigned(expires_at),
            fingerprint,
        },
        "held" => KeyState::Held(HeldRecord {
            claimed_at,
            held_at: unsigned(row.get::<_, Option<i64>>("completed_at").unwrap_or(0)),
            expires_at: unsigned(expires_at),
            fingerprint,
            reason: row
                .get::<_, Option<String>>("hold_reason")
                .as_deref()
                .and_then(Ambiguity::parse)
                .unwrap_or(Ambiguity::UpstreamTimeout),
        }),
        _ => {
            let response = row.get::<_, Option<i32>>("response_status").map(|status| {
                RecordedResponse::read_back(
                    status,
                    row.get("response_headers"),
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
    })
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
            match self.bounded(self.lanes.get().claims.call(request)).await? {
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
        state: Option<StateFilter>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let prefix = format!("{namespace}:");
        let state = state.map(|state| match state {
            StateFilter::InFlight => "in_flight",
            StateFilter::Done => "done",
            StateFilter::Held => "held",
        });
        // One more than asked for, to know whether a next page exists.
        let wanted = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let after = after.unwrap_or("");
        let rows = if state == Some("held") {
            let params: [&(dyn ToSql + Sync); 3] = [&prefix, &after, &wanted];
            self.query(&self.statements.list_held, &params).await?
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

    fn hear_outcomes(&self, heard: Heard) {
        let (listener, stop) = (self.listener.clone(), self.stop_hearing.clone());
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

    fn done_keys(&self) -> Option<u64> {
        None
    }
}
