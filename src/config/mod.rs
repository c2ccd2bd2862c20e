//! The configuration: `Config::load` turns a YAML file into a validated [`Config`], or a
//! [`ConfigError`] naming the file, line and column.
//!
//! Two steps, one way: [`file`] reads the file as written (every check runs while serde
//! reads the value it concerns, so every error has a position), then [`resolve`] turns it
//! into what runs: routes with every setting known, from the route, else `defaults:`, else
//! the built-in values of [`defaults`]. `docs/configuration.md` documents the file.

pub(crate) mod defaults;
mod errors;
mod file;
mod provider;
mod queue;
mod reading;
mod resolve;
mod schema;
mod sections;
mod store;
mod whole_map;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::route::{Policy, Route, RouteTable, Routing, Unmatched};
use crate::values::{HumanDuration, UpstreamUrl};
use file::ConfigFile;
pub use reading::read_file;

pub use crate::store::settings::{
    DirectUrl, Durability, PostgresConfig, RedisConfig, ServerUrl, SledConfig, SslMode,
    StoreConfig, TlsConfig,
};
/// Where the admin port listens when the file does not say.
pub(crate) use defaults::admin_listen as default_admin_listen;
pub use errors::ConfigError;
pub use sections::{
    AdminConfig, DeliveryLogConfig, Limits, McpAccess, OtlpProtocol, TelemetryConfig,
};

/// A loaded, validated configuration. It serializes to what `dedupe-proxy check` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The file it came from, for reloads and messages.
    #[serde(skip)]
    pub source: PathBuf,
    pub listen: SocketAddr,
    /// Where unmatched requests go, and routes without an `upstream` of their own.
    pub upstream: UpstreamUrl,
    pub admin: AdminConfig,
    pub store: StoreConfig,
    pub shutdown_grace: HumanDuration,
    pub limits: Limits,
    /// Traces; none: the `OTEL_*` environment decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetryConfig>,
    /// The log of what became of each request.
    pub delivery_log: DeliveryLogConfig,
    pub unmatched: Unmatched,
    /// `defaults:` resolved against the built-in values; unmatched requests use its
    /// `upstream_timeout`.
    pub defaults: Policy,
    pub routes: Vec<Route>,
    /// The command-line settings applied over the file, kept to apply them again on
    /// every reload.
    #[serde(skip)]
    pub overrides: Overrides,
    /// Settings that are valid but probably not what the operator meant.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Command-line settings that win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub upstream: Option<UpstreamUrl>,
    /// The number of worker threads; the file has no such setting, since a reload
    /// could not change it.
    pub workers: Option<NonZeroUsize>,
}

impl Config {
    /// What a reload replaces: the routes, and where requests no route takes go.
    pub fn routing(&self) -> Routing {
        Routing {
            table: RouteTable::new(self.routes.clone()),
            unmatched: self.unmatched,
            fallback_upstream: self.upstream.clone(),
            unmatched_timeout: self.defaults.upstream_timeout,
        }
    }
    /// Reads and validates the file at `path`, then applies `overrides`.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = read_file(path)?;
        Config::parse(&text, path, overrides)
    }

    /// Every secret value it holds: signature secrets, the admin token, and the store's
    /// passwords. Kept out of every log line and message (`crate::redact`).
    pub fn secrets(&self) -> Vec<String> {
        let verify = self
            .routes
            .iter()
            .filter_map(|route| route.verify.as_ref())
            .flat_map(|verify| verify.secrets().0.iter())
            .map(|env| env.secret.expose().to_owned());
        let admin = &self.admin;
        let token = (admin.token_env.iter())
            .chain(&admin.viewer_token_env)
            .map(|env| env.secret.expose().to_owned());
        verify.chain(token).chain(self.store.passwords()).collect()
    }

    /// The file's JSON Schema, as `dedupe-proxy schema` prints it and `config/schema.json`
    /// holds it; a route's settings show the built-in values of a route with none set.
    pub fn schema() -> serde_json::Value {
        let text = "upstream: http://127.0.0.1:1\nroutes:\n  - { name: r, match: { path: /r }, key: \"{json:/id}\" }\n";
        let config = Config::parse(text, Path::new("built-in"), &Overrides::default())
            .expect("a minimal route resolves");
        let route = serde_json::to_value(&config.routes[0]).expect("a route serializes");
        schema::generate(&route)
    }

    /// Validates configuration text; `path` is used in messages and kept as the source.
    pub fn parse(text: &str, path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let file: ConfigFile =
            serde_yaml::from_str(text).map_err(|error| errors::every_error(text, path, &error))?;
        Ok(file.resolve(path, overrides))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.yaml"), &Overrides::default())
    }

    fn error_at(text: &str) -> (usize, usize, String) {
        match parse(text) {
            Err(ConfigError::Invalid {
                line,
                column,
                message,
                ..
            }) => (line, column, message),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    const MINIMAL: &str = "upstream: http://127.0.0.1:8080\n";

    #[test]
    fn minimal_file_gets_the_documented_defaults() {
        let config = parse(MINIMAL).unwrap();
        assert_eq!(config.listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(config.admin.listen, "127.0.0.1:9091".parse().unwrap());
        assert_eq!(config.shutdown_grace.0, Duration::from_secs(25));
        assert_eq!(config.unmatched, Unmatched::Forward);
        let StoreConfig::Sled(sled) = &config.store else {
            panic!("sled by default")
        };
        assert_eq!(sled.path, PathBuf::from("./dedupe-data"));
        assert_eq!(sled.durability, Durability::Batched);
        assert_eq!(sled.flush_every.0, Duration::from_millis(100));
        assert_eq!(sled.cache.0, 8 << 20);
        assert!(config.routes.is_empty());
    }

    fn errors_of(text: &str) -> Vec<(usize, usize, String)> {
        let single = |error: ConfigError| match error {
            ConfigError::Invalid {
                line,
                column,
                message,
                ..
            } => (line, column, message),
            other => panic!("not one error: {other:?}"),
        };
        match parse(text) {
            Err(ConfigError::Several(errors)) => errors.into_iter().map(single).collect(),
            Err(error) => vec![single(error)],
            Ok(_) => panic!("valid: {text}"),
        }
    }

    const ROUTE: &str = "    match: { path: /p }\n    key: \"{json:/id}\"\n";

    #[test]
    fn a_bad_upstream_is_stood_in_for_and_the_errors_after_it_found() {
        let text = format!("upstream: ftp://x\nroutes:\n  - name: a\n{ROUTE}    lease: 0s\n");
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!((errors[0].0, errors[0].1), (1, 11));
        assert_eq!((errors[1].0, errors[1].1), (6, 12));
    }

    #[test]
    fn every_mistake_of_one_route_is_told_and_nothing_leaving_a_key_out_makes_up() {
        // `nmae` and `retension` in one route, a bad `match` and `lease` in the next: all
        // four, and not the `a route needs a name` (or `a match`) that leaving `nmae` (or
        // `match`) out would make up.
        let text = "upstream: http://127.0.0.1:1\nroutes:\n  - nmae: a\n    match: { path: /a }\n    key: \"{json:/id}\"\n    retension: 1d\n  - name: b\n    match: { path: /b, metod: POST }\n    key: \"{json:/id}\"\n    lease: 0s\n";
        let errors = errors_of(text);
        let found: Vec<(usize, usize, &str)> = errors
            .iter()
            .map(|(line, column, message)| (*line, *column, message.split(',').next().unwrap()))
            .collect();
        assert_eq!(
            found,
            [
                (3, 5, "routes[0]: unknown field `nmae`"),
                (6, 5, "routes[0]: unknown field `retension`"),
                (8, 24, "routes[1].match: unknown field `metod`"),
                (
                    10,
                    12,
                    "routes[1].lease: `0s`: the duration must be longer than zero"
                ),
            ]
        );
        // Written inline, a route's keys cannot be left out one by one (its closing brace
        // would go too): its first error, then the next route's.
        let inline = "upstream: http://127.0.0.1:1\nroutes:\n  - { name: a, mtach: { path: /a }, retension: 1d }\n  - {\n    nmae: b }\n  - name: c\n    match: { path: /c }\n    key: \"{json:/id}\"\n    lease: 0s\n";
        let messages: Vec<String> = errors_of(inline).into_iter().map(|e| e.2).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(
            messages[0].starts_with("routes[0]: unknown field `mtach`"),
            "{messages:?}"
        );
        assert!(
            messages[1].starts_with("routes[1]: unknown field `nmae`"),
            "{messages:?}"
        );
        assert!(messages[2].starts_with("routes[2].lease"), "{messages:?}");
    }

    #[test]
    fn leaving_a_route_out_makes_up_no_error() {
        // The second `a` would be a duplicate of the first, which is left out once its
        // own error is found: no duplicate is reported, and the later error is.
        let text = format!(
            "upstream: http://127.0.0.1:1\nroutes:\n  - name: a\n{ROUTE}    lease: 0s\n  - name: a\n{ROUTE}  - name: c\n{ROUTE}    retention: 0s\n"
        );
        let errors = errors_of(&text);
        let messages: Vec<&str> = errors.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(errors.len(), 2, "{messages:?}");
        assert!(messages[0].starts_with("routes[0].lease"), "{messages:?}");
        assert!(
            messages[1].starts_with("routes[2].retention"),
            "{messages:?}"
        );
    }

    #[test]
    fn only_the_first_error_where_the_parts_cannot_be_told_apart() {
        // A list written inline, a syntax error, a missing `upstream`: one error each.
        let inline = "upstream: http://127.0.0.1:1\nroutes: [ { name: a, key: \"{json:/id}\", lease: 0s }, { name: b, retention: 0s } ]\n";
        assert_eq!(errors_of(inline).len(), 1);
        assert_eq!(errors_of("upstream: [\nroutes: 5\n").len(), 1);
        // Each section's error, then the missing `upstream`, once.
        assert_eq!(
            errors_of("listen: nowhere\nlimits: { max_conections: 5 }\n").len(),
            3
        );
        let missing = errors_of("limits: { max_requests: 5 }\n");
        assert_eq!(missing.len(), 1, "{missing:?}");
    }

    /// A file nested far deeper than any configuration gets its first error, on any
    /// thread's stack (a reload runs on a worker's): the search for more does not recurse.
    #[test]
    fn a_deeply_nested_file_gets_an_error_not_a_crash() {
        let text = format!(
            "upstream: http://127.0.0.1:1\nx:\n{}\n",
            "- ".repeat(100_000)
        );
        let errors = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || errors_of(&text))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    /// A value the message quotes may hold a line break (a quoted key written over two
    /// lines): each error stays on one line, so that no line reads as another error.
    #[test]
    fn an_error_quoting_a_line_break_stays_on_one_line() {
        let text = "upstream: http://127.0.0.1:1\nstore:\n  redis: { \"a,\\nb\": 1 }\n";
        let error = parse(text).unwrap_err().to_string();
        assert_eq!(error.lines().count(), 1, "{error}");
        assert!(error.contains("a,\\n"), "{error}");
    }

    /// A route left out may hold an anchor that a later one uses: with anchors, only the
    /// first error is told, never an "unknown anchor" the search made up.
    #[test]
    fn anchors_keep_the_search_to_the_first_error() {
        let text = format!(
            "upstream: http://127.0.0.1:1\nroutes:\n  - name: a\n{ROUTE}    lease: &short 0s\n  - name: b\n{ROUTE}    retention: *short\n"
        );
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    #[test]
    fn columns_hold_after_wide_characters_are_left_out() {
        let text = format!(
            "upstream: http://127.0.0.1:1\nroutes:\n  - name: a\n    # ✓ é 日本\n{ROUTE}    lease: 0s\n  - name: b\n{ROUTE}    retention: 0s # ✓\n"
        );
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!((errors[1].0, errors[1].1), (11, 16), "{errors:?}");
    }

    #[test]
    fn unknown_field_is_located() {
        let (line, column, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a }\n    key: \"{json:/id}\"\n    retension: 1d\n",
        );
        assert_eq!((line, column), (6, 5));
        assert!(message.contains("unknown field `retension`"), "{message}");
    }

    #[test]
    fn bad_duration_is_located_at_its_scalar() {
        let (line, column, message) =
            error_at("upstream: http://127.0.0.1:8080\ndefaults:\n  lease: 5 parsecs\n");
        assert_eq!((line, column), (3, 10));
        assert!(message.contains("invalid duration"), "{message}");
    }

    #[test]
    fn bad_template_is_located() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a }\n    key: \"{body:/id}\"\n",
        );
        assert_eq!(line, 5);
        assert!(message.contains("not a key part"), "{message}");
    }

    #[test]
    fn duplicate_route_name_is_located_at_the_second_route() {
        let text = "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a }\n    key: \"{json:/id}\"\n  - name: a\n    match: { path: /b }\n    key: \"{json:/id}\"\n";
        let (line, column, message) = error_at(text);
        assert_eq!((line, column), (6, 5));
        assert!(message.contains("duplicate route name `a`"), "{message}");
    }

    #[test]
    fn path_and_prefix_together_are_refused() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match:\n      path: /a\n      path_prefix: /b\n    key: \"{json:/id}\"\n",
        );
        assert_eq!(line, 5);
        assert!(message.contains("not both"), "{message}");
    }

    #[test]
    fn defaults_may_not_name_routes() {
        let (line, _, message) =
            error_at("upstream: http://127.0.0.1:8080\ndefaults:\n  key: \"{json:/id}\"\n");
        assert_eq!(line, 3);
        assert!(message.contains("belongs to a route"), "{message}");
    }

    #[test]
    fn in_flight_status_must_refuse() {
        let (line, _, message) =
            error_at("upstream: http://127.0.0.1:8080\ndefaults:\n  in_flight_status: 200\n");
        assert_eq!(line, 3);
        assert!(message.contains("4xx or 5xx"), "{message}");
    }

    #[test]
    fn missing_upstream_and_unknown_store() {
        let (_, _, message) = error_at("listen: 127.0.0.1:1\n");
        assert!(message.contains("missing field `upstream`"), "{message}");
        let (line, _, message) = error_at("upstream: http://127.0.0.1:8080\nstore:\n  mongo: {}\n");
        assert_eq!(line, 3);
        assert!(message.contains("unknown field `mongo`"), "{message}");
    }

    #[test]
    fn unset_token_variable_is_an_error() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nadmin:\n  token_env: DEDUPE_TEST_SURELY_UNSET_VARIABLE\n",
        );
        assert_eq!(line, 3);
        assert!(message.contains("is not set"), "{message}");
    }

    #[test]
    fn a_viewer_token_needs_the_operators_and_another_value() {
        // Variables cargo sets for every test run, so that nothing is set here.
        let admin = |fields: &str| format!("upstream: http://127.0.0.1:8080\nadmin:\n{fields}");
        let config = parse(&admin(
            "  token_env: CARGO_MANIFEST_DIR\n  viewer_token_env: CARGO_PKG_NAME\n",
        ))
        .unwrap();
        assert!(config.admin.viewer_token_env.is_some());
        assert!(
            config
                .secrets()
                .contains(&env!("CARGO_PKG_NAME").to_owned())
        );
        let (line, _, message) = error_at(&admin("  viewer_token_env: CARGO_PKG_NAME\n"));
        assert_eq!(line, 3);
        assert!(message.contains("needs `token_env`"), "{message}");
        let (_, _, message) = error_at(&admin(
            "  token_env: CARGO_PKG_NAME\n  viewer_token_env: CARGO_PKG_NAME\n",
        ));
        assert!(message.contains("the same token"), "{message}");
    }

    #[test]
    fn a_host_route_that_other_hosts_pass_by_is_warned_about() {
        let route =
            "routes:\n  - name: a\n    match: { host: a.example }\n    key: \"{json:/id}\"\n";
        let config = parse(&format!("{MINIMAL}{route}")).unwrap();
        assert!(
            config.warnings.iter().any(|w| w.contains("another Host")),
            "{:?}",
            config.warnings
        );
        let config = parse(&format!("{MINIMAL}unmatched: reject\n{route}")).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn a_route_path_cannot_climb() {
        let (line, _, message) = error_at(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: a\n    match: { path: /a/../b }\n    key: \"{json:/id}\"\n",
        );
        assert_eq!(line, 4);
        assert!(message.contains("`..` segment"), "{message}");
    }

    #[test]
    fn overrides_win() {
        let overrides = Overrides {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            upstream: Some("http://10.0.0.1:9".parse().unwrap()),
            workers: None,
        };
        let config = Config::parse(MINIMAL, Path::new("t.yaml"), &overrides).unwrap();
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.upstream.to_string(), "http://10.0.0.1:9");
    }

    #[test]
    fn passwords_in_server_urls_are_masked_when_printed() {
        let config = parse("upstream: http://127.0.0.1:8080\nstore:\n  postgres: { url: \"postgres://app:hunter2@db:5432/app\" }\n").unwrap();
        let printed = serde_yaml::to_string(&config).unwrap();
        assert!(
            printed.contains("url: postgres://app:***@db:5432/app"),
            "{printed}"
        );
        assert!(!printed.contains("hunter2"));
        assert!(!format!("{config:?}").contains("hunter2"));
        let StoreConfig::Postgres(postgres) = &config.store else {
            panic!("postgres expected");
        };
        assert_eq!(postgres.url.expose(), "postgres://app:hunter2@db:5432/app");
        assert_eq!(postgres.table.0, "dedupe_claims");
    }

    #[test]
    fn error_display_names_file_line_and_column() {
        let error = parse("upstream: http://127.0.0.1:8080\nbogus: 1\n").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("test.yaml:2:1: unknown field `bogus`"),
            "{error}"
        );
    }
}
