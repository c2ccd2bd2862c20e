//! Secrets kept out of everything the process writes: each value that a configuration holds
//! as a secret (signature secrets, the admin token, the store's passwords, in every form
//! `config` finds them) is replaced by `***` in log lines, in the errors the binary prints
//! and in the admin API's messages, whatever code wrote them. Store URLs are masked where
//! they are shown; this catches what a driver's own message might quote.
//!
//! Secrets are remembered for the life of the process: a line about a configuration that
//! a reload replaced may still be written. Values shorter than [`SHORTEST`] are not
//! searched for: masking every `abc` in the log would hide more than it protects.

use std::borrow::Cow;
use std::io::{self, Write};
use std::sync::Arc;

use aho_corasick::AhoCorasick;
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

/// What stands for a secret.
pub(crate) use crate::dsn::MASK;

/// The shortest value searched for, in bytes.
pub(crate) const SHORTEST: usize = 4;

/// The most values remembered; a process reloading ever-new secrets stops adding after
/// this many (each reload's values are added before a later one's).
const MOST: usize = 4096;

/// The secrets to search for, and a matcher built from them.
struct Known {
    values: Vec<String>,
    matcher: AhoCorasick,
}

static KNOWN: ArcSwapOption<Known> = ArcSwapOption::const_empty();
/// Serializes the rebuilds of [`KNOWN`].
static ADDING: Mutex<()> = Mutex::new(());

/// Adds `secrets` to the values kept out of every line.
pub fn remember(secrets: impl IntoIterator<Item = String>) {
    let _adding = ADDING.lock();
    let current = KNOWN.load_full();
    let mut values: Vec<String> = current
        .as_ref()
        .map_or_else(Vec::new, |known| known.values.clone());
    let before = values.len();
    for secret in secrets
        .into_iter()
        .filter(|secret| secret.len() >= SHORTEST)
    {
        // As written, and as a JSON log line or a `{:?}` would escape it.
        let json = serde_json::to_string(&secret).unwrap_or_default();
        let debug = format!("{secret:?}");
        for form in [
            secret.clone(),
            json.trim_matches('"').to_owned(),
            debug.trim_matches('"').to_owned(),
        ] {
            if values.contains(&form) {
                continue;
            }
            if values.len() >= MOST {
                tracing::warn!(
                    "more secrets than are kept out of the log ({MOST}): restart the proxy to forget the ones reloads replaced"
                );
                break;
            }
            values.push(form);
        }
    }
    if values.len() == before {
        return;
    }
    // Longest first, so that a secret containing another is masked whole.
    values.sort_by_key(|value| std::cmp::Reverse(value.len()));
    let matcher = AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostLongest)
        .build(&values)
        .expect("literal patterns always build");
    KNOWN.store(Some(Arc::new(Known { values, matcher })));
}

/// `text` with every remembered secret masked.
pub fn text(text: &str) -> Cow<'_, str> {
    let known = KNOWN.load();
    match known.as_ref() {
        Some(known) if known.matcher.is_match(text) => Cow::Owned(
            known
                .matcher
                .replace_all(text, &vec![MASK; known.values.len()]),
        ),
        _ => Cow::Borrowed(text),
    }
}

/// Bytes with every remembered secret masked (a log line).
fn bytes(line: &[u8]) -> Cow<'_, [u8]> {
    let known = KNOWN.load();
    match known.as_ref() {
        Some(known) if known.matcher.is_match(line) => Cow::Owned(
            known
                .matcher
                .replace_all_bytes(line, &vec![MASK; known.values.len()]),
        ),
        _ => Cow::Borrowed(line),
    }
}

/// Standard error with every remembered secret masked, for the log. The log formats each
/// line whole before writing it, so no secret is split across two writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

impl Write for Stderr {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        io::stderr().lock().write_all(&bytes(line))?;
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_secrets_are_masked_and_short_ones_left() {
        remember(["redact-test-secret-1".to_owned(), "abc".to_owned()]);
        remember(["redact-test-secret-1-longer".to_owned()]);
        assert_eq!(
            text("a redact-test-secret-1 b redact-test-secret-1-longer c abc"),
            "a *** b *** c abc"
        );
        assert!(matches!(text("nothing here"), Cow::Borrowed(_)));
        assert_eq!(
            bytes(b"x=redact-test-secret-1\n").as_ref(),
            b"x=***\n".as_slice()
        );
        remember([r#"redact"test\secret"#.to_owned()]);
        assert_eq!(
            text(r#"{"error":"redact\"test\\secret"} redact"test\secret"#),
            r#"{"error":"***"} ***"#
        );
    }
}
