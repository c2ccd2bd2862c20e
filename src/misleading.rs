//! The characters of a sender's text that must not reach a reader as they are: controls
//! (C0, DEL, C1: line breaks, terminal escapes), line and paragraph separators, bidi
//! marks, overrides and isolates, and the invisible characters (zero-width spaces and
//! joiners, the byte-order mark, tags, soft hyphens, variation selectors, Hangul and
//! Braille blanks) that make two different strings look alike. Keys refuse them; the CLI and the console show them replaced; the text log
//! escapes them (`log_text`).

/// Whether `c` changes or hides what a terminal, a log viewer or a listing shows.
pub fn is_misleading(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{2800}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
                | '\u{E0100}'..='\u{E01EF}'
        )
}

/// `text` with each misleading character shown as U+FFFD.
pub fn replaced(text: &str) -> String {
    text.chars()
        .map(|c| if is_misleading(c) { '\u{FFFD}' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_misleads_and_what_does_not() {
        for c in [
            '\n',
            '\u{1b}',
            '\u{7f}',
            '\u{85}',
            '\u{9b}',
            '\u{61c}',
            '\u{200b}',
            '\u{ad}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{2800}',
            '\u{e0100}',
            '\u{200e}',
            '\u{200f}',
            '\u{2028}',
            '\u{202e}',
            '\u{2066}',
            '\u{2069}',
            '\u{feff}',
            '\u{e0041}',
        ] {
            assert!(is_misleading(c), "{c:?}");
        }
        for c in ['a', ' ', '=', '"', '\\', 'é', '日', '\u{ff0f}', '\u{301}'] {
            assert!(!is_misleading(c), "{c:?}");
        }
        assert_eq!(replaced("a\u{202e}b\u{1b}[0m"), "a\u{fffd}b\u{fffd}[0m");
    }

    /// The console's script keeps its own copy of the set (`MISLEADING` in `app.js`): the
    /// two agree on every code point.
    #[test]
    fn the_consoles_set_is_this_one() {
        let script = include_str!("admin/console/app.js");
        let class = script
            .split("const MISLEADING = /[")
            .nth(1)
            .and_then(|rest| rest.split("]/gu;").next())
            .expect("app.js defines MISLEADING as one character class");
        let mut ranges = Vec::new();
        let mut rest = class;
        fn code_point(rest: &mut &str) -> u32 {
            let text = rest.strip_prefix("\\u").expect("\\u escapes only");
            let (digits, after) = match text.strip_prefix('{') {
                Some(braced) => braced.split_once('}').unwrap(),
                None => text.split_at(4),
            };
            *rest = after;
            u32::from_str_radix(digits, 16).unwrap()
        }
        while !rest.is_empty() {
            let start = code_point(&mut rest);
            let end = match rest.strip_prefix('-') {
                Some(after) => {
                    rest = after;
                    code_point(&mut rest)
                }
                None => start,
            };
            ranges.push(start..=end);
        }
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let in_script = ranges.iter().any(|range| range.contains(&(c as u32)));
            assert_eq!(in_script, is_misleading(c), "U+{:04X}", c as u32);
        }
    }
}
