//! A file's errors as the operator reads them: each at its file, line and column, with a
//! suggestion where a name was misspelt, and every one that can be found in one reading,
//! not only the first.
//!
//! serde stops at the first error. To find the next, the part of the file that holds it
//! (one field of a route, one route, or one top-level section) is blanked out, keeping
//! every other line and column where it was, and the file is read again; a required
//! `upstream` gets a stand-in instead. The parts' extents come from a YAML parser that
//! reports positions (`yaml-rust2`), since serde_yaml keeps none. Blanking a route or a
//! section can only hide errors that depend on it (a duplicate name), never make one up.
//! Blanking a field can (the route then misses what the field was meant to be): such an
//! error is recognised by where it is told (at a field's start, and not an unknown field),
//! dropped, and the route blanked whole instead; so is a route written inline. The search
//! stops at an error it cannot place in a part.

use std::path::Path;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

use super::file::{ConfigFile, ROUTE_ONLY};

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read the configuration: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// More than one error, each `Invalid`, in the file's order: one per line.
    #[error("{}", lines(.0))]
    Several(Vec<ConfigError>),
}

impl ConfigError {
    /// The error on one line, several joined by `; `: for a log line or an API answer.
    pub(crate) fn on_one_line(&self) -> String {
        self.to_string().replace('\n', "; ")
    }
}

fn lines(errors: &[ConfigError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

/// At most this many errors are reported for one file.
const MOST_ERRORS: usize = 20;

/// Every error of `text` that can be found, given the first one serde found.
pub(super) fn every_error(text: &str, path: &Path, first: &serde_yaml::Error) -> ConfigError {
    let mut errors = vec![located(path, first)];
    let mut text = text.to_owned();
    // The routes left out so far: serde counts the routes after them from fewer.
    let mut routes_left_out = 0;
    'errors: while errors.len() < MOST_ERRORS {
        let Some(ConfigError::Invalid { line, column, .. }) = errors.last() else {
            break;
        };
        let at = (*line, *column);
        // The route's field that holds the error is left out alone first, so that the
        // route's other mistakes are found too. What the route then misses (`a route needs
        // a match`, for a misspelt `match`) is told at the start of one of its fields: an
        // error found there that is not itself an unknown field was made up, and the
        // route is left out whole instead.
        let all = parts(&text);
        let field = all.iter().find(|part| part.route_field && part.holds(at));
        let enclosing = all.iter().find(|part| !part.route_field && part.holds(at));
        let at_a_key = |error: &ConfigError| {
            matches!(error, ConfigError::Invalid { line, column, .. }
                if all.iter().any(|part| part.route_field && part.from == (*line, *column)))
        };
        for part in field.into_iter().chain(enclosing) {
            let shorter = part.left_out(&text);
            let Err(error) = serde_yaml::from_str::<ConfigFile>(&shorter) else {
                break 'errors;
            };
            let left_out = routes_left_out + usize::from(part.route);
            let next = counted_from_the_file(located(path, &error), left_out);
            let made_up = part.route_field && at_a_key(&next) && !is_unknown_field(&next);
            if is_new(&next, at, &errors) && !made_up {
                (text, routes_left_out) = (shorter, left_out);
                errors.push(next);
                continue 'errors;
            }
        }
        break;
    }
    if errors.len() == 1 {
        errors.remove(0)
    } else {
        ConfigError::Several(errors)
    }
}

/// Whether `next` is an error after `at` not told yet: one at or before it, or one
/// already told (a missing field, told again where the file's top-level map now ends),
/// is not a new one.
fn is_new(next: &ConfigError, at: (usize, usize), told: &[ConfigError]) -> bool {
    let ConfigError::Invalid {
        line,
        column,
        message,
        ..
    } = next
    else {
        return false;
    };
    let earlier = |error: &ConfigError| matches!(error, ConfigError::Invalid { message: earlier, .. } if earlier == message);
    (*line, *column) > at && !told.iter().any(earlier)
}

/// Whether `error` is serde's for a field the file names and the type does not have.
fn is_unknown_field(error: &ConfigError) -> bool {
    matches!(error, ConfigError::Invalid { message, .. } if message.contains("unknown field `"))
}

/// `error` with its route's index counted as in the file, where `left_out` routes before
/// it were left out (serde names it `routes[<index among the rest>]`).
fn counted_from_the_file(error: ConfigError, left_out: usize) -> ConfigError {
    let ConfigError::Invalid {
        file,
        line,
        column,
        message,
    } = error
    else {
        return error;
    };
    let renumbered = message
        .strip_prefix("routes[")
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(index, rest)| Some((index.parse::<usize>().ok()? + left_out, rest)))
        .map(|(index, rest)| format!("routes[{index}]{rest}"));
    ConfigError::Invalid {
        file,
        line,
        column,
        message: renumbered.unwrap_or(message),
    }
}

/// A part of the file that can be left out on its own: a top-level entry, a route, or one
/// field of a route.
#[derive(Debug)]
struct Part {
    /// Byte offsets: from its first character (a route's `-`) to the next part's.
    start: usize,
    end: usize,
    /// Line and column (from 1) of its first character, and of the next part's.
    from: (usize, usize),
    to: (usize, usize),
    /// For the top-level `upstream`, which may not be left out: where its value starts.
    required_value: Option<usize>,
    /// An entry of `routes:`.
    route: bool,
    /// One field of a route (its name and value), up to the route's next field.
    route_field: bool,
}

impl Part {
    fn holds(&self, at: (usize, usize)) -> bool {
        self.from <= at && at < self.to
    }

    /// `text` with this part blanked out (every character but line ends made a space),
    /// or `upstream`'s value replaced by a stand-in that parses.
    fn left_out(&self, text: &str) -> String {
        let blank = |part: &str| -> String {
            part.chars()
                .map(|c| if c == '\n' || c == '\r' { c } else { ' ' })
                .collect()
        };
        match self.required_value {
            Some(value) => format!(
                "{}http://127.0.0.1:1{}{}",
                &text[..value],
                blank(&text[value..self.end]),
                &text[self.end..]
            ),
            None => format!(
                "{}{}{}",
                &text[..self.start],
                blank(&text[self.start..self.end]),
                &text[self.end..]
            ),
        }
    }
}

/// Deeper than this, the file is not taken apart (nor walked further): no configuration
/// nests so deep, and a file that does is answered with its first error alone.
const DEEPEST: usize = 32;

/// The top-level entries of `text` and the entries of its `routes:` list, as a YAML
/// parser sees them. None where parts could not be left out without making up an error
/// or where the two parsers could disagree on positions: a file the parser cannot read or
/// that nests deeper than [`DEEPEST`], a top level or a list written inline, anchors and
/// aliases (a part left out could hold an anchor used elsewhere), line breaks other than
/// `\n` and `\r\n` (the parsers count lines differently at those).
fn parts(text: &str) -> Vec<Part> {
    let odd_line_breaks = text.contains(['\u{85}', '\u{2028}', '\u{2029}'])
        || text.replace("\r\n", "").contains('\r');
    let Some(walk) = walked(text).filter(|_| !odd_line_breaks) else {
        return Vec::new();
    };
    let Some(top_end) = walk.top_end else {
        return Vec::new();
    };
    let offsets = Offsets::of(text);
    let Some(mut parts) = route_parts(text, &walk, &offsets) else {
        return Vec::new();
    };
    let keys = route_field_parts(&walk, &parts, &offsets);
    // A route lies inside the `routes:` entry: the innermost part holding an error is
    // found first (fields are told apart by `route_field`, whatever their place).
    parts.reverse();
    parts.splice(0..0, keys);
    let mut top = top_parts(&walk, top_end, &offsets);
    top.reverse();
    parts.extend(top);
    parts
}

/// The file's top level and routes as the parser's events show them, unless the file
/// cannot be taken apart (see [`parts`]).
fn walked(text: &str) -> Option<Walk> {
    let mut walk = Walk::default();
    // Event by event, not `Parser::load`, which recurses as deep as the file nests.
    let mut parser = Parser::new_from_str(text);
    loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => break,
            Ok((event, mark)) => walk.on_event(event, mark),
            Err(_) => return None,
        }
        if walk.depth > DEEPEST || walk.anchored {
            return None;
        }
    }
    let block_style = walk.top.iter().all(|(key, _)| key.col() == 0);
    block_style.then_some(walk)
}

/// Byte offsets from the parser's lines and columns (its own byte index drifts after
/// some block scalars; its lines and columns do not).
struct Offsets<'t> {
    text: &'t str,
    line_starts: Vec<usize>,
}

impl<'t> Offsets<'t> {
    fn of(text: &'t str) -> Offsets<'t> {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(at, _)| at + 1))
            .collect();
        Offsets { text, line_starts }
    }

    /// The line (from 1) of the byte at `offset`, and where that line starts.
    fn line_of(&self, offset: usize) -> (usize, usize) {
        let line = self.line_starts.partition_point(|start| *start <= offset);
        (line, self.line_starts[line - 1])
    }

    fn byte(&self, mark: Marker) -> usize {
        let Some(&start) = self.line_starts.get(mark.line().saturating_sub(1)) else {
            return self.text.len();
        };
        let line = &self.text[start..];
        start
            + line
                .char_indices()
                .nth(mark.col())
                .map_or(line.len(), |(at, _)| at)
    }
}

/// The top-level entries, each up to the next.
fn top_parts(walk: &Walk, end: Marker, offsets: &Offsets) -> Vec<Part> {
    walk.top
        .iter()
        .enumerate()
        .map(|(index, (start, value))| {
            let next = walk.top.get(index + 1).map_or(end, |(next, _)| *next);
            Part {
                start: offsets.byte(*start),
                end: offsets.byte(next),
                from: (start.line(), start.col() + 1),
                to: (next.line(), next.col() + 1),
                required_value: value.map(|value| offsets.byte(value)),
                route: false,
                route_field: false,
            }
        })
        .collect()
}

/// The routes, each from its `-` (so that no empty entry is left behind) up to the next;
/// none if the list is not a block list.
fn route_parts(text: &str, walk: &Walk, offsets: &Offsets) -> Option<Vec<Part>> {
    let Some(routes_end) = walk.routes_end else {
        return Some(Vec::new());
    };
    let mut dashes = Vec::new();
    for start in &walk.routes {
        // Spaces lie between the `-` and the route, and line breaks where the route's
        // first key was left out.
        let before = text[..offsets.byte(*start)].trim_end_matches([' ', '\n', '\r']);
        let dash = before.strip_suffix('-')?;
        let (line, line_start) = offsets.line_of(dash.len());
        let column = 1 + dash[line_start..].chars().count();
        dashes.push((dash.len(), (line, column)));
    }
    let end = (
        offsets.byte(routes_end),
        (routes_end.line(), routes_end.col() + 1),
    );
    let parts = dashes
        .iter()
        .enumerate()
        .map(|(index, &(start, from))| {
            let (end, to) = dashes.get(index + 1).copied().unwrap_or(end);
            Part {
                start,
                end,
                from,
                to,
                required_value: None,
                route: true,
                route_field: false,
            }
        })
        .collect();
    Some(parts)
}

/// Each route's keys, each up to the next (the last up to the route's end), for the routes
/// written in block style: every key on a line of its own, at one column. None for a
/// route written inline, where leaving a key out would leave a stray comma.
fn route_field_parts(walk: &Walk, routes: &[Part], offsets: &Offsets) -> Vec<Part> {
    let mut keys_of: Vec<Vec<Marker>> = vec![Vec::new(); routes.len()];
    for (of, key) in &walk.route_fields {
        if let Some(keys) = keys_of.get_mut(*of) {
            keys.push(*key);
        }
    }
    let mut parts = Vec::new();
    for (route, keys) in routes.iter().zip(keys_of) {
        // `- { ... }`, on one line or several: its closing brace goes with its last key.
        let inline = offsets.text[route.start + 1..]
            .trim_start()
            .starts_with('{');
        let block = !inline
            && keys
                .windows(2)
                .all(|pair| pair[0].col() == pair[1].col() && pair[0].line() < pair[1].line());
        if !block {
            continue;
        }
        for (at, key) in keys.iter().enumerate() {
            let (end, to) = keys.get(at + 1).map_or((route.end, route.to), |next| {
                (offsets.byte(*next), (next.line(), next.col() + 1))
            });
            parts.push(Part {
                start: offsets.byte(*key),
                end,
                from: (key.line(), key.col() + 1),
                to,
                required_value: None,
                route: false,
                route_field: true,
            });
        }
    }
    parts
}

/// Where the top-level entries and the routes start, from the parser's events.
#[derive(Default)]
struct Walk {
    /// Nesting: 1 inside the top-level mapping.
    depth: usize,
    /// At depth 1: whether the next scalar or collection is a key.
    expecting_key: bool,
    /// The key at depth 1 whose value is being read.
    key: Option<String>,
    top: Vec<(Marker, Option<Marker>)>,
    top_end: Option<Marker>,
    /// Inside `routes:` (depth 2 is its list).
    in_routes: bool,
    /// A route that is a map has just started: the parser marks a block map where it
    /// found its first key's end, so the first key's own mark is its start.
    route_opened: bool,
    /// An anchor or an alias was seen.
    anchored: bool,
    routes: Vec<Marker>,
    routes_end: Option<Marker>,
    /// Inside a route that is a map (depth 3): whether the next scalar or collection is
    /// the name of one of its fields.
    expecting_route_field: bool,
    /// The route being read is a map (not a scalar or a list).
    route_is_map: bool,
    /// Each route's fields: the route's index and where the field's name starts.
    route_fields: Vec<(usize, Marker)>,
}

impl MarkedEventReceiver for Walk {
    fn on_event(&mut self, event: Event, mark: Marker) {
        self.anchored |= matches!(
            event,
            Event::Alias(_)
                | Event::Scalar(_, _, 1.., _)
                | Event::MappingStart(1.., _)
                | Event::SequenceStart(1.., _)
        );
        let opens = matches!(event, Event::MappingStart(..) | Event::SequenceStart(..));
        let closes = matches!(event, Event::MappingEnd | Event::SequenceEnd);
        if self.depth == 3 && self.in_routes && self.route_is_map && !closes {
            if self.expecting_route_field {
                self.route_fields
                    .push((self.routes.len().saturating_sub(1), mark));
            }
            self.expecting_route_field = !self.expecting_route_field;
        }
        if self.depth == 1 && !closes {
            if self.expecting_key {
                let key = match &event {
                    Event::Scalar(key, ..) => key.clone(),
                    _ => String::new(),
                };
                self.top.push((mark, None));
                self.key = Some(key);
            } else {
                if self.key.as_deref() == Some("upstream")
                    && let Some(entry) = self.top.last_mut()
                {
                    entry.1 = Some(mark);
                }
                self.in_routes = self.key.as_deref() == Some("routes")
                    && matches!(event, Event::SequenceStart(..));
            }
            self.expecting_key = !self.expecting_key;
        } else if self.depth == 2 && self.in_routes && !closes {
            self.routes.push(mark);
            self.route_opened = opens;
            self.route_is_map = matches!(event, Event::MappingStart(..));
            self.expecting_route_field = true;
        } else if self.route_opened {
            self.route_opened = false;
            if let Some(route) = self.routes.last_mut()
                && mark.index() < route.index()
            {
                *route = mark;
            }
        }
        if opens {
            self.depth += 1;
            if self.depth == 1 {
                self.expecting_key = true;
            }
        } else if closes {
            self.depth = self.depth.saturating_sub(1);
            match self.depth {
                0 => self.top_end = Some(mark),
                1 if self.in_routes => {
                    self.routes_end = Some(mark);
                    self.in_routes = false;
                }
                _ => {}
            }
        }
    }
}

/// Turns a serde_yaml error into `file:line:column: message`.
fn located(path: &Path, error: &serde_yaml::Error) -> ConfigError {
    let (line, column) = error
        .location()
        .map_or((1, 1), |location| (location.line(), location.column()));
    // The location goes before the message, once (a syntax error's may be inside it).
    let text = error
        .to_string()
        .replacen(&format!(" at line {line} column {column}"), "", 1);
    // The parser may quote a value of the file: a store URL's password must not go with
    // it, and a line break in it must not start what reads as another error's line.
    let message = crate::dsn::masked_anywhere(&with_suggestion(defaults_fields_only(text)));
    let mut escaped = String::with_capacity(message.len());
    for c in message.chars() {
        if c.is_control() {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    ConfigError::Invalid {
        file: path.display().to_string(),
        line,
        column,
        message: escaped,
    }
}

/// serde's message for an unknown field of `defaults:` lists a route's fields, those
/// `defaults:` may not set among them: the list keeps only the ones it may.
fn defaults_fields_only(message: String) -> String {
    let Some((head, list)) = message
        .strip_prefix("defaults: unknown field `")
        .and_then(|_| message.split_once("expected one of "))
    else {
        return message;
    };
    let allowed: Vec<&str> = list
        .split(", ")
        .filter(|field| !ROUTE_ONLY.contains(&field.trim_matches('`')))
        .collect();
    format!("{head}expected one of {}", allowed.join(", "))
}

/// serde's message for an unknown field or value (`unknown field `retension`, expected
/// one of ...`), with the expected name nearest to the one written.
fn with_suggestion(message: String) -> String {
    let written = ["unknown field `", "unknown variant `"]
        .iter()
        .find_map(|start| message.split_once(start))
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(written, _)| written);
    let expected = message
        .split_once("expected ")
        .map(|(_, list)| list.split('`').skip(1).step_by(2));
    let near = written
        .zip(expected)
        .and_then(|(written, expected)| crate::values::closest(written, expected));
    match near {
        Some(near) => format!("{message}; did you mean `{near}`?"),
        None => message,
    }
}
