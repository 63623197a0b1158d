//! Other users' words made harmless for a terminal: control characters escaped in text and
//! in JSON lines. Everything the CLI prints goes through one of these (see
//! [`crate::output`]).

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with its control characters (C0, DEL and C1: Unicode's `Cc`) written as Rust
/// writes them in a string: `\t`, `\n`, `\r`, `\u{1b}`, `\u{7f}`, `\u{9b}`. A line of text
/// is one line on the terminal, and nothing in it is a terminal's command.
pub(crate) fn for_terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            escaped.extend(c.escape_debug());
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// A line of JSON with DEL and the C1 controls, which JSON leaves as they are, escaped
/// (`\u007f`, `\u009b`): the same strings to a parser, nothing a terminal acts on. JSON has
/// the C0 controls escaped already, and outside its strings only ASCII punctuation.
pub(crate) fn json_text(line: &str) -> Cow<'_, str> {
    if !line.chars().any(char::is_control) {
        return Cow::Borrowed(line);
    }
    let mut escaped = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        match c {
            '\n' => escaped.push(c),
            c if c.is_control() => {
                let _ = write!(escaped, "\\u{:04x}", u32::from(c));
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_reach_no_terminal() {
        let hostile = "a\u{1b}]52;c;cHdu\u{7}\u{1b}[2J\tb\nc\r\u{7f}\u{9b}31m é";
        assert_eq!(
            for_terminal(hostile),
            r"a\u{1b}]52;c;cHdu\u{7}\u{1b}[2J\tb\nc\r\u{7f}\u{9b}31m é"
        );
        assert!(matches!(for_terminal("plain é"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_lines_escape_what_json_leaves_raw_and_parse_the_same() {
        let hostile = "x\u{1b}]0;title\u{7}\u{7f}\u{9b}y";
        let line = serde_json::to_string(&serde_json::json!({ "comm": hostile })).unwrap();
        let escaped = json_text(&line);
        assert!(!escaped.chars().any(char::is_control), "{escaped}");
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back["comm"], hostile);
        assert_eq!(json_text("{}\n"), "{}\n");
    }
}
