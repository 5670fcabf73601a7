//! Text from outside (override reasons, observed values, error messages
//! quoting a file, names read from the state) made safe to print on a
//! terminal. A reason with a newline could forge a line of a plan; one with
//! an ANSI escape could recolour, hide or rewrite what an operator reads.

use std::borrow::Cow;

use serde_json::Value;

/// `s` with every control character (C0, DEL, C1) and every Unicode
/// bidirectional override written as a Rust-style escape (`\n`,
/// `\u{1b}`, `\u{202e}`): visible, and never acted on by the terminal.
/// Text with none comes back borrowed.
pub(crate) fn terminal(s: &str) -> Cow<'_, str> {
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

/// A field value as every human-facing output shows it: a list as its
/// items (`citext, postgis 3.4`; `(none)` when empty), a map as
/// `key=value` pairs, never as JSON.
///
/// Escaped for a terminal: observed values come from the provider.
pub fn value(v: &Value) -> String {
    terminal(&plain(v)).into_owned()
}

fn plain(v: &Value) -> String {
    match v {
        Value::Null => "(unset)".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "(none)".into(),
        Value::Array(items) => items.iter().map(item).collect::<Vec<_>>().join(", "),
        Value::Object(map) if map.is_empty() => "(none)".into(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", plain(v)))
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

/// One item of a list: an extension (`{name, version}`) as `name version`.
fn item(v: &Value) -> String {
    match v {
        Value::Object(map) if map.get("name").is_some_and(Value::is_string) => {
            let name = map.get("name").and_then(Value::as_str).unwrap_or_default();
            let rest: Vec<String> = map
                .iter()
                .filter(|(k, _)| k.as_str() != "name")
                .map(|(k, v)| match (k.as_str(), v) {
                    ("version", Value::String(s)) => s.clone(),
                    _ => format!("{k}={}", plain(v)),
                })
                .collect();
            if rest.is_empty() {
                name.to_string()
            } else {
                format!("{name} {}", rest.join(" "))
            }
        }
        Value::String(s) => s.clone(),
        other => plain(other),
    }
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

/// `s` as Markdown text (a table cell, a list item, a quote) that renders
/// as exactly these characters and nothing else: no HTML (`<img>`, a
/// `<!--` that hides the rest of a comment, `</details>`), no link or
/// image (`[`, `]`), no table cell break (`|`), no
/// `@mention` (a word joiner follows every `@`), no line break; control
/// characters are escaped as for a terminal. For a Markdown file or a pull
/// request comment, where the text comes from a declaration, a reason or
/// a provider. Backticks stay: tend's own reasons quote names in code
/// spans, and inside one nothing renders as HTML or a link.
pub(crate) fn markdown(s: &str) -> String {
    let one_line = s.replace(['\r', '\n'], " ");
    let visible = terminal(&one_line);
    let mut out = String::with_capacity(visible.len() + 8);
    for c in visible.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' => out.push_str("&#124;"),
            '[' => out.push_str("&#91;"),
            ']' => out.push_str("&#93;"),
            '\\' => out.push_str("&#92;"),
            '*' => out.push_str("&#42;"),
            '@' => out.push_str("@\u{2060}"),
            _ => out.push(c),
        }
    }
    out
}

/// `s` inside a Markdown code span (`` `…` ``) of a table: entities are
/// not decoded there, so only what would end the span or the cell is
/// changed (a backtick becomes `'`, `|` is escaped) and control characters
/// are escaped as for a terminal.
pub(crate) fn markdown_code(s: &str) -> String {
    terminal(&s.replace(['\r', '\n'], " "))
        .replace('`', "'")
        .replace('|', "\\|")
}

#[cfg(test)]
mod markdown_tests {
    use super::*;

    #[test]
    fn hostile_text_renders_as_text() {
        for (hostile, safe) in [
            ("a\n<!-- hidden", "a &lt;!-- hidden"),
            (
                "<img src=https://evil.example/x.png>",
                "&lt;img src=https://evil.example/x.png&gt;",
            ),
            ("ping @platform-team", "ping @\u{2060}platform-team"),
            (
                "![x](https://evil.example/p.png)",
                "!&#91;x&#93;(https://evil.example/p.png)",
            ),
            ("</details> | cell", "&lt;/details&gt; &#124; cell"),
            ("`code` & \\*", "`code` &amp; &#92;&#42;"),
        ] {
            assert_eq!(markdown(hostile), safe, "{hostile:?}");
        }
        assert_eq!(markdown_code("a`b|c\nd"), "a'b\\|c d");
    }
}
