//! What the admin API's handlers take from a request, each refused as a JSON error: the
//! running proxy ([`Live`]), the names in the path, decoded ([`PathNames`]), and the request
//! with its body read within bounds ([`WithBody`]) and read as a JSON object
//! ([`json_object`]); and the rule each endpoint of the table applies to its caller
//! ([`admit`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, RawPathParams};
use axum::middleware::Next;
use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response};
use hyper::body::SizeHint;
use serde::de::DeserializeOwned;
use sync_wrapper::SyncWrapper;

use super::access::{Need, Role};
use super::places;
use super::state::{
    AdminState, BODIES_MAX, BODIES_PER_CREDENTIAL, BODY_MAX, BODY_READ_TIMEOUT, Serving,
};
use crate::body::{self, ProxyBody};
use crate::response::AdminRefusal;
use crate::server::Ends;

impl axum::response::IntoResponse for AdminRefusal {
    fn into_response(self) -> axum::response::Response {
        axum::response::IntoResponse::into_response(AdminRefusal::into_response(self))
    }
}

/// Who calls the admin API: the way in and the credential (`api:token`, `mcp:loopback`)
/// and from where; set on each request before it is answered.
#[derive(Clone)]
pub(super) struct Caller {
    pub(super) by: String,
    pub(super) client: Option<SocketAddr>,
}

/// The proxy the API reads and changes; refused `503 starting` until the store is open.
pub(super) struct Live(pub(super) Serving);

impl FromRequestParts<Arc<AdminState>> for Live {
    type Rejection = AdminRefusal;

    async fn from_request_parts(
        _parts: &mut Parts,
        state: &Arc<AdminState>,
    ) -> Result<Live, AdminRefusal> {
        state
            .serving
            .get()
            .cloned()
            .map(Live)
            .ok_or(AdminRefusal::Starting)
    }
}

/// The names in the path (a route, a key), percent-decoded: a key that holds a `/` is
/// sent with it escaped (`%2F`), so that no key reads as a sub-path.
pub(super) struct PathNames<T>(pub(super) T);

impl<T, S> FromRequestParts<S> for PathNames<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = AdminRefusal;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &S,
    ) -> Result<PathNames<T>, AdminRefusal> {
        // An empty segment (`/v1/keys/hooks//resolve`) names nothing.
        if let Ok(raw) = RawPathParams::from_request_parts(parts, state).await
            && raw.iter().any(|(_, value)| value.is_empty())
        {
            return Err(AdminRefusal::NotFound);
        }
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(names)) => Ok(PathNames(names)),
            Err(rejection) => Err(AdminRefusal::BadRequest(rejection.body_text())),
        }
    }
}

/// The request, its body read whole if it is a `POST` or a `PATCH` (no other has one: a
/// read's is never waited for, so that a sender holding one back holds no place), at most
/// `MAX` bytes within [`BODY_READ_TIMEOUT`], while holding one of the places for bodies.
pub(super) struct WithBody<const MAX: u64 = BODY_MAX>(pub(super) Request<Bytes>);

impl<const MAX: u64> FromRequest<Arc<AdminState>> for WithBody<MAX> {
    type Rejection = AdminRefusal;

    async fn from_request(
        request: axum::extract::Request,
        state: &Arc<AdminState>,
    ) -> Result<WithBody<MAX>, AdminRefusal> {
        let (head, body) = request.into_parts();
        if !matches!(head.method, Method::POST | Method::PATCH) {
            return Ok(WithBody(Request::from_parts(head, Bytes::new())));
        }
        let role = head
            .extensions
            .get::<Role>()
            .copied()
            .unwrap_or(Role::Viewer);
        let _place = state.bodies.take(role.credential()).map_err(|full| {
            AdminRefusal::TooMany(match full {
                places::Full::All => {
                    format!("{BODIES_MAX} requests' bodies are being read already; try again")
                }
                places::Full::Credential => format!(
                    "this credential's {BODIES_PER_CREDENTIAL} requests' bodies are being read already, its share; try again"
                ),
            })
        })?;
        match body::read_limited(&head.headers, body, MAX, BODY_READ_TIMEOUT).await {
            Ok(body) => Ok(WithBody(Request::from_parts(head, body))),
            Err(error) => Err(AdminRefusal::BadRequest(error.to_string())),
        }
    }
}

/// The role of a request made inside the process: a tool's, under its `/mcp` request's
/// role, which the port's rules admitted already. No request from outside carries one.
#[derive(Clone, Copy)]
pub(super) struct Inside(pub(super) Role);

/// The rule of an endpoint that needs `need`: the caller's credentials must allow it.
/// The role found, and the [`Caller`] the log names, go with the request.
pub(super) async fn admit(
    state: Arc<AdminState>,
    need: Need,
    mut request: axum::extract::Request,
    next: Next,
) -> Response<axum::body::Body> {
    let refused = |refusal: AdminRefusal| axum::response::IntoResponse::into_response(refusal);
    let role = match request.extensions().get::<Inside>() {
        Some(&Inside(role)) => role,
        None => match state.rules.admit(need, request.method(), request.headers()) {
            Ok(role) => role,
            Err(refusal) => return refused(refusal),
        },
    };
    match (need, role) {
        (Need::Anyone, _)
        | (Need::Viewer, Role::Viewer | Role::Operator { .. })
        | (Need::Operator, Role::Operator { .. }) => {}
        (Need::Operator, Role::Viewer) => return refused(AdminRefusal::ReadOnly),
        (Need::Viewer | Need::Operator, Role::Anyone) => {
            return refused(AdminRefusal::Unauthorized);
        }
    }
    if request.extensions().get::<Caller>().is_none() {
        let through = if request.uri().path() == "/mcp" {
            "mcp"
        } else {
            "api"
        };
        let client = request.extensions().get::<Ends>().map(|ends| ends.peer);
        request.extensions_mut().insert(Caller {
            by: format!("{through}:{}", role.credential()),
            client,
        });
    }
    request.extensions_mut().insert(role);
    next.run(request).await
}

/// Turns an answer of the router into the port's own body type.
pub(super) fn into_port_body(answer: Response<axum::body::Body>) -> Response<ProxyBody> {
    use http_body_util::BodyExt;
    use hyper::body::Body as _;
    answer.map(|body| {
        let left = body.size_hint();
        RouterBody {
            left,
            body: SyncWrapper::new(body),
        }
        .boxed()
    })
}

/// A router's body, which is `Send` only, as the port's bodies (`Sync` too) are: it is
/// only ever polled through `&mut`, which [`SyncWrapper`] makes safe to share. Its size
/// is kept beside it, so that whoever reads it still knows its length.
struct RouterBody {
    body: SyncWrapper<axum::body::Body>,
    left: SizeHint,
}

impl hyper::body::Body for RouterBody {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(this.body.get_mut()).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled
            && let (Some(data), Some(left)) = (frame.data_ref(), this.left.exact())
        {
            this.left = SizeHint::with_exact(left.saturating_sub(data.len() as u64));
        }
        polled.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.left.exact() == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        self.left
    }
}

/// A body read as the JSON object `T` is: anything else (an array too, which serde would
/// otherwise read as a struct's fields in order) is an error. Read once, by `T` itself, so
/// that a key given twice is refused as `T` refuses it.
pub(super) fn json_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    let first = body.iter().find(|byte| !byte.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(serde::de::Error::custom("the body is not a JSON object"));
    }
    serde_json::from_slice(body)
}
