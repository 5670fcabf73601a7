//! `tend propose`: hands an out-of-band change back to Git. For a resource
//! whose fields were changed at the provider (and held, overridden or
//! ignored), the declaration edit that makes Git declare what the provider
//! shows, and the override annotations that existed only for those fields
//! removed.
//!
//! # Guarantees
//! * Only the value nodes of the proposed fields (and the annotations
//!   that only covered them) change; comments, key order, quoting, other
//!   documents and every other line stay byte for byte.
//! * A proposal is parsed and validated before it is offered, and its
//!   spec is the old one with exactly the observed values put in: no other
//!   change in what the spec hash covers. Anything else is an error, never
//!   a proposal.

pub mod auto;
pub mod branch;
pub mod edit;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde_json::Value;

use crate::engine::{Drift, DriftOrigin};
use crate::model::overrides::{
    IGNORE_FIELDS, OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY, OVERRIDE_REASON, PAUSED,
};
use crate::model::yaml_spans::{self, Node, NodeKind, ScalarStyle};
use edit::Splice;

/// One field a proposal changes.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldChange {
    pub field: String,
    pub declared: Value,
    pub observed: Value,
    /// When tend first saw the provider's value.
    pub first_seen: Option<SystemTime>,
}

/// The declaration change for one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub name: String,
    /// The file, relative to the repository root.
    pub file: String,
    pub before: String,
    pub after: String,
    pub changes: Vec<FieldChange>,
    /// Annotations removed (they existed only for the proposed fields).
    pub removed_annotations: Vec<String>,
    /// The reasons of the overrides that held the change (the incident).
    pub reasons: Vec<String>,
}

/// Why there is no proposal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProposeError {
    /// No out-of-band drift: Git already declares what the provider shows.
    #[error(
        "nothing to propose for `{name}`: it has no out-of-band drift (Git already declares what the provider shows)"
    )]
    NothingToPropose { name: String },
    /// `--fields` named a field without out-of-band drift.
    #[error("`{name}` has no out-of-band drift on {fields}; it has on: {drifted}")]
    NotDrifted {
        name: String,
        fields: String,
        drifted: String,
    },
    /// A field propose cannot write yet.
    #[error("{field} of `{name}` is not proposed: {why}")]
    NotProposable {
        name: String,
        field: String,
        why: String,
    },
    /// The file does not hold the declaration as tend read it.
    #[error("{file}: {message}")]
    File { file: String, message: String },
    /// The edit did not come out as it must (a bug, reported rather than
    /// offered).
    #[error(
        "{file}: the proposed edit does not check out ({message}); nothing is proposed. Please report this with the file"
    )]
    Unsound { file: String, message: String },
}

/// The out-of-band drift of `drift` a proposal would cover: `fields`
/// when given (each must be drifted), else all of it.
pub fn selected<'a>(
    name: &str,
    drift: &'a [Drift],
    fields: Option<&[String]>,
) -> Result<Vec<&'a Drift>, ProposeError> {
    let out_of_band: Vec<&Drift> = drift
        .iter()
        .filter(|d| d.origin == DriftOrigin::OutOfBand)
        .collect();
    if out_of_band.is_empty() {
        return Err(ProposeError::NothingToPropose {
            name: name.to_string(),
        });
    }
    let Some(fields) = fields else {
        return Ok(out_of_band);
    };
    let missing: Vec<&String> = fields
        .iter()
        .filter(|f| !out_of_band.iter().any(|d| &d.field == *f))
        .collect();
    if !missing.is_empty() {
        return Err(ProposeError::NotDrifted {
            name: name.to_string(),
            fields: missing
                .iter()
                .map(|f| f.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            drifted: out_of_band
                .iter()
                .map(|d| d.field.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(out_of_band
        .into_iter()
        .filter(|d| fields.contains(&d.field))
        .collect())
}

/// The document of `text` that declares `name`.
fn document<'t>(docs: &'t [Node], name: &str) -> Option<&'t Node> {
    docs.iter().find(|d| {
        d.get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Node::scalar)
            == Some(name)
    })
}

/// Builds the proposal for `name` in the file `file` whose text is
/// `text`: the `drift` to write back (from [`selected`]), when each field
/// was first seen, and the override reasons.
pub fn propose(
    text: &str,
    file: &str,
    name: &str,
    drift: &[&Drift],
    first_seen: &BTreeMap<String, SystemTime>,
    reasons: &[String],
) -> Result<Proposal, ProposeError> {
    let fail = |message: String| ProposeError::File {
        file: file.to_string(),
        message,
    };
    let docs = yaml_spans::documents(text).map_err(|e| fail(e.to_string()))?;
    let doc =
        document(&docs, name).ok_or_else(|| fail(format!("no document declares `{name}`")))?;
    let spec = doc
        .get("spec")
        .ok_or_else(|| fail(format!("`{name}` has no spec mapping")))?;
    let mut splices = Vec::new();
    let mut changes = Vec::new();
    let mut parameters: Vec<(&str, &Value)> = Vec::new();
    for d in drift {
        if let Some(setting) = d.field.strip_prefix("parameters.") {
            parameters.push((setting, &d.observed));
        } else if matches!(d.observed, Value::Array(_) | Value::Object(_)) {
            return Err(ProposeError::NotProposable {
                name: name.to_string(),
                field: d.field.clone(),
                why: "propose writes scalar fields and parameters; edit a list such as extensions by hand".into(),
            });
        } else {
            splices.extend(
                field_splice(text, spec, &d.field, &d.observed).ok_or_else(|| {
                    fail(format!("cannot place {} in the spec of `{name}`", d.field))
                })?,
            );
        }
        changes.push(FieldChange {
            field: d.field.clone(),
            declared: d.desired.clone(),
            observed: d.observed.clone(),
            first_seen: first_seen.get(&d.field).copied(),
        });
    }
    if !parameters.is_empty() {
        splices.extend(
            parameter_splices(text, doc, spec, &parameters).ok_or_else(|| {
                fail(format!(
                    "cannot place the parameters in the spec of `{name}`"
                ))
            })?,
        );
    }
    let proposed: Vec<&str> = drift.iter().map(|d| d.field.as_str()).collect();
    let (annotation_splices, removed_annotations) = annotation_splices(text, doc, &proposed);
    splices.extend(annotation_splices);
    let after = edit::apply(text, splices);
    let proposal = Proposal {
        name: name.to_string(),
        file: file.to_string(),
        before: text.to_string(),
        after,
        changes,
        removed_annotations,
        reasons: reasons.to_vec(),
    };
    check(&proposal)?;
    Ok(proposal)
}

/// The splice that sets (or, for `null`, removes) a top-level spec field.
fn field_splice(text: &str, spec: &Node, field: &str, observed: &Value) -> Option<Vec<Splice>> {
    Some(match (spec.get(field), observed) {
        (Some(_), Value::Null) => vec![edit::remove_entry(text, spec, field)?],
        (Some(node), value) => vec![edit::set_scalar(node, value)?],
        (None, Value::Null) => Vec::new(),
        (None, value) => vec![edit::add_entry(
            text,
            spec,
            field,
            &edit::scalar(value, ScalarStyle::Plain),
        )?],
    })
}

/// The splices that put the observed `parameters` in: values changed in
/// place, new keys added to the mapping (or a mapping added to the spec),
/// removed keys taken out (a mapping left empty becomes `{}`: the
/// declaration still manages the parameters, and declares none).
fn parameter_splices(
    text: &str,
    doc: &Node,
    spec: &Node,
    parameters: &[(&str, &Value)],
) -> Option<Vec<Splice>> {
    let mut out = Vec::new();
    let Some((params_key, params)) = spec.entry("parameters") else {
        let step = doc
            .entry("spec")
            .map_or(2, |(k, v)| edit::indent_step(text, k, v));
        let mut added = parameters.iter().filter(|(_, v)| !v.is_null());
        let Some((first, value)) = added.next() else {
            return Some(out);
        };
        let mut splice = edit::add_nested_entry(
            text,
            spec,
            "parameters",
            first,
            &edit::scalar(value, ScalarStyle::Plain),
            step,
        )?;
        let child_indent = splice
            .text
            .lines()
            .last()
            .map(|l| l.len() - l.trim_start().len())
            .unwrap_or(step);
        for (key, value) in added {
            splice.text.push_str(&format!(
                "{}{key}: {}\n",
                " ".repeat(child_indent),
                edit::scalar(value, ScalarStyle::Plain)
            ));
        }
        out.push(splice);
        return Some(out);
    };
    let NodeKind::Mapping { flow, entries } = &params.kind else {
        return None;
    };
    if *flow {
        // Written again as one: removals and additions share its commas.
        let changes: Vec<(&str, Option<String>)> = parameters
            .iter()
            .map(|(k, v)| {
                let style = match params.get(k).map(|n| &n.kind) {
                    Some(NodeKind::Scalar { style, .. }) => *style,
                    _ => ScalarStyle::Plain,
                };
                (*k, (!v.is_null()).then(|| edit::scalar(v, style)))
            })
            .collect();
        out.push(edit::rewrite_flow_mapping(text, params, &changes)?);
        return Some(out);
    }
    let removed = parameters
        .iter()
        .filter(|(k, v)| v.is_null() && params.get(k).is_some())
        .count();
    if removed > 0
        && removed == entries.len()
        && parameters
            .iter()
            .all(|(k, v)| v.is_null() || params.get(k).is_some())
    {
        // Every parameter goes: `parameters: {}`.
        out.push(Splice {
            start: params_key.end,
            end: edit::value_end(text, params),
            text: ": {}\n".into(),
        });
        return Some(out);
    }
    for (key, value) in parameters {
        match (params.get(key), value) {
            (Some(_), Value::Null) => out.push(edit::remove_entry(text, params, key)?),
            (Some(node), value) => out.push(edit::set_scalar(node, value)?),
            (None, Value::Null) => {}
            (None, value) => out.push(edit::add_entry(
                text,
                params,
                key,
                &edit::scalar(value, ScalarStyle::Plain),
            )?),
        }
    }
    // Several keys added to one block mapping land at one place: one
    // splice holding them all, in order.
    merge_insertions(&mut out);
    Some(out)
}

/// Merges insertions at the same place into one (in their order).
fn merge_insertions(splices: &mut Vec<Splice>) {
    let mut merged: Vec<Splice> = Vec::new();
    for s in splices.drain(..) {
        match merged.last_mut() {
            Some(last) if last.start == last.end && s.start == s.end && last.start == s.start => {
                last.text.push_str(&s.text);
            }
            _ => merged.push(s),
        }
    }
    *splices = merged;
}

/// The splices that take out the override annotations that only existed
/// for `proposed`, and the annotations removed.
fn annotation_splices(text: &str, doc: &Node, proposed: &[&str]) -> (Vec<Splice>, Vec<String>) {
    let Some((annotations_key, annotations)) =
        doc.get("metadata").and_then(|m| m.entry("annotations"))
    else {
        return (Vec::new(), Vec::new());
    };
    let Some(ignore) = annotations.get(IGNORE_FIELDS) else {
        return (Vec::new(), Vec::new());
    };
    let listed: Vec<&str> = ignore
        .scalar()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    let covered = |f: &str| {
        proposed
            .iter()
            .any(|p| *p == f || p.strip_prefix(f).is_some_and(|rest| rest.starts_with('.')))
    };
    let kept: Vec<&str> = listed.iter().copied().filter(|f| !covered(f)).collect();
    if kept.len() == listed.len() {
        return (Vec::new(), Vec::new());
    }
    if !kept.is_empty() {
        let value = Value::String(kept.join(","));
        return (
            edit::set_scalar(ignore, &value).into_iter().collect(),
            Vec::new(),
        );
    }
    // Nothing left to ignore: the annotation goes, and with it the
    // reason, expiry and on-expiry unless a pause still needs them.
    let paused = annotations.get(PAUSED).is_some();
    let mut gone = vec![IGNORE_FIELDS];
    if !paused {
        gone.extend([OVERRIDE_REASON, OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY]);
    }
    let present: Vec<&str> = gone
        .into_iter()
        .filter(|k| annotations.get(k).is_some())
        .collect();
    let NodeKind::Mapping { entries, .. } = &annotations.kind else {
        return (Vec::new(), Vec::new());
    };
    let removed: Vec<String> = present.iter().map(|s| s.to_string()).collect();
    if present.len() == entries.len() {
        // Every annotation goes: the `annotations` key with them.
        let metadata = doc.get("metadata");
        return (
            metadata
                .and_then(|m| {
                    edit::remove_entry(text, m, annotations_key.scalar().unwrap_or("annotations"))
                })
                .into_iter()
                .collect(),
            removed,
        );
    }
    (
        present
            .iter()
            .filter_map(|k| edit::remove_entry(text, annotations, k))
            .collect(),
        removed,
    )
}

/// Parses and validates the proposal, and checks that its spec is the old
/// one with the observed values in, nothing else.
fn check(p: &Proposal) -> Result<(), ProposeError> {
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
            .map(|d| d.normalized_spec.clone())
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
    Ok(())
}

/// The proposal as a unified diff (`a/` and `b/` paths, as `git apply`
/// and `patch -p1` take it).
pub fn unified_diff(p: &Proposal) -> String {
    similar::TextDiff::from_lines(&p.before, &p.after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{}", p.file), &format!("b/{}", p.file))
        .to_string()
}

/// The file `path` at `commit` of the source's local Git data.
pub fn file_at(repo_dir: &Path, commit: &str, path: &str) -> Result<String, String> {
    crate::source::libgit2();
    let repo = git2::Repository::open_bare(repo_dir).map_err(|e| e.message().to_string())?;
    let commit = git2::Oid::from_str(commit)
        .and_then(|id| repo.find_commit(id))
        .map_err(|e| e.message().to_string())?;
    let entry = commit
        .tree()
        .and_then(|t| t.get_path(Path::new(path)))
        .map_err(|e| format!("{path} at {}: {}", commit.id(), e.message()))?;
    let blob = repo
        .find_blob(entry.id())
        .map_err(|e| e.message().to_string())?;
    String::from_utf8(blob.content().to_vec()).map_err(|_| format!("{path} is not UTF-8"))
}

/// The commit message of a proposal branch.
pub fn commit_message(p: &Proposal, agent_id: &str, base: &str) -> String {
    let mut out = format!(
        "propose: declare what the provider shows for {}\n\nChanged at the provider, kept in Git by tend propose:\n",
        p.name
    );
    for c in &p.changes {
        let seen = c.first_seen.map_or_else(
            || " (no cycle has recorded it yet)".to_string(),
            |t| format!(" (first seen {})", crate::time::rfc3339(t)),
        );
        out.push_str(&format!(
            "  {}: {} -> {}{seen}\n",
            c.field,
            crate::status::render::value(&c.declared),
            crate::status::render::value(&c.observed)
        ));
    }
    if !p.reasons.is_empty() {
        out.push_str(&format!("\nOverride reason: {}\n", p.reasons.join("; ")));
    }
    if !p.removed_annotations.is_empty() {
        out.push_str(&format!(
            "Removed annotations: {}\n",
            p.removed_annotations.join(", ")
        ));
    }
    out.push_str(&format!(
        "\nProposed by tend agent {agent_id} from commit {base}.\n"
    ));
    out
}
