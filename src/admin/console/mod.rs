//! The console: a page for the people who run the proxy, served from the binary on the
//! admin port. Its three files are compiled in (no build step, nothing fetched at run
//! time); they hold no data and no secret, so they are served without the token, and the
//! page reads everything from `/v1/*` with the token the operator typed, kept in the tab.
//!
//! The answers carry a Content Security Policy that lets the page run only its own script
//! and reach only its own origin, and keep it out of other sites' frames.

use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use http::{HeaderValue, Response, StatusCode};

use crate::body::{ProxyBody, empty, full};

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// The page may load its own script and style, call its own origin, and nothing else.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// `GET` of a console file the route table names, or of `/`.
pub(super) async fn serve(uri: http::Uri) -> Response<ProxyBody> {
    match Asset::named(uri.path()) {
        Some(asset) => asset.response(),
        None => crate::response::AdminRefusal::NotFound.into_response(),
    }
}

/// One of the console's files, or `/`, which leads to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asset {
    Root,
    Page,
    Script,
    Style,
}

impl Asset {
    /// The file `path` names, if any.
    fn named(path: &str) -> Option<Asset> {
        match path {
            "/" => Some(Asset::Root),
            "/console" | "/console/" => Some(Asset::Page),
            "/console/app.js" => Some(Asset::Script),
            "/console/app.css" => Some(Asset::Style),
            _ => None,
        }
    }

    /// The file, with the headers that keep the page to itself.
    fn response(self) -> Response<ProxyBody> {
        let (text, media) = match self {
            Asset::Root => {
                let mut moved = Response::new(empty());
                *moved.status_mut() = StatusCode::SEE_OTHER;
                moved
                    .headers_mut()
                    .insert(LOCATION, HeaderValue::from_static("/console/"));
                return moved;
            }
            Asset::Page => (PAGE, "text/html; charset=utf-8"),
            Asset::Script => (SCRIPT, "text/javascript; charset=utf-8"),
            Asset::Style => (STYLE, "text/css; charset=utf-8"),
        };
        let mut response = Response::new(full(text));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(media));
        headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
        headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        // A page of another site that opens the console keeps no handle on its window.
        headers.insert(
            http::header::HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        );
        headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
        // A new binary brings new files: the browser asks each time (they are small).
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }
}
