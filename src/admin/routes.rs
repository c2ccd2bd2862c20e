//! The routes as they run (`GET /v1/routes`), and the configuration file read again
//! (`POST /v1/reload`).

use http::{Response, StatusCode};
use serde_json::json;

use super::answers::{Reloaded, answer_json};
use super::extract::Live;
use crate::body::ProxyBody;
use crate::response::{AdminRefusal, json_response};

/// `GET /v1/routes`: every route with its resolved settings, and where unmatched
/// requests go.
pub(super) async fn routes(Live(serving): Live) -> Response<ProxyBody> {
    let routing = serving.proxy.routing();
    let routes: Vec<_> = routing.table.routes().collect();
    let body = json!({
        "routes": routes,
        "unmatched": routing.unmatched,
        "upstream": routing.fallback_upstream.to_string(),
    });
    json_response(StatusCode::OK, body.to_string())
}

/// `POST /v1/reload`: reads the configuration file again.
pub(super) async fn reload(Live(serving): Live) -> Response<ProxyBody> {
    match serving.reloader.reload().await {
        Ok(reloaded) => {
            let restart_needed = reloaded.restart_needed.iter().map(|s| (*s).to_owned());
            let answer = Reloaded {
                reloaded: true,
                routes: reloaded.routes,
                restart_needed: restart_needed.collect(),
            };
            answer_json(StatusCode::OK, &answer)
        }
        Err(invalid) => AdminRefusal::InvalidConfig(invalid.on_one_line()).into_response(),
    }
}
