//! The routes as they run (`GET /v1/routes`), and the configuration file read again
//! (`POST /v1/reload`).

use http::{Response, StatusCode};
use serde_json::Value;

use super::answers::{Reloaded, RouteList, answer_json};
use super::extract::Live;
use crate::body::ProxyBody;
use crate::response::AdminRefusal;

/// `GET /v1/routes`: every route with its resolved settings, and where unmatched
/// requests go.
pub(super) async fn routes(Live(serving): Live) -> Response<ProxyBody> {
    let routing = serving.proxy.routing();
    let routes = routing
        .table
        .routes()
        .map(|route| match serde_json::to_value(route) {
            Ok(Value::Object(settings)) => settings,
            _ => unreachable!("a route is written as a map"),
        });
    let answer = RouteList {
        routes: routes.collect(),
        unmatched: routing.unmatched,
        upstream: routing.fallback_upstream.to_string(),
    };
    answer_json(StatusCode::OK, &answer)
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
