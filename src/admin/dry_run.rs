//! `POST /v1/try`: a dry run of one request against the running routes (see `dry_run`),
//! as `dedupe-proxy try --json` reports it. The request comes as a plain HTTP message in
//! `request`; `at` (or the message's `# signed-at:`) is when its timestamp is judged. The
//! running routes have their secrets, so a message's `# secret:` lines are not read.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde::Deserialize;

use crate::body::ProxyBody;
use crate::dry_run::judge;
use crate::http_file;
use crate::proxy::Proxy;
use crate::response::{AdminRefusal, json_response};

/// The largest body taken: a delivery's message, which a provider keeps far smaller.
pub(super) const REQUEST_BODY_MAX: u64 = 256 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Asked {
    request: String,
    #[serde(default)]
    at: Option<String>,
}

pub(super) fn dry_run(proxy: &Proxy, body: &Bytes) -> Response<ProxyBody> {
    let asked: Asked = match serde_json::from_slice(body) {
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
