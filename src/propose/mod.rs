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

pub(crate) mod branch;
pub(crate) mod edit;
mod verify;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde_json::Value;

use crate::cause::Cause;
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
    /// The edit would touch a value written with a YAML anchor, or an
    /// alias: other values refer to it, so the edit could change them
    /// too.
    #[error(
        "{file}: tend does not edit {fields} of `{name}`: the change touches `{written}`, a YAML {what}, and other values of the document refer to it, so the edit could change them too; nothing is proposed. Edit the file by hand (write the value without the anchor or alias)"
    )]
    Anchored {
        file: String,
        name: String,
        fields: String,
        written: String,
        what: &'static str,
    },
    /// The edit would change more than it shows (or does not parse):
    /// refused rather than offered.
    #[error(
        "{file}: tend cannot propose this edit safely: {message}; nothing is proposed. Edit the file by hand to declare the values above"
    )]
    Unsound { file: String, message: String },
}

/// The out-of-band drift of `drift` a proposal would cover: `fields`
/// when given (each must be drifted), else all of it.
pub(crate) fn selected<'a>(
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
    refuse_anchored(text, doc, &splices, file, name, &proposed)?;
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
    verify::check(&proposal)?;
    Ok(proposal)
}

/// Refuses splices that touch an anchored node or an alias of `doc`:
/// replacing `&v "x"` drops the anchor, and every `*v` after it would
/// then mean an earlier `&v` (or nothing); writing inside an anchored
/// mapping changes every alias of it. An insertion counts when it lands
/// inside the node or at its very end.
fn refuse_anchored(
    text: &str,
    doc: &Node,
    splices: &[Splice],
    file: &str,
    name: &str,
    proposed: &[&str],
) -> Result<(), ProposeError> {
    let marked = doc.anchors_and_aliases();
    let hit = marked.iter().find(|(_, start, end)| {
        splices.iter().any(|s| {
            if s.start == s.end {
                *start < s.start && s.start <= *end
            } else {
                s.start < *end && *start < s.end
            }
        })
    });
    match hit {
        None => Ok(()),
        Some((marker, start, end)) => Err(ProposeError::Anchored {
            file: file.to_string(),
            name: name.to_string(),
            fields: proposed.join(", "),
            // As written, its first line (a mapping's can be long).
            written: text
                .get(*start..*end)
                .and_then(|t| t.lines().next())
                .map(|l| l.trim_end().chars().take(60).collect())
                .unwrap_or_else(|| marker.clone()),
            what: if marker.starts_with('&') {
                "anchor"
            } else {
                "alias"
            },
        }),
    }
}

/// The splice that sets (or, for `null`, removes) a top-level spec field.
fn field_splice(text: &str, spec: &Node, field: &str, observed: &Value) -> Option<Vec<Splice>> {
    Some(match (spec.get(field), observed) {
        (Some(_), Value::Null) => vec![edit::remove_entry(text, spec, field)?],
        (Some(node), value) => vec![edit::set_scalar(text, node, value)?],
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
            (Some(node), value) => out.push(edit::set_scalar(text, node, value)?),
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
    let kept = kept_ignored(&listed, proposed);
    if kept.len() == listed.len() {
        return (Vec::new(), Vec::new());
    }
    if !kept.is_empty() {
        let value = Value::String(kept.join(","));
        return (
            edit::set_scalar(text, ignore, &value).into_iter().collect(),
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

/// The fields of `tend.dev/ignore-fields` (`listed`) a proposal of
/// `proposed` keeps: those it does not cover (`parameters` covers
/// `parameters.work_mem`'s proposal).
fn kept_ignored<'a>(listed: &[&'a str], proposed: &[&str]) -> Vec<&'a str> {
    let covered = |f: &str| {
        proposed
            .iter()
            .any(|p| *p == f || p.strip_prefix(f).is_some_and(|rest| rest.starts_with('.')))
    };
    listed.iter().copied().filter(|f| !covered(f)).collect()
}

/// The proposal as a unified diff (`a/` and `b/` paths, as `git apply`
/// and `patch -p1` take it).
pub(crate) fn unified_diff(p: &Proposal) -> String {
    similar::TextDiff::from_lines(&p.before, &p.after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{}", p.file), &format!("b/{}", p.file))
        .to_string()
}

/// The file `path` at `commit` of the source's local Git data. The error
/// keeps libgit2's (or the UTF-8 decoder's) as its cause.
pub(crate) fn file_at(repo_dir: &Path, commit: &str, path: &str) -> Result<String, Cause> {
    crate::source::libgit2();
    let git = |e: git2::Error| Cause::git(&e);
    let repo = git2::Repository::open_bare(repo_dir).map_err(git)?;
    let commit = git2::Oid::from_str(commit)
        .and_then(|id| repo.find_commit(id))
        .map_err(git)?;
    let entry = commit
        .tree()
        .and_then(|t| t.get_path(Path::new(path)))
        .map_err(|e| {
            Cause::explained(
                format!("{path} at {}: {}", commit.id(), e.message()),
                Cause::git(&e),
            )
        })?;
    let blob = repo.find_blob(entry.id()).map_err(git)?;
    String::from_utf8(blob.content().to_vec())
        .map_err(|e| Cause::explained(format!("{path} is not UTF-8"), e))
}

/// The commit message of a proposal branch.
pub(crate) fn commit_message(p: &Proposal, agent_id: &str, base: &str) -> String {
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
            crate::escape::value(&c.declared),
            crate::escape::value(&c.observed)
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

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
spec:
  comment: &v \"true\"
  owner: &v \"false\"
metadata:
  name: orders
  annotations:
    tend.dev/override-reason: INC-1
    tend.dev/paused: *v
";

    fn proposal(after: &str) -> Proposal {
        Proposal {
            name: "orders".into(),
            file: "orders.yaml".into(),
            before: BEFORE.into(),
            after: after.into(),
            changes: vec![FieldChange {
                field: "owner".into(),
                declared: Value::String("false".into()),
                observed: Value::String("alice".into()),
                first_seen: None,
            }],
            removed_annotations: Vec::new(),
            reasons: Vec::new(),
        }
    }

    /// The edit the anchor guard stops, made by hand: the spec is exactly
    /// the observed one, and the whole-document comparison still finds
    /// the pause it would switch on.
    #[test]
    fn a_change_outside_the_spec_is_named_and_refused() {
        let dropped_anchor = BEFORE.replace("&v \"false\"", "alice");
        let err = verify::check(&proposal(&dropped_anchor)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "orders.yaml: tend cannot propose this edit safely: it would also change metadata.annotations.tend.dev/paused from 'false' to 'true', which the proposal does not show; nothing is proposed. Edit the file by hand to declare the values above"
        );
        let sound = BEFORE.replace("owner: &v \"false\"", "owner: alice");
        let sound = sound.replace("*v", "\"false\"");
        let mut p = proposal(&sound);
        p.before = BEFORE.replace("*v", "\"false\"");
        assert_eq!(verify::check(&p), Ok(()));
    }
}
