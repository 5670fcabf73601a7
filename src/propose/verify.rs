//! A proposal is checked before it is offered: it parses and validates,
//! its spec is the old one with exactly the observed values put in, every
//! other declaration of the file is unchanged, and every document, parsed
//! whole (aliases resolved), differs only where the proposal says.

use std::path::Path;

use serde_json::Value;

use super::{Proposal, ProposeError, kept_ignored};
use crate::model::overrides::IGNORE_FIELDS;

/// Parses and validates the proposal, and checks that its spec is the old
/// one with the observed values in, nothing else.
pub(super) fn check(p: &Proposal) -> Result<(), ProposeError> {
    let unsound = |message: String| ProposeError::Unsound {
        file: p.file.clone(),
        message,
    };
    let parse = |text: &str| crate::model::parse_file(Path::new(&p.file), text.as_bytes());
    let before = parse(&p.before);
    let after = parse(&p.after);
    if let Some(d) = after.diagnostics.first() {
        return Err(unsound(format!("the result does not validate: {d}")));
    }
    let find = |set: &crate::model::load::FileContents| {
        set.declarations
            .iter()
            .find(|d| d.name() == p.name)
            .map(|d| d.normalized_spec.to_value())
    };
    let (Some(mut expected), Some(got)) = (find(&before), find(&after)) else {
        return Err(unsound(format!(
            "`{}` is not declared after the edit",
            p.name
        )));
    };
    for c in &p.changes {
        let (map, key) = match c.field.strip_prefix("parameters.") {
            Some(setting) => {
                let spec = expected
                    .as_object_mut()
                    .ok_or_else(|| unsound("no spec".into()))?;
                let params = spec
                    .entry("parameters")
                    .or_insert_with(|| Value::Object(Default::default()));
                (params, setting)
            }
            None => (&mut expected, c.field.as_str()),
        };
        let map = map
            .as_object_mut()
            .ok_or_else(|| unsound("no mapping".into()))?;
        match &c.observed {
            Value::Null => {
                map.remove(key);
            }
            // A setting is text in a declaration: a provider that reports
            // `128` reports the setting `"128"`.
            Value::Number(n) if c.field.starts_with("parameters.") => {
                map.insert(key.to_string(), Value::String(n.to_string()));
            }
            Value::Bool(b) if c.field.starts_with("parameters.") => {
                map.insert(key.to_string(), Value::String(b.to_string()));
            }
            v => {
                map.insert(key.to_string(), v.clone());
            }
        }
    }
    if got != expected {
        return Err(unsound(format!(
            "the spec would be {got}, not the observed values {expected}"
        )));
    }
    // Every other declaration of the file is unchanged.
    let others = |set: &crate::model::load::FileContents| -> Vec<(String, crate::model::SpecHash)> {
        set.declarations
            .iter()
            .filter(|d| d.name() != p.name)
            .map(|d| (d.name().to_string(), d.spec_hash.clone()))
            .collect()
    };
    if others(&before) != others(&after) {
        return Err(unsound("another declaration of the file changed".into()));
    }
    whole_documents_unchanged(p).map_err(unsound)
}

/// Compares every document of the file, parsed as YAML (aliases
/// resolved), before and after: the same documents, each the same
/// except for the proposed declaration's spec (checked above) and the
/// annotations the proposal names as removed. What an alias, a merge or
/// any edit outside the spec would change shows up here.
fn whole_documents_unchanged(p: &Proposal) -> Result<(), String> {
    use serde::Deserialize;
    use serde_norway::Value as Yaml;
    let parse = |text: &str| -> Result<Vec<Yaml>, String> {
        serde_norway::Deserializer::from_str(text)
            .map(Yaml::deserialize)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the file does not parse: {e}"))
    };
    let (before, after) = (parse(&p.before)?, parse(&p.after)?);
    if before.len() != after.len() {
        return Err(format!(
            "the file would hold {} documents, not {}",
            after.len(),
            before.len()
        ));
    }
    let is_proposed = |doc: &Yaml| doc["metadata"]["name"].as_str() == Some(p.name.as_str());
    for (mut old, mut new) in before.into_iter().zip(after) {
        if is_proposed(&old) && is_proposed(&new) {
            for doc in [&mut old, &mut new] {
                if let Some(map) = doc.as_mapping_mut() {
                    map.remove("spec");
                }
            }
            if let Some(annotations) = old
                .get_mut("metadata")
                .and_then(|m| m.get_mut("annotations"))
                .and_then(Yaml::as_mapping_mut)
            {
                for removed in &p.removed_annotations {
                    annotations.remove(removed.as_str());
                }
                // The fields proposed leave `tend.dev/ignore-fields`.
                let ignored = annotations.get(IGNORE_FIELDS).and_then(Yaml::as_str);
                if let Some(ignored) = ignored {
                    let listed: Vec<&str> = ignored
                        .split(',')
                        .map(str::trim)
                        .filter(|f| !f.is_empty())
                        .collect();
                    let proposed: Vec<&str> = p.changes.iter().map(|c| c.field.as_str()).collect();
                    let kept = kept_ignored(&listed, &proposed);
                    if kept.len() != listed.len() {
                        let kept = Yaml::String(kept.join(","));
                        annotations.insert(Yaml::String(IGNORE_FIELDS.into()), kept);
                    }
                }
            }
            let emptied = old["metadata"]["annotations"]
                .as_mapping()
                .is_some_and(|m| m.is_empty());
            if emptied
                && new["metadata"].get("annotations").is_none()
                && let Some(metadata) = old.get_mut("metadata").and_then(Yaml::as_mapping_mut)
            {
                metadata.remove("annotations");
            }
        }
        if let Some((path, was, would)) = first_difference(&old, &new, String::new()) {
            let show = |v: Option<&Yaml>| {
                v.map_or_else(
                    || "absent".to_string(),
                    |v| {
                        serde_norway::to_string(v)
                            .map(|s| s.trim_end().to_string())
                            .unwrap_or_else(|_| "?".into())
                    },
                )
            };
            return Err(format!(
                "it would also change {path} from {} to {}, which the proposal does not show",
                show(was),
                show(would)
            ));
        }
    }
    Ok(())
}

/// The first place two YAML values differ: its dotted path and both
/// values there (`None`: absent on that side).
fn first_difference<'v>(
    a: &'v serde_norway::Value,
    b: &'v serde_norway::Value,
    path: String,
) -> Option<(
    String,
    Option<&'v serde_norway::Value>,
    Option<&'v serde_norway::Value>,
)> {
    use serde_norway::Value as Yaml;
    if a == b {
        return None;
    }
    let here = |p: &str| {
        if p.is_empty() {
            "the document".to_string()
        } else {
            p.to_string()
        }
    };
    match (a, b) {
        (Yaml::Mapping(x), Yaml::Mapping(y)) => {
            let key_text = |k: &Yaml| {
                k.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{k:?}"))
            };
            let join = |k: &Yaml| {
                if path.is_empty() {
                    key_text(k)
                } else {
                    format!("{path}.{}", key_text(k))
                }
            };
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => {
                        if let Some(found) = first_difference(v, w, join(k)) {
                            return Some(found);
                        }
                    }
                    None => return Some((join(k), Some(v), None)),
                }
            }
            y.iter()
                .find(|(k, _)| !x.contains_key(*k))
                .map(|(k, w)| (join(k), None, Some(w)))
        }
        _ => Some((here(&path), Some(a), Some(b))),
    }
}
