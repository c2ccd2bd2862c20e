//! The admin API described in OpenAPI 3.1, generated from the route table: each
//! endpoint's method, path and its names, query parameters, request body (the schema of
//! the type its handler reads), the role it needs, and its answers; every refusal is an
//! [`ErrorBody`]. Served at `/v1/openapi.json`, and committed as `docs/openapi.json`.
//! Each answer's schema, whole in itself, is also an MCP tool's `outputSchema`.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::access::Need;
use super::endpoint::{Endpoint, Success};
use crate::response::ErrorBody;

/// The document of `table`'s endpoints.
pub(super) fn document(table: &[Endpoint]) -> Value {
    let settings = SchemaSettings::draft2020_12().with(|settings| {
        settings.definitions_path = "/components/schemas".into();
        settings.meta_schema = None;
    });
    let mut generator = settings.into_generator();
    let error = Value::from(generator.subschema_for::<ErrorBody>());
    let mut paths = Map::new();
    for endpoint in table {
        let operations = paths
            .entry(endpoint.path)
            .or_insert_with(|| Value::Object(Map::new()));
        let method = endpoint.method.as_str().to_ascii_lowercase();
        operations[method] = operation(endpoint, &mut generator, &error);
    }
    let bearer = |who: &str| {
        json!({
            "type": "http",
            "scheme": "bearer",
            "description": format!("The {who}'s token. A listener on a loopback address without `admin.token_env` asks for none."),
        })
    };
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "dedupe-proxy admin API",
            "version": "v1",
            "description": "The admin port of dedupe-proxy: probes, metrics, the console, and the API under /v1/ that reads and changes routes, keys, the queue and the delivery log. Every refusal is a JSON error body. A name in a path is one segment: a `/` inside a key is sent escaped (%2F).",
        },
        "paths": paths,
        "components": {
            "schemas": generator.take_definitions(true),
            "securitySchemes": { "operator": bearer("operator"), "viewer": bearer("viewer") },
        },
    })
}

/// The JSON Schema of an endpoint's typed answer, whole in itself (its definitions under
/// `$defs`), as an MCP tool's `outputSchema`; `None` unless the answer is a typed object
/// (a tool's schema must be one).
pub(super) fn answer_schema(endpoint: &Endpoint) -> Option<Map<String, Value>> {
    let (Success::Json(_), Some(schema_of)) = (endpoint.success, endpoint.returns) else {
        return None;
    };
    let settings = SchemaSettings::draft2020_12().with(|settings| settings.meta_schema = None);
    let mut generator = settings.into_generator();
    let found = Value::from(schema_of(&mut generator));
    let mut definitions = generator.take_definitions(true);
    let named = found["$ref"]
        .as_str()
        .and_then(|to| to.strip_prefix("#/$defs/"));
    let root = match named {
        // The answer's own definition is the root; what it names stays beside it.
        Some(name) => definitions.get(name).cloned()?,
        None => found,
    };
    let Value::Object(mut root) = root else {
        return None;
    };
    if root.get("type") != Some(&json!("object")) {
        return None;
    }
    if !definitions.is_empty() {
        root.insert(
            "$defs".into(),
            Value::Object(std::mem::take(&mut definitions)),
        );
    }
    Some(root)
}

fn operation(
    endpoint: &Endpoint,
    generator: &mut schemars::SchemaGenerator,
    error: &Value,
) -> Value {
    let mut parameters: Vec<Value> = names(endpoint.path)
        .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string", "minLength": 1 } }))
        .collect();
    parameters.extend(endpoint.query.iter().copied().flatten().map(|param| {
        json!({ "name": param.name, "in": "query", "required": param.required, "schema": param.takes.schema() })
    }));
    let security = match endpoint.need {
        Need::Anyone => json!([]),
        Need::Viewer => json!([{ "viewer": [] }, { "operator": [] }]),
        Need::Operator => json!([{ "operator": [] }]),
    };
    let refused = json!({ "description": "Refused; `error` says why.", "content": { "application/json": { "schema": error } } });
    let returns = endpoint
        .returns
        .map(|schema_of| Value::from(schema_of(generator)));
    let mut responses = answers(endpoint.success, returns);
    if endpoint.path == "/mcp" {
        // The protocol's own refusals are JSON-RPC errors.
        responses["4XX"] =
            json!({ "description": "Refused, by the port's rules or the protocol." });
    } else {
        responses["4XX"] = refused.clone();
    }
    if endpoint.need != Need::Anyone {
        responses["5XX"] = refused;
    }
    let mut operation = json!({
        "operationId": operation_id(endpoint),
        "summary": endpoint.summary,
        "security": security,
        "parameters": parameters,
        "responses": responses,
    });
    if let Some(schema_of) = endpoint.body {
        let schema = Value::from(schema_of(generator));
        let required = !endpoint.body_optional;
        operation["requestBody"] = json!({ "required": required, "content": { "application/json": { "schema": schema } } });
    }
    operation
}

/// A success's answers.
fn answers(success: Success, returns: Option<Value>) -> Value {
    let text = |media: &str| json!({ "content": { media: { "schema": { "type": "string" } } } });
    let mut answers = Map::new();
    let (status, mut described) = match success {
        Success::Json(status) => {
            let schema = returns.unwrap_or_else(|| json!({ "type": "object" }));
            (
                status,
                json!({ "content": { "application/json": { "schema": schema } } }),
            )
        }
        Success::NoContent => (204, json!({})),
        Success::Events => (200, text("text/event-stream")),
        Success::Text(media) => (200, text(media)),
        Success::Redirect => (
            303,
            json!({ "headers": { "Location": { "schema": { "type": "string" } } } }),
        ),
        Success::Probe => {
            let schema = returns.unwrap_or_else(|| json!({ "type": "object" }));
            let probe = json!({ "content": { "application/json": { "schema": schema } } });
            answers.insert("503".into(), probe.clone());
            answers["503"]["description"] = json!("Starting, or shutting down.");
            (200, probe)
        }
    };
    described["description"] = json!("Done.");
    answers.insert(status.to_string(), described);
    Value::Object(answers)
}

/// The names in braces in `path`, in order.
fn names(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
}

/// `get_keys_route_key` for `GET /v1/keys/{route}/{key}`; `index` for a path ending in `/`.
fn operation_id(endpoint: &Endpoint) -> String {
    let mut id = endpoint.method.as_str().to_ascii_lowercase();
    let path = endpoint.path.strip_prefix("/v1").unwrap_or(endpoint.path);
    for segment in path.split('/').skip(1) {
        id.push('_');
        let segment = match segment.trim_matches(['{', '}']) {
            "" => "index",
            named => named,
        };
        id.extend(
            segment
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_its_own_id_and_every_path_name_is_a_parameter() {
        let document = crate::admin::openapi_document();
        let mut ids = std::collections::BTreeSet::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                let id = operation["operationId"].as_str().unwrap();
                assert!(ids.insert(id.to_owned()), "{method} {path}: {id} twice");
                let declared: Vec<&str> = operation["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|param| param["in"] == "path")
                    .map(|param| param["name"].as_str().unwrap())
                    .collect();
                assert_eq!(declared, names(path).collect::<Vec<_>>(), "{method} {path}");
            }
        }
        assert_eq!(
            document["paths"]["/v1/keys/{route}/{key}"]["delete"]["security"],
            json!([{ "operator": [] }])
        );
        assert_eq!(document["paths"]["/healthz"]["get"]["security"], json!([]));
    }
}
