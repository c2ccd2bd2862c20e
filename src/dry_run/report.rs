//! A dry run's report: what it found, as JSON; the answers a route gives (first
//! delivery, duplicate, in flight) and why a signature was refused, in words; and the
//! report as the text `dedupe-proxy try` prints.

use std::fmt;

use bytes::Bytes;
use http::Request;
use serde::Serialize;

use crate::response::Refusal;
use crate::route::{DeliveryMode, OnAmbiguous, OnInFlight, ReplayGuard, Route};
use crate::verify::VerifyError;

/// What the proxy would do with a request.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `taken` (a route takes it and forwards or queues it), `refused` (the sender gets
    /// an error) or `unmatched` (no route takes it; it is forwarded unchecked).
    pub verdict: Verdict,
    pub request: Asked,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteTaken>,
    /// Each route, and why it does not take the request: only when none does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_taken_by: Vec<NotTaken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyRead>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderRead>,
    /// What the first delivery of the key gets, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_delivery: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<Answered>,
    /// The answer while another delivery of the key is running, or while it is held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<Answered>,
    /// The answer a refused request gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Answered>,
    /// What the caller of the dry run adds (where a secret came from, say).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Taken,
    Refused,
    Unmatched,
}

/// The request, as the dry run read it.
#[derive(Debug, Serialize)]
pub struct Asked {
    pub method: String,
    pub target: String,
    pub host: Option<String>,
    pub body_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct RouteTaken {
    pub name: String,
    pub scope: String,
    pub delivery: DeliveryMode,
    pub upstream: String,
}

#[derive(Debug, Serialize)]
pub struct NotTaken {
    pub route: String,
    pub because: String,
}

#[derive(Debug, Serialize)]
pub struct Signature {
    /// `verified`, `refused`, `not_checked` (a secret's variable is not set) or `none`
    /// (the route checks no signature).
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Why it was refused or not checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct KeyRead {
    pub template: String,
    /// The key, or none when a part read nothing.
    pub value: Option<String>,
    /// Each part that reads the request, with its value or why it has none.
    pub parts: Vec<PartRead>,
    /// Where the store keeps it (a Redis store puts its prefix in front).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_key: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PartRead {
    pub part: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct OrderRead {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why the guard cannot use the event (it goes unguarded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

/// An answer the proxy gives itself.
#[derive(Debug, Serialize)]
pub struct Answered {
    pub status: u16,
    /// The `error` code of a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// A refusal's detail, or the body of another answer.
    pub detail: String,
}

impl Report {
    pub(super) fn of(request: &Request<Bytes>) -> Report {
        let host = request.headers().get(http::header::HOST);
        Report {
            verdict: Verdict::Taken,
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
}

/// Fills in what the first delivery of a keyed request, a duplicate and a delivery in
/// flight would get on `route`.
pub(super) fn answers(report: &mut Report, route: &Route, request: &Request<Bytes>) {
    let policy = &route.policy;
    let success: Vec<String> = policy
        .success_status
        .iter()
        .map(ToString::to_string)
        .collect();
    let first = match (&policy.delivery, &policy.queue) {
        (DeliveryMode::Queued, Some(queue)) => format!(
            "stored, and answered {} at once; the proxy delivers it to {} and retries until the app answers {}",
            queue.accepted_status.as_u16(),
            route.upstream,
            success.join(" or ")
        ),
        _ => {
            let mut first = format!(
                "forwarded to {} ({} {}); the key is done once the app answers {}, and released for the sender's retry after any other answer",
                route.upstream,
                request.method(),
                request.uri(),
                success.join(" or ")
            );
            if policy.on_ambiguous == OnAmbiguous::Hold {
                first.push_str("; no answer within upstream_timeout holds it for an operator");
            }
            first
        }
    };
    report.first_delivery = Some(first);
    let duplicate = &policy.duplicate_response;
    let mut detail = if duplicate.replay {
        format!(
            "the app's recorded answer, marked Idempotent-Replayed (where none was recorded: {})",
            String::from_utf8_lossy(&duplicate.body)
        )
    } else {
        String::from_utf8_lossy(&duplicate.body).into_owned()
    };
    if route.replay_guard == ReplayGuard::Body {
        detail.push_str(
            "; the same signed body under another key is a duplicate too (replay_guard: body)",
        );
    }
    report.duplicate = Some(Answered {
        status: duplicate.status.as_u16(),
        error: None,
        detail,
    });
    let retry_after = crate::values::HumanDuration(policy.retry_after);
    let in_flight = match policy.on_in_flight {
        OnInFlight::Respond => format!("at once, with Retry-After: {retry_after}"),
        OnInFlight::Wait => format!(
            "after waiting up to {} for the running delivery's outcome (then as a duplicate, or run)",
            crate::values::HumanDuration(policy.in_flight_wait)
        ),
    };
    report.in_flight = Some(Answered {
        status: policy.in_flight_status.as_u16(),
        error: Some("in_flight"),
        detail: in_flight,
    });
}

/// Why a signature was refused, with what to look at.
pub(super) fn why_refused(failure: &VerifyError) -> String {
    match failure {
        VerifyError::NoMatch => format!(
            "{failure}: the secret differs from the sender's, or the body changed after it was signed (one byte is enough: whitespace, re-encoded JSON, a final newline)"
        ),
        VerifyError::Stale(_) => format!(
            "{failure}: a recorded delivery is judged as of when it was signed with `--at` (or a `# signed-at:` line in its file)"
        ),
        other => other.to_string(),
    }
}

/// `dedupe-proxy try`'s text: one line per step, a label and what it found. What the
/// request carries is shown as it is: a terminal's printer makes it safe.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let asked = &self.request;
        line(
            f,
            "request",
            &format!(
                "{} {} (host {}, {} bytes of body)",
                asked.method,
                asked.target,
                asked.host.as_deref().unwrap_or("none"),
                asked.body_bytes
            ),
        )?;
        if let Some(route) = &self.route {
            let delivery = match route.delivery {
                DeliveryMode::Direct => "direct",
                DeliveryMode::Queued => "queued",
            };
            let text = format!(
                "{} (scope {}, {delivery} delivery)",
                route.name, route.scope
            );
            line(f, "route", &text)?;
        }
        for not_taken in &self.not_taken_by {
            let text = format!("by {}: {}", not_taken.route, not_taken.because);
            line(f, "not taken", &text)?;
        }
        if let Some(signature) = &self.signature {
            signature_lines(f, signature)?;
        }
        if let Some(key) = &self.key {
            key_lines(f, key)?;
        }
        if let Some(order) = &self.order {
            let text = match (&order.entity, &order.version, &order.unusable) {
                (Some(entity), Some(version), _) => format!("entity {entity}, version {version}"),
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
            Verdict::Refused => "refused",
            Verdict::Unmatched => "unmatched: no route takes it",
        };
        line(f, "verdict", verdict)
    }
}

fn line(f: &mut fmt::Formatter<'_>, label: &str, text: &str) -> fmt::Result {
    writeln!(f, "{label:<11}{text}")
}

fn signature_lines(f: &mut fmt::Formatter<'_>, signature: &Signature) -> fmt::Result {
    let mut text = signature.result.replace('_', " ");
    if let Some(scheme) = signature.scheme {
        text.push_str(&format!(
            ": {scheme} with {}",
            signature.secrets.join(" or ")
        ));
    }
    if let Some(detail) = &signature.detail {
        text.push_str(&format!("; {detail}"));
    }
    line(f, "signature", &text)
}

fn key_lines(f: &mut fmt::Formatter<'_>, key: &KeyRead) -> fmt::Result {
    let value = key.value.as_deref().unwrap_or("(none)");
    line(f, "key", &format!("{value} from {}", key.template))?;
    for part in &key.parts {
        let read = match (&part.value, &part.missing) {
            (Some(value), _) => value.clone(),
            (None, Some(missing)) => format!("nothing: {missing}"),
            (None, None) => String::new(),
        };
        line(f, "", &format!("  {} read {read}", part.part))?;
    }
    match &key.store_key {
        Some(store_key) => line(f, "store key", store_key),
        None => Ok(()),
    }
}
