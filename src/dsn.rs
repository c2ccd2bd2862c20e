//! The passwords in a store's connection string, in every form the drivers accept: a URL's
//! user information (`postgres://user:pass@host`), a URL's query (`?password=...`,
//! Redis's `?pass=...`), and libpq's `key=value` form (`password='...'`). Found here so
//! that they can be masked wherever the string is shown and kept out of every log line
//! (`crate::redact`).
//!
//! A URL is read as RFC 3986 reads it: its authority ends at the first `/`, `?` or `#`
//! after the scheme, and its user information at the authority's last `@`. A password
//! holding one of those characters unescaped would end the authority early, so the rest
//! of it would be read as a host or a path (and shown in a connection error): an `@`
//! after the authority is refused ([`check`]).

use std::borrow::Cow;

/// Query parameters and `key=value` keys that hold a password, as libpq and redis-rs read
/// them.
const PASSWORD_KEYS: [&str; 3] = ["password", "pass", "sslpassword"];

/// The keys the PostgreSQL driver (tokio-postgres) reads in the `key=value` form; it
/// refuses any other, quoting it.
const DRIVER_KEYS: [&str; 19] = [
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// What stands for a password in anything shown.
pub(crate) const MASK: &str = "***";

/// A password's place in a connection string: its bytes `start..end`, as written.
type Span = std::ops::Range<usize>;

/// Refuses a URL whose password would be read in part as its host or path: one with an
/// `@` after its authority. The message never quotes the URL.
pub fn check(url: &str) -> Result<(), String> {
    let Some((_, rest)) = url.split_once("://") else {
        return check_key_value(url);
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[authority_end..].contains('@') {
        return Err(
            "the URL has an `@` after its host: percent-encode the special characters of a password (`@` as %40, `/` as %2F, `?` as %3F, `#` as %23, `%` as %25)"
                .into(),
        );
    }
    Ok(())
}

/// Refuses a `key=value` string holding a word without `=`: libpq refuses it too, and
/// quotes the word in its message, which for `password=two words` is half the password.
/// The message never quotes the string.
fn check_key_value(text: &str) -> Result<(), String> {
    if key_value_words(text).any(|word| word.bare) {
        return Err(
            "the connection string has a word without `=`: write a value holding spaces in single quotes (password='two words')"
                .into(),
        );
    }
    // The driver would quote an unknown key, which for `password=a b=c` is part of the
    // password; so it is refused here, unquoted.
    if key_value_words(text).any(|word| !is_driver_key(word.key)) {
        return Err(format!(
            "the connection string has a key the PostgreSQL driver does not read (it is not quoted here: it may be part of a password; write a value holding spaces in single quotes); the keys are {}",
            DRIVER_KEYS.join(", ")
        ));
    }
    Ok(())
}

fn is_driver_key(name: &str) -> bool {
    DRIVER_KEYS.contains(&name)
}

/// The connection string with every password replaced by [`MASK`].
pub fn masked(text: &str) -> Cow<'_, str> {
    let spans = password_spans(text);
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    Cow::Owned(with_masks(text, &spans))
}

/// `text` with each of `spans` (in order) replaced by [`MASK`]; a span that overlaps the
/// one before is masked from where that one ended.
fn with_masks(text: &str, spans: &[Span]) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut from = 0;
    for span in spans {
        if span.end <= from {
            continue;
        }
        shown.push_str(&text[from..span.start.max(from)]);
        shown.push_str(MASK);
        from = span.end;
    }
    shown.push_str(&text[from..]);
    shown
}

/// Free text (a parser's message that quotes a value of the file) with the password of
/// every URL and `password=` value in it masked.
pub(crate) fn masked_anywhere(text: &str) -> String {
    let is_delimiter = |c: char| c.is_whitespace() || matches!(c, '"' | '`' | ',');
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at].rfind(is_delimiter).map_or(0, |d| d + 1);
        let end = rest[at..].find(is_delimiter).map_or(rest.len(), |d| at + d);
        shown.push_str(&rest[..start]);
        shown.push_str(&masked(&rest[start..end]));
        rest = &rest[end..];
    }
    shown.push_str(rest);
    with_masks(&shown, &key_value_password_spans(&shown))
}

/// Every password in the connection string, as written and, where that differs, as the
/// driver reads it (percent-decoded, or unquoted): the forms that could reach a message.
pub fn passwords(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for span in password_spans(text) {
        let written = &text[span];
        let read = if written.starts_with('\'') {
            unquote(written)
        } else {
            percent_encoding::percent_decode_str(written)
                .decode_utf8_lossy()
                .into_owned()
        };
        found.push(written.to_owned());
        if read != written {
            found.push(read);
        }
    }
    found.retain(|password| !password.is_empty());
    found
}

/// Where the passwords are, in order, not overlapping.
fn password_spans(text: &str) -> Vec<Span> {
    match text.split_once("://") {
        Some((scheme, _)) if !scheme.contains([' ', '=']) => url_password_spans(text),
        _ => key_value_password_spans(text),
    }
}

/// A URL's password in its user information, and in its query.
fn url_password_spans(url: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    let after_scheme = url.find("://").map_or(0, |at| at + 3);
    let rest = &url[after_scheme..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some(last_at) = rest[authority_end..].rfind('@') {
        // A password with an unescaped `/`, `?` or `#` (refused by `check`): all that
        // may be part of it is masked, user and all.
        spans.push(after_scheme..after_scheme + authority_end + last_at);
        return spans;
    }
    if let Some(at) = authority.rfind('@')
        && let Some(colon) = authority[..at].find(':')
    {
        spans.push(after_scheme + colon + 1..after_scheme + at);
    }
    // The query starts after the authority: a `?` before `://` (no URL has one) is not it.
    if let Some(query_at) = rest[authority_end..]
        .find('?')
        .map(|at| after_scheme + authority_end + at)
    {
        let query_start = query_at + 1;
        let query_end = url[query_start..]
            .find('#')
            .map_or(url.len(), |end| query_start + end);
        let mut at = query_start;
        for pair in url[query_start..query_end].split('&') {
            if let Some((name, _)) = pair.split_once('=')
                && is_password_key(name)
            {
                let value_start = at + name.len() + 1;
                spans.push(value_start..at + pair.len());
            }
            at += pair.len() + 1;
        }
    }
    spans.retain(|span| !span.is_empty());
    spans
}

/// One `key=value` pair of libpq's form, or a bare word (no `=` after it).
struct Word<'a> {
    key: &'a str,
    /// Where the key (or the bare word) ends.
    key_end: usize,
    /// The value as written, quotes and all (empty for a bare word).
    value: Span,
    bare: bool,
}

/// libpq's `key=value` form: keys and values separated by white space, `=` with white
/// space around it allowed, a value in single quotes with `\'` and `\\` escapes.
fn key_value_words(text: &str) -> impl Iterator<Item = Word<'_>> {
    let bytes = text.as_bytes();
    let skip_space = |mut at: usize| {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    let mut at = 0;
    std::iter::from_fn(move || {
        at = skip_space(at);
        if at >= bytes.len() {
            return None;
        }
        let key_start = at;
        while at < bytes.len() && !bytes[at].is_ascii_whitespace() && bytes[at] != b'=' {
            at += 1;
        }
        let (key, key_end) = (&text[key_start..at], at);
        at = skip_space(at);
        if at >= bytes.len() || bytes[at] != b'=' {
            return Some(Word {
                key,
                key_end,
                value: at..at,
                bare: true,
            });
        }
        at = skip_space(at + 1);
        let value_start = at;
        if bytes.get(at) == Some(&b'\'') {
            at += 1;
            while at < bytes.len() && bytes[at] != b'\'' {
                at += if bytes[at] == b'\\' { 2 } else { 1 };
            }
            at = (at + 1).min(bytes.len());
        } else {
            while at < bytes.len() && !bytes[at].is_ascii_whitespace() {
                at += if bytes[at] == b'\\' { 2 } else { 1 };
            }
            at = at.min(bytes.len());
        }
        Some(Word {
            key,
            key_end,
            value: value_start..at,
            bare: false,
        })
    })
}

/// The passwords' places in libpq's `key=value` form. An unquoted password is taken to
/// run on over the bare words and unknown keys after it (`password=two words host=db`,
/// `password=a b=c`), which a driver would refuse, quoting them.
fn key_value_password_spans(text: &str) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    let mut open = false;
    for word in key_value_words(text) {
        let unknown = !is_driver_key(word.key) && !is_password_key(word.key);
        if word.bare || (open && unknown) {
            if open && let Some(last) = spans.last_mut() {
                last.end = if word.bare {
                    word.key_end
                } else {
                    word.value.end
                };
            }
            continue;
        }
        open = false;
        if is_password_key(word.key) && !word.value.is_empty() {
            open = !text[word.value.clone()].starts_with('\'');
            spans.push(word.value);
        }
    }
    spans
}

fn is_password_key(name: &str) -> bool {
    PASSWORD_KEYS
        .iter()
        .any(|key| name.eq_ignore_ascii_case(key))
}

/// A quoted `key=value` value as libpq reads it.
fn unquote(written: &str) -> String {
    let inner = written
        .strip_prefix('\'')
        .map(|rest| rest.strip_suffix('\'').unwrap_or(rest))
        .unwrap_or(written);
    let mut read = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => read.extend(chars.next()),
            c => read.push(c),
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A password with every character a URL or a `key=value` string treats specially.
    const HARD: &str = "p@ss:w/rd?#%&'=\\ x;";

    fn encoded() -> String {
        percent_encoding::utf8_percent_encode(HARD, percent_encoding::NON_ALPHANUMERIC).to_string()
    }

    fn quoted() -> String {
        format!("'{}'", HARD.replace('\\', "\\\\").replace('\'', "\\'"))
    }

    #[test]
    fn every_form_of_password_is_masked() {
        let encoded = encoded();
        let forms = [
            format!("postgres://app:{encoded}@db.internal:5432/app?sslmode=disable"),
            format!("postgresql://app:{encoded}@db.internal/app"),
            format!("postgres://app@db.internal/app?sslmode=disable&password={encoded}"),
            format!("postgres://app@db.internal/app?PASSWORD={encoded}#x"),
            format!("redis://:{encoded}@cache.internal:6379/0"),
            format!("rediss://default:{encoded}@cache.internal:6380"),
            format!("redis+unix:///run/redis.sock?db=1&pass={encoded}"),
            format!("host=db.internal user=app password={encoded} dbname=app"),
            format!(
                "host=db.internal user=app password = {} dbname=app",
                quoted()
            ),
            format!("password={} host=db.internal", quoted()),
            format!("host=db.internal sslpassword={encoded}"),
        ];
        for form in &forms {
            let shown = masked(form);
            assert!(shown.contains(MASK), "{form} → {shown}");
            assert!(!shown.contains(&encoded), "{form} → {shown}");
            assert!(!shown.contains(HARD), "{form} → {shown}");
            assert!(!shown.contains("ss:w"), "{form} → {shown}");
            let known = passwords(form);
            assert!(
                known.iter().any(|password| password == HARD),
                "{form}: {known:?}"
            );
        }
        assert_eq!(
            masked(&forms[0]),
            "postgres://app:***@db.internal:5432/app?sslmode=disable"
        );
        assert_eq!(
            masked(&forms[8]),
            "host=db.internal user=app password = *** dbname=app"
        );
    }

    /// `password=a b=c` meant `a b=c`: the driver would read `b` as a key and quote it.
    #[test]
    fn an_unquoted_password_running_into_a_key_is_masked_and_refused_unquoted() {
        let text = "host=db password=secret half=other dbname=app";
        assert_eq!(masked(text), "host=db password=*** dbname=app");
        let refused = check(text).unwrap_err();
        assert!(!refused.contains("half"), "{refused}");
        assert!(!refused.contains("other"), "{refused}");
        assert!(check("host=db user=app password='two words' dbname=app sslmode=require").is_ok());
    }

    #[test]
    fn text_that_only_looks_like_a_url_masks_without_a_panic() {
        // Found by fuzzing: a `?` before `://` was read as the query's start, and its
        // `password=` overlapped the user information's.
        let odd = "%40ss@h:5464/ds?s://%5mslboe&password=x:{}@cache.internal:6379/0";
        let shown = masked(odd);
        assert!(!shown.contains("x:{}"), "{shown}");
        assert!(!passwords(odd).is_empty());
    }

    #[test]
    fn messages_quoting_a_connection_string_are_masked() {
        let message = format!(
            "invalid type: string \"postgres://app:{}@db/app\", expected a map; also `host=db password={} user=app`",
            encoded(),
            quoted()
        );
        let shown = masked_anywhere(&message);
        assert!(!shown.contains(&encoded()), "{shown}");
        assert!(!shown.contains("ss:w"), "{shown}");
        assert!(shown.contains("postgres://app:***@db/app"), "{shown}");
        assert_eq!(masked_anywhere("no secrets here"), "no secrets here");
    }

    #[test]
    fn strings_without_a_password_are_shown_as_they_are() {
        for plain in [
            "postgres://app@db.internal/app",
            "postgres://db.internal:5432/app?sslmode=require",
            "redis://127.0.0.1:6379/0",
            "host=db user=app dbname=app",
            "redis://user@cache/0",
        ] {
            assert!(matches!(masked(plain), Cow::Borrowed(_)), "{plain}");
            assert!(passwords(plain).is_empty(), "{plain}");
        }
    }

    #[test]
    fn an_unescaped_at_after_the_host_is_refused_without_quoting_the_url() {
        let error = check("postgres://app:pa/ss@db/app").unwrap_err();
        assert!(!error.contains("pa/ss"), "{error}");
        assert_eq!(
            masked("postgres://app:pa?ss@db/app"),
            "postgres://***@db/app"
        );
        assert!(check("postgres://app:pa?ss@db/app").is_err());
        assert!(check("redis://:a#b@cache/0").is_err());
        assert!(check(&format!("postgres://app:{}@db/app", encoded())).is_ok());
        assert!(check("host=db password=a@b/c").is_ok());
    }

    /// libpq refuses `password=two words`, quoting `words`: the mask covers it, and
    /// `check` refuses it first, quoting nothing.
    #[test]
    fn an_unquoted_password_with_spaces_is_masked_whole_and_refused() {
        let text = "host=db password=correct horse battery user=app";
        assert_eq!(masked(text), "host=db password=*** user=app");
        assert_eq!(passwords(text), ["correct horse battery"]);
        let error = check(text).unwrap_err();
        assert!(!error.contains("horse"), "{error}");
        assert!(check("host=db password='correct horse' user=app").is_ok());
        assert_eq!(
            masked("password='a b' stray user=app"),
            "password=*** stray user=app"
        );
        assert!(check("host=db user=app").is_ok());
    }
}
