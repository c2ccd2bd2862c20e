//! The admin API's answers as types: the port writes them, the CLI reads them, and the
//! OpenAPI document gives their schemas (`Endpoint::returns`). An answer not typed here
//! is documented as an object.

use http::{Response, StatusCode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::body::ProxyBody;
use crate::response::json_response;

/// A typed answer as JSON.
pub(super) fn answer_json(status: StatusCode, answer: &impl Serialize) -> Response<ProxyBody> {
    json_response(
        status,
        serde_json::to_string(answer).expect("an answer is JSON"),
    )
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
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
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
    pub headers: Vec<(String, String)>,
    pub body_bytes: usize,
}
