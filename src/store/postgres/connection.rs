//! How the PostgreSQL store reaches its server: the driver's settings and TLS, the pools,
//! and how the store's statements (`statements.rs`) are sent: prepared once per
//! connection or, through a pooler that keeps no session, unnamed with their parameters'
//! types.

use std::fmt::Display;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Object, Pool, PoolConfig, Runtime, Timeouts, Transaction,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{NoTls, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::settings::{PostgresConfig, ServerUrl, SslMode, driver_url};
use crate::store::{StoreError, tls, within};

/// How a connection of the statement pools plans, when statements are prepared. Every
/// statement of `statements.rs` finds its rows through an index, and is planned once: a
/// batch's plan does not depend on how many keys it carries, and planning it again for
/// each batch would cost more than running it. A cached plan is made with the table's
/// size at that moment: made on a new, empty table it would scan the whole table, and keep
/// doing so as the table grows, so such scans are ruled out.
const SESSION_SETTINGS: &str = "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan";

/// How statements are sent on a connection of the statement pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sending {
    /// The connection is a session of its own: statements are prepared once per
    /// connection and planned as [`SESSION_SETTINGS`] says.
    Prepared,
    /// The connection goes, or may go, through a pooler in transaction mode
    /// ([`sessions`]): each transaction may run in a session that other clients use
    /// next, so nothing is left in one: statements travel unnamed with their parameters'
    /// types, and are planned each time with the table's size at that time.
    Unnamed,
}

/// What the store may leave in the server sessions it uses, decided at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sessions {
    /// How statements are sent on the statement pools.
    pub(super) sending: Sending,
    /// Whether [`direct_or_url`] reaches a session of the store's own, as `LISTEN` and
    /// the index build's session lock need: not through a pooler without `direct_url`.
    pub(super) own_session: bool,
}

/// What the store may leave in sessions, from `config` and `client`, a connection on
/// [`direct_or_url`] that has run nothing yet. With `direct_url`, statements travel
/// unnamed on `url` and the rest goes to the server itself. Without it, a `url` whose
/// server was reached on another port than the URL's, or over its Unix socket, may be a
/// pooler in transaction mode, whose sessions other clients share next: then nothing is
/// left in them (no setting, no prepared statement, no `LISTEN`, no session lock), and
/// the log says to set `direct_url`. A port that is only mapped (a container's) costs
/// the prepared statements and the notifications, never a start.
pub(super) async fn sessions(
    config: &PostgresConfig,
    client: &Object,
) -> Result<Sessions, StoreError> {
    if config.direct_url.is_some() {
        return Ok(Sessions {
            sending: Sending::Unnamed,
            own_session: true,
        });
    }
    let Some(reached) = elsewhere(config, client).await? else {
        return Ok(Sessions {
            sending: Sending::Prepared,
            own_session: true,
        });
    };
    tracing::warn!(
        url = %config.url.masked(),
        "the PostgreSQL server was reached on {reached}: `url` may go through a pooler in transaction mode (PgBouncer's pool_mode = transaction, Supavisor's port 6543), whose sessions other clients share, so this proxy leaves nothing in them: statements are not prepared, waiters are not told of outcomes (they look at the store again from time to time) and a table from an earlier version does not get its state indexes; set `direct_url` to the server itself for all of them (a pooler on the server's own port is not told apart: set `direct_url` there too)"
    );
    Ok(Sessions {
        sending: Sending::Unnamed,
        own_session: false,
    })
}

/// A statement's text and its parameters' types, and how it is sent.
pub(super) struct Sql {
    pub(super) text: String,
    pub(super) types: &'static [Type],
    pub(super) sending: Sending,
}

impl Sql {
    /// Runs the statement on `client`, returning its rows.
    pub(super) async fn query(
        &self,
        client: &Object,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self.sending {
            Sending::Prepared => {
                let prepared = client.prepare_cached(&self.text).await?;
                client.query(&prepared, params).await
            }
            Sending::Unnamed => client.query_typed(&self.text, &self.typed(params)).await,
        }
    }

    /// Runs the statement on `client`, returning how many rows it changed.
    pub(super) async fn execute(
        &self,
        client: &Object,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self.sending {
            Sending::Prepared => {
                let prepared = client.prepare_cached(&self.text).await?;
                client.execute(&prepared, params).await
            }
            Sending::Unnamed => client.execute_typed(&self.text, &self.typed(params)).await,
        }
    }

    /// Runs the statement in `transaction`, returning how many rows it changed.
    pub(super) async fn execute_in(
        &self,
        transaction: &Transaction<'_>,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self.sending {
            Sending::Prepared => {
                let prepared = transaction.prepare_cached(&self.text).await?;
                transaction.execute(&prepared, params).await
            }
            Sending::Unnamed => {
                transaction
                    .execute_typed(&self.text, &self.typed(params))
                    .await
            }
        }
    }

    fn typed<'a>(&self, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        debug_assert_eq!(params.len(), self.types.len(), "{}", self.text);
        params
            .iter()
            .copied()
            .zip(self.types.iter().cloned())
            .collect()
    }
}

/// Whether `error` is the server breaking a deadlock, a serialization conflict or a lock
/// wait that ran out: another transaction was in the way, and trying again passes.
pub(super) fn passes_when_tried_again(error: &tokio_postgres::Error) -> bool {
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

/// Runs a batch's statement within `timeout`. Its keys are in order, but the order rows
/// are locked in is the plan's, which the batch cannot choose: a statement the server
/// aborts as a deadlock changed nothing, and runs again.
pub(super) async fn batch_query(
    client: &Object,
    statement: &Sql,
    params: &[&(dyn ToSql + Sync)],
    timeout: Duration,
) -> Result<Vec<Row>, StoreError> {
    within("postgres", timeout, async {
        let mut attempt = 1;
        loop {
            match statement.query(client, params).await {
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

/// The driver's settings for `url`, and how its connections speak TLS.
pub(super) fn driver(
    config: &PostgresConfig,
    url: &ServerUrl,
) -> Result<(deadpool_postgres::Config, Connector), StoreError> {
    let mut driver = deadpool_postgres::Config::new();
    driver.url = Some(driver_url(url.expose()));
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
pub(super) enum Connector {
    Plain,
    Tls(MakeRustlsConnect),
}

pub(super) fn invalid_url(url: &ServerUrl, error: &dyn Display) -> StoreError {
    StoreError::Backend(format!("postgres URL {}: {error}", url.masked()))
}

/// The URL for what needs a session of its own (the schema's locks, `LISTEN`):
/// `direct_url`, the server itself, else `url` (see [`sessions`] for when that is used).
pub(super) fn direct_or_url(config: &PostgresConfig) -> &ServerUrl {
    config
        .direct_url
        .as_ref()
        .map_or(&config.url, |direct| &direct.0)
}

/// A pool of at most `size` connections for statements sent as `sending` says, opened
/// when first needed.
pub(super) fn pool(
    config: &PostgresConfig,
    size: usize,
    sending: Sending,
) -> Result<Pool, StoreError> {
    pool_at(config, &config.url, size, sending)
}

/// One connection on [`direct_or_url`]: the schema's steps at start
/// (the planner settings are not for them).
pub(super) fn schema_pool(config: &PostgresConfig) -> Result<Pool, StoreError> {
    pool_at(config, direct_or_url(config), 1, Sending::Unnamed)
}

/// A pool on `url`; its connections take [`SESSION_SETTINGS`] when statements are
/// prepared on them.
fn pool_at(
    config: &PostgresConfig,
    url: &ServerUrl,
    size: usize,
    sending: Sending,
) -> Result<Pool, StoreError> {
    let (mut driver, connector) = driver(config, url)?;
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
    let builder = builder
        .map_err(|error| invalid_url(url, &error))?
        .runtime(Runtime::Tokio1);
    let builder = if sending == Sending::Prepared {
        builder.post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .batch_execute(SESSION_SETTINGS)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
    } else {
        builder
    };
    builder.build().map_err(|error| invalid_url(url, &error))
}

/// Where the server was reached, if not on the port `url` names: another port, or its
/// Unix socket (a pooler, or a port mapped on the way). `None` for a `url` of several
/// hosts or a socket, which names no one port.
async fn elsewhere(config: &PostgresConfig, client: &Object) -> Result<Option<String>, StoreError> {
    let Ok(server) = driver(config, &config.url)?.0.get_pg_config() else {
        return Ok(None);
    };
    let one_tcp_host = matches!(server.get_hosts(), [tokio_postgres::config::Host::Tcp(_)]);
    if !one_tcp_host {
        return Ok(None);
    }
    let port = server.get_ports().first().copied().unwrap_or(5432);
    // A simple query: behind a pooler, a prepared one may not be found.
    let reached = first_value(client, "SELECT inet_server_port()").await?;
    let reached: Option<i32> = reached.and_then(|port| port.parse().ok());
    if reached == Some(i32::from(port)) {
        return Ok(None);
    }
    Ok(Some(reached.map_or_else(
        || format!("its Unix socket, not the URL's port {port}"),
        |reached| format!("port {reached}, not the URL's port {port}"),
    )))
}

/// Warns when the sessions this proxy's statements run in do not wait for their commits
/// to reach the server's disk (`synchronous_commit = off`, set for the server, database
/// or role): then a crash of the database's host can lose done marks and queued jobs
/// that were acknowledged. The proxy never changes the setting itself.
pub(super) async fn warn_if_commits_unsynced(
    config: &PostgresConfig,
    client: &Object,
) -> Result<(), StoreError> {
    let setting = first_value(client, "SELECT current_setting('synchronous_commit')").await?;
    if setting.as_deref() == Some("off") {
        tracing::warn!(
            url = %config.url.masked(),
            "PostgreSQL runs this proxy's sessions with synchronous_commit = off: a commit is answered before it is on the server's disk, so a crash of the database's host can lose done marks and queued jobs acknowledged in its last moments; set synchronous_commit = on for this database or role (ALTER ROLE ... SET synchronous_commit = on)"
        );
    }
    Ok(())
}

/// Refuses a `direct_url` that reaches another server or database than `url`: the
/// schema made there and the outcomes heard there would not be `url`'s, and every claim
/// would fail (or, with `on_store_error: forward`, go undeduplicated).
pub(super) async fn same_server(pooled: &Object, direct: &Object) -> Result<(), StoreError> {
    const WHICH: &str =
        "SELECT current_database() || ' on the server started at ' || pg_postmaster_start_time()";
    let pooled = first_value(pooled, WHICH).await?;
    let direct = first_value(direct, WHICH).await?;
    if pooled != direct {
        return Err(StoreError::Backend(format!(
            "`url` and `direct_url` reach different databases: {} and {}",
            pooled.unwrap_or_default(),
            direct.unwrap_or_default()
        )));
    }
    Ok(())
}

/// The first column of the first row of a simple query (no prepared statement).
async fn first_value(client: &Object, query: &str) -> Result<Option<String>, StoreError> {
    let messages = client.simple_query(query).await?;
    Ok(messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
            _ => None,
        })
        .flatten())
}
