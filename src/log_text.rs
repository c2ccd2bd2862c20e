//! How a text log line writes an event's fields, so that text a sender chose (a key, a
//! path, a header value, an error quoting them) reads as the one field it is: a value
//! holding anything but plain word characters is written quoted, with quotes,
//! backslashes, line breaks, terminal escapes and bidi controls escaped as Rust's `{:?}`
//! escapes them. A log pipeline reading `name=value` pairs cannot be handed a forged
//! `route=...`, and a terminal showing the log cannot be made to recolour or reorder it.
//!
//! tracing-subscriber's own text format quotes string fields but writes `%value` fields
//! and messages as they are; this replaces only the field formatting, the rest of its
//! line (time, level, target, spans) stays as it writes them.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// The field formatter for text logs (`fmt::layer().fmt_fields(QuotedFields)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct QuotedFields;

impl<'a> MakeVisitor<Writer<'a>> for QuotedFields {
    type Visitor = FieldWriter<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> FieldWriter<'a> {
        FieldWriter {
            writer,
            first: true,
            result: Ok(()),
        }
    }
}

/// Writes one event's (or span's) fields, space-separated, the message first as tracing
/// records it.
pub struct FieldWriter<'a> {
    writer: Writer<'a>,
    first: bool,
    result: fmt::Result,
}

impl FieldWriter<'_> {
    fn write(&mut self, field: &Field, value: Value<'_>) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        self.result = if name == "message" {
            write!(self.writer, "{separator}")
                .and_then(|()| write_escaped(&mut self.writer, &value.text()))
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}=")
                .and_then(|()| write_value(&mut self.writer, value))
        };
    }
}

/// A field's value as tracing hands it over.
enum Value<'v> {
    /// A string field: always quoted, as tracing-subscriber's own format does.
    Str(&'v str),
    /// Anything else, as its `Debug` (which is `Display` for a `%value` field).
    Formatted(&'v dyn fmt::Debug),
}

impl Value<'_> {
    fn text(&self) -> String {
        match self {
            Value::Str(text) => (*text).to_owned(),
            Value::Formatted(value) => format!("{value:?}"),
        }
    }
}

fn write_value(writer: &mut impl Write, value: Value<'_>) -> fmt::Result {
    match value {
        Value::Str(text) => quoted(writer, text),
        Value::Formatted(value) => {
            let text = format!("{value:?}");
            if is_bare(&text) {
                writer.write_str(&text)
            } else {
                quoted(writer, &text)
            }
        }
    }
}

/// `text` in quotes, escaped as `{:?}` escapes it, and every misleading character
/// (some of which `{:?}` prints as they are) as `\u{..}` too.
fn quoted(writer: &mut impl Write, text: &str) -> fmt::Result {
    writer.write_char('"')?;
    for c in text.chars() {
        let printed_raw = c.escape_debug().nth(1).is_none();
        if printed_raw && crate::misleading::is_misleading(c) {
            write!(writer, "\\u{{{:x}}}", u32::from(c))?;
        } else {
            write!(writer, "{}", c.escape_debug())?;
        }
    }
    writer.write_char('"')
}

/// Characters a value may hold and still be written unquoted: none of them ends a field
/// or starts another (no space, `=` or quote) or changes what a terminal shows.
fn is_bare(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|byte| {
            byte.is_ascii_alphanumeric() || b"-_.:/@+,*%()[]{}#~!?&;<>|^$".contains(&byte)
        })
}

/// A character `{:?}` would escape other than quotes and backslashes: controls, line
/// and paragraph separators, bidi and other invisible format characters.
fn needs_escape(c: char) -> bool {
    crate::misleading::is_misleading(c)
        || (!matches!(c, '"' | '\'' | '\\') && c.escape_debug().nth(1).is_some())
}

/// A message written as it is, but for the characters a terminal or a line-based reader
/// would act on, which are escaped.
fn write_escaped(writer: &mut impl Write, text: &str) -> fmt::Result {
    for c in text.chars() {
        if needs_escape(c) {
            write!(writer, "{}", c.escape_debug())?;
        } else {
            writer.write_char(c)?;
        }
    }
    Ok(())
}

impl Visit for FieldWriter<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, Value::Str(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(cause) = source {
            write!(text, ": {cause}").ok();
            source = cause.source();
        }
        self.write(field, Value::Str(&text));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, Value::Formatted(value));
    }
}

impl VisitOutput<fmt::Result> for FieldWriter<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for FieldWriter<'_> {
    fn writer(&mut self) -> &mut dyn Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> String {
        let mut out = String::new();
        write_value(&mut out, Value::Formatted(&format_args!("{text}"))).unwrap();
        out
    }

    #[test]
    fn sender_text_becomes_one_quoted_value() {
        assert_eq!(value("evt_1"), "evt_1");
        assert_eq!(value("a route=evil"), r#""a route=evil""#);
        assert_eq!(value("x\" route=\"y"), r#""x\" route=\"y""#);
        assert_eq!(value("line\nroute=z"), r#""line\nroute=z""#);
        assert_eq!(value("\u{1b}[31mred"), r#""\u{1b}[31mred""#);
        assert_eq!(value("abc\u{202e}fed"), r#""abc\u{202e}fed""#);
        assert_eq!(value(r"back\slash"), r#""back\\slash""#);
        assert_eq!(value(""), r#""""#);
        // A value that looks quoted is quoted again: `"evt_1"` is not `evt_1`.
        assert_eq!(value(r#""evt_1""#), r#""\"evt_1\"""#);
        // Blanks `{:?}` prints as they are: escaped all the same.
        assert_eq!(value("a b\u{3164}"), r#""a b\u{3164}""#);
        assert_eq!(value("a b\u{2800}"), r#""a b\u{2800}""#);
        assert_eq!(value("\"a\\\u{200e}\""), r#""\"a\\\u{200e}\"""#);
    }

    #[test]
    fn messages_keep_their_words_and_lose_their_controls() {
        let mut out = String::new();
        write_escaped(&mut out, "held \"key\" a\nb \u{1b}[0m\u{2066}é").unwrap();
        assert_eq!(out, "held \"key\" a\\nb \\u{1b}[0m\\u{2066}é");
    }
}
