//! Listening for the outcomes of announced claims: one connection per store, opened again
//! when it fails, which also keeps the server's notification queue from filling.
//!
//! The server keeps every notification until each listening session has read past it.
//! A replica that stops reading (frozen, cut off with its connection still open) would
//! let the queue fill, and once it is full every transaction that notifies fails, on
//! every replica and for every application on the server. So each listener, at each
//! check, ends the sessions of stalled listeners: those of this program, under the same
//! role, idle for longer than three checks (a live listener's checks keep it from that)
//! and blocked writing to their client, while the queue is past [`QUEUE_BOUND`]. A
//! replica whose listener was ended listens again when it runs again. Where the server
//! refuses the check (its functions revoked), the listener warns once and only listens.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls};

use super::connection::{Connector, direct_or_url, driver, invalid_url};
use super::statements::outcomes_channel;
use crate::store::settings::PostgresConfig;
use crate::store::{Heard, StoreError, within};

/// How often the listening connection is checked: a connection that died without a word
/// would otherwise leave waiters to their rechecks for good, and a stalled listener
/// elsewhere would go on filling the queue.
const LISTEN_CHECK: Duration = Duration::from_secs(10);

/// How long a listener may have sent no statement before it counts as stalled: three
/// checks.
const STALLED_AFTER_S: u64 = 3 * LISTEN_CHECK.as_secs();

/// How a listening connection names itself (`application_name`), for other replicas'
/// checks to find.
pub(super) const APPLICATION_NAME: &str = "dedupe-proxy listener";

/// The share of the notification queue past which a stalled listener is ended: 8 MB of
/// PostgreSQL's default 8 GB, far beyond what listeners that read ever leave behind.
const QUEUE_BOUND: f64 = 0.001;

/// The statement that ends the sessions of listeners that stopped reading while the
/// queue is past the bound, answering their process ids.
fn end_stalled_listeners_sql() -> String {
    format!(
        "WITH stalled AS MATERIALIZED (
           SELECT pid FROM pg_stat_activity
           WHERE application_name = '{APPLICATION_NAME}' AND usename = current_user
             AND pid <> pg_backend_pid() AND wait_event = 'ClientWrite'
             AND state = 'idle' AND state_change < now() - interval '{STALLED_AFTER_S} seconds'
             AND pg_notification_queue_usage() >= {QUEUE_BOUND})
         SELECT pid FROM stalled WHERE pg_terminate_backend(pid)"
    )
}

/// Where the connection that listens for announced outcomes goes, and what it listens on.
#[derive(Clone)]
pub(super) struct Listener {
    server: tokio_postgres::Config,
    connector: Connector,
    channel: String,
    timeout: Duration,
}

impl Listener {
    /// On [`direct_or_url`] (made only where that is a session of the store's own), under
    /// a name other replicas' checks find.
    pub(super) fn new(config: &PostgresConfig) -> Result<Listener, StoreError> {
        let url = direct_or_url(config);
        let (driver, connector) = driver(config, url)?;
        let mut server = driver
            .get_pg_config()
            .map_err(|error| invalid_url(url, &error))?;
        server.application_name(APPLICATION_NAME);
        Ok(Listener {
            server,
            connector,
            channel: outcomes_channel(&config.table.0),
            timeout: config.timeout.0,
        })
    }
}

/// Listens on the outcomes channel and passes each notified store key to `heard`, for
/// ever: a connection that fails is opened again, after a pause that grows up to 5 s
/// while the server does not answer.
pub(super) async fn hear(listener: Listener, heard: Heard) {
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
    let stalled = end_stalled_listeners_sql();
    let (client, mut connection) = within("postgres", timeout, connecting).await?;
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen = format!("LISTEN {}", listener.channel);
    // Each statement answers whether the server takes the queue's check.
    let mut statement: Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send + '_>> =
        Box::pin(within("postgres", timeout, async {
            client.batch_execute(&listen).await.map(|()| true)
        }));
    let mut checks = tokio::time::interval(LISTEN_CHECK);
    checks.tick().await;
    let mut listening = false;
    let mut bounding = true;
    loop {
        tokio::select! {
            done = &mut statement => {
                bounding &= done?;
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
                statement = if bounding {
                    Box::pin(within("postgres", timeout, end_stalled_listeners(&client, &stalled)))
                } else {
                    Box::pin(within("postgres", timeout, async {
                        client.batch_execute("").await.map(|()| false)
                    }))
                };
            }
        }
    }
}

/// Ends stalled listeners' sessions (see the module's doc), which also shows that this
/// connection still answers; answers false if the server refuses the check.
async fn end_stalled_listeners(
    client: &tokio_postgres::Client,
    stalled: &str,
) -> Result<bool, tokio_postgres::Error> {
    let messages = match client.simple_query(stalled).await {
        Ok(messages) => messages,
        // The server answered, refusing the statement: the connection is sound.
        Err(error) if error.code().is_some() => {
            tracing::warn!(%error, "cannot bound the server's notification queue from here (listening goes on): a replica that stops reading could fill it");
            return Ok(false);
        }
        Err(error) => return Err(error),
    };
    for message in messages {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = message {
            let pid = row.get(0).unwrap_or_default();
            tracing::warn!(
                pid,
                "ended a replica's listening session that stopped reading while the server's notification queue filled; that replica listens again when it runs again"
            );
        }
    }
    Ok(true)
}
