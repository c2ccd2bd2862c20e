//! A dry run's report: what each step found, as JSON (`try --json`, `POST /v1/try`); the
//! answers a route gives, the refusals and their reasons in words; and the report as the
//! text `dedupe-proxy try` prints.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, Request};
use serde::Serialize;

use crate::order::Guard;
use crate::preset::Preset;
use crate::response::Refusal;
use crate::route::{DeliveryMode, OnAmbiguous, OnInFlight, OnPayloadMismatch, ReplayGuard, Route};
use crate::values::{HumanDuration, UpstreamUrl};
use crate::verify::VerifyError;

/// What the proxy would do with a request. A field left out when empty is `default` too,
/// so that its schema does not call it required.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Report {
    pub verdict: Verdict,
    pub request: Asked,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteTaken>,
    /// Each route, and why it does not take the request: only when none does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_taken_by: Vec<NotTaken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyRead>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderRead>,
    /// What the first delivery of the key gets, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_delivery: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<Answered>,
    /// The answer while another delivery of the key is running, or while it is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<Answered>,
    /// The answer a refused request gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Answered>,
    /// What the caller of the dry run adds (where a secret came from, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A route takes it: forwarded, or queued.
    Taken,
    /// A route would take it if its signature verifies, which was not checked (a secret's
    /// variable is not set).
    Unverified,
    /// The sender gets an error.
    Refused,
    /// No route takes it: forwarded unchecked, as `unmatched: forward` says.
    Unmatched,
}

/// The request, as the dry run read it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Asked {
    pub method: String,
    pub target: String,
    pub host: Option<String>,
    pub body_bytes: usize,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RouteTaken {
    pub name: String,
    pub scope: String,
    pub delivery: DeliveryMode,
    pub upstream: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NotTaken {
    pub route: String,
    pub because: String,
}

/// What became of the signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[expect(
    clippy::enum_variant_names,
    reason = "`not_checked` is the report's word"
)]
pub enum Checked {
    Verified,
    Refused,
    /// A secret's variable is not set here.
    NotChecked,
    /// The route checks none.
    None,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Signature {
    pub result: Checked,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<&'static str>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// When a timestamped scheme's timestamp was judged at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged_at: Option<String>,
    /// Why it was refused or not checked, or what a route without a check misses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct KeyRead {
    pub template: String,
    /// The key, or none when a part read nothing.
    pub value: Option<String>,
    /// Each part that reads the request, with its value or why it has none.
    pub parts: Vec<PartRead>,
    /// The key in its scope, as the admin API and the sled and PostgreSQL stores name it
    /// (a Redis store puts its prefix in front).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_key: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PartRead {
    pub part: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrderRead {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why the guard cannot use the event (it goes unguarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

/// An answer the proxy gives itself.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Answered {
    pub status: u16,
    /// The `error` code of a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// A refusal's detail, or the body of another answer and when it is given.
    pub detail: String,
}

impl Report {
    /// A report of `request`, refused until a step finds otherwise.
    pub(super) fn of(request: &Request<Bytes>) -> Report {
        let host = request.headers().get(http::header::HOST);
        Report {
            verdict: Verdict::Refused,
            request: Asked {
                method: request.method().to_string(),
                target: request.uri().to_string(),
                host: host.and_then(|host| host.to_str().ok()).map(str::to_owned),
                body_bytes: request.body().len(),
            },
            route: None,
            not_taken_by: Vec::new(),
            signature: None,
            key: None,
            order: None,
            first_delivery: None,
            duplicate: None,
            in_flight: None,
            refusal: None,
            notes: Vec::new(),
        }
    }

    pub(super) fn refused(mut self, refusal: Refusal) -> Report {
        let (status, error, detail) = refusal.parts();
        self.verdict = Verdict::Refused;
        self.refusal = Some(Answered {
            status: status.as_u16(),
            error: Some(error),
            detail,
        });
        self
    }

    pub(super) fn forwarded_unmatched(mut self, upstream: &UpstreamUrl) -> Report {
        self.verdict = Verdict::Unmatched;
        self.first_delivery = Some(format!(
            "forwarded to {upstream} as it is: no signature check, no key, no deduplication"
        ));
        self
    }

    pub(super) fn forwarded_unkeyed(mut self, route: &Route) -> Report {
        self.verdict = self.taken();
        self.first_delivery = Some(format!(
            "forwarded to {} without a claim (on_missing_key: forward): not deduplicated",
            route.upstream
        ));
        self
    }

    /// Taken, unless the signature went unchecked.
    fn taken(&self) -> Verdict {
        let unchecked = self
            .signature
            .as_ref()
            .is_some_and(|signature| signature.result == Checked::NotChecked);
        if unchecked {
            Verdict::Unverified
        } else {
            Verdict::Taken
        }
    }

    /// What the first delivery of a keyed request, a duplicate and a delivery in flight
    /// get on `route`: the request is taken.
    pub(super) fn answers(&mut self, route: &Route, request: &Request<Bytes>) {
        self.verdict = self.taken();
        let policy = &route.policy;
        let success: Vec<String> = policy
            .success_status
            .iter()
            .map(ToString::to_string)
            .collect();
        let success = success.join(" or ");
        self.first_delivery = Some(match (&policy.delivery, &policy.queue) {
            (DeliveryMode::Queued, Some(queue)) => format!(
                "stored, and answered {} at once; the proxy delivers it to {} and retries until the app answers {success}",
                queue.accepted_status.as_u16(),
                route.upstream,
            ),
            _ => {
                let other = match policy.on_ambiguous {
                    OnAmbiguous::Release => {
                        "released for the sender's retry after any other answer or none"
                    }
                    OnAmbiguous::Hold => {
                        "released after another answer; held for an operator when no answer comes within upstream_timeout"
                    }
                };
                format!(
                    "forwarded to {} ({} {}); the key is done once the app answers {success}, {other}",
                    route.upstream,
                    request.method(),
                    request.uri(),
                )
            }
        });
        let duplicate = &policy.duplicate_response;
        let body = String::from_utf8_lossy(&duplicate.body);
        let mut detail = if duplicate.replay {
            format!(
                "the app's recorded answer, marked Idempotent-Replayed (where none was recorded: {body})"
            )
        } else {
            body.into_owned()
        };
        if policy.on_payload_mismatch == OnPayloadMismatch::Reject {
            detail.push_str("; with another body (another request, for idempotency keys), 422");
        }
        if route.replay_guard == ReplayGuard::Body {
            detail.push_str(
                "; the same signed body under another key is a duplicate too (replay_guard: body)",
            );
        }
        self.duplicate = Some(Answered {
            status: duplicate.status.as_u16(),
            error: None,
            detail,
        });
        let in_flight = match policy.on_in_flight {
            OnInFlight::Respond => format!(
                "at once, with Retry-After: {}",
                HumanDuration(policy.retry_after)
            ),
            OnInFlight::Wait => format!(
                "only if the running delivery has no outcome within {}; with one, the duplicate's answer, or it runs",
                HumanDuration(policy.in_flight_wait)
            ),
        };
        self.in_flight = Some(Answered {
            status: policy.in_flight_status.as_u16(),
            error: Some("in_flight"),
            detail: in_flight,
        });
    }
}

impl RouteTaken {
    pub(super) fn of(route: &Route) -> RouteTaken {
        RouteTaken {
            name: route.name.clone(),
            scope: route.namespace.clone(),
            delivery: route.policy.delivery,
            upstream: route.upstream.to_string(),
        }
    }
}

impl Signature {
    /// A route that checks none; a provider's signature header in the request is pointed
    /// out, since nothing reads it.
    pub(super) fn none(headers: &HeaderMap) -> Signature {
        let carried = Preset::signature_header_in(|name| headers.contains_key(name));
        Signature {
            result: Checked::None,
            scheme: None,
            secrets: Vec::new(),
            judged_at: None,
            detail: carried.map(|name| {
                format!("the request carries {name}, which this route does not check: add a `preset` or `verify`")
            }),
        }
    }
}

impl OrderRead {
    pub(super) fn of(guard: Guard) -> OrderRead {
        let (entity, version, unusable) = match guard {
            Guard::Versioned(ordered) => (Some(ordered.entity), Some(ordered.version.text), None),
            Guard::Unversioned(why) => (None, None, Some(why)),
            Guard::Off => (None, None, None),
        };
        OrderRead {
            entity,
            version,
            unusable,
        }
    }
}

/// Why a route whose matcher takes the request's plain reading did not take it.
pub(super) fn another_reading() -> String {
    "it takes another reading of the request (a method override or a rewritten URL)".into()
}

/// Why a signature was refused, with what to look at; a timestamp is judged at
/// `judged_at`.
pub(super) fn why_refused(failure: &VerifyError, judged_at: Option<&str>) -> String {
    match failure {
        VerifyError::NoMatch => format!(
            "{failure}: the secret differs from the sender's, or the body changed after it was signed (one byte is enough: whitespace, re-encoded JSON, a final newline)"
        ),
        VerifyError::Stale(tolerance) => format!(
            "the signature's timestamp is more than {tolerance} from {}, when it was judged: judge a recorded delivery as of when it was signed (`--at`, the API's `at`, or a `# signed-at:` line)",
            judged_at.unwrap_or("now")
        ),
        other => other.to_string(),
    }
}

/// `dedupe-proxy try`'s text: one line per step, a label and what it found. What the
/// request carries is shown as it is: a terminal's printer makes it safe.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let asked = &self.request;
        let host = asked.host.as_deref().unwrap_or("none");
        let text = format!(
            "{} {} (host {host}, {} bytes of body)",
            asked.method, asked.target, asked.body_bytes
        );
        line(f, "request", &text)?;
        if let Some(route) = &self.route {
            let delivery = match route.delivery {
                DeliveryMode::Direct => "direct",
                DeliveryMode::Queued => "queued",
            };
            line(
                f,
                "route",
                &format!(
                    "{} (scope {}, {delivery} delivery)",
                    route.name, route.scope
                ),
            )?;
        }
        for not_taken in &self.not_taken_by {
            line(
                f,
                "not taken",
                &format!("by {}: {}", not_taken.route, not_taken.because),
            )?;
        }
        if let Some(signature) = &self.signature {
            signature_line(f, signature)?;
        }
        if let Some(key) = &self.key {
            key_lines(f, key)?;
        }
        if let Some(order) = &self.order {
            let text = match (&order.entity, &order.version, &order.unusable) {
                (Some(entity), Some(version), _) => format!(
                    "entity {entity}, version {version}: stale if the store holds a newer version done for it"
                ),
                (_, _, Some(why)) => format!("unguarded: {why}"),
                _ => "off".to_owned(),
            };
            line(f, "order", &text)?;
        }
        if let Some(first) = &self.first_delivery {
            line(f, "first", first)?;
        }
        for (label, answer) in [
            ("duplicate", &self.duplicate),
            ("in flight", &self.in_flight),
            ("refused", &self.refusal),
        ] {
            if let Some(answer) = answer {
                let code = answer
                    .error
                    .map(|code| format!(" {code}"))
                    .unwrap_or_default();
                line(
                    f,
                    label,
                    &format!("{}{code}: {}", answer.status, answer.detail),
                )?;
            }
        }
        for note in &self.notes {
            line(f, "note", note)?;
        }
        let verdict = match self.verdict {
            Verdict::Taken => "taken",
            Verdict::Unverified => {
                "unverified: taken if its signature verifies, which was not checked"
            }
            Verdict::Refused => "refused",
            Verdict::Unmatched => "unmatched: no route takes it",
        };
        line(f, "verdict", verdict)
    }
}

fn line(f: &mut fmt::Formatter<'_>, label: &str, text: &str) -> fmt::Result {
    writeln!(f, "{label:<11}{text}")
}

fn signature_line(f: &mut fmt::Formatter<'_>, signature: &Signature) -> fmt::Result {
    let mut text = match signature.result {
        Checked::Verified => "verified",
        Checked::Refused => "refused",
        Checked::NotChecked => "not checked",
        Checked::None => "none: the route checks no signature",
    }
    .to_owned();
    if let Some(scheme) = signature.scheme {
        text.push_str(&format!(
            ": {scheme} with {}",
            signature.secrets.join(" or ")
        ));
    }
    if let (Some(at), Checked::Verified) = (&signature.judged_at, signature.result) {
        text.push_str(&format!(", its timestamp judged as of {at}"));
    }
    if let Some(detail) = &signature.detail {
        text.push_str(&format!("; {detail}"));
    }
    line(f, "signature", &text)
}

/// The key, and each part's reading where there are several or one read nothing.
fn key_lines(f: &mut fmt::Formatter<'_>, key: &KeyRead) -> fmt::Result {
    let value = key.value.as_deref().unwrap_or("(none)");
    line(f, "key", &format!("{value} from {}", key.template))?;
    let missing = key.parts.iter().any(|part| part.missing.is_some());
    if key.parts.len() > 1 || missing {
        for part in &key.parts {
            let read = match (&part.value, &part.missing) {
                (Some(value), _) => value.clone(),
                (None, Some(missing)) => format!("nothing: {missing}"),
                (None, None) => String::new(),
            };
            line(f, "", &format!("  {} read {read}", part.part))?;
        }
    }
    match &key.store_key {
        Some(store_key) => line(f, "store key", store_key),
        None => Ok(()),
    }
}
