//! Field values to compare: a declaration's spec flattened to field paths
//! (`parameters.<key>` per setting) over the fields a provider observes.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::observation::Capabilities;
use crate::model::{FlatMap, ManagedDatabase, NormalizedSpec};

/// The declared value of every field the provider observes and the
/// declaration sets. Absent fields are not managed and are not listed.
pub fn desired_fields(decl: &ManagedDatabase, caps: &Capabilities) -> BTreeMap<String, Value> {
    desired_fields_of(&NormalizedSpec::of(decl), caps).into()
}

/// [`desired_fields`] from an already normalised spec.
pub(crate) fn desired_fields_of(spec: &NormalizedSpec, caps: &Capabilities) -> FlatMap<Value> {
    let mut out = FlatMap::new();
    for (name, value) in spec.iter() {
        if !caps.fields.contains_key(name) {
            continue;
        }
        match (name, value) {
            ("parameters", Value::Object(map)) => {
                for (key, v) in map {
                    let path = format!("parameters.{key}");
                    let v = caps.comparable(&path, v.clone());
                    out.insert(path, v);
                }
            }
            (_, value) => {
                out.insert(name.to_string(), value.clone());
            }
        }
    }
    out
}

/// Whether the declaration manages the whole `parameters` map (then an
/// observed key it does not list is drift, and applying resets it).
pub(crate) fn manages_parameters(decl: &ManagedDatabase, caps: &Capabilities) -> bool {
    decl.spec.parameters.is_some() && caps.fields.contains_key("parameters")
}
