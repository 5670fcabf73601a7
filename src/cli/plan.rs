//! `tend plan` and `tend explain`.

use std::io::{self, IsTerminal, Write};
use std::time::SystemTime;

use clap::{Args, ValueEnum};

use super::exit;
use crate::config::Config;
use crate::cycle::{PlannedSubject, plan};
use crate::provider::Observed;
use crate::status::{build_report, render};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    Markdown,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
    /// Exit 2 when changes or drift are pending (0 in sync, 1 error).
    #[arg(long)]
    pub detailed_exitcode: bool,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The declaration's metadata.name.
    pub name: String,
}

fn load(config_path: &std::path::Path) -> Result<Config, u8> {
    Config::load(config_path).map_err(|e| {
        let _ = writeln!(io::stderr(), "tend: {e}");
        exit::CONFIG
    })
}

/// Prints a report on stdout; colour only on a terminal without `NO_COLOR`.
pub fn print_report(format: ReportFormat, report: &crate::status::Report) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match format {
        ReportFormat::Json => {
            serde_json::to_writer_pretty(&mut out, report)?;
            writeln!(out)
        }
        ReportFormat::Markdown => write!(out, "{}", render::markdown(report)),
        ReportFormat::Text => {
            let colour = io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            write!(out, "{}", render::text(report, colour))
        }
    }
}

pub fn run_plan(config_path: &std::path::Path, args: &PlanArgs) -> io::Result<u8> {
    let config = match load(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let plan = match plan(&config, SystemTime::now()) {
        Ok(p) => p,
        Err(e) => {
            writeln!(io::stderr(), "tend: {e}")?;
            return Ok(exit::ERROR);
        }
    };
    let report = build_report(&config, &plan);
    print_report(args.format, &report)?;
    let code = if report.has_errors() {
        exit::ERROR
    } else if args.detailed_exitcode && report.has_pending() {
        exit::PENDING
    } else {
        exit::OK
    };
    super::heap::release_at_exit((plan, report));
    Ok(code)
}

pub fn run_explain(config_path: &std::path::Path, args: &ExplainArgs) -> io::Result<u8> {
    let config = match load(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let now = SystemTime::now();
    let plan = match plan(&config, now) {
        Ok(p) => p,
        Err(e) => {
            writeln!(io::stderr(), "tend: {e}")?;
            return Ok(exit::ERROR);
        }
    };
    let mut out = io::stdout().lock();
    let Some(r) = plan.resources.iter().find(|r| r.name == args.name) else {
        for e in plan.errors.iter() {
            writeln!(
                io::stderr(),
                "{}:{}:{}: {}",
                e.file.display(),
                e.line,
                e.column,
                e.message
            )?;
        }
        writeln!(
            io::stderr(),
            "tend: no valid declaration named `{}` under `{}` of {} at {} (errors above, if any, may be why)",
            args.name,
            config.source.path,
            config.source.url,
            plan.commit.as_deref().unwrap_or("?")
        )?;
        return Ok(exit::ERROR);
    };
    let t = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    writeln!(out, "{}", r.name)?;
    match &r.subject {
        PlannedSubject::Declared(decl) => {
            writeln!(
                out,
                "  declaration: {}:{} at commit {} of {}, provider `{}`",
                r.file,
                decl.line,
                plan.commit.as_deref().unwrap_or("?"),
                config.source.url,
                r.provider
            )?;
            writeln!(out, "  database:    {}", decl.manifest.database_name())?;
        }
        PlannedSubject::Removed(tomb) => {
            writeln!(
                out,
                "  declaration: removed in commit {} (first seen {}), deletionPolicy {:?}, provider `{}`",
                tomb.removal_commit,
                t(tomb.removed_at),
                tomb.last.spec.deletion_policy,
                r.provider
            )?;
            writeln!(out, "  database:    {}", tomb.last.database_name())?;
        }
    }
    writeln!(out, "  spec hash:   {}", r.spec_hash)?;
    match &r.observed {
        Observed::Found(o) => {
            let age = now.duration_since(o.observed_at).unwrap_or_default();
            writeln!(
                out,
                "  observed:    {} ({:?}) at {} ({} ago)",
                o.external_id,
                o.status,
                t(o.observed_at),
                humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))
            )?;
            match o.marker() {
                Some(m) => writeln!(
                    out,
                    "  owner:       agent `{}`, declaration `{}`",
                    m.agent_id, m.declaration
                )?,
                None => writeln!(out, "  owner:       no tend marker")?,
            }
            for (field, value) in &o.fields {
                writeln!(out, "    {field} = {value}")?;
            }
        }
        Observed::NotFound => writeln!(out, "  observed:    not found at the provider")?,
        Observed::Failed(e) => writeln!(out, "  observed:    FAILED: {e}")?,
    }
    match &r.memory.applied_spec_hash {
        Some(h) => writeln!(
            out,
            "  remembered:  last applied spec {h} (commit {})",
            r.memory.applied_commit.as_deref().unwrap_or("?")
        )?,
        None => writeln!(
            out,
            "  remembered:  nothing (first sight: differences count as out-of-band)"
        )?,
    }
    let ov = &r.decision.overrides;
    if ov.is_empty() {
        writeln!(out, "  overrides:   none")?;
    } else {
        let sources: Vec<&str> = ov.sources.iter().map(|s| s.as_str()).collect();
        writeln!(
            out,
            "  overrides:   {} from {}: {}{}{}",
            ov.kind(),
            sources.join(", "),
            ov.reasons.join("; "),
            ov.expires
                .map(|e| format!("; expires {}", t(e)))
                .unwrap_or_default(),
            if ov.expired { " (EXPIRED)" } else { "" }
        )?;
        if !ov.ignore_fields.is_empty() {
            writeln!(
                out,
                "               ignored fields: {}",
                ov.ignore_fields.join(", ")
            )?;
        }
    }
    let d = &r.decision;
    writeln!(out, "  decision:    {:?} / {:?}", d.state, d.action)?;
    writeln!(
        out,
        "  rule:        {}",
        serde_json::to_value(d.rule)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    )?;
    writeln!(out, "  reason:      {}", d.reason)?;
    for x in &d.drift {
        writeln!(
            out,
            "  drift:       {} declared {} observed {} ({:?}{})",
            x.field,
            x.desired,
            x.observed,
            x.origin,
            if x.ignored { ", ignored" } else { "" }
        )?;
    }
    if let Some((kind, id)) = &r.operation {
        writeln!(out, "  operation:   {} {id}", kind.as_str())?;
    }
    if let Some(at) = d.act_at {
        writeln!(out, "  acts at:     {}", t(at))?;
    }
    Ok(exit::OK)
}
