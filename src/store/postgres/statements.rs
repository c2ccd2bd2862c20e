//! The statements the PostgreSQL store runs, with the table's name filled in once, and
//! each with its parameters' types (which a pooler that keeps no prepared statement needs).

use tokio_postgres::types::Type;

use super::connection::{Sending, Sql};
use crate::store::RESOLVED_STATUS;
use crate::store::minutes::MINUTE_MAX;

/// The database's time in milliseconds since the Unix epoch. A statement that writes two
/// times reads it once (a `now` CTE): the wall clock can step back between two reads, and
/// a record whose expiry came before its own start would break its invariants.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The columns of a record, as `record.rs` reads them.
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
pub(super) fn outcomes_channel(table: &str) -> String {
    beside(table, "_outcomes")
}

/// The table of entities' records beside `table`, its name cut to fit PostgreSQL's
/// 63-byte names.
pub(super) fn entities_table(table: &str) -> String {
    beside(table, "_entities")
}

/// The table of the replicas' reports beside `table`.
pub(super) fn replicas_table(table: &str) -> String {
    beside(table, "_replicas")
}

/// The table of the replicas' figures per minute beside `table`.
pub(super) fn minutes_table(table: &str) -> String {
    beside(table, "_minutes")
}

/// `table` (its first 54 bytes: names are ASCII) followed by `suffix`.
pub(super) fn beside(table: &str, suffix: &str) -> String {
    format!("{}{suffix}", &table[..table.len().min(54)])
}

/// The statements, with the table name filled in once.
pub(super) struct Statements {
    pub(super) claim_many: Sql,
    pub(super) current: Sql,
    pub(super) finish_many: Sql,
    pub(super) release: Sql,
    pub(super) release_many: Sql,
    pub(super) renew: Sql,
    pub(super) hold: Sql,
    pub(super) resolve_done: Sql,
    pub(super) resolve_release: Sql,
    pub(super) list: Sql,
    pub(super) list_held: Sql,
    pub(super) list_in_flight: Sql,
    pub(super) forget_done: Sql,
    pub(super) set_expiry: Sql,
    pub(super) count_held: Sql,
    pub(super) state_of: Sql,
    pub(super) sweep: Sql,
    pub(super) newest_version: Sql,
    pub(super) record_version: Sql,
    pub(super) forget_entity: Sql,
    pub(super) sweep_entities: Sql,
    pub(super) report_replica: Sql,
    pub(super) replicas: Sql,
    pub(super) forget_replicas: Sql,
    pub(super) record_minute: Sql,
    pub(super) minutes: Sql,
    pub(super) forget_minutes: Sql,
}

impl Statements {
    pub(super) fn for_table(table: &str, sending: Sending) -> Statements {
        let sql = |(types, text): (&'static [Type], String)| Sql {
            text,
            types,
            sending,
        };
        let channel = outcomes_channel(table);
        let entities = entities_table(table);
        let replicas = replicas_table(table);
        let minutes = minutes_table(table);
        Statements {
            claim_many: sql(claim_many(table)),
            current: sql(current(table)),
            hold: sql(hold(table, &channel)),
            resolve_done: sql(resolve_done(table)),
            resolve_release: sql(resolve_release(table)),
            list: sql(list(table)),
            list_held: sql(list_in_state(table, "held")),
            list_in_flight: sql(list_in_state(table, "in_flight")),
            finish_many: sql(finish_many(table, &channel)),
            release: sql(release(table, &channel)),
            release_many: sql(release_many(table)),
            renew: sql(renew(table)),
            forget_done: sql(forget_done(table)),
            set_expiry: sql(set_expiry(table)),
            count_held: sql(count_held(table)),
            state_of: sql(state_of(table)),
            sweep: sql(sweep(table)),
            newest_version: sql(newest_version(&entities)),
            record_version: sql(record_version(&entities)),
            forget_entity: sql(forget_entity(&entities)),
            sweep_entities: sql(sweep(&entities)),
            report_replica: sql((
                &[Type::TEXT, Type::INT8, Type::TEXT],
                format!(
                    "INSERT INTO {replicas} (id, seen_at, report) VALUES ($1, $2, $3)
                     ON CONFLICT (id) DO UPDATE SET seen_at = $2, report = $3"
                ),
            )),
            replicas: sql((&[], format!("SELECT report FROM {replicas}"))),
            forget_replicas: sql((
                &[Type::INT8],
                format!("DELETE FROM {replicas} WHERE seen_at < $1"),
            )),
            record_minute: sql((
                &[Type::TEXT, Type::INT8, Type::TEXT],
                format!(
                    "INSERT INTO {minutes} (replica, minute, figures) VALUES ($1, $2, $3)
                     ON CONFLICT (minute, replica) DO UPDATE SET figures = $3"
                ),
            )),
            minutes: sql((
                &[Type::INT8, Type::INT8],
                format!(
                    "SELECT figures FROM {minutes} WHERE minute >= $1 AND octet_length(figures) <= {MINUTE_MAX}
                     ORDER BY minute DESC LIMIT $2"
                ),
            )),
            forget_minutes: sql((
                &[Type::INT8],
                // By the server's clock, which every replica shares: one whose own runs
                // ahead would drop the others' minutes.
                format!(
                    "DELETE FROM {minutes}
                     WHERE minute < (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $1"
                ),
            )),
        }
    }
}

fn claim_many(table: &str) -> (&'static [Type], String) {
    (
        &[
            Type::TEXT_ARRAY,
            Type::TEXT_ARRAY,
            Type::INT8_ARRAY,
            Type::BYTEA_ARRAY,
        ],
        format!(
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
    )
}

fn current(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT],
        format!("SELECT {RECORD}, {NOW_MS} AS now FROM {table} WHERE key = $1"),
    )
}

fn hold(table: &str, channel: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::TEXT, Type::INT8, Type::TEXT, Type::BOOL],
        format!(
            "WITH now AS (SELECT {NOW_MS} AS ms),
         held AS (
           UPDATE {table} SET state = 'held', owner = NULL, completed_at = now.ms,
                  expires_at = now.ms + $3, hold_reason = $4
           FROM now WHERE key = $1 AND owner = $2 AND state = 'in_flight'
           RETURNING key)
         SELECT key, CASE WHEN $5 THEN pg_notify('{channel}', key) END FROM held"
        ),
    )
}

fn resolve_done(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::INT8],
        format!(
            "WITH now AS (SELECT {NOW_MS} AS ms)
         UPDATE {table} SET state = 'done', completed_at = now.ms,
                expires_at = now.ms + $2, upstream_status = {RESOLVED_STATUS},
                hold_reason = NULL
         FROM now WHERE key = $1 AND state = 'held' AND expires_at > now.ms"
        ),
    )
}

fn resolve_release(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT],
        format!("DELETE FROM {table} WHERE key = $1 AND state = 'held' AND expires_at > {NOW_MS}"),
    )
}

/// A key that starts with the namespace's prefix sorts at or after it in any
/// collation, so the walk of the key's index begins there.
fn list(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::TEXT, Type::TEXT, Type::INT8],
        format!(
            "SELECT key, {LISTED}, {NOW_MS} AS now FROM {table}
         WHERE starts_with(key, $1) AND key >= $1 AND key > $2
           AND expires_at > {NOW_MS} AND ($3::text IS NULL OR state = $3)
         ORDER BY key LIMIT $4"
        ),
    )
}

/// The keys of one indexed state (`held` or `in_flight`) alone, through its partial
/// index (the generic plan of `list` cannot know what `$3` is).
fn list_in_state(table: &str, state: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::TEXT, Type::INT8],
        format!(
            "SELECT key, {LISTED}, {NOW_MS} AS now FROM {table}
         WHERE state = '{state}' AND starts_with(key, $1) AND key >= $1 AND key > $2
           AND expires_at > {NOW_MS}
         ORDER BY key LIMIT $3"
        ),
    )
}

fn finish_many(table: &str, channel: &str) -> (&'static [Type], String) {
    (
        &[
            Type::TEXT_ARRAY,
            Type::TEXT_ARRAY,
            Type::INT8_ARRAY,
            Type::INT4_ARRAY,
            Type::INT4_ARRAY,
            Type::TEXT_ARRAY,
            Type::BYTEA_ARRAY,
            Type::BOOL_ARRAY,
            Type::BYTEA_ARRAY,
        ],
        format!(
            "WITH now AS (SELECT {NOW_MS} AS ms),
         done AS (UPDATE {table} AS t SET state = 'done', completed_at = now.ms,
                expires_at = now.ms + f.retention, upstream_status = f.upstream_status,
                response_status = f.response_status,
                response_content_type = f.response_content_type,
                response_body = f.response_body,
                response_headers = f.response_headers, owner = NULL
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::int[],
                     $6::text[], $7::bytea[], $8::bool[], $9::bytea[])
           AS f(key, owner, retention, upstream_status, response_status,
                response_content_type, response_body, announce, response_headers),
           now
         WHERE t.key = f.key AND t.owner = f.owner AND t.state = 'in_flight'
         RETURNING t.key, f.announce)
         SELECT key, CASE WHEN announce THEN pg_notify('{channel}', key) END FROM done"
        ),
    )
}

fn release(table: &str, channel: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::TEXT, Type::BOOL],
        format!(
            "WITH gone AS (
           DELETE FROM {table} WHERE key = $1 AND owner = $2 AND state = 'in_flight'
           RETURNING key)
         SELECT key, CASE WHEN $3 THEN pg_notify('{channel}', key) END FROM gone"
        ),
    )
}

/// Releases the claims of these keys that these owners still hold, none announced.
fn release_many(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT_ARRAY, Type::TEXT_ARRAY],
        format!(
            "DELETE FROM {table} t USING unnest($1::text[], $2::text[]) AS g(key, owner)
         WHERE t.key = g.key AND t.owner = g.owner AND t.state = 'in_flight'
         RETURNING t.key"
        ),
    )
}

fn renew(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::TEXT, Type::INT8],
        format!(
            "UPDATE {table} SET expires_at = {NOW_MS} + $3
         WHERE key = $1 AND owner = $2 AND state = 'in_flight'
         RETURNING key"
        ),
    )
}

fn forget_done(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT],
        format!("DELETE FROM {table} WHERE key = $1 AND state = 'done' AND expires_at > {NOW_MS}"),
    )
}

fn set_expiry(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::INT8],
        format!(
            "UPDATE {table} SET expires_at = $2
         WHERE key = $1 AND state = 'done' AND expires_at > {NOW_MS}"
        ),
    )
}

fn count_held(table: &str) -> (&'static [Type], String) {
    (
        &[],
        format!(
            "SELECT split_part(key, ':', 1) AS namespace, count(*) AS held FROM {table}
         WHERE state = 'held' AND expires_at > {NOW_MS} GROUP BY 1"
        ),
    )
}

fn state_of(table: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT],
        format!("SELECT state FROM {table} WHERE key = $1 AND expires_at > {NOW_MS}"),
    )
}

/// Deletes a batch of `table`'s expired rows (the claims' or the entities' table).
fn sweep(table: &str) -> (&'static [Type], String) {
    (
        &[Type::INT8],
        format!(
            "DELETE FROM {table} WHERE key IN (
           SELECT key FROM {table} WHERE expires_at <= {NOW_MS}
           ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
        ),
    )
}

fn newest_version(entities: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT],
        format!(
            "SELECT sort_key, version, recorded_at, expires_at FROM {entities}
         WHERE key = $1 AND expires_at > {NOW_MS}"
        ),
    )
}

fn record_version(entities: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT, Type::TEXT, Type::TEXT, Type::INT8],
        format!(
            "INSERT INTO {entities} AS e (key, sort_key, version, recorded_at, expires_at)
         SELECT $1, $2, $3, now.ms, now.ms + $4 FROM (SELECT {NOW_MS} AS ms) AS now
         ON CONFLICT (key) DO UPDATE SET
           sort_key = EXCLUDED.sort_key, version = EXCLUDED.version,
           recorded_at = EXCLUDED.recorded_at, expires_at = EXCLUDED.expires_at
         WHERE e.expires_at <= EXCLUDED.recorded_at OR e.sort_key < EXCLUDED.sort_key"
        ),
    )
}

fn forget_entity(entities: &str) -> (&'static [Type], String) {
    (
        &[Type::TEXT],
        format!("DELETE FROM {entities} WHERE key = $1 RETURNING expires_at > {NOW_MS} AS live"),
    )
}

#[cfg(test)]
mod tests {
    use deadpool_postgres::{PoolConfig, Runtime};
    use tokio_postgres::NoTls;

    use super::*;

    impl Statements {
        /// Every statement: the pattern names every field, so a new one must be added.
        fn every(&self) -> [&Sql; 27] {
            let Statements {
                claim_many,
                current,
                finish_many,
                release,
                release_many,
                renew,
                hold,
                resolve_done,
                resolve_release,
                list,
                list_held,
                list_in_flight,
                forget_done,
                set_expiry,
                count_held,
                state_of,
                sweep,
                newest_version,
                record_version,
                forget_entity,
                sweep_entities,
                report_replica,
                replicas,
                forget_replicas,
                record_minute,
                minutes,
                forget_minutes,
            } = self;
            [
                claim_many,
                current,
                finish_many,
                release,
                release_many,
                renew,
                hold,
                resolve_done,
                resolve_release,
                list,
                list_held,
                list_in_flight,
                forget_done,
                set_expiry,
                count_held,
                state_of,
                sweep,
                newest_version,
                record_version,
                forget_entity,
                sweep_entities,
                report_replica,
                replicas,
                forget_replicas,
                record_minute,
                minutes,
                forget_minutes,
            ]
        }
    }

    /// Through a pooler, statements travel with the types written here: each must be the
    /// type the server gives the parameter when it prepares the statement itself.
    #[tokio::test]
    async fn every_statement_declares_the_types_the_server_gives_its_parameters() {
        let mut config = deadpool_postgres::Config::new();
        config.url = Some("postgres://postgres@127.0.0.1:5432/test".into());
        config.pool = Some(PoolConfig::new(1));
        let pool = config.create_pool(Some(Runtime::Tokio1), NoTls).unwrap();
        let mut client = match pool.get().await {
            Ok(client) => client,
            Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
                panic!("PostgreSQL must be running in CI: {error}")
            }
            Err(error) => {
                eprintln!("skipped: PostgreSQL is not reachable ({error})");
                return;
            }
        };
        let table = "dedupe_statement_types";
        super::super::schema::prepare(&mut client, table, /* own session */ true)
            .await
            .unwrap();
        let statements = Statements::for_table(table, Sending::Unnamed);
        for sql in statements.every() {
            let prepared = client.prepare(&sql.text).await.unwrap();
            assert_eq!(prepared.params(), sql.types, "{}", sql.text);
        }
    }
}
