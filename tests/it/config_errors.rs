//! Configuration errors, through the real binary: every file in `tests/fixtures/invalid`
//! must make `dedupe-proxy check` exit 2 with `file:line:column: message`, as its first
//! line (`# expect: LINE:COLUMN fragment`) says; every example in `config/` must pass.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::binary_path;

fn check(args: &[&str], file: &Path) -> Output {
    Command::new(binary_path())
        .args(args)
        .arg(file)
        .env_remove("DEDUPE_PROXY_CONFIG")
        .output()
        .unwrap()
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML files in {}", dir.display());
    files
}

#[test]
fn every_invalid_fixture_is_refused_with_its_location() {
    let mut failures = Vec::new();
    for file in yaml_files("tests/fixtures/invalid") {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks an `# expect:` line", file.display()));
        let (location, fragment) = expect.split_once(' ').unwrap();
        let output = check(&["check", "-c"], &file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let wanted_prefix = format!("error: {}:{location}: ", file.display());
        let ok = output.status.code() == Some(2)
            && stderr.starts_with(&wanted_prefix)
            && stderr.contains(fragment);
        if !ok {
            failures.push(format!(
                "{}: exit {:?}, wanted `{wanted_prefix}…{fragment}…`, got: {}",
                file.display(),
                output.status.code(),
                stderr.trim()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn run_refuses_an_invalid_file_with_exit_2() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid/duplicate_route_name.yaml");
    let output = check(&["run", "-c"], &file);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("duplicate route name"));
}

#[test]
fn a_missing_file_or_no_file_is_exit_2() {
    let output = check(&["check", "-c"], Path::new("/nonexistent/dedupe.yaml"));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("/nonexistent/dedupe.yaml: cannot read")
    );
    let output = Command::new(binary_path())
        .arg("check")
        .env_remove("DEDUPE_PROXY_CONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--config"));
}

/// The secrets the example configurations' presets and checks read.
const EXAMPLE_SECRETS: [(&str, &str); 9] = [
    ("LINEAR_WEBHOOK_SECRET", "example"),
    ("STRIPE_WEBHOOK_SECRET", "whsec_example"),
    (
        "SVIX_WEBHOOK_SECRET",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ),
    ("GITHUB_WEBHOOK_SECRET", "example"),
    ("SHOPIFY_WEBHOOK_SECRET", "example"),
    ("SLACK_SIGNING_SECRET", "example"),
    ("PADDLE_WEBHOOK_SECRET", "pdl_ntfset_example"),
    ("LEGACY_HOOK_SECRET", "example"),
    ("WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
];

#[test]
fn every_example_config_passes_check_and_prints_its_routes() {
    for file in yaml_files("config") {
        let output = Command::new(binary_path())
            .args(["check", "-c"])
            .arg(&file)
            .envs(EXAMPLE_SECRETS)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("routes:"), "{}", file.display());
    }
}

#[test]
fn the_config_variable_names_the_file() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.yaml");
    let output = Command::new(binary_path())
        .arg("check")
        .env("DEDUPE_PROXY_CONFIG", &file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stdout).contains("name: stripe"));
}

#[test]
fn command_line_overrides_win_over_the_file() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.yaml");
    let output = check(
        &[
            "check",
            "--listen",
            "127.0.0.1:18081",
            "--upstream",
            "http://10.1.2.3:9000",
            "-c",
        ],
        &file,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("listen: 127.0.0.1:18081"), "{stdout}");
    assert!(
        stdout.contains("upstream: http://10.1.2.3:9000"),
        "{stdout}"
    );
}

/// A misspelt field name gets the nearest one the file could have meant, and no message
/// states its location again after the `file:line:column:` it starts with.
#[test]
fn messages_suggest_the_nearest_name_and_state_their_location_once() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid");
    let misspelt = check(&["check", "-c"], &dir.join("unknown_route_field.yaml"));
    assert!(
        String::from_utf8_lossy(&misspelt.stderr)
            .trim_end()
            .ends_with("did you mean `retention`?"),
        "{}",
        String::from_utf8_lossy(&misspelt.stderr)
    );
    for file in yaml_files("tests/fixtures/invalid") {
        let stderr = String::from_utf8_lossy(&check(&["check", "-c"], &file).stderr).into_owned();
        // `error: FILE.yaml:LINE:COLUMN: message`
        let location = stderr.split(".yaml:").nth(1).unwrap_or_default();
        let mut parts = location.splitn(3, ':');
        let (line, column) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        assert!(
            !stderr.contains(&format!("line {line} column {column}")),
            "{}: {stderr}",
            file.display()
        );
        assert_eq!(
            stderr.lines().count(),
            1,
            "{}: one line: {stderr}",
            file.display()
        );
    }
}

/// A file without routes passes `check`, but says loudly that it dedupes nothing.
#[test]
fn a_file_without_routes_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    for (text, says) in [
        (
            "upstream: http://127.0.0.1:8080\nroutes: []\n",
            "every request is forwarded unchecked",
        ),
        (
            "upstream: http://127.0.0.1:8080\nunmatched: reject\n",
            "with `unmatched: reject`, every request is refused",
        ),
    ] {
        let file = dir.path().join("empty.yaml");
        std::fs::write(&file, text).unwrap();
        let output = check(&["check", "-c"], &file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0));
        assert!(
            stderr.contains(&format!("warning: no routes: {says}")),
            "{stderr}"
        );
    }
}

/// A queued route whose lanes anyone can choose (no signature check, or a lane read from
/// what the signature does not cover) passes `check` with a warning; a signed one does
/// not warn.
#[test]
fn lanes_anyone_can_choose_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let route = |verify: &str, order_by: &str| {
        format!(
            "upstream: http://127.0.0.1:8080\nroutes:\n  - name: hooks\n    match: {{ path: /hooks }}\n    key: \"{{json:/id}}\"\n{verify}    delivery: queued\n    queue: {{ order_by: \"{order_by}\" }}\n"
        )
    };
    let signed =
        "    verify: { hmac: { secret_env: LANES_SECRET, header: X-Signature, encoding: hex } }\n";
    for (text, warned) in [
        (route("", "{json:/entity}"), true),
        (route(signed, "{header:x-entity}"), true),
        (route(signed, "{json:/entity}"), false),
    ] {
        let file = dir.path().join("lanes.yaml");
        std::fs::write(&file, &text).unwrap();
        let output = Command::new(binary_path())
            .args(["check", "-c"])
            .arg(&file)
            .env("LANES_SECRET", "0123456789abcdef0123456789abcdef")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{text}\n{stderr}");
        assert_eq!(
            stderr.contains("queue.order_by can be set by whoever reaches the route"),
            warned,
            "{text}\n{stderr}"
        );
    }
}

/// A file with several mistakes gets one line for each, in the file's order, each with its
/// own line and column (and a route's index as the file counts it): the operator fixes
/// them all in one go instead of one per run.
#[test]
fn every_error_a_file_has_is_shown_in_one_run() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/several_errors.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let expected: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# expect: ")?.split_once(' '))
        .collect();
    let output = check(&["check", "-c"], &file);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{stderr}");
    for (line, (location, fragment)) in lines.iter().zip(&expected) {
        let prefix = format!("error: {}:{location}: ", file.display());
        assert!(
            line.starts_with(&prefix) && line.contains(fragment),
            "wanted `{prefix}…{fragment}…`, got: {line}"
        );
    }
}
