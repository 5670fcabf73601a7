//! Text and Markdown renderings of a [`Report`]. JSON is the report itself.

use std::fmt::Write;

use serde_json::Value;

use super::report::{Report, ResourceReport};
use crate::engine::{DriftOrigin, State};
use crate::escape::terminal as esc;

/// A field value as every human-facing output shows it.
///
/// Escaped for a terminal: observed values come from the provider.
pub fn value(v: &Value) -> String {
    match v {
        Value::Null => "(unset)".into(),
        Value::String(s) => esc(s).into_owned(),
        other => esc(&other.to_string()).into_owned(),
    }
}

/// A drift line's origin, and whether an override leaves the field alone.
pub fn drift_origin(o: DriftOrigin, ignored: bool) -> String {
    if ignored {
        format!("{}, ignored by the override: not corrected", origin(o))
    } else {
        origin(o).to_string()
    }
}

/// A drift origin as every human-facing output shows it.
pub fn origin(o: DriftOrigin) -> &'static str {
    match o {
        DriftOrigin::Declared => "declared",
        DriftOrigin::OutOfBand => "out-of-band",
    }
}

fn state_colour(state: State) -> &'static str {
    match state {
        State::InSync | State::Released => "\x1b[32m",
        State::Drifted | State::Missing | State::Deleting | State::Overridden => "\x1b[33m",
        _ => "\x1b[31m",
    }
}

fn summary_line(report: &Report) -> String {
    let s = &report.summary;
    format!(
        "{} resources: {} in sync, {} drifted, {} missing, {} blocked, {} overridden, {} deleting, {} errors",
        s.total, s.in_sync, s.drifted, s.missing, s.blocked, s.overridden, s.deleting, s.errors
    )
}

fn override_line(r: &ResourceReport) -> Option<String> {
    let o = r.override_.as_ref()?;
    let mut line = format!("override ({}, {}): {}", o.source, o.kind, esc(&o.reason));
    if !o.fields.is_empty() {
        let _ = write!(line, "; fields {}", esc(&o.fields.join(", ")));
    }
    match (&o.expires, o.expired) {
        (Some(t), true) => {
            let _ = write!(line, "; EXPIRED at {t}");
        }
        (Some(t), false) => {
            let _ = write!(line, "; expires {t}");
        }
        (None, _) => line.push_str("; no expiry"),
    }
    Some(line)
}

/// An aligned table; colour only when `colour` (a TTY without `NO_COLOR`).
pub fn text(report: &Report, colour: bool) -> String {
    let mut out = String::new();
    let commit = report.source.commit.as_deref().unwrap_or("unknown commit");
    let _ = writeln!(
        out,
        "source: {} ({}, {})",
        esc(&report.source.url),
        esc(&report.source.branch),
        esc(commit)
    );
    let name_w = report
        .resources
        .iter()
        .map(|r| esc(&r.name).chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let state_w = 14;
    let action_w = 7;
    let _ = writeln!(
        out,
        "{:name_w$}  {:state_w$}  {:action_w$}  REASON",
        "NAME", "STATE", "ACTION"
    );
    for r in &report.resources {
        let state = format!("{:?}", r.state);
        let padded = format!("{state:state_w$}");
        let shown = if colour {
            format!("{}{padded}\x1b[0m", state_colour(r.state))
        } else {
            padded
        };
        let _ = writeln!(
            out,
            "{:name_w$}  {shown}  {:action_w$}  {}",
            esc(&r.name),
            format!("{:?}", r.action),
            esc(&r.reason)
        );
        let indent = " ".repeat(name_w + 2);
        for d in &r.drift {
            let _ = writeln!(
                out,
                "{indent}drift {}: declared {}, observed {} ({})",
                esc(&d.field),
                value(&d.desired),
                value(&d.observed),
                drift_origin(d.origin, d.ignored)
            );
        }
        if let Some(line) = override_line(r) {
            let _ = writeln!(out, "{indent}{line}");
        }
    }
    for e in &report.errors {
        let _ = writeln!(
            out,
            "error: {}:{}:{}: {}",
            esc(&e.file),
            e.line,
            e.column,
            esc(&e.message)
        );
    }
    for o in &report.orphaned_overrides {
        let _ = writeln!(out, "{}", orphan_line(o));
    }
    let _ = writeln!(out, "{}", summary_line(report));
    out
}

/// A local override that protects nothing, as text.
fn orphan_line(o: &super::report::OrphanedOverrideReport) -> String {
    format!(
        "orphaned override: `{}` has no declaration and no resource; the local override set {} ({}) protects nothing. Check the name; `tend override clear {}` removes it",
        esc(&o.name),
        o.set_at,
        esc(&o.reason),
        esc(&o.name)
    )
}

fn md_escape(s: &str) -> String {
    esc(&s.replace('|', "\\|").replace('\n', " ")).into_owned()
}

/// Markdown for a pull-request comment.
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    let commit = report.source.commit.as_deref().unwrap_or("unknown commit");
    let _ = writeln!(out, "### tend plan\n");
    let _ = writeln!(
        out,
        "Source `{}` on `{}` at `{commit}`. {}.\n",
        report.source.url,
        report.source.branch,
        summary_line(report)
    );
    let _ = writeln!(out, "| name | state | action | reason |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for r in &report.resources {
        let _ = writeln!(
            out,
            "| `{}` | {:?} | {:?} | {} |",
            r.name,
            r.state,
            r.action,
            md_escape(&r.reason)
        );
    }
    let drifted: Vec<&ResourceReport> = report
        .resources
        .iter()
        .filter(|r| !r.drift.is_empty())
        .collect();
    if !drifted.is_empty() {
        let _ = writeln!(out, "\n#### Drift\n");
        let _ = writeln!(out, "| name | field | declared | observed | origin |");
        let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
        for r in drifted {
            for d in &r.drift {
                let _ = writeln!(
                    out,
                    "| `{}` | `{}` | {} | {} | {} |",
                    r.name,
                    d.field,
                    md_escape(&value(&d.desired)),
                    md_escape(&value(&d.observed)),
                    drift_origin(d.origin, d.ignored)
                );
            }
        }
    }
    let overridden: Vec<(&ResourceReport, String)> = report
        .resources
        .iter()
        .filter_map(|r| override_line(r).map(|l| (r, l)))
        .collect();
    if !overridden.is_empty() {
        let _ = writeln!(out, "\n#### Active overrides\n");
        for (r, line) in overridden {
            let _ = writeln!(out, "- `{}`: {}", r.name, md_escape(&line));
        }
    }
    if !report.orphaned_overrides.is_empty() {
        let _ = writeln!(out, "\n#### Orphaned local overrides\n");
        for o in &report.orphaned_overrides {
            let _ = writeln!(out, "- {}", md_escape(&orphan_line(o)));
        }
    }
    if !report.errors.is_empty() {
        let _ = writeln!(out, "\n#### Errors\n");
        for e in &report.errors {
            let _ = writeln!(
                out,
                "- `{}:{}:{}`: {}",
                e.file,
                e.line,
                e.column,
                md_escape(&e.message)
            );
        }
    }
    out
}
