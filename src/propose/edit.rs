//! Edits of a YAML file that change only the nodes they name: a scalar's
//! value (in the quoting style it was written in), a key added to a
//! mapping (with the mapping's own indentation or flow style), a key
//! removed. Every other byte stays as it was.

use serde_json::Value;

use crate::model::yaml_spans::{Node, NodeKind, ScalarStyle};

/// Bytes `start..end` of the file replaced by `text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Splice {
    pub start: usize,
    pub end: usize,
    pub text: String,
}

/// Applies `splices` (they must not overlap) to `text`.
pub(crate) fn apply(text: &str, mut splices: Vec<Splice>) -> String {
    splices.sort_by_key(|s| std::cmp::Reverse(s.start));
    let mut out = text.to_string();
    for s in splices {
        out.replace_range(s.start..s.end, &s.text);
    }
    out
}

/// `value` written as a YAML scalar in `style` where that keeps it the
/// same value; otherwise single-quoted (a string) or plain (a number, a
/// boolean).
pub(crate) fn scalar(value: &Value, style: ScalarStyle) -> String {
    match value {
        Value::String(s) => match style {
            ScalarStyle::DoubleQuoted | ScalarStyle::Block => double_quoted(s),
            ScalarStyle::SingleQuoted => single_quoted(s),
            ScalarStyle::Plain if reads_back_as(s, value) => s.clone(),
            ScalarStyle::Plain if !s.contains('\n') => single_quoted(s),
            ScalarStyle::Plain => double_quoted(s),
        },
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// The string `s` as a YAML scalar: plain where it reads back as the same
/// string, double-quoted otherwise (`"16"`, `"true"`, `"Café Orders"`
/// stays plain, `"a: b"` does not).
pub(crate) fn string_scalar(s: &str) -> String {
    let value = Value::String(s.to_string());
    if reads_back_as(s, &value) {
        s.to_string()
    } else {
        double_quoted(s)
    }
}

fn single_quoted(s: &str) -> String {
    if s.contains('\n') {
        return double_quoted(s);
    }
    format!("'{}'", s.replace('\'', "''"))
}

/// A JSON string is a YAML double-quoted scalar.
fn double_quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Whether `text`, written plain, reads back as `value` (not as a number,
/// a boolean, null, or broken YAML).
fn reads_back_as(text: &str, value: &Value) -> bool {
    if text.is_empty() || text.trim() != text || text.contains(['\n', '#', '\t']) {
        return false;
    }
    serde_norway::from_str::<Value>(&format!("k: {text}\n"))
        .ok()
        .and_then(|v| v.get("k").cloned())
        .as_ref()
        == Some(value)
}

/// Replaces the scalar `node` of `text` with `value`.
///
/// A block scalar's span runs to the start of the line after it, its
/// line breaks included: they stay, so what follows (a comment, a blank
/// line, the next key) keeps its own line.
pub(crate) fn set_scalar(text: &str, node: &Node, value: &Value) -> Option<Splice> {
    let NodeKind::Scalar { style, .. } = &node.kind else {
        return None;
    };
    let written = text.get(node.start..node.end)?;
    let breaks = if *style == ScalarStyle::Block {
        let kept = written.trim_end_matches(['\n', '\r']);
        &written[kept.len()..]
    } else {
        ""
    };
    Some(Splice {
        start: node.start,
        end: node.end,
        text: format!("{}{breaks}", scalar(value, *style)),
    })
}

/// The start of the line holding byte `at`.
fn line_start(text: &str, at: usize) -> usize {
    text[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// Just after the line holding byte `at` (its newline included).
fn line_end(text: &str, at: usize) -> usize {
    text[at..].find('\n').map_or(text.len(), |i| at + i + 1)
}

/// The column of byte `at` on its line.
fn column(text: &str, at: usize) -> usize {
    at - line_start(text, at)
}

/// Where the text of `node` ends: a block collection's end mark is the
/// next token after it (past blank lines and comments), so its last
/// scalar's end is taken instead; a flow collection ends at its bracket.
fn written_end(node: &Node) -> usize {
    match &node.kind {
        NodeKind::Mapping {
            flow: false,
            entries,
        } => entries
            .last()
            .map_or(node.start, |(k, v)| written_end(v).max(k.end)),
        NodeKind::Sequence { flow: false, items } => items.last().map_or(node.start, written_end),
        _ => node.end,
    }
}

/// Just after the last line of a value (its newline included).
pub(crate) fn value_end(text: &str, value: &Node) -> usize {
    value_line_end(text, value)
}

fn value_line_end(text: &str, value: &Node) -> usize {
    let end = written_end(value);
    if end > 0 && text[..end].ends_with('\n') {
        // A block scalar ends after its line break.
        end
    } else {
        line_end(text, end.saturating_sub(1).max(value.start))
    }
}

/// Adds `key: value` to the mapping `map` (`value` already written as
/// YAML: a scalar, or for a block mapping a nested `name: value` text
/// given by `nested`). A block mapping gets a line at its end with its
/// entries' indentation; a flow mapping an entry before its `}`.
pub(crate) fn add_entry(text: &str, map: &Node, key: &str, value: &str) -> Option<Splice> {
    let NodeKind::Mapping { flow, entries } = &map.kind else {
        return None;
    };
    if *flow {
        let close = text[..map.end].rfind('}')?;
        let inner = text[map.start + 1..close].trim();
        let before = text[..close].trim_end().len();
        let sep = if inner.is_empty() { "" } else { ", " };
        return Some(Splice {
            start: before,
            end: before,
            text: format!("{sep}{key}: {value}"),
        });
    }
    let (last_key, last_value) = entries.last()?;
    let indent = column(text, last_key.start);
    let at = value_line_end(text, last_value);
    let eol = line_ending(text);
    let newline = if at > 0 && !text[..at].ends_with('\n') {
        eol
    } else {
        ""
    };
    Some(Splice {
        start: at,
        end: at,
        text: format!("{newline}{}{key}: {value}{eol}", " ".repeat(indent)),
    })
}

/// The line ending the file uses: CRLF when any line ends so (an added
/// line must not be the one LF line of a CRLF file), else LF.
fn line_ending(text: &str) -> &'static str {
    if text.contains("\r\n") { "\r\n" } else { "\n" }
}

/// Adds `key:` with one nested `child: value` to the block mapping `map`
/// (the child indented one step deeper, the step the file uses).
pub(crate) fn add_nested_entry(
    text: &str,
    map: &Node,
    key: &str,
    child: &str,
    value: &str,
    step: usize,
) -> Option<Splice> {
    let NodeKind::Mapping { flow, entries } = &map.kind else {
        return None;
    };
    if *flow {
        return add_entry(text, map, key, &format!("{{{child}: {value}}}"));
    }
    let indent = entries.first().map(|(k, _)| column(text, k.start))?;
    let eol = line_ending(text);
    let mut splice = add_entry(text, map, key, "")?;
    splice.text = splice
        .text
        .replacen(&format!("{key}: {eol}"), &format!("{key}:{eol}"), 1);
    splice.text.push_str(&format!(
        "{}{child}: {value}{eol}",
        " ".repeat(indent + step)
    ));
    Some(splice)
}

/// Removes the entry `key` from the mapping `map`: its lines in a block
/// mapping, the entry and one comma in a flow mapping.
pub(crate) fn remove_entry(text: &str, map: &Node, key: &str) -> Option<Splice> {
    let NodeKind::Mapping { flow, entries } = &map.kind else {
        return None;
    };
    let index = entries.iter().position(|(k, _)| k.scalar() == Some(key))?;
    let (k, v) = &entries[index];
    if *flow {
        let (start, end) = match (entries.get(index + 1), index.checked_sub(1)) {
            (Some((next, _)), _) => (k.start, next.start),
            (None, Some(prev)) => (entries[prev].1.end, v.end),
            (None, None) => (k.start, v.end),
        };
        return Some(Splice {
            start,
            end,
            text: String::new(),
        });
    }
    let start = line_start(text, k.start);
    let end = value_line_end(text, v);
    Some(Splice {
        start,
        end,
        text: String::new(),
    })
}

/// The indentation step of a block mapping nested in another: how much
/// deeper its keys are than the parent's (2 when it cannot be told).
pub(crate) fn indent_step(text: &str, parent_key: &Node, map: &Node) -> usize {
    match &map.kind {
        NodeKind::Mapping {
            flow: false,
            entries,
        } => entries
            .first()
            .map(|(k, _)| column(text, k.start).saturating_sub(column(text, parent_key.start)))
            .filter(|step| *step > 0)
            .unwrap_or(2),
        _ => 2,
    }
}

/// The flow mapping `map` written again with `changes` (`None` removes a
/// key): kept entries as they were written, changed values in their
/// style, new keys at the end. One splice for the whole mapping, so
/// removals and additions cannot disagree about commas.
pub(crate) fn rewrite_flow_mapping(
    text: &str,
    map: &Node,
    changes: &[(&str, Option<String>)],
) -> Option<Splice> {
    let NodeKind::Mapping {
        flow: true,
        entries,
    } = &map.kind
    else {
        return None;
    };
    let mut parts = Vec::new();
    for (k, v) in entries {
        let key = k.scalar()?;
        match changes.iter().find(|(c, _)| *c == key) {
            Some((_, None)) => {}
            Some((_, Some(value))) => parts.push(format!("{}: {value}", &text[k.start..k.end])),
            None => parts.push(text[k.start..v.end].to_string()),
        }
    }
    for (key, value) in changes {
        if let (Some(value), None) = (value, map.get(key)) {
            parts.push(format!("{key}: {value}"));
        }
    }
    Some(Splice {
        start: map.start,
        end: map.end,
        text: format!("{{{}}}", parts.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::yaml_spans::documents;
    use serde_json::json;

    #[test]
    fn a_scalar_keeps_its_quoting_where_it_can() {
        assert_eq!(scalar(&json!("64MB"), ScalarStyle::Plain), "64MB");
        assert_eq!(
            scalar(&json!("128MB"), ScalarStyle::SingleQuoted),
            "'128MB'"
        );
        assert_eq!(
            scalar(&json!("a\"b"), ScalarStyle::DoubleQuoted),
            "\"a\\\"b\""
        );
        // Plain would read back as something else: quoted.
        assert_eq!(scalar(&json!("500"), ScalarStyle::Plain), "'500'");
        assert_eq!(scalar(&json!("yes: no"), ScalarStyle::Plain), "'yes: no'");
        assert_eq!(scalar(&json!("true"), ScalarStyle::Plain), "'true'");
        assert_eq!(scalar(&json!(500), ScalarStyle::Plain), "500");
        assert_eq!(scalar(&json!(false), ScalarStyle::Plain), "false");
    }

    #[test]
    fn entries_are_added_and_removed_in_both_styles() {
        let text = "spec:\n  parameters:\n    a: 1 # keep\n  owner: x\nflow: {b: 2}\n";
        let docs = documents(text).unwrap();
        let params = docs[0].get("spec").unwrap().get("parameters").unwrap();
        let added = apply(text, vec![add_entry(text, params, "c", "3").unwrap()]);
        assert_eq!(
            added,
            "spec:\n  parameters:\n    a: 1 # keep\n    c: 3\n  owner: x\nflow: {b: 2}\n"
        );
        let flow = docs[0].get("flow").unwrap();
        let added = apply(text, vec![add_entry(text, flow, "c", "3").unwrap()]);
        assert!(added.ends_with("flow: {b: 2, c: 3}\n"), "{added}");
        let removed = apply(text, vec![remove_entry(text, params, "a").unwrap()]);
        assert_eq!(removed, "spec:\n  parameters:\n  owner: x\nflow: {b: 2}\n");
        let spec = docs[0].get("spec").unwrap();
        let nested = apply(
            text,
            vec![add_nested_entry(text, spec, "labels", "k", "v", 2).unwrap()],
        );
        assert!(
            nested.contains("  owner: x\n  labels:\n    k: v\nflow"),
            "{nested}"
        );
    }

    /// A comment after a `|+` block scalar stayed on its own line (it
    /// was joined onto the new value's).
    #[test]
    fn a_block_scalar_keeps_the_lines_after_it() {
        let value = json!("new");
        for (text, expected) in [
            (
                "spec:\n  comment: |+\n    hello\n\n  # about owner\n  owner: x\n",
                "spec:\n  comment: \"new\"\n\n  # about owner\n  owner: x\n",
            ),
            (
                "spec:\n  comment: |\n    hello\n  owner: x\n",
                "spec:\n  comment: \"new\"\n  owner: x\n",
            ),
            (
                "spec:\r\n  comment: >-\r\n    hello\r\n  # c\r\n  owner: x\r\n",
                "spec:\r\n  comment: \"new\"\r\n  # c\r\n  owner: x\r\n",
            ),
            (
                "spec:\n  comment: 'old' # c\n",
                "spec:\n  comment: 'new' # c\n",
            ),
        ] {
            let docs = documents(text).unwrap();
            let node = docs[0].get("spec").unwrap().get("comment").unwrap();
            let edited = apply(text, vec![set_scalar(text, node, &value).unwrap()]);
            assert_eq!(edited, expected);
        }
    }

    #[test]
    fn a_crlf_file_gets_crlf_lines() {
        let text = "spec:\r\n  parameters:\r\n    a: 1\r\n  owner: x\r\n";
        let docs = documents(text).unwrap();
        let spec = docs[0].get("spec").unwrap();
        let params = spec.get("parameters").unwrap();
        let added = apply(text, vec![add_entry(text, params, "c", "3").unwrap()]);
        assert_eq!(
            added,
            "spec:\r\n  parameters:\r\n    a: 1\r\n    c: 3\r\n  owner: x\r\n"
        );
        let nested = apply(
            text,
            vec![add_nested_entry(text, spec, "labels", "k", "v", 2).unwrap()],
        );
        assert!(
            nested.ends_with("  owner: x\r\n  labels:\r\n    k: v\r\n"),
            "{nested:?}"
        );
        assert!(!nested.replace("\r\n", "").contains('\n'), "{nested:?}");
    }
}
