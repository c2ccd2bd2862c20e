//! One endpoint of the admin port as the route table ([`super::table`]) gives it: its
//! method, path, the role it needs, whether a success is synced to disk, what it reads
//! and answers (for the OpenAPI document), and its handler.

use std::sync::Arc;

use axum::handler::Handler;
use axum::routing::{MethodFilter, MethodRouter, on};
use http::Method;

use super::access::Need;
use super::state::AdminState;

/// One endpoint of the admin port.
pub(super) struct Endpoint {
    pub(super) method: Method,
    /// The path, its names in braces (`/v1/keys/{route}/{key}`): each is one segment,
    /// a `/` inside it sent escaped.
    pub(super) path: &'static str,
    pub(super) need: Need,
    /// A success is a change to the store, synced to stable storage before it is
    /// answered, so that the answer may say it is saved.
    pub(super) syncs: bool,
    /// What it does, in a line.
    pub(super) summary: &'static str,
    /// The query parameters it reads, in groups (a filter, then a page's).
    pub(super) query: Vec<&'static [QueryParam]>,
    /// The schema of the JSON body it takes, if it takes one.
    pub(super) body: Option<SchemaOf>,
    /// The handler reads a request without a body as `{}`: the document marks the body
    /// optional.
    pub(super) body_optional: bool,
    /// What a success answers.
    pub(super) success: Success,
    /// The schema of a JSON success's body, if the answer is a type.
    pub(super) returns: Option<SchemaOf>,
    pub(super) handler: MethodRouter<Arc<AdminState>>,
}

/// A query parameter: its name, whether the endpoint refuses a request without it, and
/// the values it takes.
#[derive(Clone, Copy)]
pub(super) struct QueryParam {
    pub(super) name: &'static str,
    pub(super) required: bool,
    pub(super) takes: Takes,
}

/// The values a query parameter takes: its schema in the OpenAPI document. A count's
/// limit and a list of names are the ones its parser uses; Schemathesis' negative cases
/// (`tests/it/openapi.rs`) check that the parsers refuse what the schema excludes.
#[derive(Clone, Copy)]
pub(super) enum Takes {
    /// Any text, the empty one too.
    Text,
    /// A count from 1 to the maximum.
    Count(usize),
    /// An HTTP status, 100 to 599.
    Status,
    /// A status (502) or a class of them (5xx).
    StatusOrClass,
    /// An RFC 3339 time.
    Time,
    /// One of these names.
    OneOf(&'static [&'static str]),
    /// Some of these names, joined by commas.
    SomeOf(&'static [&'static str]),
}

impl Takes {
    pub(super) fn schema(self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Takes::Text => json!({ "type": "string" }),
            Takes::Count(max) => json!({ "type": "integer", "minimum": 1, "maximum": max }),
            Takes::Status => json!({ "type": "integer", "minimum": 100, "maximum": 599 }),
            Takes::StatusOrClass => {
                json!({ "type": "string", "pattern": "^[1-5]([0-9][0-9]|[xX][xX])$" })
            }
            Takes::Time => json!({ "type": "string", "format": "date-time" }),
            Takes::OneOf(names) => json!({ "type": "string", "enum": names }),
            Takes::SomeOf(names) => {
                let name = names.join("|");
                json!({ "type": "string", "pattern": format!("^({name})(,({name}))*$") })
            }
        }
    }
}

pub(super) const fn optional(name: &'static str, takes: Takes) -> QueryParam {
    QueryParam {
        name,
        required: false,
        takes,
    }
}

pub(super) const fn required(name: &'static str, takes: Takes) -> QueryParam {
    QueryParam {
        name,
        required: true,
        takes,
    }
}

/// The schema of a request's type, its definitions added to the generator's.
pub(super) type SchemaOf = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

fn schema_of<T: schemars::JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    generator.subschema_for::<T>()
}

/// What a success answers: its status and media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Success {
    Json(u16),
    NoContent,
    /// `text/event-stream`, until the client or the proxy ends it.
    Events,
    Text(&'static str),
    /// `303 See Other`.
    Redirect,
    /// A probe's `{"status"}`: 200, or 503 while starting or shutting down.
    Probe,
}

impl Endpoint {
    pub(super) fn new<H, T>(
        method: Method,
        path: &'static str,
        need: Need,
        summary: &'static str,
        handler: H,
    ) -> Endpoint
    where
        H: Handler<T, Arc<AdminState>>,
        T: 'static,
    {
        let filter =
            MethodFilter::try_from(method.clone()).expect("the table's methods are filters");
        Endpoint {
            method,
            path,
            need,
            syncs: false,
            summary,
            query: Vec::new(),
            body: None,
            body_optional: false,
            success: Success::Json(200),
            returns: None,
            handler: on(filter, handler),
        }
    }

    /// Marks the endpoint as one whose success changes the store.
    pub(super) fn syncs(self) -> Endpoint {
        Endpoint {
            syncs: true,
            ..self
        }
    }

    /// The endpoint reads `params` too.
    pub(super) fn query(mut self, params: &'static [QueryParam]) -> Endpoint {
        self.query.push(params);
        self
    }

    /// The endpoint takes a JSON body of type `T`.
    pub(super) fn body<T: schemars::JsonSchema>(self) -> Endpoint {
        Endpoint {
            body: Some(schema_of::<T>),
            ..self
        }
    }

    /// The handler reads a request without a body as `{}`.
    pub(super) fn body_optional(self) -> Endpoint {
        Endpoint {
            body_optional: true,
            ..self
        }
    }

    /// A JSON success is a `T`.
    pub(super) fn returns<T: schemars::JsonSchema>(self) -> Endpoint {
        Endpoint {
            returns: Some(schema_of::<T>),
            ..self
        }
    }

    pub(super) fn answers(self, success: Success) -> Endpoint {
        Endpoint { success, ..self }
    }
}
