//! What the admin port's handlers share: the running proxy once it is up, the access
//! rules, the metrics, the bulk replays and live tails started here, and the places for
//! request bodies with their bounds.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::FromRef;

use super::access::Rules;
use super::{bulk, places, tails};
use crate::config::McpAccess;
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::reload::Reloader;

/// The largest request body the API reads (a resolution, an expiry), and how long it
/// waits for one (a `/mcp` message's too).
pub(super) const BODY_MAX: u64 = 1024;
pub(super) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests whose body is being read at once at most, in all and per credential: one that
/// holds its body back holds a place for [`BODY_READ_TIMEOUT`] at most, and the port's
/// other connections stay free for the probes and other clients.
pub(super) const BODIES_MAX: usize = 16;
pub(super) const BODIES_PER_CREDENTIAL: usize = 8;

/// What the admin API serves once the store is open and the routes loaded.
#[derive(Clone)]
pub struct Serving {
    pub proxy: Arc<Proxy>,
    pub reloader: Arc<Reloader>,
}

/// What the admin port's handlers share.
pub(super) struct AdminState {
    pub(super) serving: OnceLock<Serving>,
    pub(super) shutting_down: AtomicBool,
    pub(super) rules: Rules,
    pub(super) metrics: Arc<Metrics>,
    /// Bulk replays of dead letters started here.
    pub(super) replays: bulk::Replays,
    /// Live tails of the delivery log.
    pub(super) tails: tails::Tails,
    /// Requests whose body is being read.
    pub(super) bodies: places::Places,
    /// What `/mcp` offers.
    pub(super) mcp: McpAccess,
    pub(super) started: Instant,
    /// `/v1/openapi.json`, made at its first request.
    pub(super) openapi: OnceLock<String>,
}

// The parts a handler takes alone (`State<Replays>`), so that their files need not know
// the whole state.
impl FromRef<Arc<AdminState>> for bulk::Replays {
    fn from_ref(state: &Arc<AdminState>) -> bulk::Replays {
        state.replays.clone()
    }
}

impl FromRef<Arc<AdminState>> for tails::Tails {
    fn from_ref(state: &Arc<AdminState>) -> tails::Tails {
        state.tails.clone()
    }
}

impl AdminState {
    pub(super) fn new(rules: Rules, metrics: Arc<Metrics>, mcp: McpAccess) -> AdminState {
        AdminState {
            serving: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            rules,
            metrics,
            replays: bulk::Replays::default(),
            tails: tails::Tails::default(),
            bodies: places::Places::new(BODIES_MAX, BODIES_PER_CREDENTIAL),
            mcp,
            started: Instant::now(),
            openapi: OnceLock::new(),
        }
    }
}
