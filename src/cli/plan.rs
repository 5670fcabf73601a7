//! `tend plan` and `tend explain`: one read-only cycle on the shared
//! reconcile path, reported.

use std::io::{self, IsTerminal, Write};
use std::time::SystemTime;

use clap::{Args, ValueEnum};

use super::{exit, session};
use crate::engine::Rule;
use crate::escape::terminal as esc;
use crate::journal::Access;
use crate::provider::Observed;
use crate::reconcile::{Mode, Plan, PlannedResource, PlannedSubject};
use crate::status::files::ReportFiles;
use crate::status::render;
use crate::status::render::{drift_origin, value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    Markdown,
}

/// How a command prints its report.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// How to print the report.
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
    /// List every resource in the text and Markdown output. Without it, a
    /// report of more than 1,000 resources counts those in sync with
    /// nothing more to say instead of listing them (JSON always lists
    /// every one).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub output: ReportArgs,
    /// Exit 2 when changes or drift are pending (0 in sync, 1 error).
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// List only the resources tend would change or that need attention;
    /// those in sync are counted in the summary, not listed (for a
    /// pull-request comment).
    #[arg(long)]
    pub changes_only: bool,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The declaration's metadata.name.
    pub name: String,
}

/// Prints a report on stdout; colour only on a terminal without `NO_COLOR`.
/// `title` heads the Markdown (`tend plan`).
pub(super) fn print_report(
    output: &ReportArgs,
    report: &crate::status::Report,
    title: &str,
) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match output.format {
        ReportFormat::Json => {
            serde_json::to_writer_pretty(&mut out, report)?;
            writeln!(out)
        }
        ReportFormat::Markdown => write!(out, "{}", render::markdown(report, title, output.all)),
        ReportFormat::Text => {
            let colour = io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            write!(out, "{}", render::text(report, colour, output.all))
        }
    }
}

/// Opens the agent read-only and runs one read-only cycle, handing its
/// result to `f`; the exit code is `f`'s, or the failure's.
fn read_only_cycle(
    config_path: &std::path::Path,
    f: impl FnOnce(&crate::agent::Agent, session::CycleResult<'_, '_>) -> io::Result<u8>,
) -> io::Result<u8> {
    let agent = match session::open_agent(config_path, Access::ReadOnly) {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    session::one_cycle(&agent, Mode::Plan, |_| Ok(()), |result| f(&agent, result))
}

pub(super) fn run_plan(config_path: &std::path::Path, args: &PlanArgs) -> io::Result<u8> {
    read_only_cycle(config_path, |agent, result| {
        // Read, never written: plan writes nothing. It knows since when a
        // failing source has failed from the last report a writer made.
        let previous = ReportFiles::new(&agent.config().reports_dir(), 0).read_last_failures();
        let mut report = result.report(agent, &previous);
        let title = if args.changes_only {
            let before = report.resources.len();
            report.resources.retain(|r| {
                r.action != crate::engine::Action::None
                    || !matches!(
                        r.state,
                        crate::engine::State::InSync | crate::engine::State::Released
                    )
            });
            format!(
                "tend plan: {} to look at, {} in sync (not listed)",
                report.resources.len(),
                before - report.resources.len()
            )
        } else {
            "tend plan".to_string()
        };
        print_report(&args.output, &report, &title)?;
        let code = if report.has_errors() {
            exit::ERROR
        } else if args.detailed_exitcode && report.has_pending() {
            exit::PENDING
        } else {
            exit::OK
        };
        super::heap::release_at_exit(report);
        Ok(code)
    })
}

pub(super) fn run_explain(config_path: &std::path::Path, args: &ExplainArgs) -> io::Result<u8> {
    read_only_cycle(config_path, |agent, result| {
        let Some(plan) = result.outcome.map(|o| o.latest()) else {
            return Ok(exit::ERROR);
        };
        let Some(r) = plan.resources.iter().find(|r| r.name == args.name) else {
            let mut err = io::stderr().lock();
            for e in &plan.errors {
                writeln!(err, "{e}")?;
            }
            let source = &agent.config().source;
            writeln!(
                err,
                "tend: no valid declaration named `{}` under `{}` of {} at {} (errors above, if any, may be why)",
                esc(&args.name),
                esc(&source.path),
                esc(&crate::config::redacted_url(&source.url)),
                plan.commit.as_deref().unwrap_or("?")
            )?;
            return Ok(exit::ERROR);
        };
        explain(&mut io::stdout().lock(), agent, plan, r)?;
        Ok(if result.source_failure.is_some() {
            exit::ERROR
        } else {
            exit::OK
        })
    })
}

fn explain(
    out: &mut impl Write,
    agent: &crate::agent::Agent,
    plan: &Plan<'_>,
    r: &PlannedResource<'_>,
) -> io::Result<()> {
    let now = plan.now;
    let t = crate::time::rfc3339;
    writeln!(out, "{}", r.name)?;
    explain_subject(out, agent, plan, r)?;
    writeln!(out, "  spec hash:   {}", r.spec_hash)?;
    explain_observed(out, &r.observed, now)?;
    match &r.memory.applied_spec_hash {
        Some(h) => writeln!(
            out,
            "  remembered:  last applied spec {h} (commit {})",
            r.memory.applied_commit.as_deref().unwrap_or("?")
        )?,
        None if r.memory.unconfirmed_write => writeln!(
            out,
            "  remembered:  no confirmed apply; tend's own create (or update) is unconfirmed or failed partway: differences are tend's to correct, not out-of-band"
        )?,
        None => writeln!(
            out,
            "  remembered:  nothing (first sight: differences count as out-of-band)"
        )?,
    }
    if r.memory.applied_spec_hash.is_some() && r.memory.unconfirmed_write {
        writeln!(
            out,
            "               and a later write of tend's, unconfirmed or failed partway: differences are tend's to correct"
        )?;
    }
    explain_overrides(out, r)?;
    let d = &r.decision;
    writeln!(out, "  decision:    {} / {}", d.state, d.action)?;
    writeln!(out, "  rule:        {}", d.rule.as_str())?;
    writeln!(out, "  reason:      {}", esc(&d.reason))?;
    for x in &d.drift {
        writeln!(
            out,
            "  drift:       {} declared {} observed {} ({})",
            esc(&x.field),
            value(&x.desired),
            value(&x.observed),
            drift_origin(x.origin, x.ignored)
        )?;
    }
    if let Some(op) = &r.operation {
        writeln!(out, "  operation:   {} {}", op.kind.as_str(), op.id)?;
    }
    for intent in plan.intents.iter().filter(|i| i.name == r.name) {
        writeln!(
            out,
            "  journal:     {} {} ({}): {}",
            intent.kind.as_str(),
            intent.id,
            intent.rule.as_str(),
            esc(&intent.reason)
        )?;
    }
    if let Some(at) = d.act_at {
        writeln!(out, "  acts at:     {}", t(at))?;
    }
    if let Some(page) = runbook(d.rule, d.overrides.expired) {
        writeln!(out, "  runbook:     {page}")?;
    }
    Ok(())
}

/// The page an operator follows for a decision of this rule (an expired
/// override has its own).
fn runbook(rule: Rule, override_expired: bool) -> Option<&'static str> {
    if override_expired {
        return Some("docs/runbooks/override-expiry.md");
    }
    Some(match rule {
        Rule::ObservationFailed => "docs/runbooks/provider-unavailable.md",
        Rule::NameTaken
        | Rule::OwnedByOtherAgent
        | Rule::OwnedByOtherDeclaration
        | Rule::Renamed
        | Rule::RequiresReplacement
        | Rule::DeletionNotOurs => "docs/runbooks/blocked.md",
        Rule::Unconvergeable => "docs/runbooks/unconvergeable.md",
        Rule::DriftGrace | Rule::MissingOutOfBand => "docs/runbooks/drift-held.md",
        Rule::DeletionGuard => "docs/runbooks/deletion-held.md",
        Rule::DeletionStalled => "docs/runbooks/deletion-stalled.md",
        Rule::CorruptState => "docs/runbooks/state-recovery.md",
        Rule::OperationFailed => "docs/runbooks/operation-failed.md",
        Rule::Paused
        | Rule::PausedMissing
        | Rule::IgnoredDrift
        | Rule::DeletionPaused
        | Rule::InvalidProviderOverride => "docs/overrides.md",
        _ => return None,
    })
}

fn explain_subject(
    out: &mut impl Write,
    agent: &crate::agent::Agent,
    plan: &Plan<'_>,
    r: &PlannedResource<'_>,
) -> io::Result<()> {
    let t = crate::time::rfc3339;
    let commit = plan.commit.as_deref().unwrap_or("?");
    match &r.subject {
        PlannedSubject::Declared(decl) => {
            writeln!(
                out,
                "  declaration: {}:{} at commit {commit} of {}, provider `{}`",
                esc(&r.file),
                decl.line,
                esc(&crate::config::redacted_url(&agent.config().source.url)),
                r.provider
            )?;
            writeln!(
                out,
                "  database:    {}",
                esc(&decl.manifest.database_name())
            )?;
        }
        PlannedSubject::Removed(tomb) => {
            writeln!(
                out,
                "  declaration: removed in commit {} (first seen {}), deletionPolicy {}, provider `{}`",
                tomb.removal_commit,
                t(tomb.removed_at),
                match tomb.last.spec.deletion_policy {
                    crate::model::DeletionPolicy::Delete => "Delete",
                    crate::model::DeletionPolicy::Retain => "Retain",
                },
                r.provider
            )?;
            writeln!(out, "  database:    {}", esc(&tomb.last.database_name()))?;
        }
        PlannedSubject::Unreadable => {
            writeln!(out, "  declaration: unknown (the state cannot be read)")?
        }
    }
    Ok(())
}

fn explain_observed(out: &mut impl Write, observed: &Observed, now: SystemTime) -> io::Result<()> {
    match observed {
        Observed::Found(o) => {
            // The database by its name; the provider's id (a PostgreSQL
            // OID, a DBaaS id) said as what it is.
            writeln!(
                out,
                "  observed:    database `{}` ({}) at {} ({} ago); provider id {}",
                esc(&o.database_name),
                o.status.as_str(),
                crate::time::rfc3339(o.observed_at),
                crate::time::duration(crate::time::since(now, o.observed_at)),
                esc(&o.external_id)
            )?;
            // tend's ownership marker, never called "owner": that is the
            // database's owner role, one of its fields below.
            match o.marker() {
                Some(m) => writeln!(
                    out,
                    "  tend marker: agent `{}`, declaration `{}`",
                    esc(&m.agent_id),
                    esc(&m.declaration)
                )?,
                None => writeln!(out, "  tend marker: none (tend does not manage it)")?,
            }
            for (field, v) in &o.fields {
                writeln!(out, "    {} = {}", esc(field), value(v))?;
            }
            for field in &o.unobserved {
                writeln!(
                    out,
                    "    {} not observed (unknown this time: neither in sync nor drifted)",
                    esc(field)
                )?;
            }
            Ok(())
        }
        Observed::NotFound => writeln!(out, "  observed:    not found at the provider"),
        Observed::Failed(e) => writeln!(out, "  observed:    FAILED: {}", esc(&e.to_string())),
    }
}

fn explain_overrides(out: &mut impl Write, r: &PlannedResource<'_>) -> io::Result<()> {
    let ov = &r.decision.overrides;
    if ov.is_empty() {
        return writeln!(out, "  overrides:   none");
    }
    let sources: Vec<&str> = ov.sources.iter().map(|s| s.as_str()).collect();
    writeln!(
        out,
        "  overrides:   {} from {}: {}{}{}",
        ov.kind(),
        sources.join(", "),
        esc(&ov.reasons.join("; ")),
        ov.expires
            .map(|e| format!("; expires {}", crate::time::rfc3339(e)))
            .unwrap_or_default(),
        if ov.expired { " (EXPIRED)" } else { "" }
    )?;
    if !ov.ignore_fields.is_empty() {
        writeln!(
            out,
            "               ignored fields: {}",
            esc(&ov.ignore_fields.join(", "))
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_runbook_explain_names_exists() {
        let rules = [
            Rule::ObservationFailed,
            Rule::NameTaken,
            Rule::Unconvergeable,
            Rule::DriftGrace,
            Rule::DeletionGuard,
            Rule::DeletionStalled,
            Rule::CorruptState,
            Rule::Paused,
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for (rule, expired) in rules
            .iter()
            .map(|r| (*r, false))
            .chain([(Rule::Paused, true)])
        {
            let page = runbook(rule, expired).expect("a page");
            assert!(root.join(page).exists(), "{rule:?}: {page} is missing");
        }
        assert_eq!(runbook(Rule::InSync, false), None);
    }
}
