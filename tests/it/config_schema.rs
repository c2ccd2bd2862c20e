//! The configuration's JSON Schema (`config/schema.json`, `dedupe-proxy schema`): the
//! committed file is the one the types generate; every example configuration validates
//! against it with a real validator (`check-jsonschema`, the one pre-commit hooks use);
//! and each typo of a list that `check` refuses, the schema refuses too, so an editor
//! flags it while it is typed.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{binary_path, installed};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `check-jsonschema`, or `None` (the test skipped) where tests/setup has not installed
/// it; under `CI=true` a missing validator fails the test.
fn validator() -> Option<Command> {
    if !installed("check-jsonschema", "check-jsonschema", &["--version"]) {
        return None;
    }
    let mut command = Command::new("check-jsonschema");
    let schema = repository().join("config/schema.json");
    command.arg("--schemafile").arg(schema);
    Some(command)
}

fn examples() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(repository().join("config"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    found.sort();
    assert!(found.len() >= 10, "{found:?}");
    found
}

#[test]
fn the_committed_schema_is_the_one_the_configuration_types_generate() {
    let printed = Command::new(binary_path()).arg("schema").output().unwrap();
    assert!(printed.status.success());
    let generated: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    let committed = std::fs::read_to_string(repository().join("config/schema.json")).unwrap();
    let committed: serde_json::Value = serde_json::from_str(&committed).unwrap();
    assert!(
        generated == committed,
        "config/schema.json is out of date: run `cargo run -- schema > config/schema.json`"
    );
    // What an editor shows: a route's settings with their doc and built-in value.
    let retention = &generated["definitions"]["RouteFile"]["properties"]["retention"];
    assert_eq!(retention["default"], "7d");
    assert!(
        retention["description"]
            .as_str()
            .is_some_and(|text| text.contains("done key")),
        "{retention}"
    );
    // Every setting of every section says what it is.
    let mut sections = vec![("the top level", &generated["properties"])];
    for (name, definition) in generated["definitions"].as_object().unwrap() {
        if let Some(properties) = definition.get("properties") {
            sections.push((name.as_str(), properties));
        }
    }
    for (section, properties) in sections {
        for (name, property) in properties.as_object().unwrap() {
            assert!(
                property["description"].is_string(),
                "`{name}` of {section} has no description: {property}"
            );
        }
    }
}

#[test]
fn every_example_configuration_names_and_meets_the_schema() {
    for example in examples() {
        let text = std::fs::read_to_string(&example).unwrap();
        assert!(
            text.starts_with("# yaml-language-server: $schema=schema.json\n"),
            "{} does not name the schema on its first line",
            example.display()
        );
    }
    let Some(mut validator) = validator() else {
        return;
    };
    let checked = validator.args(examples()).output().unwrap();
    assert!(
        checked.status.success(),
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// Typos an editor should flag, each refused by `check` too.
const TYPOS: [(&str, &str); 18] = [
    (
        "a misspelt top-level field",
        "upstrem: http://127.0.0.1:1\n",
    ),
    ("a misspelt route field", "    retension: 7d\n"),
    ("a misspelt enum value", "    on_missing_key: forwrd\n"),
    ("an unknown preset", "    preset: strip\n"),
    ("an unknown delivery mode", "    delivery: queue\n"),
    ("a duration without a unit", "    retention: \"7\"\n"),
    ("a duration that is a word", "    lease: forever\n"),
    ("a size that is a word", "    max_body: large\n"),
    ("a status out of range", "    success_status: [\"6xx\"]\n"),
    ("an upper-case scope", "    scope: Payments\n"),
    ("a misspelt match field", "    match: { pth: /r }\n"),
    (
        "a misspelt verify field",
        "    verify: { stripe: { secret: X } }\n",
    ),
    ("a boolean where a map goes", "    log: true\n"),
    ("a misspelt store", "store: { sledd: {} }\n"),
    (
        "two stores",
        "store: { sled: {}, redis: { url: redis://127.0.0.1 } }\n",
    ),
    (
        "a route's setting in defaults",
        "defaults: { key: \"{json:/id}\" }\n",
    ),
    (
        "a misspelt part kind",
        "    order: { entity: \"{jsn:/id}\", version: \"{json:/v}\" }\n",
    ),
    (
        "a template with no part",
        "    order: { entity: \"id\", version: \"{json:/v}\" }\n",
    ),
];

/// Values the readers take that a schema could be too strict about: each passes both.
const VALID: [&str; 9] = [
    "    retention: 1.5s\n",
    "    retention: 7 days\n",
    "    retry_after: 0\n",
    "    max_body: 1048576\n",
    "    max_body: +100\n",
    "    max_body: .5KiB\n",
    "    success_status: [200, \"2xx\", \"0201\"]\n",
    "    in_flight_status: 409\n",
    "    key: \"{{literal}}-{header:X-Id}\"\n",
];

#[test]
fn values_the_readers_take_the_schema_takes() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (index, value) in VALID.iter().enumerate() {
        let (path, checked) = checked(dir.path(), &format!("valid-{index}"), value);
        assert!(
            checked.status.success(),
            "check refused {value}: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
        files.push((value, path));
    }
    let Some(_) = validator() else {
        return;
    };
    let paths: Vec<_> = files.iter().map(|(_, path)| path.as_path()).collect();
    let refused = refused_by_schema(&paths);
    for (value, path) in &files {
        assert!(!refused.contains(path), "the schema refused {value}");
    }
    assert!(refused.is_empty(), "{refused:?}");
}

#[test]
fn typos_that_check_refuses_the_schema_refuses_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (index, (what, typo)) in TYPOS.iter().enumerate() {
        let (path, checked) = checked(dir.path(), &format!("typo-{index}"), typo);
        assert_eq!(checked.status.code(), Some(2), "check took {what}:\n{typo}");
        files.push((what, path));
    }
    // The list's base, without a typo, passes both.
    let base = dir.path().join("base.yaml");
    std::fs::write(&base, config_with("")).unwrap();
    let checked = Command::new(binary_path())
        .args(["check", "-c"])
        .arg(&base)
        .output()
        .unwrap();
    assert!(checked.status.success());
    let Some(_) = validator() else {
        return;
    };
    let mut paths: Vec<_> = files.iter().map(|(_, path)| path.as_path()).collect();
    paths.push(&base);
    let refused = refused_by_schema(&paths);
    assert!(!refused.contains(&base), "the base is valid");
    for (what, path) in &files {
        assert!(refused.contains(path), "the schema took {what}");
    }
    assert_eq!(refused.len(), files.len(), "{refused:?}");
}

/// A route-level typo goes inside the route; a top-level one (no indent) at the top.
fn config_with(typo: &str) -> String {
    let (top, route) = if typo.starts_with(' ') {
        ("", typo)
    } else {
        (typo, "")
    };
    let upstream = if top.starts_with("upstrem") {
        ""
    } else {
        "upstream: http://127.0.0.1:1\n"
    };
    // A `match:` or `key:` given stands in for the route's own.
    let matcher = if route.starts_with("    match:") {
        ""
    } else {
        "    match: { path: /r }\n"
    };
    let key = if route.starts_with("    key:") {
        ""
    } else {
        "    key: \"{json:/id}\"\n"
    };
    format!("{upstream}{top}routes:\n  - name: r\n{matcher}{key}{route}")
}

/// The file `name`.yaml in `dir`, holding the base configuration with `setting`, and what
/// `dedupe-proxy check` made of it.
fn checked(dir: &Path, name: &str, setting: &str) -> (PathBuf, std::process::Output) {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, config_with(setting)).unwrap();
    let output = Command::new(binary_path())
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    (path, output)
}

/// The files of `paths` the schema refuses, found by one run of the validator (a run
/// per file took most of this binary's time).
fn refused_by_schema(paths: &[&Path]) -> std::collections::HashSet<PathBuf> {
    let mut validator = validator().unwrap();
    let output = validator
        .args(["--output-format", "json"])
        .args(paths)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "check-jsonschema answered no report: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let unread = report
        .get("parse_errors")
        .and_then(|errors| errors.as_array());
    assert!(unread.is_none_or(|errors| errors.is_empty()), "{report}");
    let errors = report["errors"].as_array().unwrap();
    assert_eq!(output.status.success(), errors.is_empty(), "{report}");
    errors
        .iter()
        .map(|error| PathBuf::from(error["filename"].as_str().unwrap()))
        .collect()
}
