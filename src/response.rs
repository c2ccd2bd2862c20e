//! The answers the proxy writes itself, in one place: every refusal's status, JSON error
//! body and `Retry-After` (the proxy's and the admin API's), the same refusals as RFC 9457
//! problems (`as_problem`, for the `idempotency_key` preset), the duplicate answer (a
//! replay marked `Idempotent-Replayed`), the answer to a skipped stale event, and the `Dedupe-Status` header that says what
//! happened to a delivery.

use std::time::Duration;

use http::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderName, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};

use crate::body::{BodyError, ProxyBody, full};
use crate::key::{KeyError, MAX_KEY_BYTES};
use crate::route::DuplicateResponse;
use crate::store::{RecordedResponse, StoreError};
use crate::target::TargetError;
use crate::upstream::{UnforwardableTarget, UpstreamError};
use crate::verify::VerifyError;

pub static DEDUPE_STATUS: HeaderName = HeaderName::from_static("dedupe-status");

/// What happened to a delivery on a matched route, sent back as `Dedupe-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupeStatus {
    /// Refused before anything was stored.
    Rejected,
    /// Forwarded without deduplication (no usable key, or the store failed).
    Unkeyed,
    /// The store could not be used; nothing was forwarded.
    Unavailable,
    /// The key was done: answered without forwarding.
    Duplicate,
    /// Another delivery of the key is being forwarded.
    InFlight,
    /// Forwarded, the upstream succeeded, the key is done.
    Forwarded,
    /// Forwarded, the upstream failed, the claim was released for a retry.
    Released,
    /// The key's forward may have run (`on_ambiguous: hold`): nothing runs it again until
    /// an operator resolves it. Said to the delivery whose forward was ambiguous and to
    /// every delivery of the key until then.
    Held,
    /// Older than a version already done for its entity (`order:` with `on_stale: skip`):
    /// recorded as done without forwarding.
    Stale,
    /// Stored for queued delivery (`delivery: queued`) and acknowledged; the proxy
    /// delivers it.
    Queued,
}

impl DedupeStatus {
    pub const ALL: [DedupeStatus; 10] = [
        DedupeStatus::Rejected,
        DedupeStatus::Unkeyed,
        DedupeStatus::Unavailable,
        DedupeStatus::Duplicate,
        DedupeStatus::InFlight,
        DedupeStatus::Forwarded,
        DedupeStatus::Released,
        DedupeStatus::Held,
        DedupeStatus::Stale,
        DedupeStatus::Queued,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DedupeStatus::Rejected => "rejected",
            DedupeStatus::Unkeyed => "unkeyed",
            DedupeStatus::Unavailable => "unavailable",
            DedupeStatus::Duplicate => "duplicate",
            DedupeStatus::InFlight => "in-flight",
            DedupeStatus::Forwarded => "forwarded",
            DedupeStatus::Released => "released",
            DedupeStatus::Held => "held",
            DedupeStatus::Stale => "stale",
            DedupeStatus::Queued => "queued",
        }
    }
}

/// Adds `Dedupe-Status` to an answer.
pub fn tag(mut response: Response<ProxyBody>, status: DedupeStatus) -> Response<ProxyBody> {
    response.headers_mut().insert(
        DEDUPE_STATUS.clone(),
        HeaderValue::from_static(status.as_str()),
    );
    response
}

/// Every reason the proxy answers a delivery itself instead of relaying the upstream.
#[derive(Debug)]
pub enum Refusal {
    NoRoute,
    BodyTooLarge {
        limit: u64,
    },
    BodyUnreadable(String),
    BodyTimeout(Duration),
    /// The route checks signatures and this one fails.
    Signature(VerifyError),
    MissingKey(String),
    KeyTooLong(usize),
    StoreUnavailable {
        retry_after: Duration,
    },
    /// A queued route's queue holds `queue.max_queued` jobs.
    QueueFull {
        retry_after: Duration,
    },
    InFlight {
        status: StatusCode,
        retry_after: Duration,
    },
    /// The key is held (`on_ambiguous: hold`): answered like one in flight.
    Held {
        status: StatusCode,
        retry_after: Duration,
    },
    PayloadMismatch,
    /// The detail (the upstream's address, say) goes to the log, never to the sender.
    UpstreamUnreachable,
    UpstreamTimeout(Duration),
    /// More requests are in progress than `limits.max_requests` allows (or, for requests
    /// no route takes, half of it).
    Overloaded,
    /// More connections are open than `limits.max_connections` allows.
    TooManyConnections,
    /// The request came on a connection told to close (idle eviction, shutdown).
    Closing,
    /// The request's target or `Host` is malformed (RFC 9112 section 3.2).
    BadTarget(String),
    /// A forward task ended without an answer (it panicked); the claim's lease frees the key.
    Internal,
}

impl Refusal {
    /// The answer's status, `error` code and detail.
    pub(crate) fn parts(&self) -> (StatusCode, &'static str, String) {
        (self.status(), self.code(), self.detail())
    }

    /// The answer's status.
    fn status(&self) -> StatusCode {
        match self {
            Refusal::NoRoute => StatusCode::NOT_FOUND,
            Refusal::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            Refusal::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Refusal::Signature(_) => StatusCode::UNAUTHORIZED,
            Refusal::MissingKey(_) => StatusCode::BAD_REQUEST,
            Refusal::KeyTooLong(_) => StatusCode::BAD_REQUEST,
            Refusal::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::QueueFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::InFlight { status, .. } => *status,
            Refusal::Held { status, .. } => *status,
            Refusal::PayloadMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
            Refusal::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Refusal::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::TooManyConnections => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::BadTarget(_) => StatusCode::BAD_REQUEST,
            Refusal::Closing => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error code of the body.
    fn code(&self) -> &'static str {
        match self {
            Refusal::NoRoute => "no_route",
            Refusal::BodyTooLarge { .. } => "body_too_large",
            Refusal::BodyUnreadable(_) => "body_unreadable",
            Refusal::BodyTimeout(_) => "body_timeout",
            Refusal::Signature(failure) => failure.code(),
            Refusal::MissingKey(_) => "missing_key",
            Refusal::KeyTooLong(_) => "key_too_long",
            Refusal::StoreUnavailable { .. } => "store_unavailable",
            Refusal::QueueFull { .. } => "queue_full",
            Refusal::InFlight { .. } => "in_flight",
            Refusal::Held { .. } => "held",
            Refusal::PayloadMismatch => "payload_mismatch",
            Refusal::UpstreamUnreachable => "upstream_unreachable",
            Refusal::UpstreamTimeout(_) => "upstream_timeout",
            Refusal::Overloaded => "overloaded",
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::BadTarget(_) => "bad_request",
            Refusal::Closing => "closing",
            Refusal::Internal => "internal",
        }
    }

    /// What the body says of it.
    fn detail(&self) -> String {
        match self {
            Refusal::NoRoute => "no route matches this request".into(),
            Refusal::BodyTooLarge { limit } => format!("the body exceeds this route's max_body of {limit} bytes"),
            Refusal::BodyUnreadable(reason) => reason.clone(),
            Refusal::BodyTimeout(after) => format!("the body did not arrive within {}", crate::values::HumanDuration(*after)),
            Refusal::Signature(failure) => failure.to_string(),
            Refusal::MissingKey(reason) => format!("no usable event key: {reason}"),
            Refusal::KeyTooLong(length) => format!("the event key is {length} bytes; the limit is {MAX_KEY_BYTES}"),
            Refusal::StoreUnavailable { .. } => "the claim store is unavailable; retry later".into(),
            Refusal::QueueFull { .. } => "the route's queue is full; retry later".into(),
            Refusal::InFlight { .. } => "another delivery of this event is being processed; retry later".into(),
            Refusal::Held { .. } => "an earlier delivery of this event may have been processed; it waits for an operator to resolve it".into(),
            Refusal::PayloadMismatch => "this key was already processed with a different request (its body; with the idempotency_key preset, its method, target or body)".into(),
            Refusal::UpstreamUnreachable => "the application could not be reached; retry later".into(),
            Refusal::UpstreamTimeout(timeout) => format!("the application did not answer within {}", crate::values::HumanDuration(*timeout)),
            Refusal::Overloaded => "too many requests are being handled; retry shortly".into(),
            Refusal::TooManyConnections => "connection limit reached; retry".into(),
            Refusal::BadTarget(reason) => reason.clone(),
            Refusal::Closing => "this connection is closing; retry on a new one".into(),
            Refusal::Internal => "the delivery failed inside the proxy; retry later".into(),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Refusal::StoreUnavailable { retry_after }
            | Refusal::QueueFull { retry_after }
            | Refusal::InFlight { retry_after, .. }
            | Refusal::Held { retry_after, .. } => Some(*retry_after),
            Refusal::Overloaded | Refusal::TooManyConnections | Refusal::Closing => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }

    /// The answer: its status, `{"error","detail"}` JSON body and `Retry-After`.
    pub fn into_response(self) -> Response<ProxyBody> {
        let (status, code, detail) = self.parts();
        let mut response = json_response(status, error_body(code, &detail));
        if let Some(after) = self.retry_after() {
            response
                .headers_mut()
                .insert(RETRY_AFTER, retry_after_value(after));
        }
        response
            .extensions_mut()
            .insert(RefusalParts { code, detail });
        response
    }

    /// The same answer as HTTP/1.1 bytes that close the connection, for a connection that
    /// is refused before hyper serves it.
    pub fn into_http1_bytes(self) -> Vec<u8> {
        let (status, body) = self.status_and_body();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        if let Some(after) = self.retry_after() {
            let seconds = retry_after_value(after);
            head.push_str(&format!(
                "retry-after: {}\r\n",
                seconds.to_str().unwrap_or("1")
            ));
        }
        head.push_str(&format!(
            "connection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        ));
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        bytes
    }

    fn status_and_body(&self) -> (StatusCode, String) {
        let (status, code, detail) = self.parts();
        (status, error_body(code, &detail))
    }
}

/// What the proxy wrote itself, kept with a refusal's response (never sent) so that a
/// route can write it another way: [`as_problem`].
#[derive(Clone, Debug)]
pub(crate) struct RefusalParts {
    pub(crate) code: &'static str,
    detail: String,
}

/// A refusal the proxy wrote, as an RFC 9457 problem (`application/problem+json`), for the
/// routes of the `idempotency_key` preset; any other response passes unchanged. The
/// problem's `type` is `about:blank` (its `title` the status's phrase), and `code` is the
/// refusal's usual error code.
pub fn as_problem(mut response: Response<ProxyBody>) -> Response<ProxyBody> {
    let Some(written) = response.extensions_mut().remove::<RefusalParts>() else {
        return response;
    };
    let status = response.status();
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": written.detail,
        "code": written.code,
    });
    let (mut head, _) = response.into_parts();
    head.headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    head.headers.remove(http::header::CONTENT_LENGTH);
    Response::from_parts(head, full(body.to_string()))
}

/// The `{"error","detail"}` body of every refusal.
fn error_body(code: &str, detail: &str) -> String {
    let body = ErrorBody {
        error: code,
        detail,
    };
    serde_json::to_string(&body).expect("two strings are JSON")
}

/// Every error the proxy answers with, on either port.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct ErrorBody<'a> {
    /// What went wrong, as a code that stays the same (`not_found`, `read_only`).
    pub error: &'a str,
    /// What went wrong, for a person.
    pub detail: &'a str,
}

/// Every reason the admin API refuses a request.
#[derive(Debug, PartialEq)]
pub enum AdminRefusal {
    /// `/v1/*` on a non-loopback listener without a token.
    Closed,
    Unauthorized,
    /// A change asked with the viewer's token, which only reads.
    ReadOnly,
    /// The store is not open yet.
    Starting,
    NotFound,
    NoSuchRoute(String),
    /// The route has no `order:`, so it records no versions.
    NoOrder(String),
    /// No version is recorded for the entity.
    NoVersion,
    /// The key is absent, released or expired.
    Absent,
    /// Forgetting a key in flight could run its event twice at once.
    InFlight,
    /// A held key is resolved, not forgotten.
    Held,
    /// The key is not held, so there is nothing to resolve.
    NotHeld,
    /// The key is held, but not since the `held_at` the resolution named.
    HeldAgain,
    /// The request is malformed (a query parameter, a resolution's body).
    BadRequest(String),
    StoreUnavailable(String),
    InvalidConfig(String),
    /// A known endpoint asked with a method it does not take (the router adds `Allow`).
    MethodNotAllowed(http::Method),
    Internal(String),
    /// The request names the port by another host than its own address, `localhost` or
    /// `admin.hosts`: a web page's rebound name, say.
    HostNotAllowed(String),
    /// A change asked for by a page of another origin.
    CrossOrigin,
    /// A `POST` any page could send: no JSON content type and no `Authorization`.
    JsonRequired,
    /// The route does not deliver through the queue (`delivery: queued`).
    NotQueued(String),
    /// No queued or dead job has the key.
    NoSuchJob,
    /// The job is queued, not dead: only a dead letter is replayed or discarded.
    NotDead,
    /// Too many of something run already (bulk replays, live tails).
    TooMany(String),
    /// The delivery log is off, so there is nothing to read.
    NoDeliveryLog,
    /// No entry of the delivery log has the id: trimmed, or never logged.
    NoSuchDelivery,
    /// No route keeps its keys in the scope named.
    NoSuchScope(String),
    /// Keys a clearing would take are in flight (how many were seen), or could not all
    /// be counted in the time a request has (`false`).
    ScopeInFlight(u64, bool),
}

impl AdminRefusal {
    fn parts(&self) -> (StatusCode, &'static str, String) {
        (self.status(), self.code(), self.detail())
    }

    /// The answer's status.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            AdminRefusal::Closed => StatusCode::FORBIDDEN,
            AdminRefusal::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminRefusal::ReadOnly => StatusCode::FORBIDDEN,
            AdminRefusal::Starting => StatusCode::SERVICE_UNAVAILABLE,
            AdminRefusal::NotFound => StatusCode::NOT_FOUND,
            AdminRefusal::NoSuchRoute(_) => StatusCode::NOT_FOUND,
            AdminRefusal::NoOrder(_) => StatusCode::NOT_FOUND,
            AdminRefusal::NoVersion => StatusCode::NOT_FOUND,
            AdminRefusal::Absent => StatusCode::NOT_FOUND,
            AdminRefusal::InFlight => StatusCode::CONFLICT,
            AdminRefusal::Held => StatusCode::CONFLICT,
            AdminRefusal::NotHeld => StatusCode::CONFLICT,
            AdminRefusal::HeldAgain => StatusCode::CONFLICT,
            AdminRefusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminRefusal::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminRefusal::InvalidConfig(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminRefusal::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AdminRefusal::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            AdminRefusal::HostNotAllowed(_) => StatusCode::FORBIDDEN,
            AdminRefusal::CrossOrigin => StatusCode::FORBIDDEN,
            AdminRefusal::JsonRequired => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AdminRefusal::NotQueued(_) => StatusCode::NOT_FOUND,
            AdminRefusal::NoSuchJob => StatusCode::NOT_FOUND,
            AdminRefusal::NotDead => StatusCode::CONFLICT,
            AdminRefusal::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            AdminRefusal::NoDeliveryLog => StatusCode::NOT_FOUND,
            AdminRefusal::NoSuchDelivery => StatusCode::NOT_FOUND,
            AdminRefusal::NoSuchScope(_) => StatusCode::NOT_FOUND,
            AdminRefusal::ScopeInFlight(..) => StatusCode::CONFLICT,
        }
    }

    /// The error code of the body.
    fn code(&self) -> &'static str {
        match self {
            AdminRefusal::Closed => "admin_api_closed",
            AdminRefusal::Unauthorized => "unauthorized",
            AdminRefusal::ReadOnly => "read_only",
            AdminRefusal::Starting => "starting",
            AdminRefusal::NotFound => "not_found",
            AdminRefusal::NoSuchRoute(_) => "no_such_route",
            AdminRefusal::NoOrder(_) => "no_order",
            AdminRefusal::NoVersion => "absent",
            AdminRefusal::Absent => "absent",
            AdminRefusal::InFlight => "in_flight",
            AdminRefusal::Held => "held",
            AdminRefusal::NotHeld => "not_held",
            AdminRefusal::HeldAgain => "held_again",
            AdminRefusal::BadRequest(_) => "bad_request",
            AdminRefusal::StoreUnavailable(_) => "store_unavailable",
            AdminRefusal::InvalidConfig(_) => "invalid_config",
            AdminRefusal::MethodNotAllowed(_) => "method_not_allowed",
            AdminRefusal::Internal(_) => "internal",
            AdminRefusal::HostNotAllowed(_) => "host_not_allowed",
            AdminRefusal::CrossOrigin => "cross_origin",
            AdminRefusal::JsonRequired => "json_required",
            AdminRefusal::NotQueued(_) => "not_queued",
            AdminRefusal::NoSuchJob => "no_such_job",
            AdminRefusal::NotDead => "not_dead",
            AdminRefusal::TooMany(_) => "too_many",
            AdminRefusal::NoDeliveryLog => "no_delivery_log",
            AdminRefusal::NoSuchDelivery => "no_such_delivery",
            AdminRefusal::NoSuchScope(_) => "no_such_scope",
            AdminRefusal::ScopeInFlight(..) => "in_flight",
        }
    }

    /// What the body says of it.
    fn detail(&self) -> String {
        match self {
            AdminRefusal::Closed => "the admin API listens beyond loopback without admin.token_env, so /v1/* is off; set a token to use it".into(),
            AdminRefusal::Unauthorized => "a valid bearer token is required".into(),
            AdminRefusal::ReadOnly => "this token reads and changes nothing; a change needs the operator's token (admin.token_env)".into(),
            AdminRefusal::Starting => "the store is not open yet".into(),
            AdminRefusal::NotFound => "no such admin endpoint".into(),
            AdminRefusal::NoSuchRoute(name) => format!("no route named `{name}`"),
            AdminRefusal::NoOrder(name) => format!("route `{name}` has no `order:`, so it records no versions"),
            AdminRefusal::NoVersion => "no version is recorded for the entity: none was done, or its record expired"
                    .into(),
            AdminRefusal::Absent => "the key is absent, released or expired".into(),
            AdminRefusal::InFlight => "the key is being processed; forgetting it could run the event twice at once"
                    .into(),
            AdminRefusal::Held => "the key is held; resolve it with POST .../resolve and {\"outcome\":\"done\"} or {\"outcome\":\"release\"}".into(),
            AdminRefusal::NotHeld => "the key is not held, so there is nothing to resolve".into(),
            AdminRefusal::HeldAgain => "the key was held again since the held_at given: look at it again".into(),
            AdminRefusal::BadRequest(reason) => reason.clone(),
            AdminRefusal::StoreUnavailable(failure) => failure.clone(),
            AdminRefusal::InvalidConfig(error) => error.clone(),
            AdminRefusal::MethodNotAllowed(method) => {
                format!("this endpoint does not take {method}; `Allow` lists the methods it takes")
            }
            AdminRefusal::Internal(failure) => failure.clone(),
            AdminRefusal::HostNotAllowed(host) => format!("the admin port answers to its own address, localhost and admin.hosts, not to `{}`", host.chars().take(256).collect::<String>()),
            AdminRefusal::CrossOrigin => "a change from a page of another origin is refused".into(),
            AdminRefusal::JsonRequired => "a POST to the admin port needs Content-Type: application/json (or an Authorization header)".into(),
            AdminRefusal::NotQueued(name) => format!("route `{name}` does not have `delivery: queued`"),
            AdminRefusal::NoSuchJob => "no queued or dead job has this key: it was delivered, discarded, or never queued".into(),
            AdminRefusal::NotDead => "the job is queued, not dead: only a dead letter is replayed or discarded".into(),
            AdminRefusal::TooMany(reason) => reason.clone(),
            AdminRefusal::NoDeliveryLog => "the delivery log is off (delivery_log.enabled: false)".into(),
            AdminRefusal::NoSuchDelivery => "no entry of the delivery log has this id: it was trimmed, or never logged".into(),
            AdminRefusal::NoSuchScope(scope) => format!("no route keeps its keys in scope `{scope}`"),
            AdminRefusal::ScopeInFlight(seen, true) => format!("{seen} of the keys to clear are being processed; wait for them, or pass \"force\":true to clear the rest (keys in flight are never removed)"),
            AdminRefusal::ScopeInFlight(seen, false) => format!("the keys in flight could not all be counted in the time a request has ({seen} seen so far); pass a narrower prefix, or \"force\":true to clear the rest (keys in flight are never removed)"),
        }
    }

    /// The answer: its status and `{"error","detail"}` JSON body.
    pub fn into_response(self) -> Response<ProxyBody> {
        let (status, code, detail) = self.parts();
        // A store's or a reload's message may quote what a driver was given.
        let detail = crate::redact::text(&detail);
        let mut response = json_response(status, error_body(code, &detail));
        if matches!(self, AdminRefusal::Unauthorized) {
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<BodyError> for Refusal {
    fn from(error: BodyError) -> Refusal {
        match error {
            BodyError::TooLarge { limit } => Refusal::BodyTooLarge { limit },
            BodyError::Broken(reason) => Refusal::BodyUnreadable(reason),
            BodyError::TimedOut(after) => Refusal::BodyTimeout(after),
        }
    }
}

impl From<UnforwardableTarget> for Refusal {
    fn from(error: UnforwardableTarget) -> Refusal {
        Refusal::BadTarget(error.to_string())
    }
}

/// A store that failed an admin request's operation.
impl From<StoreError> for AdminRefusal {
    fn from(failure: StoreError) -> AdminRefusal {
        match failure {
            StoreError::BadRequest(reason) => AdminRefusal::BadRequest(reason),
            other => AdminRefusal::StoreUnavailable(other.to_string()),
        }
    }
}

impl From<TargetError> for Refusal {
    fn from(error: TargetError) -> Refusal {
        Refusal::BadTarget(error.to_string())
    }
}

impl From<VerifyError> for Refusal {
    fn from(failure: VerifyError) -> Refusal {
        Refusal::Signature(failure)
    }
}

impl From<KeyError> for Refusal {
    fn from(error: KeyError) -> Refusal {
        match error {
            KeyError::TooLong(length) => Refusal::KeyTooLong(length),
            missing @ KeyError::Missing { .. } => Refusal::MissingKey(missing.to_string()),
        }
    }
}

/// A forward that got no answer, as its sender hears of it.
impl From<UpstreamError> for Refusal {
    fn from(error: UpstreamError) -> Refusal {
        match error {
            UpstreamError::Unreachable(_) | UpstreamError::Dropped(_) => {
                Refusal::UpstreamUnreachable
            }
            UpstreamError::SenderBody(detail) => Refusal::BodyUnreadable(detail),
            UpstreamError::Timeout(after) => Refusal::UpstreamTimeout(after),
        }
    }
}

/// `Retry-After` in whole seconds, rounded up, at least 1.
fn retry_after_value(after: Duration) -> HeaderValue {
    let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    HeaderValue::from(seconds.max(1))
}

pub fn json_response(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The answer to a duplicate of a done key: the upstream's recorded answer when the
/// route replays and one was recorded, else the configured duplicate response.
pub fn duplicate(
    configured: &DuplicateResponse,
    recorded: Option<RecordedResponse>,
) -> Response<ProxyBody> {
    let Some(recorded) = recorded.filter(|_| configured.replay) else {
        let mut response = Response::new(full(configured.body.clone()));
        *response.status_mut() = configured.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, configured.content_type.clone());
        return response;
    };
    let mut response = Response::new(full(recorded.body));
    *response.status_mut() = StatusCode::from_u16(recorded.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    for (name, value) in recorded.headers {
        // Recorded by the proxy from valid headers; anything else is left out, as is a
        // header `replay_headers` no longer names (taking a cookie off the list stops
        // the ones already recorded too). The body's encoding always goes with it.
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) else {
            continue;
        };
        if name == CONTENT_ENCODING || configured.replay_headers.contains(&name) {
            headers.append(name, value);
        }
    }
    headers.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    response
}

/// The answer to a stale event skipped unforwarded (`on_stale: skip`): a success, so that
/// the provider does not send it again. It does not say the newest version: on a route
/// anyone can reach, that would tell them when an object last changed.
pub fn stale() -> Response<ProxyBody> {
    json_response(
        StatusCode::OK,
        r#"{"received":true,"stale":true}"#.to_owned(),
    )
}

/// Marks a replayed answer, as Stripe's API does, besides `Dedupe-Status: duplicate`.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Whether `docs/contract.md` has a table row for `code` with `status`.
    fn documented(code: &str, status: StatusCode) -> bool {
        let row_start = format!("| `{code}` |");
        let status = format!("`{}`", status.as_u16());
        include_str!("../docs/contract.md")
            .lines()
            .any(|line| line.starts_with(&row_start) && line.contains(&status))
    }

    #[test]
    fn every_answer_is_in_the_contract() {
        // A new variant fails to compile here until it is listed below and documented.
        let listed = |refusal: &Refusal| match refusal {
            Refusal::NoRoute
            | Refusal::BodyTooLarge { .. }
            | Refusal::BodyUnreadable(_)
            | Refusal::BodyTimeout(_)
            | Refusal::Signature(_)
            | Refusal::MissingKey(_)
            | Refusal::KeyTooLong(_)
            | Refusal::StoreUnavailable { .. }
            | Refusal::QueueFull { .. }
            | Refusal::InFlight { .. }
            | Refusal::Held { .. }
            | Refusal::PayloadMismatch
            | Refusal::UpstreamUnreachable
            | Refusal::UpstreamTimeout(_)
            | Refusal::Overloaded
            | Refusal::TooManyConnections
            | Refusal::Closing
            | Refusal::BadTarget(_)
            | Refusal::Internal => refusal.parts(),
        };
        let second = Duration::from_secs(1);
        let refusals = [
            Refusal::NoRoute,
            Refusal::BodyTooLarge { limit: 1 },
            Refusal::BodyUnreadable(String::new()),
            Refusal::BodyTimeout(second),
            Refusal::Signature(VerifyError::NoMatch),
            Refusal::Signature(VerifyError::MissingHeader("h")),
            Refusal::Signature(VerifyError::Malformed("h")),
            Refusal::Signature(VerifyError::IdMismatch("h")),
            Refusal::Signature(VerifyError::Stale("5m".into())),
            Refusal::MissingKey(String::new()),
            Refusal::KeyTooLong(513),
            Refusal::StoreUnavailable {
                retry_after: second,
            },
            Refusal::QueueFull {
                retry_after: second,
            },
            Refusal::InFlight {
                status: StatusCode::CONFLICT,
                retry_after: second,
            },
            Refusal::Held {
                status: StatusCode::CONFLICT,
                retry_after: second,
            },
            Refusal::PayloadMismatch,
            Refusal::UpstreamUnreachable,
            Refusal::UpstreamTimeout(second),
            Refusal::Overloaded,
            Refusal::TooManyConnections,
            Refusal::Closing,
            Refusal::BadTarget(String::new()),
            Refusal::Internal,
        ];
        for refusal in &refusals {
            let (status, code, _) = listed(refusal);
            assert!(
                documented(code, status),
                "{code} ({status}) is not in docs/contract.md"
            );
        }
        let admin = |refusal: &AdminRefusal| match refusal {
            AdminRefusal::Closed
            | AdminRefusal::Unauthorized
            | AdminRefusal::ReadOnly
            | AdminRefusal::Starting
            | AdminRefusal::NotFound
            | AdminRefusal::NoSuchRoute(_)
            | AdminRefusal::NoOrder(_)
            | AdminRefusal::NoVersion
            | AdminRefusal::Absent
            | AdminRefusal::InFlight
            | AdminRefusal::Held
            | AdminRefusal::NotHeld
            | AdminRefusal::HeldAgain
            | AdminRefusal::BadRequest(_)
            | AdminRefusal::StoreUnavailable(_)
            | AdminRefusal::InvalidConfig(_)
            | AdminRefusal::MethodNotAllowed(_)
            | AdminRefusal::Internal(_)
            | AdminRefusal::HostNotAllowed(_)
            | AdminRefusal::CrossOrigin
            | AdminRefusal::JsonRequired
            | AdminRefusal::NotQueued(_)
            | AdminRefusal::NoSuchJob
            | AdminRefusal::NotDead
            | AdminRefusal::TooMany(_)
            | AdminRefusal::NoDeliveryLog
            | AdminRefusal::NoSuchDelivery
            | AdminRefusal::NoSuchScope(_)
            | AdminRefusal::ScopeInFlight(..) => refusal.parts(),
        };
        for refusal in [
            AdminRefusal::Closed,
            AdminRefusal::Unauthorized,
            AdminRefusal::ReadOnly,
            AdminRefusal::Starting,
            AdminRefusal::NotFound,
            AdminRefusal::NoSuchRoute(String::new()),
            AdminRefusal::NoOrder(String::new()),
            AdminRefusal::NoVersion,
            AdminRefusal::Absent,
            AdminRefusal::InFlight,
            AdminRefusal::Held,
            AdminRefusal::NotHeld,
            AdminRefusal::HeldAgain,
            AdminRefusal::BadRequest(String::new()),
            AdminRefusal::StoreUnavailable(String::new()),
            AdminRefusal::InvalidConfig(String::new()),
            AdminRefusal::MethodNotAllowed(http::Method::PUT),
            AdminRefusal::Internal(String::new()),
            AdminRefusal::HostNotAllowed(String::new()),
            AdminRefusal::CrossOrigin,
            AdminRefusal::JsonRequired,
            AdminRefusal::NotQueued(String::new()),
            AdminRefusal::NoSuchJob,
            AdminRefusal::NotDead,
            AdminRefusal::TooMany(String::new()),
            AdminRefusal::NoDeliveryLog,
            AdminRefusal::NoSuchDelivery,
            AdminRefusal::NoSuchScope(String::new()),
            AdminRefusal::ScopeInFlight(1, true),
        ] {
            let (status, code, _) = admin(&refusal);
            assert!(
                documented(code, status),
                "admin {code} ({status}) is not in docs/contract.md"
            );
        }
        assert!(
            !documented("no_such_code", StatusCode::OK),
            "the check can fail"
        );
    }

    async fn body_text(response: Response<ProxyBody>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn refusals_are_json_with_retry_after_where_it_helps() {
        let response = Refusal::StoreUnavailable {
            retry_after: Duration::from_millis(1500),
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let body: serde_json::Value = serde_json::from_str(&body_text(response).await).unwrap();
        assert_eq!(body["error"], "store_unavailable");
        assert!(body["detail"].is_string());

        let response = Refusal::KeyTooLong(600).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(!response.headers().contains_key(RETRY_AFTER));
    }

    #[test]
    fn a_refusal_written_as_bytes_declares_its_own_length() {
        let bytes = Refusal::TooManyConnections.into_http1_bytes();
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains("retry-after: 1"), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"], "too_many_connections");
    }

    /// Its place in [`DedupeStatus::ALL`]: a new status does not compile until it has one.
    fn position(status: DedupeStatus) -> usize {
        match status {
            DedupeStatus::Rejected => 0,
            DedupeStatus::Unkeyed => 1,
            DedupeStatus::Unavailable => 2,
            DedupeStatus::Duplicate => 3,
            DedupeStatus::InFlight => 4,
            DedupeStatus::Forwarded => 5,
            DedupeStatus::Released => 6,
            DedupeStatus::Held => 7,
            DedupeStatus::Stale => 8,
            DedupeStatus::Queued => 9,
        }
    }

    #[test]
    fn every_status_is_listed() {
        for (index, status) in DedupeStatus::ALL.into_iter().enumerate() {
            assert_eq!(position(status), index, "{status:?}");
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_secs(5)), "5");
        assert_eq!(retry_after_value(Duration::from_millis(5001)), "6");
    }
}
