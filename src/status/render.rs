//! Text and Markdown renderings of a [`Report`]. JSON is the report itself.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use super::report::{Report, ResourceReport};
use crate::engine::{DriftOrigin, State};
use crate::escape::terminal as esc;

pub use crate::escape::value;

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
        "{}: {} in sync, {} drifted, {} missing, {} blocked, {} overridden, {} deleting, {} errors",
        s.resources(),
        s.in_sync,
        s.drifted,
        s.missing,
        s.blocked,
        s.overridden,
        s.deleting,
        s.errors
    )
}

/// When the report was made, if it says.
fn made_at(report: &Report) -> Option<SystemTime> {
    humantime::parse_rfc3339(&report.generated_at).ok()
}

/// `t` (RFC 3339) as the time between it and the report, said as of the
/// report (a report file is read long after it was made, and an age
/// frozen at "35s ago" would lie): `in 2h 5m as of this report`, `3days
/// ago as of this report`. `None` when either time is unknown, or `t` is
/// the report's own time (the absolute time says it all).
pub fn relative(report: &Report, t: &str) -> Option<String> {
    let made = made_at(report)?;
    let t = humantime::parse_rfc3339(t).ok()?;
    let (ahead, behind) = (crate::time::since(t, made), crate::time::since(made, t));
    if ahead.as_secs() > 0 {
        Some(format!("in {} as of this report", coarse(ahead)))
    } else if behind.as_secs() > 0 {
        Some(format!("{} ago as of this report", coarse(behind)))
    } else {
        None
    }
}

/// A duration to its two largest units (`2days 3h`, `5m 10s`): ages and
/// time left are read at a glance.
fn coarse(d: Duration) -> String {
    let shown = crate::time::duration(d);
    let parts: Vec<&str> = shown.split(' ').take(2).collect();
    parts.join(" ")
}

/// The override of `r` on one line: sources, kind, reason, fields,
/// expiry (with the time left), age.
pub fn override_line(report: &Report, r: &ResourceReport) -> Option<String> {
    let o = r.override_.as_ref()?;
    let mut line = format!("override ({}, {}): {}", o.source, o.kind, esc(&o.reason));
    if !o.fields.is_empty() {
        let _ = write!(line, "; fields {}", esc(&o.fields.join(", ")));
    }
    let when = |t: &str| {
        relative(report, t)
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    };
    let (expired, expires) = if o.is_folded() {
        ("one of them EXPIRED at", "the first of them expires")
    } else {
        ("EXPIRED at", "expires")
    };
    match (&o.expires, o.expired) {
        (Some(t), true) => {
            let _ = write!(line, "; {expired} {t}{}", when(t));
        }
        (Some(t), false) => {
            let _ = write!(line, "; {expires} {t}{}", when(t));
        }
        (None, _) => line.push_str("; no expiry"),
    }
    if let Some(t) = &o.first_seen {
        let _ = write!(line, "; first seen {t}{}", when(t));
    }
    Some(line)
}

/// The source line: url, branch, commit and when it was committed.
fn source_line(report: &Report) -> String {
    let commit = report.source.commit.as_deref().unwrap_or("unknown commit");
    let committed = report
        .source
        .commit_time
        .as_deref()
        .map(|t| {
            let ago = relative(report, t)
                .map(|r| format!(", {r}"))
                .unwrap_or_default();
            format!(", committed {t}{ago}")
        })
        .unwrap_or_default();
    format!(
        "{} ({}, {}{committed})",
        esc(&report.source.url),
        esc(&report.source.branch),
        esc(commit)
    )
}

/// Why the source is failing, and what the report is then based on.
pub fn source_error_line(report: &Report) -> Option<String> {
    let e = report.source.error.as_ref()?;
    let based_on = match &report.source.commit {
        Some(c) => format!(
            "the resources are decided from the last accepted commit {}",
            esc(c)
        ),
        None => "no commit was ever accepted: nothing is decided".into(),
    };
    Some(format!(
        "SOURCE ERROR since {} ({} failed {}): {}; {based_on}",
        e.since,
        e.failures,
        if e.failures == 1 {
            "attempt"
        } else {
            "attempts"
        },
        esc(&e.message)
    ))
}

/// Why the status branch cannot be written, if it cannot.
pub fn status_branch_line(report: &Report) -> Option<String> {
    let b = report.status_branch.as_ref()?;
    Some(format!(
        "STATUS BRANCH `{}` NOT WRITTEN since {}: {}",
        esc(&b.branch),
        b.since,
        esc(&b.error)
    ))
}

/// Databases carrying one other agent's marker, by that agent's id
/// (sorted), with their names.
pub fn other_agents(report: &Report) -> Vec<(&str, Vec<&str>)> {
    let mut by_agent: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for r in &report.resources {
        if let Some(agent) = &r.owned_by {
            by_agent.entry(agent).or_default().push(&r.name);
        }
    }
    by_agent.into_iter().collect()
}

/// The resources the text and Markdown tables leave out because a banner
/// says it for all of them: two or more carrying the same other agent's
/// marker, or not observed for the same reason (a wrong provider password
/// is one line, not one per database).
fn folded(report: &Report) -> std::collections::BTreeSet<&str> {
    other_agents(report)
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .flat_map(|(_, names)| names)
        .chain(
            unobserved_alike(report)
                .into_iter()
                .flat_map(|(_, names)| names),
        )
        .collect()
}

/// Resources that could not be observed, grouped by why (the provider's
/// message), where two or more share it.
fn unobserved_alike(report: &Report) -> Vec<(String, Vec<&str>)> {
    let mut by_reason: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for r in &report.resources {
        if r.rule == crate::engine::Rule::ObservationFailed.as_str() {
            let why = r.reason.replace(&format!("`{}`", r.name), "");
            let message = why
                .split_once("at the provider (")
                .and_then(|(_, rest)| rest.rsplit_once("); no action"))
                .map_or(why.clone(), |(message, _)| message.to_string());
            // A listing's failure is about no database in particular.
            let message = message.trim_start_matches("*: ").to_string();
            by_reason.entry(message).or_default().push(&r.name);
        }
    }
    by_reason
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .collect()
}

/// A few names, and how many more there are: `a, b, c and 37 more`.
fn some_names(names: &[&str]) -> String {
    let shown: Vec<String> = names.iter().take(3).map(|n| esc(n).into_owned()).collect();
    match names.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// One line for every database carrying another agent's marker.
fn other_agent_line(report: &Report, agent: &str, names: &[&str]) -> String {
    let shown: Vec<String> = names.iter().take(3).map(|n| esc(n).into_owned()).collect();
    let more = names.len().saturating_sub(shown.len());
    format!(
        "{} database{} ({}{}) carr{} the ownership marker of tend agent `{}`, not this agent's (`{}`): Blocked. If this state was rebuilt or agent_id changed, set agent_id = \"{}\" in the configuration (docs/runbooks/state-recovery.md); otherwise that agent manages them",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
        if names.len() == 1 { "ies" } else { "y" },
        esc(agent),
        esc(&report.agent.id),
        esc(agent)
    )
}

/// The agent-wide freeze, first above everything while one is set.
pub fn suspension_line(report: &Report) -> Option<String> {
    let s = report.suspended.as_ref()?;
    let expiry = match (&s.expires, s.expired, s.in_force) {
        (Some(at), true, true) => format!("; EXPIRED at {at}, held on (on expiry: hold)"),
        (Some(at), true, false) => {
            format!("; EXPIRED at {at} and no longer holds anything (on expiry: resume)")
        }
        (Some(at), false, _) => format!("; ends at {at} (on expiry: {})", s.on_expiry),
        (None, _, _) => "; until `tend resume`".into(),
    };
    Some(format!(
        "SUSPENDED since {} by {}: {}{expiry}. tend observes and reports, and changes nothing (`tend resume` ends it)",
        s.since,
        esc(&s.by),
        esc(&s.reason)
    ))
}

/// What every rendering says above the resources, each with an id (the
/// HTML page's element): a suspension, the source failing, the status
/// branch not written, databases owned by another agent.
pub fn banners(report: &Report) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(line) = suspension_line(report) {
        out.push(("suspended", line));
    }
    if let Some(line) = source_error_line(report) {
        out.push(("source-error", line));
    }
    if let Some(line) = status_branch_line(report) {
        out.push(("status-branch-error", line));
    }
    for (agent, names) in other_agents(report) {
        out.push(("other-agent", other_agent_line(report, agent, &names)));
    }
    for (message, names) in unobserved_alike(report) {
        out.push((
            "not-observed",
            format!(
                "{} databases ({}) could not be observed at the provider: {}; nothing is done about them until they can be (Error; docs/runbooks/provider-unavailable.md)",
                names.len(),
                some_names(&names),
                esc(&message)
            ),
        ));
    }
    out
}

/// How to keep a change made at the provider, where tend leaves it.
pub fn propose_line(r: &ResourceReport) -> Option<String> {
    r.propose
        .as_ref()
        .map(|command| format!("to keep this change, run `{}`", esc(command)))
}

/// The declared fields a resource's provider could not observe.
fn unobserved_line(r: &ResourceReport) -> Option<String> {
    (!r.unobserved.is_empty()).then(|| {
        format!(
            "not observed: {} (unknown this time: neither in sync nor drifted)",
            esc(&r.unobserved.join(", "))
        )
    })
}

/// An aligned table; colour only when `colour` (a TTY without `NO_COLOR`);
/// `all`: list the quiet resources of a large report too (see
/// [`Report::lists_quiet`]).
pub fn text(report: &Report, colour: bool, all: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "source: {}", source_line(report));
    for (_, line) in banners(report) {
        let _ = writeln!(out, "{line}");
    }
    let folded = folded(report);
    let (listed, quiet) = report.listed(all);
    let name_w = listed
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
    for r in listed.iter().filter(|r| !folded.contains(r.name.as_str())) {
        let padded = format!("{:state_w$}", r.state.as_str());
        let shown = if colour {
            format!("{}{padded}\x1b[0m", state_colour(r.state))
        } else {
            padded
        };
        let _ = writeln!(
            out,
            "{:name_w$}  {shown}  {:action_w$}  {}",
            esc(&r.name),
            r.action.as_str(),
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
        for line in [
            unobserved_line(r),
            override_line(report, r),
            propose_line(r),
        ]
        .into_iter()
        .flatten()
        {
            let _ = writeln!(out, "{indent}{line}");
        }
    }
    if quiet > 0 {
        let _ = writeln!(
            out,
            "… and {quiet} more in sync, not listed (`--all` lists every resource)"
        );
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
    if !report.generated_at.is_empty() {
        let _ = writeln!(out, "report made {}", report.generated_at);
    }
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
    crate::escape::markdown(s)
}

fn md_code(s: &str) -> String {
    crate::escape::markdown_code(s)
}

/// Markdown for a pull-request comment or a file; `title` names what made
/// the report (`tend plan`, `tend apply`, `tend run`).
pub fn markdown(report: &Report, title: &str, all: bool) -> String {
    let mut out = String::new();
    markdown_into(&mut out, report, title, all);
    out
}

/// [`markdown`] written to `out`; `all`: list the quiet resources of a
/// large report too (see [`Report::lists_quiet`]).
pub fn markdown_into<W: Write>(out: &mut W, report: &Report, title: &str, all: bool) {
    let _ = writeln!(out, "### {title}\n");
    let _ = writeln!(
        out,
        "Source {}. {}.{}\n",
        md_escape(&source_line(report)),
        summary_line(report),
        if report.generated_at.is_empty() {
            String::new()
        } else {
            format!(" Report made {}.", report.generated_at)
        }
    );
    for (_, line) in banners(report) {
        let _ = writeln!(out, "> **{}**\n", md_escape(&line));
    }
    let folded = folded(report);
    let (listed, quiet) = report.listed(all);
    let _ = writeln!(out, "| name | state | action | reason |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for r in listed.iter().filter(|r| !folded.contains(r.name.as_str())) {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            md_code(&r.name),
            r.state.as_str(),
            r.action.as_str(),
            md_escape(&r.reason)
        );
    }
    if quiet > 0 {
        let _ = writeln!(
            out,
            "\n{quiet} more in sync are not listed (`latest.json` lists every resource)."
        );
    }
    let drifted: Vec<&ResourceReport> = report.entries().filter(|r| !r.drift.is_empty()).collect();
    if !drifted.is_empty() {
        let _ = writeln!(out, "\n#### Drift\n");
        let _ = writeln!(out, "| name | field | declared | observed | origin |");
        let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
        for r in drifted {
            for d in &r.drift {
                let _ = writeln!(
                    out,
                    "| `{}` | `{}` | {} | {} | {} |",
                    md_code(&r.name),
                    md_code(&d.field),
                    md_escape(&value(&d.desired)),
                    md_escape(&value(&d.observed)),
                    drift_origin(d.origin, d.ignored)
                );
            }
        }
    }
    let unobserved: Vec<(&ResourceReport, String)> = report
        .entries()
        .filter_map(|r| unobserved_line(r).map(|l| (r, l)))
        .collect();
    if !unobserved.is_empty() {
        let _ = writeln!(out, "\n#### Not observed\n");
        for (r, line) in unobserved {
            let _ = writeln!(out, "- `{}`: {}", md_code(&r.name), md_escape(&line));
        }
    }
    let overridden: Vec<(&ResourceReport, String)> = report
        .entries()
        .filter_map(|r| override_line(report, r).map(|l| (r, l)))
        .collect();
    if !overridden.is_empty() {
        let _ = writeln!(out, "\n#### Active overrides\n");
        for (r, line) in overridden {
            let _ = writeln!(out, "- `{}`: {}", md_code(&r.name), md_escape(&line));
        }
    }
    let kept: Vec<&ResourceReport> = report.entries().filter(|r| r.propose.is_some()).collect();
    if !kept.is_empty() {
        let _ = writeln!(out, "\n#### Changes made at the provider, to keep in Git\n");
        for r in kept {
            if let Some(line) = propose_line(r) {
                let _ = writeln!(out, "- `{}`: {}", md_code(&r.name), md_escape(&line));
            }
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
                md_code(&e.file),
                e.line,
                e.column,
                md_escape(&e.message)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::value;
    use serde_json::json;

    #[test]
    fn lists_and_maps_read_as_words_not_json() {
        assert_eq!(value(&json!([{"name": "citext"}])), "citext");
        assert_eq!(
            value(&json!([{"name": "citext"}, {"name": "postgis", "version": "3.4"}])),
            "citext, postgis 3.4"
        );
        assert_eq!(value(&json!([])), "(none)");
        assert_eq!(value(&json!(["public", "app"])), "public, app");
        assert_eq!(value(&json!({"work_mem": "64MB"})), "work_mem=64MB");
        assert_eq!(value(&json!(null)), "(unset)");
        assert_eq!(value(&json!(50)), "50");
    }
}
