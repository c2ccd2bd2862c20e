//! The claims table's schema: made at a replica's start, or brought up to date from an
//! earlier version's. Replicas start together (a Deployment rolling out), so every step
//! here may meet another replica's same step: the table's changes run one replica at a
//! time under a transaction lock, the held index is built by whichever replica takes its
//! lock first (the others ask again until it is built; not at all without a session of
//! the store's own, behind a pooler), and a step the server aborted to break a deadlock or
//! a lock wait is tried again, a bounded number of times.

use std::time::Duration;

use deadpool_postgres::Object;

use super::connection::passes_when_tried_again;
use super::statements::{entities_table, minutes_table, replicas_table};
use crate::store::StoreError;

/// How many times a start tries the schema steps when another replica's get in the way.
const ATTEMPTS: u32 = 5;

/// Creates the claims table and its entities' table, or brings those of an earlier
/// version up to date, keeping their records. The state indexes of an earlier version's
/// table are built only on a session of the store's own (their lock is a session's).
pub(super) async fn prepare(
    client: &mut Object,
    table: &str,
    own_session: bool,
) -> Result<(), StoreError> {
    let mut attempt = 1;
    loop {
        let prepared = match update_tables(client, table).await {
            Ok(()) if own_session => build_state_indexes(client, table).await,
            Ok(()) => Ok(()),
            Err(error) => Err(error),
        };
        match prepared {
            Ok(()) => return Ok(()),
            Err(error) if attempt < ATTEMPTS && passes_when_tried_again(&error) => {
                tracing::info!(
                    table,
                    attempt,
                    %error,
                    "the schema step met another replica's; trying again"
                );
                // Apart in time, so that the replicas that met do not meet again.
                let pause = 50 * u64::from(attempt) + rand::random::<u64>() % 100;
                tokio::time::sleep(Duration::from_millis(pause)).await;
                attempt += 1;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// The tables, columns, constraint and plain indexes, in one transaction. A table that
/// is up to date is not locked: each change runs only where it is missing, and waits at
/// most 10 s for the table's lock rather than hold every replica's claims up behind it.
/// A table made here gets its held index at once (it is empty: nothing to block).
async fn update_tables(client: &mut Object, table: &str) -> Result<(), tokio_postgres::Error> {
    let transaction = client.transaction().await?;
    transaction
        .batch_execute(
            "SELECT pg_advisory_xact_lock(hashtext('dedupe-proxy schema'));
             SET LOCAL lock_timeout = '10s';",
        )
        .await?;
    let existed: bool = transaction
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    transaction.batch_execute(&create_claims(table)).await?;
    if !existed {
        for state in INDEXED_STATES {
            transaction
                .batch_execute(&create_state_index(table, state, ""))
                .await?;
        }
    }
    transaction.batch_execute(&upgrade_claims(table)).await?;
    transaction.batch_execute(&create_entities(table)).await?;
    transaction
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (
               id text PRIMARY KEY,
               seen_at bigint NOT NULL,
               report text NOT NULL
             )",
            replicas_table(table)
        ))
        .await?;
    transaction
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (
               minute bigint NOT NULL,
               replica text NOT NULL,
               figures text NOT NULL,
               PRIMARY KEY (minute, replica)
             )",
            minutes_table(table)
        ))
        .await?;
    transaction
        .batch_execute(&super::queue::create_tables(table))
        .await?;
    transaction
        .batch_execute(&super::log::create_table(table))
        .await?;
    transaction.commit().await
}

/// The claims table, as this version makes it.
fn create_claims(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
           key text PRIMARY KEY,
           state text NOT NULL CONSTRAINT dedupe_claim_state
             CHECK (state IN ('in_flight', 'done', 'held')),
           owner text,
           claimed_at bigint NOT NULL,
           expires_at bigint NOT NULL,
           completed_at bigint,
           upstream_status integer,
           body_sha256 bytea NOT NULL,
           response_status integer,
           response_content_type text,
           response_body bytea,
           response_headers bytea,
           hold_reason text
         )"
    )
}

/// Brings an earlier version's claims table up to date, each change only where it is
/// missing: the expiry index, the `hold_reason` and `response_headers` columns, and the
/// state check, whose two-state form on a table made before `held` existed gives way
/// (NOT VALID: every row passes the new one, none is read).
fn upgrade_claims(table: &str) -> String {
    format!(
        "DO $$
         DECLARE old record;
         BEGIN
           IF to_regclass('{table}_expires_at') IS NULL THEN
             CREATE INDEX {table}_expires_at ON {table} (expires_at);
           END IF;
           IF NOT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = '{table}'::regclass
                            AND attname = 'hold_reason' AND NOT attisdropped) THEN
             ALTER TABLE {table} ADD COLUMN hold_reason text;
           END IF;
           IF NOT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = '{table}'::regclass
                            AND attname = 'response_headers' AND NOT attisdropped) THEN
             ALTER TABLE {table} ADD COLUMN response_headers bytea;
           END IF;
           IF NOT EXISTS (SELECT 1 FROM pg_constraint
                          WHERE conrelid = '{table}'::regclass
                            AND conname = 'dedupe_claim_state') THEN
             FOR old IN SELECT conname FROM pg_constraint
                        WHERE conrelid = '{table}'::regclass AND contype = 'c'
                          AND pg_get_constraintdef(oid) LIKE '%in_flight%' LOOP
               EXECUTE format('ALTER TABLE {table} DROP CONSTRAINT %I', old.conname);
             END LOOP;
             ALTER TABLE {table} ADD CONSTRAINT dedupe_claim_state
               CHECK (state IN ('in_flight', 'done', 'held')) NOT VALID;
           END IF;
         END $$;"
    )
}

/// The entities' table beside the claims table, and its expiry index.
fn create_entities(table: &str) -> String {
    let entities = entities_table(table);
    let expiry_index = format!("{}_entity_expiry", &table[..table.len().min(50)]);
    format!(
        "CREATE TABLE IF NOT EXISTS {entities} (
           key text PRIMARY KEY,
           sort_key text COLLATE \"C\" NOT NULL,
           version text NOT NULL,
           recorded_at bigint NOT NULL,
           expires_at bigint NOT NULL
         );
         DO $$
         BEGIN
           IF to_regclass('{expiry_index}') IS NULL THEN
             CREATE INDEX {expiry_index} ON {entities} (expires_at);
           END IF;
         END $$;"
    )
}

/// The states whose keys have a partial index of their own: few keys among many done
/// ones, listed and counted by the admin API (held keys; keys in flight, which a
/// clearing counts first).
const INDEXED_STATES: [&str; 2] = ["held", "in_flight"];

fn create_state_index(table: &str, state: &str, how: &str) -> String {
    format!("CREATE INDEX {how} {table}_{state} ON {table} (key) WHERE state = '{state}'")
}

/// The partial indexes of [`INDEXED_STATES`] on a table that lacks one. Each is built
/// without blocking writes (`CONCURRENTLY`, which cannot run in a transaction) under a
/// session lock, which the others wait for by asking again every [`LOCK_POLL`], outside
/// any statement: a replica waiting inside one would be among the transactions the build
/// waits for, a deadlock (the lock's key is the one earlier versions take, so that they
/// build in turn too). After [`LOCK_WAIT`], a replica starts without them: they only speed
/// up listing. A build that failed half-way left an invalid index, made again.
async fn build_state_indexes(client: &Object, table: &str) -> Result<(), tokio_postgres::Error> {
    let mut missing = Vec::new();
    for state in INDEXED_STATES {
        if state_index_valid(client, table, state).await? != Some(true) {
            missing.push(state);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let lock = "hashtext('dedupe-proxy held index')";
    let waiting = tokio::time::Instant::now();
    loop {
        let taken: bool = client
            .query_one(&format!("SELECT pg_try_advisory_lock({lock})"), &[])
            .await?
            .get(0);
        if taken {
            break;
        }
        if waiting.elapsed() >= LOCK_WAIT {
            tracing::warn!(
                table,
                "another replica has been building an index for {LOCK_WAIT:?}; starting without the held and in-flight keys' indexes (the next start builds them)"
            );
            return Ok(());
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    let built = async {
        for state in missing {
            match state_index_valid(client, table, state).await? {
                Some(true) => continue,
                Some(false) => {
                    client
                        .batch_execute(&format!("DROP INDEX CONCURRENTLY {table}_{state}"))
                        .await?;
                }
                None => {}
            }
            client
                .batch_execute(&create_state_index(table, state, "CONCURRENTLY"))
                .await?;
        }
        Ok(())
    }
    .await;
    let unlocked = client
        .batch_execute(&format!("SELECT pg_advisory_unlock({lock})"))
        .await;
    built?;
    unlocked
}

/// How often a replica asks for the index build's lock, and for how long at most.
const LOCK_POLL: Duration = Duration::from_millis(100);
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// Whether the partial index of `state` is valid; `None` when there is none.
async fn state_index_valid(
    client: &Object,
    table: &str,
    state: &str,
) -> Result<Option<bool>, tokio_postgres::Error> {
    let valid = format!(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass('{table}_{state}')"
    );
    Ok(client
        .query(&valid, &[])
        .await?
        .first()
        .map(|row| row.get(0)))
}
