//! A dry run's report in words: the answers a route gives (first delivery, duplicate, in
//! flight), why a signature was refused, and the report as the text `dedupe-proxy try`
//! prints.

use std::fmt;

use bytes::Bytes;
use http::Request;

use super::{Answered, Report, Verdict};
use crate::route::{DeliveryMode, OnAmbiguous, OnInFlight, ReplayGuard, Route};
use crate::verify::VerifyError;

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
        let line =
            |f: &mut fmt::Formatter<'_>, label: &str, text: &str| writeln!(f, "{label:<11}{text}");
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
            line(
                f,
                "route",
                &format!(
                    "{} (scope {}, {} delivery)",
                    route.name,
                    route.scope,
                    serde_json::to_value(route.delivery)
                        .ok()
                        .and_then(|mode| mode.as_str().map(str::to_owned))
                        .unwrap_or_default()
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
            line(f, "signature", &text)?;
        }
        if let Some(key) = &self.key {
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
            if let Some(store_key) = &key.store_key {
                line(f, "store key", store_key)?;
            }
        }
        if let Some(order) = &self.order {
            let text = match (&order.entity, &order.version, &order.unusable) {
                (Some(entity), Some(version), _) => {
                    format!("entity {entity}, version {version}")
                }
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
