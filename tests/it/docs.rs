//! The documents a user reads: the README stays short and opens with its two commands,
//! and every link between the repository's documents leads to a file that exists and,
//! with a `#fragment`, to a heading that exists in it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
        .iter()
        .map(|name| root().join(name))
        .collect();
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "md") {
            files.push(path);
        }
    }
    files
}

/// The anchors GitHub gives a document's headings: lower case, punctuation dropped,
/// spaces made hyphens, a repeated heading numbered.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !in_code) else {
            continue;
        };
        let slug: String = heading
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 1;
        while !seen.insert(anchor.clone()) {
            anchor = format!("{slug}-{n}");
            n += 1;
        }
    }
    seen
}

/// `[text](target)` links of a Markdown text, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_link_between_the_documents_leads_somewhere() {
    let mut broken = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                document.clone()
            } else {
                document.parent().unwrap().join(file)
            };
            let name = document.strip_prefix(root()).unwrap().display().to_string();
            if !target.exists() {
                broken.push(format!("{name}: {link}: no such file"));
                continue;
            }
            if !fragment.is_empty() {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{name}: {link}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "\n{}", broken.join("\n"));
}

/// A user reads the README in ten minutes: at most 350 lines, and the two commands that
/// run the proxy and the tests come first.
#[test]
fn the_readme_is_short_and_opens_with_the_two_commands() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines <= 350, "README.md has {lines} lines");
    let blocks: Vec<&str> = text
        .split("```sh\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(code, _)| code.trim()))
        .take(2)
        .collect();
    assert_eq!(
        blocks,
        [
            "cargo run --release -- run -c config/example.yaml",
            "tests/setup && cargo test"
        ]
    );
}
