//! The configuration file's JSON Schema, for editors: generated from the types that read
//! the file (`file`), so it describes exactly the file `check` takes. A route's settings
//! carry the built-in values as their defaults, taken from a route resolved with none set.

use schemars::generate::SchemaSettings;
use serde_json::Value;

use super::file::{ConfigFile, ROUTE_ONLY};

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
    with_defaults(&mut schema, built_in);
    with_whole_map_rules(&mut schema);
    schema
}

/// A route's settings with the built-in values as defaults.
fn with_defaults(schema: &mut Value, built_in: &Value) {
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
}

/// What the readers check over a whole map, where a schema can say it too: a route needs a
/// name, a `match` and a key (or a preset that gives one); `defaults:` takes no setting that
/// belongs to one route; a store is exactly one backend.
fn with_whole_map_rules(schema: &mut Value) {
    let definitions = schema["definitions"]
        .as_object_mut()
        .expect("the schema has definitions");
    let mut defaults = definitions["RouteFile"].clone();
    let settings = defaults["properties"]
        .as_object_mut()
        .expect("a route has settings");
    for field in ROUTE_ONLY {
        settings.remove(field);
    }
    defaults["description"] = "Route settings every route inherits where it sets none.".into();
    definitions.insert("Defaults".into(), defaults);
    let route = &mut definitions["RouteFile"];
    route["required"] = serde_json::json!(["name", "match"]);
    route["anyOf"] = serde_json::json!([{ "required": ["key"] }, { "required": ["preset"] }]);
    let store = &mut definitions["StoreFile"];
    store["minProperties"] = 1.into();
    store["maxProperties"] = 1.into();
    // Draft 7 reads nothing beside a `$ref`: the reference sits in `allOf`, beside the
    // description.
    schema["properties"]["defaults"]["allOf"] =
        serde_json::json!([{ "$ref": "#/definitions/Defaults" }]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_with_a_dependent_default_is_a_route_setting() {
        let schema = crate::config::Config::schema();
        let route = &schema["definitions"]["RouteFile"]["properties"];
        for name in DEPENDENT {
            assert!(route.get(name).is_some(), "`{name}` is no route setting");
            assert!(
                route[name].get("default").is_none(),
                "`{name}` shows a default"
            );
        }
        assert_eq!(route["retention"]["default"], "7d");
    }
}
