//! Every built-in value of the file: what a setting is when the file leaves it out (and,
//! for a route's policy, when neither the route nor `defaults:` sets it). sled's own are
//! beside its settings, in `store/settings.rs`, which imports nothing of the
//! configuration.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderValue, StatusCode};

use crate::values::{HumanDuration, Size, StatusPattern, TableName};

pub fn listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8081))
}

pub(crate) fn admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9091))
}

pub(crate) fn yes() -> bool {
    true
}

/// The delivery log keeps three days, and at most a hundred thousand entries.
pub fn log_retention() -> HumanDuration {
    HumanDuration(Duration::from_secs(3 * 24 * 3600))
}

pub fn log_max_entries() -> u64 {
    100_000
}

/// Bounds on what `delivery_log:` and a route's `log:` may ask for.
pub(crate) const LOG_MAX_ENTRIES_LIMIT: u64 = 100_000_000;
pub(crate) const LOG_BODY_LIMIT: u64 = 64 << 10;

pub fn shutdown_grace() -> HumanDuration {
    HumanDuration(Duration::from_secs(25))
}

// `limits:`

pub fn max_connections() -> usize {
    1024
}

pub fn max_requests() -> usize {
    1024
}

pub fn header_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

pub fn body_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

pub fn max_header_bytes() -> Size {
    Size(64 << 10)
}

// `store:`

pub(crate) fn redis_prefix() -> String {
    "dedupe:".into()
}

pub(crate) fn postgres_table() -> TableName {
    TableName("dedupe_claims".into())
}

/// How long one Redis command or PostgreSQL statement may take.
pub(crate) fn server_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(2))
}

pub(crate) fn postgres_pool_size() -> usize {
    4
}

// A route's policy.

pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
pub const LEASE: Duration = Duration::from_secs(300);
/// A claim's lease is renewed every third of it while its delivery runs: shorter than this,
/// the renewals would be more work than the deliveries.
pub(crate) const LEASE_MIN: Duration = Duration::from_millis(100);
pub(crate) const MAX_BODY: u64 = 1 << 20;
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const IN_FLIGHT_STATUS: StatusCode = StatusCode::CONFLICT;
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);
pub(crate) const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// Providers give up on an answer within about half a minute (Stripe 20 s, GitHub 10 s);
/// a longer wait only holds a request's place.
pub(crate) const IN_FLIGHT_WAIT_MAX: Duration = Duration::from_secs(60);
pub(crate) const FORWARD_KEY_HEADER: bool = true;

/// Any 2xx.
pub fn success_status() -> Vec<StatusPattern> {
    vec![StatusPattern::Class(2)]
}

pub(crate) const DUPLICATE_STATUS: StatusCode = StatusCode::OK;
pub(crate) const DUPLICATE_BODY: &str = r#"{"received":true,"duplicate":true}"#;
pub(crate) const DUPLICATE_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/json");
pub(crate) const DUPLICATE_REPLAY: bool = false;
/// The app's headers a replay repeats unless `replay_headers` says otherwise: what a
/// client needs to read the answer and find what it created, never a cookie.
pub(crate) const REPLAY_HEADERS: [&str; 5] = [
    "content-type",
    "content-location",
    "location",
    "etag",
    "cache-control",
];
