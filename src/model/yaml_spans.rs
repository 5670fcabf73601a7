//! YAML nodes with their byte spans in the file, for edits that leave
//! every other byte as it was (`tend propose`).
//!
//! `serde_norway` gives values, not where they are written; its parser,
//! libyaml (`unsafe-libyaml-norway`, the crate it is built on), reports
//! the start and end of every event. This module wraps that parser's
//! event stream in a safe function and builds a tree from it. It is used
//! only on text the declaration parser already accepted.

use std::mem::MaybeUninit;

use unsafe_libyaml_norway as unsafe_sys;

/// How a scalar is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalarStyle {
    Plain,
    SingleQuoted,
    DoubleQuoted,
    /// `|` or `>` block scalars.
    Block,
}

/// A node and the bytes `start..end` of the document text it is written
/// in (for a scalar: from its first character, quote included, to just
/// after its last).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub kind: NodeKind,
    pub start: usize,
    pub end: usize,
    /// The anchor written on the node (`&name`), which aliases elsewhere
    /// in the document may refer to: its span starts at the anchor.
    pub anchor: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeKind {
    Scalar {
        value: String,
        style: ScalarStyle,
    },
    /// Key and value nodes in order; `flow`: written `{…}`.
    Mapping {
        flow: bool,
        entries: Vec<(Node, Node)>,
    },
    /// `flow`: written `[…]`.
    Sequence {
        flow: bool,
        items: Vec<Node>,
    },
    /// `*name`: the node anchored `&name` before it.
    Alias {
        name: String,
    },
}

impl Node {
    /// The value of the scalar key `key` of a mapping node.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|(_, v)| v)
    }

    /// The key and value nodes of `key` in a mapping node.
    pub(crate) fn entry(&self, key: &str) -> Option<(&Node, &Node)> {
        match &self.kind {
            NodeKind::Mapping { entries, .. } => entries
                .iter()
                .find(|(k, _)| k.scalar() == Some(key))
                .map(|(k, v)| (k, v)),
            _ => None,
        }
    }

    /// A scalar node's value.
    pub(crate) fn scalar(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { value, .. } => Some(value),
            _ => None,
        }
    }

    /// Every node at or below this one that is anchored or an alias, as
    /// it is written (`&name` or `*name`) with its span.
    pub(crate) fn anchors_and_aliases(&self) -> Vec<(String, usize, usize)> {
        let mut out = Vec::new();
        let mut todo = vec![self];
        while let Some(n) = todo.pop() {
            if let Some(a) = &n.anchor {
                out.push((format!("&{a}"), n.start, n.end));
            }
            match &n.kind {
                NodeKind::Alias { name } => out.push((format!("*{name}"), n.start, n.end)),
                NodeKind::Mapping { entries, .. } => {
                    todo.extend(entries.iter().flat_map(|(k, v)| [k, v]))
                }
                NodeKind::Sequence { items, .. } => todo.extend(items),
                NodeKind::Scalar { .. } => {}
            }
        }
        out.sort_by_key(|(_, start, _)| *start);
        out
    }
}

/// The YAML text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the YAML cannot be parsed for editing")]
pub(crate) struct SpanError;

/// One event, converted from libyaml's.
enum Event {
    DocumentStart,
    DocumentEnd,
    Scalar(String, ScalarStyle, Option<String>),
    MappingStart(bool, Option<String>),
    MappingEnd,
    SequenceStart(bool, Option<String>),
    SequenceEnd,
    Alias(String),
    StreamEnd,
    Other,
}

/// Every event of `text` with its byte span.
fn events(text: &str) -> Result<Vec<(Event, usize, usize)>, SpanError> {
    let mut out = Vec::new();
    // The parser keeps pointers to its own buffers and to `text`: it stays
    // on the heap, unmoved, until deleted below.
    let mut parser: Box<MaybeUninit<unsafe_sys::yaml_parser_t>> = Box::new(MaybeUninit::uninit());
    let p = parser.as_mut_ptr();
    // SAFETY: `p` points to writable memory for a parser, initialised by
    // `yaml_parser_initialize` before any other use; `text` outlives the
    // parser (deleted before this function returns); every event is
    // deleted after it is converted, and the parser once, at the end.
    unsafe {
        if unsafe_sys::yaml_parser_initialize(p).fail {
            return Err(SpanError);
        }
        unsafe_sys::yaml_parser_set_encoding(p, unsafe_sys::YAML_UTF8_ENCODING);
        unsafe_sys::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        let result = loop {
            let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
            if unsafe_sys::yaml_parser_parse(p, event.as_mut_ptr()).fail {
                break Err(SpanError);
            }
            let event = event.as_mut_ptr();
            let converted = convert(&*event);
            let (start, end) = (
                (*event).start_mark.index as usize,
                (*event).end_mark.index as usize,
            );
            unsafe_sys::yaml_event_delete(event);
            let done = matches!(converted, Event::StreamEnd);
            out.push((converted, start, end));
            if done {
                break Ok(());
            }
        };
        unsafe_sys::yaml_parser_delete(p);
        result?;
    }
    Ok(out)
}

/// SAFETY: `e` is an event libyaml produced and has not deleted yet.
unsafe fn convert(e: &unsafe_sys::yaml_event_t) -> Event {
    match e.type_ {
        unsafe_sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
        unsafe_sys::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
        unsafe_sys::YAML_STREAM_END_EVENT => Event::StreamEnd,
        // SAFETY: an alias event's data is the alias variant.
        unsafe_sys::YAML_ALIAS_EVENT => {
            Event::Alias(unsafe { anchor(e.data.alias.anchor) }.unwrap_or_default())
        }
        unsafe_sys::YAML_SCALAR_EVENT => {
            // SAFETY: a scalar event's data is the scalar variant, whose
            // value points to `length` bytes owned by the event.
            let (bytes, style, name) = unsafe {
                let s = e.data.scalar;
                (
                    std::slice::from_raw_parts(s.value, s.length as usize),
                    s.style,
                    anchor(s.anchor),
                )
            };
            let style = match style {
                unsafe_sys::YAML_SINGLE_QUOTED_SCALAR_STYLE => ScalarStyle::SingleQuoted,
                unsafe_sys::YAML_DOUBLE_QUOTED_SCALAR_STYLE => ScalarStyle::DoubleQuoted,
                unsafe_sys::YAML_LITERAL_SCALAR_STYLE | unsafe_sys::YAML_FOLDED_SCALAR_STYLE => {
                    ScalarStyle::Block
                }
                _ => ScalarStyle::Plain,
            };
            Event::Scalar(String::from_utf8_lossy(bytes).into_owned(), style, name)
        }
        unsafe_sys::YAML_MAPPING_START_EVENT => {
            // SAFETY: the mapping-start variant of a mapping-start event.
            let (style, name) = unsafe {
                (
                    e.data.mapping_start.style,
                    anchor(e.data.mapping_start.anchor),
                )
            };
            Event::MappingStart(style == unsafe_sys::YAML_FLOW_MAPPING_STYLE, name)
        }
        unsafe_sys::YAML_MAPPING_END_EVENT => Event::MappingEnd,
        unsafe_sys::YAML_SEQUENCE_START_EVENT => {
            // SAFETY: the sequence-start variant of a sequence-start event.
            let (style, name) = unsafe {
                (
                    e.data.sequence_start.style,
                    anchor(e.data.sequence_start.anchor),
                )
            };
            Event::SequenceStart(style == unsafe_sys::YAML_FLOW_SEQUENCE_STYLE, name)
        }
        unsafe_sys::YAML_SEQUENCE_END_EVENT => Event::SequenceEnd,
        _ => Event::Other,
    }
}

/// An anchor name libyaml holds as a NUL-terminated string (or null).
///
/// SAFETY: `p` is null or points to a NUL-terminated string owned by an
/// event that has not been deleted.
unsafe fn anchor(p: *const u8) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: as the caller promises, a NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(p.cast()) };
    Some(name.to_string_lossy().into_owned())
}

/// The root node of every document in `text` (byte offsets into `text`).
pub(crate) fn documents(text: &str) -> Result<Vec<Node>, SpanError> {
    let events = events(text)?;
    let mut documents = Vec::new();
    // Open collections: their node and, for a mapping, a key waiting for
    // its value.
    let mut stack: Vec<(Node, Option<Node>)> = Vec::new();
    let mut finished: Option<Node> = None;
    let push = |stack: &mut Vec<(Node, Option<Node>)>,
                finished: &mut Option<Node>,
                node: Node|
     -> Result<(), SpanError> {
        let Some((parent, pending_key)) = stack.last_mut() else {
            *finished = Some(node);
            return Ok(());
        };
        match &mut parent.kind {
            NodeKind::Sequence { items, .. } => items.push(node),
            NodeKind::Mapping { entries, .. } => match pending_key.take() {
                Some(key) => entries.push((key, node)),
                None => *pending_key = Some(node),
            },
            _ => return Err(SpanError),
        }
        Ok(())
    };
    for (event, start, end) in events {
        match event {
            Event::DocumentStart => finished = None,
            Event::DocumentEnd => {
                if let Some(root) = finished.take() {
                    documents.push(root);
                }
            }
            Event::Scalar(value, style, anchor) => push(
                &mut stack,
                &mut finished,
                Node {
                    kind: NodeKind::Scalar { value, style },
                    start,
                    end,
                    anchor,
                },
            )?,
            Event::Alias(name) => push(
                &mut stack,
                &mut finished,
                Node {
                    kind: NodeKind::Alias { name },
                    start,
                    end,
                    anchor: None,
                },
            )?,
            Event::MappingStart(flow, anchor) => stack.push((
                Node {
                    kind: NodeKind::Mapping {
                        flow,
                        entries: Vec::new(),
                    },
                    start,
                    end,
                    anchor,
                },
                None,
            )),
            Event::SequenceStart(flow, anchor) => stack.push((
                Node {
                    kind: NodeKind::Sequence {
                        flow,
                        items: Vec::new(),
                    },
                    start,
                    end,
                    anchor,
                },
                None,
            )),
            Event::MappingEnd | Event::SequenceEnd => {
                let (mut node, _) = stack.pop().ok_or(SpanError)?;
                node.end = end;
                push(&mut stack, &mut finished, node)?;
            }
            Event::StreamEnd | Event::Other => {}
        }
    }
    Ok(documents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_the_written_scalar_quotes_included() {
        let text = "a: 1 # one\nb: 'two'\nc: {d: \"x y\", e: [1, 2]}\n---\nf: plain text\n";
        let docs = documents(text).unwrap();
        assert_eq!(docs.len(), 2);
        let span = |n: &Node| &text[n.start..n.end];
        assert_eq!(span(docs[0].get("a").unwrap()), "1");
        assert_eq!(span(docs[0].get("b").unwrap()), "'two'");
        let c = docs[0].get("c").unwrap();
        assert_eq!(span(c), "{d: \"x y\", e: [1, 2]}");
        assert_eq!(span(c.get("d").unwrap()), "\"x y\"");
        assert!(matches!(c.kind, NodeKind::Mapping { flow: true, .. }));
        assert_eq!(span(docs[1].get("f").unwrap()), "plain text");
        assert_eq!(docs[0].get("b").unwrap().scalar(), Some("two"));
    }

    #[test]
    fn anchors_and_aliases_are_found_with_the_anchor_inside_the_span() {
        let text = "spec:\n  comment: &v \"true\"\n  owner: &v \"false\"\nmeta: {paused: *v}\n";
        let docs = documents(text).unwrap();
        let found = docs[0].anchors_and_aliases();
        let shown: Vec<(&str, &str)> = found
            .iter()
            .map(|(n, s, e)| (n.as_str(), &text[*s..*e]))
            .collect();
        assert_eq!(
            shown,
            [("&v", "&v \"true\""), ("&v", "&v \"false\""), ("*v", "*v")]
        );
    }
}
