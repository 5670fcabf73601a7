//! One imported database as a declaration file: the fields the provider
//! observes, each checked by the declaration's own validator before it
//! is written, in the layout and key order of `examples/databases/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::model::declaration::{API_VERSION, KIND, ManagedDatabase};
use crate::model::fields::{FIELDS, Mutability};
use crate::model::validate::validate;
use crate::propose::edit::string_scalar;
use crate::provider::{Capabilities, Observation};

/// A field the declaration does not carry, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeftOut {
    /// The field path (`extensions`, `parameters`, `extensions.name`).
    pub field: String,
    pub why: String,
}

/// What the file says beyond the observation.
pub(crate) struct Heading<'a> {
    /// `$schema` of the modeline.
    pub schema_ref: &'a str,
    pub provider: &'a str,
    pub provider_kind: &'a str,
    /// Write `spec.provider` (more than one provider is configured).
    pub spell_provider: bool,
}

/// Observed values equal to these are the server's defaults: left out
/// unless every field is asked for.
pub(crate) type Defaults = BTreeMap<String, Value>;

/// The spec fields `obs` gives a declaration (in the field table's order)
/// and the fields left out with why. `all_fields`: defaults and the
/// extensions' versions and schemas too.
pub(crate) fn spec_fields(
    obs: &Observation,
    capabilities: &Capabilities,
    defaults: &Defaults,
    all_fields: bool,
) -> (Vec<(&'static str, Value)>, Vec<LeftOut>) {
    let mut fields = Vec::new();
    let mut left_out = Vec::new();
    for info in FIELDS {
        let name = info.name;
        if matches!(name, "provider" | "databaseName")
            || matches!(
                info.mutability,
                Mutability::Behaviour | Mutability::CreateOnly
            )
            || !capabilities.fields.contains_key(name)
        {
            continue;
        }
        if obs.unobserved.iter().any(|u| u == name) {
            left_out.push(LeftOut {
                field: name.to_string(),
                why: "the provider could not observe it (a database that refuses connections shows no extensions); declare it by hand once it can be read".into(),
            });
            continue;
        }
        let value = match name {
            "parameters" => match parameters(obs) {
                Ok(Some(map)) => map,
                Ok(None) => continue,
                Err(why) => {
                    left_out.push(LeftOut {
                        field: name.to_string(),
                        why,
                    });
                    continue;
                }
            },
            "extensions" => match obs.fields.get(name) {
                Some(Value::Array(list)) => {
                    let (kept, dropped) = extensions(list, all_fields);
                    left_out.extend(dropped);
                    if kept.is_empty() {
                        continue;
                    }
                    Value::Array(kept)
                }
                Some(Value::Null) | None => continue,
                Some(other) => {
                    left_out.push(LeftOut {
                        field: name.to_string(),
                        why: format!("the provider shows {other}, not a list of extensions"),
                    });
                    continue;
                }
            },
            _ => match obs.fields.get(name) {
                None | Some(Value::Null) => continue,
                Some(value) => value.clone(),
            },
        };
        if !all_fields && defaults.get(name) == Some(&value) {
            continue;
        }
        match fits(name, &value) {
            Ok(()) => fields.push((name, value)),
            Err(why) => left_out.push(LeftOut {
                field: name.to_string(),
                why,
            }),
        }
    }
    (fields, left_out)
}

/// Every observed setting as one map, or why none is written. All or
/// none: a declaration that lists settings manages all of them, and one
/// left out would be reset.
fn parameters(obs: &Observation) -> Result<Option<Value>, String> {
    let mut map = serde_json::Map::new();
    for (path, value) in &obs.fields {
        let Some(key) = path.strip_prefix("parameters.") else {
            continue;
        };
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(_) | Value::Bool(_) => value.to_string(),
            other => {
                return Err(format!(
                    "setting `{key}` shows {other}, not text; a declaration that lists settings manages all of them, so none is written"
                ));
            }
        };
        map.insert(key.to_string(), Value::String(text.clone()));
        if let Err(why) = fits("parameters", &json!({ key: text })) {
            return Err(format!(
                "{why}; a declaration that lists settings manages all of them, so none is written"
            ));
        }
    }
    Ok((!map.is_empty()).then_some(Value::Object(map)))
}

/// The extensions a declaration can state (name, and with `all_fields`
/// the version and schema; the schema also when it is not `public`),
/// sorted by name, and the ones it cannot.
fn extensions(list: &[Value], all_fields: bool) -> (Vec<Value>, Vec<LeftOut>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for item in list {
        let Some(name) = item.get("name").and_then(Value::as_str) else {
            dropped.push(LeftOut {
                field: "extensions".into(),
                why: format!("the provider shows {item}, an extension without a name"),
            });
            continue;
        };
        let mut entry = serde_json::Map::new();
        entry.insert("name".into(), json!(name));
        if all_fields && let Some(version) = item.get("version").and_then(Value::as_str) {
            entry.insert("version".into(), json!(version));
        }
        if let Some(schema) = item.get("schema").and_then(Value::as_str)
            && (all_fields || schema != "public")
        {
            entry.insert("schema".into(), json!(schema));
        }
        let entry = Value::Object(entry);
        match fits("extensions", &json!([entry])) {
            Ok(()) => kept.push(entry),
            Err(why) => dropped.push(LeftOut {
                field: format!("extensions.{name}"),
                why,
            }),
        }
    }
    kept.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    (kept, dropped)
}

/// Whether a declaration can carry `field: value`: the declaration's own
/// parser and validator decide, so an import never writes what `tend
/// validate` refuses.
fn fits(field: &str, value: &Value) -> Result<(), String> {
    let doc = json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "x"},
        "spec": { field: value },
    });
    let decl: ManagedDatabase = serde_json::from_value(doc)
        .map_err(|e| format!("a declaration cannot hold the value the provider shows: {e}"))?;
    let (_, problems) = validate(&decl);
    match problems.first() {
        None => Ok(()),
        Some(p) => Err(format!(
            "the value the provider shows breaks a rule: {}",
            p.message
        )),
    }
}

/// The declaration file: modeline, heading comment, the document.
pub(crate) fn document(
    heading: &Heading<'_>,
    name: &str,
    database_name: Option<&str>,
    fields: &[(&'static str, Value)],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# yaml-language-server: $schema={}",
        heading.schema_ref
    );
    let _ = writeln!(
        out,
        "# Imported by `tend import` from provider {} ({}).",
        comment_text(heading.provider),
        heading.provider_kind
    );
    let _ = writeln!(out, "apiVersion: {API_VERSION}");
    let _ = writeln!(out, "kind: {KIND}");
    out.push_str("metadata:\n");
    let _ = writeln!(out, "  name: {name}");
    out.push_str("  annotations:\n    tend.dev/adopt: \"true\"\n");
    let mut spec = Vec::new();
    if heading.spell_provider {
        spec.push(("provider", json!(heading.provider)));
    }
    if let Some(database) = database_name {
        spec.push(("databaseName", json!(database)));
    }
    spec.extend(fields.iter().cloned());
    if spec.is_empty() {
        out.push_str("spec: {}\n");
        return out;
    }
    out.push_str("spec:\n");
    for (key, value) in &spec {
        write_field(&mut out, key, value);
    }
    out
}

/// `key: value` at the spec's indentation; maps and lists in block style
/// (a list's items indented under their key, as the examples write them).
fn write_field(out: &mut String, key: &str, value: &Value) {
    match value {
        Value::Object(map) => {
            let _ = writeln!(out, "  {key}:");
            for (k, v) in map {
                let _ = writeln!(out, "    {}: {}", string_scalar(k), scalar(v));
            }
        }
        Value::Array(items) => {
            let _ = writeln!(out, "  {key}:");
            for item in items {
                match item.as_object() {
                    Some(o) if o.len() == 1 && o.contains_key("name") => {
                        let _ = writeln!(out, "    - {}", scalar(&o["name"]));
                    }
                    Some(o) => {
                        // An extension's keys in the declaration's order.
                        let keys = ["name", "version", "schema"];
                        let present = keys.iter().filter_map(|k| Some((*k, o.get(*k)?)));
                        for (i, (k, v)) in present.enumerate() {
                            let lead = if i == 0 { "    - " } else { "      " };
                            let _ = writeln!(out, "{lead}{k}: {}", scalar(v));
                        }
                    }
                    None => {
                        let _ = writeln!(out, "    - {}", scalar(item));
                    }
                }
            }
        }
        other => {
            let _ = writeln!(out, "  {key}: {}", scalar(other));
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => string_scalar(s),
        other => other.to_string(),
    }
}

/// A provider name fit for a comment line: quoted, control characters
/// escaped (a name cannot end the comment's line).
fn comment_text(text: &str) -> String {
    format!("{text:?}")
}
