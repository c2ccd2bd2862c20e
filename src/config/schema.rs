//! The configuration file's JSON Schema, for editors: generated from the types that read
//! the file (`file`), so it describes exactly the file `check` takes. A route's settings
//! carry the built-in values as their defaults, taken from a route resolved with none set.

use schemars::generate::SchemaSettings;
use serde_json::Value;

use super::file::ConfigFile;

/// Settings whose value, left out, depends on the route's other settings or on the file
/// (a preset's key, the top-level upstream): they have no single default to show.
const DEPENDENT: [&str; 8] = [
    "name",
    "match",
    "key",
    "scope",
    "preset",
    "verify",
    "upstream",
    "replay_guard",
];

/// The schema, with `built_in` (a resolved route, as JSON) giving its settings' defaults.
pub(super) fn generate(built_in: &Value) -> Value {
    // Draft 7: the newest draft every editor's YAML support reads.
    let generator = SchemaSettings::draft07().into_generator();
    let root = generator.into_root_schema_for::<ConfigFile>();
    let mut schema = serde_json::to_value(root).expect("a schema is JSON");
    schema["title"] = "dedupe-proxy configuration".into();
    let properties = schema
        .pointer_mut("/definitions/RouteFile/properties")
        .and_then(Value::as_object_mut)
        .expect("a route's settings are described");
    for (name, property) in properties.iter_mut() {
        let value = built_in.get(name).filter(|value| !value.is_null());
        if let (Some(value), Some(property)) = (value, property.as_object_mut())
            && !DEPENDENT.contains(&name.as_str())
        {
            property.insert("default".into(), value.clone());
        }
    }
    schema
}
