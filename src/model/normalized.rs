//! A declaration's normalised spec as the decision core reads it, in a
//! compact form: one allocation of (field, value) pairs in name order.
//!
//! The planner compares field values from it for every resource in every
//! cycle, so it is computed once with the spec hash and kept with the
//! declaration. As a `serde_json::Value` it cost a map node sized for
//! eleven entries and one allocation per key: about 1.2 KB a declaration
//! (120 MB at 100,000) for the four or five fields a spec usually sets.

use std::borrow::Cow;

use serde_json::Value;

use super::fields::field_info;

/// The normalised spec's fields (defaults applied, absent optional fields
/// omitted), sorted by name: the same fields, values and order as the
/// canonical JSON object the spec hash is computed from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NormalizedSpec(Box<[(Cow<'static, str>, Value)]>);

impl NormalizedSpec {
    /// From the normalised spec as a JSON object (anything else is an
    /// empty spec). Field names in the field table share its static names.
    pub(crate) fn from_value(value: Value) -> Self {
        let Value::Object(map) = value else {
            return Self::default();
        };
        NormalizedSpec(
            map.into_iter()
                .map(|(name, value)| {
                    let name = match field_info(&name) {
                        Some(info) => Cow::Borrowed(info.name),
                        None => Cow::Owned(name),
                    };
                    (name, value)
                })
                .collect(),
        )
    }

    /// The normalised spec of `decl`.
    pub(crate) fn of(decl: &super::ManagedDatabase) -> Self {
        Self::from_value(super::hash::normalized_spec_value(decl))
    }

    /// The value of field `name`, if the spec has it.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0
            .binary_search_by(|(field, _)| field.as_ref().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Whether the spec has field `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every field and its value, in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.0.iter().map(|(name, value)| (name.as_ref(), value))
    }

    /// The spec as a JSON object (for a report or a comparison that edits
    /// it).
    pub fn to_value(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(name, value)| (name.to_string(), value.clone()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compact_spec_reads_as_the_object_it_came_from() {
        let object = serde_json::json!({
            "provider": "p1",
            "databaseName": "a_b",
            "connectionLimit": 5,
            "parameters": {"work_mem": "4MB"},
            "deletionPolicy": "Retain",
            "notAField": true,
        });
        let spec = NormalizedSpec::from_value(object.clone());
        assert_eq!(spec.to_value(), object);
        let names: Vec<&str> = spec.iter().map(|(name, _)| name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "name order, as the canonical JSON");
        for (name, value) in object.as_object().unwrap() {
            assert_eq!(spec.get(name), Some(value), "{name}");
            assert!(spec.contains_key(name));
        }
        assert_eq!(spec.get("owner"), None);
        assert_eq!(spec.get(""), None);
        assert_eq!(NormalizedSpec::from_value(Value::Null).iter().len(), 0);
    }
}
