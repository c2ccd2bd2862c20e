//! `POST /v1/try`: a dry run of one request against the running routes (see `dry_run`),
//! as `dedupe-proxy try --json` reports it. The request comes as a plain HTTP message in
//! `request`; `at` (or the message's `# signed-at:`) is when its timestamp is judged. The
//! running routes have their secrets, so a message's `# secret:` lines are not read.

use http::{Response, StatusCode};
use serde::Deserialize;

use super::extract::{Live, WithBody};
use crate::body::ProxyBody;
use crate::dry_run::judge;
use crate::http_file;
use crate::proxy::Proxy;
use crate::response::{AdminRefusal, json_response};

/// The largest body taken: a delivery's message, which a provider keeps far smaller.
pub(super) const REQUEST_BODY_MAX: u64 = 256 * 1024;

/// A dry run's request.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Tried {
    /// A plain HTTP message, as a `.http` file holds one.
    request: String,
    /// When its timestamp is judged (RFC 3339); the message's `# signed-at:` without it.
    #[serde(default)]
    at: Option<String>,
}

pub(super) async fn dry_run(
    Live(serving): Live,
    WithBody(request): WithBody<REQUEST_BODY_MAX>,
) -> Response<ProxyBody> {
    let proxy: &Proxy = &serving.proxy;
    let asked: Tried = match super::extract::json_object(request.body()) {
        Ok(asked) => asked,
        Err(error) => {
            return AdminRefusal::BadRequest(format!(
                "the body is {{\"request\": \"<an HTTP message>\", \"at\": \"<a time>\"}}: {error}"
            ))
            .into_response();
        }
    };
    let judged = http_file::parse(asked.request.as_bytes()).and_then(|written| {
        let now = written.judged_at(asked.at.as_deref())?;
        Ok(judge(&proxy.routing(), &written.request, now))
    });
    match judged {
        Ok(report) => json_response(
            StatusCode::OK,
            serde_json::to_string(&report).expect("a report is JSON"),
        ),
        Err(error) => AdminRefusal::BadRequest(format!("the request: {error}")).into_response(),
    }
}
