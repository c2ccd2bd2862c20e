//! A route's `queue:` section as written (`delivery: queued`), its checks, and how it
//! resolves: each field the route's own, else built in (`defaults:` does not set
//! `delivery` or `queue`).

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde::de::Deserializer;

use super::whole_map::map_then;
use crate::key::KeyTemplate;
use crate::route::delivery::{QueuePolicy, Rate};
use crate::values::{HumanDuration, StatusValue};

/// Built-in values. The schedule follows Standard Webhooks' published one in spirit:
/// eighteen tries with full jitter over about a day on average, kept up to three days
/// (GitHub keeps a delivery for redelivery that long).
const ACCEPTED_STATUS: StatusCode = StatusCode::ACCEPTED;
const ACCEPTED_BODY: &str = r#"{"received":true,"queued":true}"#;
const MAX_ATTEMPTS: u32 = 18;
const MAX_AGE: Duration = Duration::from_secs(3 * 24 * 3600);
const BACKOFF_BASE: Duration = Duration::from_secs(5);
const BACKOFF_CAP: Duration = Duration::from_secs(10 * 3600);
const RETRY_STATUSES: [u16; 4] = [408, 409, 425, 429];
const MAX_CONCURRENCY: u32 = 10;
const MAX_QUEUED: u64 = 1_000_000;
/// Dead letters are discarded this long after they died: long enough for an operator to
/// find and replay them, and a bound on what a sender whose events the app refuses fills.
const DEAD_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Bounds on what a file may ask for.
const MAX_ATTEMPTS_LIMIT: u32 = 1000;
const MAX_CONCURRENCY_LIMIT: u32 = 1000;

/// `queue:` as written.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct QueueFile {
    accepted_status: Option<StatusValue>,
    /// The body of the answer once the request is stored.
    accepted_body: Option<String>,
    /// Deliveries tried at most before the job goes to dead letters.
    max_attempts: Option<u32>,
    /// No attempt starts later than this after the request was accepted (or replayed).
    max_age: Option<HumanDuration>,
    /// The longest wait after the first attempt; it doubles after each.
    backoff_base: Option<HumanDuration>,
    /// The longest wait between attempts.
    backoff_cap: Option<HumanDuration>,
    /// 4xx answers that are tried again (every 5xx is).
    retry_statuses: Option<Vec<StatusValue>>,
    /// Deliveries to the app at once.
    max_concurrency: Option<u32>,
    /// Jobs waiting at most; more are answered 503.
    max_queued: Option<u64>,
    /// How long a dead letter is kept after it died.
    dead_retention: Option<HumanDuration>,
    /// Deliveries a second at most.
    rate: Option<u32>,
    /// Deliveries above `rate` allowed at once (with `rate`).
    burst: Option<u32>,
    /// A time from acceptance to the app's success that a metric counts jobs against.
    target: Option<HumanDuration>,
    order_by: Option<KeyTemplate>,
}

impl QueueFile {
    fn check(&self) -> Result<(), String> {
        if let Some(status) = self.accepted_status
            && !status.0.is_success()
        {
            return Err(format!(
                "`accepted_status` must be a 2xx (the sender must not retry a stored request): {}",
                status.0.as_u16()
            ));
        }
        if self
            .max_attempts
            .is_some_and(|n| n == 0 || n > MAX_ATTEMPTS_LIMIT)
        {
            return Err(format!(
                "`max_attempts` must be from 1 to {MAX_ATTEMPTS_LIMIT}"
            ));
        }
        if self
            .max_concurrency
            .is_some_and(|n| n == 0 || n > MAX_CONCURRENCY_LIMIT)
        {
            return Err(format!(
                "`max_concurrency` must be from 1 to {MAX_CONCURRENCY_LIMIT}"
            ));
        }
        if self.max_queued == Some(0) {
            return Err("`max_queued` must be at least 1".into());
        }
        if self.rate == Some(0) || self.burst == Some(0) {
            return Err("`rate` and `burst` must be at least 1 (pause a route to stop it)".into());
        }
        if self.burst.is_some() && self.rate.is_none() {
            return Err("`burst` goes with a `rate`".into());
        }
        for (name, value) in [
            ("max_age", self.max_age),
            ("backoff_base", self.backoff_base),
            ("backoff_cap", self.backoff_cap),
            ("target", self.target),
            ("dead_retention", self.dead_retention),
        ] {
            if value.is_some_and(|duration| duration.0.is_zero()) {
                return Err(format!("`{name}` must be longer than zero"));
            }
        }
        if let (Some(base), Some(cap)) = (self.backoff_base, self.backoff_cap)
            && base.0 > cap.0
        {
            return Err("`backoff_base` must not be longer than `backoff_cap`".into());
        }
        if let Some(status) = self
            .retry_statuses
            .iter()
            .flatten()
            .find(|status| !status.0.is_client_error())
        {
            return Err(format!(
                "`retry_statuses` lists the 4xx tried again (every 5xx is): {} is not a 4xx",
                status.0.as_u16()
            ));
        }
        Ok(())
    }

    /// The settings, each the route's own, else built in.
    pub(super) fn resolve(own: Option<&QueueFile>) -> QueuePolicy {
        let none = QueueFile::default();
        let own = own.unwrap_or(&none);
        let duration = |own: Option<HumanDuration>, builtin| own.map_or(builtin, |value| value.0);
        let backoff_base = duration(own.backoff_base, BACKOFF_BASE);
        QueuePolicy {
            accepted_status: own
                .accepted_status
                .map_or(ACCEPTED_STATUS, |status| status.0),
            accepted_body: Bytes::from(
                own.accepted_body
                    .clone()
                    .unwrap_or_else(|| ACCEPTED_BODY.to_owned()),
            ),
            max_attempts: own.max_attempts.unwrap_or(MAX_ATTEMPTS),
            max_age: duration(own.max_age, MAX_AGE),
            backoff_base,
            backoff_cap: duration(own.backoff_cap, BACKOFF_CAP).max(backoff_base),
            retry_statuses: own.retry_statuses.as_ref().map_or_else(
                || RETRY_STATUSES.to_vec(),
                |statuses| statuses.iter().map(|status| status.0.as_u16()).collect(),
            ),
            max_concurrency: own.max_concurrency.unwrap_or(MAX_CONCURRENCY),
            max_queued: own.max_queued.unwrap_or(MAX_QUEUED),
            dead_retention: duration(own.dead_retention, DEAD_RETENTION),
            rate: own.rate.map(|per_second| Rate {
                per_second,
                burst: own.burst.unwrap_or(per_second).max(1),
            }),
            target: own.target.map(|target| target.0),
            order_by: own.order_by.clone(),
        }
    }
}

/// `queue:`, checked while it is read.
pub(super) fn queue_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<QueueFile>, D::Error> {
    map_then(deserializer, |queue: QueueFile| {
        queue.check()?;
        Ok(Some(queue))
    })
}
