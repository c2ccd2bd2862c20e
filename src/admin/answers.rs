//! The admin API's answers as types: the port writes them, the CLI reads those it shows
//! (the ones deriving `Deserialize`), and the OpenAPI document and the MCP tools give
//! their schemas (`Endpoint::returns`).

use std::collections::BTreeMap;

use http::{Response, StatusCode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::body::ProxyBody;
use crate::reload::LastReload;
use crate::response::{DedupeStatus, json_response};
use crate::route::{DeliveryMode, Unmatched};

/// A typed answer as JSON.
pub(super) fn answer_json(status: StatusCode, answer: &impl Serialize) -> Response<ProxyBody> {
    json_response(
        status,
        serde_json::to_string(answer).expect("an answer is JSON"),
    )
}

/// Headers as `[name, value]` pairs. Written as an array of two strings rather than
/// schemars' `prefixItems`, which Schemathesis 4.32 fails to read in an answer's schema.
fn header_pairs(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "array", "items": { "type": "string" }, "minItems": 2, "maxItems": 2 },
    })
}

/// A probe's answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Status {
    /// `ok` (`/healthz`); `ready`, `starting` or `shutting_down` (`/readyz`).
    pub status: String,
}

/// `POST /v1/reload`'s answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Reloaded {
    pub reloaded: bool,
    /// The routes running now.
    pub routes: usize,
    /// Settings that changed in the file but take effect only at the next start.
    pub restart_needed: Vec<String>,
}

/// `GET /v1/queue`'s answer: each queued route's counts.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct QueueList {
    pub routes: Vec<QueueRoute>,
}

/// A queued route's counts, as `GET /v1/queue` and `/v1/overview` show them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct QueueRoute {
    pub route: String,
    pub paused: bool,
    /// Not tried yet.
    pub waiting: u64,
    /// Tried, not delivered, not dead.
    pub retrying: u64,
    /// Being attempted by this replica now.
    pub in_flight: u64,
    pub dead: u64,
    /// When the oldest job that is not dead was received; `null` with none.
    pub oldest_received_at: Option<String>,
    pub oldest_age_seconds: Option<u64>,
}

/// A bulk replay of dead letters, as it started and as it goes on
/// (`POST /v1/queue/{route}/replays`, `GET` and `DELETE /v1/replays/{id}`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ReplayProgress {
    pub id: u64,
    pub route: String,
    pub filter: DeadFilterView,
    /// `running`, `done`, `cancelled` or `failed`.
    pub state: String,
    /// Dead letters the filter picked so far.
    pub matched: u64,
    /// Of those, replayed so far.
    pub replayed: u64,
    /// Why it failed; `null` otherwise.
    pub error: Option<String>,
}

/// Which dead letters a replay picks, as it was asked (times RFC 3339).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeadFilterView {
    pub status: Option<u16>,
    pub reason: Option<String>,
    pub key_prefix: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
}

/// `POST /v1/queue/{route}/pause` and `/resume`'s answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Paused {
    pub route: String,
    pub paused: bool,
}

/// `GET /v1/scopes`'s answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Scopes {
    pub scopes: Vec<ScopeCount>,
}

/// A scope, the routes that keep their keys in it, and its live keys by state.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ScopeCount {
    pub scope: String,
    pub routes: Vec<String>,
    pub keys: StateCounts,
    /// `false` where the count stopped at its time limit.
    pub counted_all: bool,
}

/// Keys counted by state.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct StateCounts {
    pub in_flight: u64,
    pub done: u64,
    pub held: u64,
}

/// `POST /v1/scopes/{scope}/clear`'s answer: the counts of this answer's part.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Cleared {
    pub scope: String,
    pub prefix: String,
    pub removed: u64,
    pub released: u64,
    pub held_left: u64,
    pub in_flight_left: u64,
    /// `false` while more is left: ask again with `after` set to `next`.
    pub complete: bool,
    pub next: Option<String>,
}

/// `GET /v1/entities/{route}/{entity}`'s answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EntityVersion {
    pub route: String,
    pub entity: String,
    /// As the entity's event carried it.
    pub newest_version: String,
    pub recorded_at: String,
    pub expires_at: String,
}

/// `GET /v1/keys`'s answer: a page of keys, and the cursor of the next (`null` after the
/// last).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct KeyPage {
    pub keys: Vec<KeyView>,
    pub next: Option<String>,
}

/// A key as the API shows it. Times are RFC 3339 with milliseconds.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct KeyView {
    pub route: String,
    pub key: String,
    pub state: KeyStateName,
    /// Absent only for an `absent` key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<String>,
    /// A held key's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_at: Option<String>,
    /// A done key's; `null` otherwise.
    #[serde(default)]
    pub completed_at: Option<String>,
    /// For a key in flight, its lease's end. Absent only for an `absent` key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The app's answer to a done key's delivery; `null` where none was seen.
    #[serde(default)]
    pub upstream_status: Option<u16>,
    /// A done key's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_because: Option<DoneBecause>,
    /// A held key's: `upstream_timeout`, `upstream_dropped`, `shutdown`, `forward_failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_because: Option<String>,
    /// Absent only for an `absent` key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_sha256: Option<String>,
    /// A done key's: the status of the answer recorded for duplicates (`null` if none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_status: Option<Option<u16>>,
    /// The recorded answer whole, as `GET /v1/keys/{route}/{key}` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<RecordedAnswer>,
}

/// A key the store no longer holds, as a resolution with `release` answers: a
/// [`KeyView`] with its three fields alone.
#[derive(Debug, Serialize)]
pub(crate) struct AbsentKey {
    pub route: String,
    pub key: String,
    pub state: KeyStateName,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KeyStateName {
    InFlight,
    Done,
    Held,
    /// Released, expired or never seen: a resolution's answer after `release`.
    Absent,
    /// A state a newer proxy names, read by an older client.
    #[serde(other)]
    #[schemars(skip)]
    #[allow(dead_code)]
    Other,
}

/// How a key came to be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DoneBecause {
    UpstreamSuccess,
    /// An operator resolved it as done.
    Resolved,
    /// `order` with `on_stale: skip`.
    StaleSkipped,
    /// Its delivery was queued.
    Queued,
    /// A reason a newer proxy names, read by an older client.
    #[serde(other)]
    #[schemars(skip)]
    #[allow(dead_code)]
    Other,
}

/// The answer recorded for a done key's duplicates.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RecordedAnswer {
    pub status: u16,
    /// `[name, value]`, values masked unless the header is known to carry no secret.
    #[schemars(schema_with = "header_pairs")]
    pub headers: Vec<(String, String)>,
    pub body_bytes: usize,
}

/// `GET /v1/queue/{route}/dead`'s answer: a page of dead letters, oldest death first, and
/// the cursor of the next (`null` after the last).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeadLetterPage {
    pub jobs: Vec<JobSummary>,
    pub next: Option<String>,
}

/// A queued or dead job as a listing shows it. Times are RFC 3339 with milliseconds.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JobSummary {
    pub route: String,
    /// The event's key, without its scope.
    pub key: String,
    /// `waiting`, `retrying` or `dead`.
    pub state: String,
    /// The lane of a route with `queue.order_by`.
    pub lane: Option<String>,
    pub received_at: String,
    /// Attempts made in all.
    pub attempts: u32,
    /// The app's status at the last attempt; `null` without an answer.
    pub last_status: Option<u16>,
    pub dead_at: Option<String>,
    /// A dead letter's: `max_attempts`, `max_age` or `refused`.
    pub dead_because: Option<String>,
}

/// `GET /v1/queue/{route}/jobs/{key}`'s answer: a job with its request's head and every
/// attempt kept. Configured secrets are masked wherever they appear.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JobDetail {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub request: QueuedRequestView,
    /// The attempts kept, oldest first.
    pub history: Vec<AttemptView>,
    pub attempts_kept: usize,
}

/// A queued request's head: header values masked unless known to carry no secret, the
/// query's values masked.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct QueuedRequestView {
    pub method: String,
    pub target: String,
    /// `[name, value]`.
    #[schemars(schema_with = "header_pairs")]
    pub headers: Vec<(String, String)>,
    pub body_bytes: usize,
}

/// One attempt to deliver a job.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct AttemptView {
    pub at: String,
    /// The app's status; `null` when it gave no answer.
    pub status: Option<u16>,
    pub latency_ms: u64,
    /// Why there was no answer, or the answer's first bytes.
    pub answer: String,
}

/// `POST /v1/queue/{route}/jobs/{key}/replay`'s answer: the job queued again, or, when a
/// worker delivered it before this answer was written, its route, key and `delivered`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ReplayedJob {
    Queued(Box<JobDetail>),
    Delivered(DeliveredJob),
}

/// A replayed job that is no longer in the queue.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeliveredJob {
    pub route: String,
    pub key: String,
    /// `delivered`.
    pub state: String,
}

/// `GET /v1/deliveries`'s answer: a page of the delivery log, newest first, and the
/// cursor of the next (`null` after the last).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeliveryPage {
    pub deliveries: Vec<DeliverySummary>,
    pub next: Option<String>,
}

/// An entry of the delivery log, as a page and the tail's events show it. Times are RFC
/// 3339 with milliseconds.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeliverySummary {
    pub id: String,
    /// When it was answered (an attempt: when it started).
    pub at: String,
    /// `null` for a request no route took.
    pub route: Option<String>,
    /// The route's key namespace: its `scope`, else its name.
    pub scope: Option<String>,
    pub key: Option<String>,
    /// One of the overview's `outcomes` (`forwarded`, `duplicate`, `refused`, ...).
    pub outcome: String,
    /// The code of the proxy's own refusal, if it refused.
    pub refusal: Option<String>,
    /// It waited for another delivery of its key (`on_in_flight: wait`).
    pub waited: bool,
    /// It was answered with the app's recorded answer (`duplicate_response.replay`).
    pub replayed: bool,
    /// A queued job's attempt: its number.
    pub attempt: Option<u32>,
    /// What the sender was answered; `null` for a queued attempt (no sender waits).
    pub status: Option<u16>,
    pub upstream_status: Option<u16>,
    pub upstream_ms: Option<u32>,
    pub duration_ms: u32,
    /// The request body's size in bytes, when known.
    pub size: Option<u64>,
    pub method: String,
    /// The request's path, without its query.
    pub path: String,
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
    /// The sender's address, as the connection came.
    pub client: Option<String>,
    /// The replica that logged it (its host name), when known.
    pub replica: Option<String>,
    pub body_recorded: bool,
    /// Who changed the key, for a `changed` entry: the way in and the credential
    /// (`api:token`, `mcp:loopback`).
    pub by: Option<String>,
}

/// `GET /v1/deliveries/{id}`'s answer: an entry whole, with the headers its route's
/// `log.headers` names and the body its `log.bodies` kept.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeliveryDetail {
    #[serde(flatten)]
    pub summary: DeliverySummary,
    /// `[name, value]`.
    #[schemars(schema_with = "header_pairs")]
    pub headers: Vec<(String, String)>,
    pub body_truncated: bool,
    /// The body as text when it is UTF-8, else in base64; `null` when none was kept.
    pub body: Option<String>,
    /// `utf-8` or `base64`; `null` when no body was kept.
    pub body_encoding: Option<String>,
}

/// `GET /v1/routes`' answer.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RouteList {
    /// Each route's resolved settings, as `dedupe-proxy check` prints them under
    /// `routes:`.
    pub routes: Vec<serde_json::Map<String, serde_json::Value>>,
    /// What a request no route matches gets.
    pub unmatched: Unmatched,
    /// Where such a request is forwarded.
    pub upstream: String,
}

/// `GET /v1/overview`'s answer: the proxy at a glance, as the console's first page shows
/// it.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Overview {
    pub version: String,
    pub uptime_seconds: f64,
    pub access: AccessView,
    pub store: StoreHealth,
    /// Claims this replica holds open now.
    pub claims_in_flight: u64,
    /// The last reload tried, `null` before the first.
    pub reload: Option<LastReload>,
    /// Whether the delivery log is on.
    pub delivery_log: bool,
    /// Every outcome the delivery log and `requests` name.
    pub outcomes: Vec<String>,
    pub routes: Vec<RouteOverview>,
    /// Every replica sharing the store, as each last reported; `null` on sled, whose
    /// store is this process's alone.
    pub replicas: Option<ReplicaList>,
}

/// The replicas of a shared store.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ReplicaList {
    /// This replica's id.
    pub this: String,
    /// By id; empty when the store did not answer.
    pub replicas: Vec<ReplicaView>,
    /// Their requests added up, by outcome.
    pub totals: BTreeMap<String, u64>,
}

/// A replica as it last reported (every 5 s).
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ReplicaView {
    /// The host's name and the process's id.
    pub id: String,
    pub version: String,
    pub started_at: String,
    pub last_seen: String,
    /// Not heard from for 15 s: stopped, or cut off from the store.
    pub silent: bool,
    /// Requests since it started, by outcome.
    pub requests: BTreeMap<String, u64>,
}

/// Who asks, and whether they may change anything.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AccessView {
    /// `operator` or `viewer`.
    pub role: String,
    /// Which credential admitted the request (`token`, `viewer_token`, `loopback`, ...).
    pub credential: String,
}

/// The store's health, as this replica sees it.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct StoreHealth {
    /// `sled`, `redis` or `postgres`.
    pub kind: String,
    /// Whether the store answered a read within 2 s.
    pub healthy: bool,
    /// Why not, when not.
    pub error: Option<String>,
    /// Done keys held, where the store counts them (sled); `null` elsewhere.
    pub done_keys: Option<u64>,
    /// Store errors since this replica started.
    pub errors: u64,
    /// On a shared store, whether waiters are told of the outcomes other replicas
    /// announce: `false` behind a PostgreSQL pooler without `direct_url` (they look at the
    /// store again every 0.25 to 2 s instead); `null` on sled, which nothing shares.
    pub outcomes_announced: Option<bool>,
}

/// A route's line on the overview: its requests since this replica started, by outcome.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RouteOverview {
    pub route: String,
    pub scope: String,
    pub delivery: DeliveryMode,
    /// Requests by outcome (`forwarded`, `duplicate`, ...), since this replica started.
    pub requests: BTreeMap<String, u64>,
    /// Keys held for an operator now.
    pub held_keys: i64,
    /// A queued route's counts; `null` for a route that forwards.
    pub queue: Option<QueueRoute>,
}

/// `GET /v1/charts`'s answer: the range's minutes, oldest first, the running one last.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Charts {
    /// `hour` (60 minutes) or `day` (1440).
    pub range: String,
    /// The route charted; `null` for every route.
    pub route: Option<String>,
    /// The first minute's start.
    pub from: String,
    pub minutes: Vec<ChartMinute>,
    /// The replicas whose figures are counted.
    pub replicas: Vec<String>,
    /// A queued route's depth was counted in the range: the minutes carry it.
    pub queued: bool,
    /// The store's error where it did not give the minutes: they are this replica's own.
    pub store_error: Option<String>,
}

/// One minute of the charts, every replica's figures added up.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChartMinute {
    /// The minute's start.
    pub at: String,
    pub deliveries: DeliveryGroups,
    /// The app's answers to forwarded deliveries.
    pub answers: u64,
    /// The app's latency: the median of those answers in milliseconds, estimated inside
    /// its bucket (0 to 1 ms, then doubling up to 32.768 s; above, shown as 32 768);
    /// `null` without answers.
    pub p50_ms: Option<f64>,
    /// The 99th percentile, estimated the same way.
    pub p99_ms: Option<f64>,
    /// Queued routes' jobs not delivered yet at the minute's end; `null` unless
    /// `queued`, 0 where no replica counted any.
    pub queue_waiting: Option<u64>,
    /// The age of the oldest of those jobs.
    pub queue_oldest_seconds: Option<f64>,
}

/// Deliveries of a minute by what became of them (`Dedupe-Status` values in groups).
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DeliveryGroups {
    /// `forwarded` and `unkeyed`: the app ran them.
    pub forwarded: u64,
    /// `duplicate`, `in-flight` and `stale`: answered without the app.
    pub duplicate: u64,
    /// `rejected` and `unavailable`: refused before a claim (bad requests, signatures,
    /// the store down).
    pub refused: u64,
    /// `released`: the app failed; the claim was released for the sender's retry.
    pub released: u64,
    /// `held`: waiting for an operator.
    pub held: u64,
    /// `queued`: stored for queued delivery.
    pub queued: u64,
}

impl DeliveryGroups {
    /// The count an outcome (a `Dedupe-Status` value) adds to; `None` for a name that is
    /// none (a record another version wrote).
    pub(super) fn count_mut(&mut self, outcome: &str) -> Option<&mut u64> {
        let status = (DedupeStatus::ALL.into_iter()).find(|status| status.as_str() == outcome)?;
        Some(match status {
            DedupeStatus::Forwarded | DedupeStatus::Unkeyed => &mut self.forwarded,
            DedupeStatus::Duplicate | DedupeStatus::InFlight | DedupeStatus::Stale => {
                &mut self.duplicate
            }
            DedupeStatus::Rejected | DedupeStatus::Unavailable => &mut self.refused,
            DedupeStatus::Released => &mut self.released,
            DedupeStatus::Held => &mut self.held,
            DedupeStatus::Queued => &mut self.queued,
        })
    }
}
