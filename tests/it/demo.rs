//! `dedupe-proxy demo`: the newcomer's first run completes and reports no loss.

use crate::support;

use std::process::Command;

fn row(output: &str, label: &str) -> usize {
    let line = output
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` row in:\n{output}"));
    line.split_whitespace().last().unwrap().parse().unwrap()
}

#[test]
fn the_demo_forwards_each_event_once_and_loses_none() {
    let output = Command::new(support::binary_path())
        .args(["demo", "--events", "60"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(row(&stdout, "events  "), 60);
    assert_eq!(row(&stdout, "upstream executions"), 60);
    assert_eq!(row(&stdout, "events acknowledged"), 60);
    assert_eq!(row(&stdout, "forwarded, app failed (released)"), 12);
    assert_eq!(row(&stdout, "extra executions"), 0);
    assert_eq!(row(&stdout, "events lost"), 0);
    assert!(
        row(&stdout, "duplicates answered") >= 60,
        "every replay is a duplicate"
    );
}
