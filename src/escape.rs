//! Text from outside (override reasons, observed values, error messages
//! quoting a file, names read from the state) made safe to print on a
//! terminal. A reason with a newline could forge a line of a plan; one with
//! an ANSI escape could recolour, hide or rewrite what an operator reads.

use std::borrow::Cow;

/// `s` with every control character (C0, DEL, C1) and every Unicode
/// bidirectional override written as a Rust-style escape (`\n`,
/// `\u{1b}`, `\u{202e}`): visible, and never acted on by the terminal.
/// Text with none comes back borrowed.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_escaped_and_the_rest_kept() {
        assert!(matches!(terminal("plain: ünïcode ok"), Cow::Borrowed(_)));
        assert_eq!(
            terminal("a\nb\x1b[31mred\x07\u{9b}\u{202e}x\t"),
            "a\\nb\\u{1b}[31mred\\u{7}\\u{9b}\\u{202e}x\\t"
        );
    }
}
