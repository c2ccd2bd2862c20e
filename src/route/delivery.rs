//! A route's queued delivery (`delivery: queued` and its `queue:` settings, resolved),
//! and what an attempt's answer means for the job: delivered, tried again when (full
//! jitter, at least `Retry-After`), or dead.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::Serialize;

use crate::key::KeyTemplate;
use crate::store::Millis;
use crate::store::queue::DeadReason;
use crate::values::as_written;

/// A route's `queue:` settings, resolved (`delivery: queued`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueuePolicy {
    /// The answer to the sender once its request is stored.
    #[serde(serialize_with = "as_written::status")]
    pub accepted_status: StatusCode,
    #[serde(serialize_with = "as_written::text")]
    pub accepted_body: Bytes,
    pub max_attempts: u32,
    #[serde(serialize_with = "as_written::duration")]
    pub max_age: Duration,
    /// The first retry's longest wait; each later one doubles, up to `backoff_cap`.
    #[serde(serialize_with = "as_written::duration")]
    pub backoff_base: Duration,
    #[serde(serialize_with = "as_written::duration")]
    pub backoff_cap: Duration,
    /// The 4xx statuses tried again; other 4xx go to dead letters at once.
    pub retry_statuses: Vec<u16>,
    pub max_concurrency: u32,
    /// The most jobs the route's queue holds, dead letters included: beyond, the sender
    /// gets 503 (`queue_full`). Bounds the store at about `max_queued * max_body`.
    pub max_queued: u64,
    /// How long a dead letter is kept after it died.
    #[serde(serialize_with = "as_written::duration")]
    pub dead_retention: Duration,
    /// How fast deliveries may start, if limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// A time from acceptance to the app's success that the metrics hold the route to.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "some_duration"
    )]
    pub target: Option<Duration>,
    /// What a job's lane is: jobs of one lane are delivered one at a time, in the order
    /// they were stored (a replayed one joins the end). An event the template cannot
    /// read has no lane.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_by: Option<KeyTemplate>,
}

fn some_duration<S: serde::Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => as_written::duration(value, serializer),
        None => serializer.serialize_none(),
    }
}

/// `queue.rate` and `queue.burst`: deliveries started per second, and how many may start
/// at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

/// What happens to a job after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Delivered,
    RetryAt(Millis),
    Dead(DeadReason),
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy)]
pub enum Answered<'a> {
    /// The app answered with this status and headers.
    Status(StatusCode, &'a HeaderMap),
    /// No answer: refused, reset, or timed out.
    Failed,
}

impl QueuePolicy {
    /// What follows an attempt that ended `answered` at `now`, for a job that has made
    /// `attempts` in this round (this one included) since `started`. `success` says
    /// whether a status is the app's success (`success_status`); `random` is in [0, 1).
    pub fn next(
        &self,
        answered: Answered<'_>,
        success: impl Fn(StatusCode) -> bool,
        attempts: u32,
        started: Millis,
        now: Millis,
        random: f64,
    ) -> Next {
        let mut not_before = 0;
        if let Answered::Status(status, headers) = answered {
            if success(status) {
                return Next::Delivered;
            }
            if status.is_client_error() && !self.retry_statuses.contains(&status.as_u16()) {
                return Next::Dead(DeadReason::Refused);
            }
            if matches!(status.as_u16(), 429 | 503) {
                not_before = retry_after(headers, now).map_or(0, crate::store::millis);
            }
        }
        if attempts >= self.max_attempts {
            return Next::Dead(DeadReason::Attempts);
        }
        let wait = self.backoff(attempts, random).max(not_before);
        let at = now.saturating_add(wait);
        if at >= started.saturating_add(crate::store::millis(self.max_age)) {
            return Next::Dead(DeadReason::Age);
        }
        Next::RetryAt(at)
    }

    /// Full jitter: a wait drawn evenly from zero to `min(cap, base * 2^(attempts - 1))`,
    /// in milliseconds.
    fn backoff(&self, attempts: u32, random: f64) -> Millis {
        let base = crate::store::millis(self.backoff_base);
        let cap = crate::store::millis(self.backoff_cap);
        let ceiling = base
            .saturating_mul(1u64 << attempts.saturating_sub(1).min(40))
            .min(cap);
        (ceiling as f64 * random.clamp(0.0, 1.0)) as Millis
    }
}

/// `Retry-After` as a wait from `now`: seconds, or an HTTP date. None when absent,
/// unreadable, or in the past.
pub fn retry_after(headers: &HeaderMap, now: Millis) -> Option<Duration> {
    let text = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(now);
    at.duration_since(now).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> QueuePolicy {
        QueuePolicy {
            accepted_status: StatusCode::ACCEPTED,
            accepted_body: Bytes::new(),
            max_attempts: 5,
            max_age: Duration::from_secs(3600),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(10),
            retry_statuses: vec![408, 409, 425, 429],
            max_concurrency: 1,
            max_queued: 10,
            dead_retention: Duration::from_secs(3600),
            rate: None,
            target: None,
            order_by: None,
        }
    }

    fn two_xx(status: StatusCode) -> bool {
        status.is_success()
    }

    fn status(code: u16, headers: &HeaderMap) -> Answered<'_> {
        Answered::Status(StatusCode::from_u16(code).unwrap(), headers)
    }

    #[test]
    fn full_jitter_doubles_up_to_the_cap() {
        let policy = policy();
        let none = HeaderMap::new();
        let wait = |attempts, random| match policy.next(
            status(500, &none),
            two_xx,
            attempts,
            0,
            0,
            random,
        ) {
            Next::RetryAt(at) => at,
            other => panic!("{other:?}"),
        };
        assert_eq!(wait(1, 0.999_999), 999);
        assert_eq!(wait(2, 0.999_999), 1999);
        assert_eq!(wait(3, 0.5), 2000);
        assert_eq!(wait(4, 0.999_999), 7999);
        // Capped at 10 s from the fifth on.
        let mut capped = policy.clone();
        capped.max_attempts = 100;
        for attempts in [5, 30, 99] {
            assert!(matches!(
                capped.next(status(503, &none), two_xx, attempts, 0, 0, 0.999_999),
                Next::RetryAt(9999)
            ));
        }
        assert_eq!(wait(1, 0.0), 0);
    }

    #[test]
    fn answers_decide_the_fate() {
        let policy = policy();
        let none = HeaderMap::new();
        let next = |answer, attempts| policy.next(answer, two_xx, attempts, 0, 0, 0.5);
        assert_eq!(next(status(204, &none), 1), Next::Delivered);
        assert_eq!(next(status(400, &none), 1), Next::Dead(DeadReason::Refused));
        assert_eq!(next(status(410, &none), 1), Next::Dead(DeadReason::Refused));
        for retried in [408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(matches!(next(status(retried, &none), 1), Next::RetryAt(_)));
        }
        assert!(matches!(next(Answered::Failed, 4), Next::RetryAt(_)));
        assert_eq!(next(Answered::Failed, 5), Next::Dead(DeadReason::Attempts));
        // A success that is not 2xx by `success_status`.
        let redirect_ok = |status: StatusCode| status.as_u16() == 302;
        assert_eq!(
            policy.next(status(302, &none), redirect_ok, 1, 0, 0, 0.5),
            Next::Delivered
        );
    }

    #[test]
    fn retry_after_is_a_floor_and_max_age_an_end() {
        let policy = policy();
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, "120".parse().unwrap());
        assert_eq!(
            policy.next(status(429, &headers), two_xx, 1, 0, 1000, 0.5),
            Next::RetryAt(121_000)
        );
        // Only on 429 and 503.
        assert_eq!(
            policy.next(status(500, &headers), two_xx, 1, 0, 1000, 0.5),
            Next::RetryAt(1500)
        );
        // Past `max_age` (an hour from the start).
        headers.insert(http::header::RETRY_AFTER, "7200".parse().unwrap());
        assert_eq!(
            policy.next(status(503, &headers), two_xx, 1, 0, 1000, 0.5),
            Next::Dead(DeadReason::Age)
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = 1_700_000_000_000;
        let mut headers = HeaderMap::new();
        let date = httpdate::fmt_http_date(
            SystemTime::UNIX_EPOCH + Duration::from_millis(now) + Duration::from_secs(30),
        );
        headers.insert(http::header::RETRY_AFTER, date.parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(30)));
        for unread in ["soon", "-5", "Wed, 21 Oct 2015 07:28:00 GMT", ""] {
            headers.insert(http::header::RETRY_AFTER, unread.parse().unwrap());
            assert_eq!(retry_after(&headers, now), None, "{unread}");
        }
    }
}
