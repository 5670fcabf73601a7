//! Low-level YAML handling on top of `serde_norway`: splitting a file into
//! documents, a guarded first pass against hostile input, and finding the
//! line and column of a node by its path.
//!
//! `serde_norway` reports positions only inside errors, so [`locate`] walks to
//! a node and raises a marker error there: the error's mark is the node's
//! position. Its multi-document iterator also repeats a syntax error forever
//! instead of moving on, so documents are split here (a line starting with
//! `---` or `...` always ends a document in YAML 1.2, even inside scalars)
//! and each is parsed on its own.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Nesting deeper than this is refused (no declaration comes close).
pub(crate) const MAX_DEPTH: usize = 64;

/// A document with more `[` and `{` than this is refused before it is
/// parsed. libyaml's time grows with the square of flow nesting (40,000
/// levels take 2 s, 100,000 more than 30 s, and a 1 MiB file holds
/// 500,000), and [`MAX_DEPTH`] is checked only on what it has parsed.
/// Counting every `[` and `{`, in scalars and comments too, cannot be
/// fooled by quoting: each level of nesting needs one. A declaration has
/// a few dozen.
pub(crate) const MAX_FLOW_OPENERS: usize = 10_000;

/// The byte offset in `text` of the first `[` or `{` beyond
/// [`MAX_FLOW_OPENERS`], if there is one.
pub(crate) fn too_many_flow_openers(text: &str) -> Option<usize> {
    text.bytes()
        .enumerate()
        .filter(|(_, b)| matches!(b, b'[' | b'{'))
        .nth(MAX_FLOW_OPENERS)
        .map(|(at, _)| at)
}

const NESTING_MESSAGE: &str = "nesting is deeper than";
const EXPANSION_MESSAGE: &str = "the document expands to far more nodes";
/// The start of the guard's messages, to find them behind serde's path prefix.
pub(crate) const GUARD_MESSAGES: &[&str] = &[NESTING_MESSAGE, EXPANSION_MESSAGE];

/// One YAML document of a file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Document<'a> {
    pub text: &'a str,
    /// Lines of the file before this document (add to a 1-based line).
    pub line_offset: usize,
}

/// Splits `text` at document markers. Directive and comment lines before a
/// `---` stay with the document they introduce.
pub(crate) fn split_documents(text: &str) -> Vec<Document<'_>> {
    let mut documents = Vec::new();
    let mut start = 0;
    let mut start_line = 0;
    let mut has_content = false;
    let mut offset = 0;
    for (line_no, line) in text.split_inclusive('\n').enumerate() {
        let is_marker = |marker: &str| {
            line.strip_prefix(marker)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
        };
        if is_marker("---") {
            if has_content {
                documents.push(Document {
                    text: &text[start..offset],
                    line_offset: start_line,
                });
                start = offset;
                start_line = line_no;
            }
            has_content = true;
        } else if is_marker("...") {
            documents.push(Document {
                text: &text[start..offset + line.len()],
                line_offset: start_line,
            });
            start = offset + line.len();
            start_line = line_no + 1;
            has_content = false;
        } else {
            let trimmed = line.trim_start();
            if !(trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with('%')) {
                has_content = true;
            }
        }
        offset += line.len();
    }
    if has_content {
        documents.push(Document {
            text: &text[start..],
            line_offset: start_line,
        });
    }
    documents
}

/// The top-level shape of a document, with `apiVersion` and `kind` when it
/// is a mapping that has them as scalars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    Null,
    Scalar(Option<String>),
    List,
    Mapping {
        api_version: Option<String>,
        kind: Option<String>,
    },
}

/// Walks a whole document once, counting nodes (aliases are walked as often
/// as they are referenced, so an alias bomb runs into the node budget) and
/// refusing nesting deeper than [`MAX_DEPTH`].
pub(crate) fn guarded_shape(text: &str) -> Result<Shape, serde_norway::Error> {
    // A node takes at least two bytes of text unless an alias repeats it, so
    // more nodes than bytes means expansion.
    let budget = Cell::new(text.len() + 1024);
    let guard = Guard {
        depth: 0,
        budget: &budget,
    };
    guard.deserialize(serde_norway::Deserializer::from_str(text))
}

struct Guard<'a> {
    depth: usize,
    budget: &'a Cell<usize>,
}

impl Guard<'_> {
    fn child(&self) -> Self {
        Guard {
            depth: self.depth + 1,
            budget: self.budget,
        }
    }

    fn count<E: de::Error>(&self) -> Result<(), E> {
        match self.budget.get().checked_sub(1) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(E::custom(format!(
                "{EXPANSION_MESSAGE} than its size (YAML alias bomb?): remove the anchors and aliases"
            ))),
        }
    }

    fn enter<E: de::Error>(&self) -> Result<(), E> {
        self.count()?;
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format!(
                "{NESTING_MESSAGE} {MAX_DEPTH} levels: a declaration never needs this, flatten the document"
            )));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Guard<'_> {
    type Value = Shape;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Guard<'_> {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(None))
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(None))
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(None))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Scalar(Some(v.to_owned())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Shape, E> {
        self.count()?;
        Ok(Shape::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Shape, E> {
        self.visit_unit()
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Shape, A::Error> {
        // A tagged value (`!Tag value`): walk the value like any other node.
        self.enter()?;
        let (_, variant) = data.variant_seed(self.child())?;
        de::VariantAccess::newtype_variant_seed(variant, self.child())?;
        Ok(Shape::Scalar(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        self.enter()?;
        while seq.next_element_seed(self.child())?.is_some() {}
        Ok(Shape::List)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        self.enter()?;
        let (mut api_version, mut kind) = (None, None);
        // A key written twice: serde refuses it for a struct's fields, but
        // a map (annotations, labels, parameters) would silently keep the
        // last value, and a `tend.dev/paused: "true"` above a `"false"`
        // would be no pause at all.
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key_seed(self.child())? {
            if let Shape::Scalar(Some(key)) = &key
                && !keys.insert(key.clone())
            {
                return Err(de::Error::custom(format!("duplicate field `{key}`")));
            }
            let value = map.next_value_seed(self.child())?;
            if self.depth == 0
                && let (Shape::Scalar(Some(key)), Shape::Scalar(Some(value))) = (key, value)
            {
                match key.as_str() {
                    "apiVersion" => api_version = Some(value),
                    "kind" => kind = Some(value),
                    _ => {}
                }
            }
        }
        Ok(Shape::Mapping { api_version, kind })
    }
}

const FOUND: &str = "\u{1}tend-locate-found";

/// The 1-based (line, column) of the node at `path` in a single document, or
/// `None` when there is no such node. An empty path is the document's root.
/// With `at_key`, the position of the last path element's key rather than of
/// its value (for problems with the key itself: an unknown annotation).
pub(crate) fn locate(text: &str, path: &[String], at_key: bool) -> Option<(usize, usize)> {
    match (Locate { path, at_key }).deserialize(serde_norway::Deserializer::from_str(text)) {
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| (l.line(), l.column())),
        _ => None,
    }
}

struct Locate<'p> {
    path: &'p [String],
    at_key: bool,
}

/// Raises the marker error when the key it reads is the wanted one.
struct KeyMatch<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for KeyMatch<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyMatch<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        if v == self.0 {
            Err(E::custom(FOUND))
        } else {
            Ok(true)
        }
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(true)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(true)
    }
}

impl<'de> DeserializeSeed<'de> for Locate<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Locate<'_> {
    fn scalar<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

/// A mapping key as text, when it is a scalar.
struct KeyText(Option<String>);

impl<'de> de::Deserialize<'de> for KeyText {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let shape = Guard {
            depth: 0,
            budget: &Cell::new(usize::MAX),
        }
        .deserialize(d)?;
        Ok(KeyText(match shape {
            Shape::Scalar(text) => text,
            _ => None,
        }))
    }
}

impl<'de> Visitor<'de> for Locate<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.scalar()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(FOUND));
        };
        let Ok(wanted) = first.parse::<usize>() else {
            return Ok(());
        };
        let mut index = 0;
        loop {
            if index == wanted {
                let at_key = self.at_key;
                return seq
                    .next_element_seed(Locate { path: rest, at_key })
                    .map(|_| ());
            }
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(FOUND));
        };
        if rest.is_empty() && self.at_key {
            while map.next_key_seed(KeyMatch(first))?.is_some() {
                map.next_value::<IgnoredAny>()?;
            }
            return Ok(());
        }
        while let Some(KeyText(key)) = map.next_key::<KeyText>()? {
            if key.as_deref() == Some(first.as_str()) {
                let at_key = self.at_key;
                return map.next_value_seed(Locate { path: rest, at_key });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn split_keeps_directives_with_their_document() {
        let text = "%YAML 1.2\n---\na: 1\n---\nb: 2\n...\n# tail\n";
        let docs = split_documents(text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].text, "%YAML 1.2\n---\na: 1\n");
        assert_eq!(docs[0].line_offset, 0);
        assert_eq!(docs[1].text, "---\nb: 2\n...\n");
        assert_eq!(docs[1].line_offset, 3);
    }

    #[test]
    fn split_ignores_markers_that_are_not_alone() {
        let docs = split_documents("a: ---x\nb: |\n  ---\n");
        assert_eq!(docs.len(), 1);
        assert!(split_documents("# only a comment\n\n").is_empty());
    }

    #[test]
    fn locate_finds_values_and_list_items() {
        let text = "metadata:\n  name: x\nspec:\n  extensions:\n    - a\n    - name: b\n";
        assert_eq!(
            locate(text, &path(&["metadata", "name"]), false),
            Some((2, 9))
        );
        assert_eq!(
            locate(text, &path(&["metadata", "name"]), true),
            Some((2, 3))
        );
        assert_eq!(
            locate(text, &path(&["spec", "extensions", "1"]), false),
            Some((6, 7))
        );
        assert_eq!(locate(text, &path(&[]), false), Some((1, 1)));
        assert_eq!(locate(text, &path(&["spec", "missing"]), false), None);
        assert_eq!(locate(text, &path(&["spec", "missing"]), true), None);
    }

    #[test]
    fn guard_refuses_deep_nesting_and_alias_bombs() {
        let deep = format!("{}1{}", "[".repeat(80), "]".repeat(80));
        let err = guarded_shape(&deep).unwrap_err();
        assert!(err.to_string().contains("deeper than 64"), "{err}");
        let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x]\n");
        for (name, prev) in [
            ("b", "a"),
            ("c", "b"),
            ("d", "c"),
            ("e", "d"),
            ("f", "e"),
            ("g", "f"),
        ] {
            bomb.push_str(&format!(
                "{name}: &{name} [{}]\n",
                vec![format!("*{prev}"); 9].join(",")
            ));
        }
        let err = guarded_shape(&bomb).unwrap_err();
        assert!(err.to_string().contains("alias bomb"), "{err}");
    }
}
