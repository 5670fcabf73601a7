//! What each operator command does to the state, written once for both
//! ways it is carried out: by the running agent (its control channel) and
//! by the command itself when no agent runs.
//!
//! # Guarantees
//! * The same checks either way: a name no declaration or resource has
//!   is refused (`--force` sets an override anyway), an override is
//!   checked by the rules annotations in Git are, a reason is required.
//! * Nothing is written when a check fails.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::{Answer, Request};
use crate::engine::Suspension;
use crate::escape::terminal as esc;
use crate::journal::StateStore;
use crate::model::overrides::parse_override_strings;
use crate::model::validate::is_dns_label;
use crate::model::{DeletionPolicy, OnExpiry, OverrideExpiry};
use crate::source::Snapshot;

/// Where and for whom a request is carried out.
pub(crate) struct Context<'a> {
    pub store: &'a StateStore,
    /// The declarations names are checked against (the agent's snapshot,
    /// or the last accepted commit's); `Err`: why they cannot be read.
    pub declarations: Result<Option<&'a Snapshot>, &'a (dyn std::error::Error + Send + Sync)>,
    pub now: SystemTime,
    /// Who asked: `uid 0 (pid 4242)`.
    pub by: String,
    /// Carried out by the running agent (else by the command itself).
    pub by_agent: bool,
}

/// Carries `request` out; the answer says what was done.
pub(crate) fn carry_out(request: &Request, ctx: &Context<'_>) -> Answer {
    let done = match request {
        Request::OverrideSet {
            name,
            annotations,
            force,
        } => override_set(ctx, name, annotations, *force),
        Request::OverrideClear { name } => override_clear(ctx, name),
        Request::DeletionsApprove { names, reason } => approve(ctx, names, reason),
        Request::ResetAttempts { name } => reset_attempts(ctx, name),
        Request::Reconcile { names } => reconcile(ctx, names),
        Request::Suspend {
            reason,
            expires,
            on_expiry,
        } => suspend(ctx, reason, expires.as_deref(), on_expiry.as_deref()),
        Request::Resume => resume(ctx),
    };
    match done {
        Ok(text) => Answer::ok(text),
        Err(message) => Answer::refused(format!("{}: {message}\n", request.describe())),
    }
}

/// Why a request is refused: what is wrong with it, or the state's own
/// failure (kept as the cause).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// What is wrong with the request, and what to do instead.
    #[error("{0}")]
    Request(String),
    /// The state could not be read or written.
    #[error(transparent)]
    State(#[from] crate::journal::StateError),
}

impl From<String> for Refusal {
    fn from(text: String) -> Self {
        Refusal::Request(text)
    }
}

impl From<&str> for Refusal {
    fn from(text: &str) -> Self {
        Refusal::Request(text.to_string())
    }
}

/// What is known of a name.
enum Name {
    /// A declaration of the declarations, or a resource of the state.
    Known,
    /// Neither: why.
    Unknown(String),
    /// The declarations cannot be read (no commit accepted yet, or its
    /// Git data unreadable), and the state does not have it: why.
    Unchecked(String),
}

fn check_name(ctx: &Context<'_>, name: &str) -> Result<Name, Refusal> {
    if ctx.store.knows_resource(name)? {
        return Ok(Name::Known);
    }
    Ok(match &ctx.declarations {
        Ok(Some(snapshot)) => match snapshot.declared(name) {
            Some(_) => Name::Known,
            None => {
                let names: Vec<&str> = snapshot
                    .declarations
                    .declarations
                    .iter()
                    .map(|d| d.name())
                    .collect();
                let hint = crate::model::suggest::closest(name, &names)
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                Name::Unknown(format!(
                    "no declaration named `{}`{hint} in the last accepted commit {} ({} declarations) and no such resource in the state",
                    esc(name),
                    snapshot.commit.get(..12).unwrap_or(&snapshot.commit),
                    snapshot.declarations.declarations.len()
                ))
            }
        },
        Ok(None) => Name::Unchecked(
            "no commit has been accepted yet, so the name cannot be checked".to_string(),
        ),
        Err(e) => Name::Unchecked(format!(
            "the last accepted commit cannot be read ({}), so the name cannot be checked",
            esc(&e.to_string())
        )),
    })
}

/// Refuses a name the declarations are known not to have (one that cannot
/// be checked is let through: the command changes nothing for a name
/// nothing has).
fn refuse_unknown(ctx: &Context<'_>, name: &str) -> Result<(), Refusal> {
    match check_name(ctx, name)? {
        Name::Unknown(why) => Err(Refusal::Request(format!(
            "{why}; check the name (`tend plan` lists every resource)"
        ))),
        Name::Known | Name::Unchecked(_) => Ok(()),
    }
}

fn override_set(
    ctx: &Context<'_>,
    name: &str,
    annotations: &BTreeMap<String, String>,
    force: bool,
) -> Result<String, Refusal> {
    // Never stored, even with --force: no declaration can have this name.
    if !is_dns_label(name) {
        return Err(Refusal::Request(format!(
            "`{}` cannot be a declaration's name: metadata.name is a lowercase DNS label (a-z, 0-9 and `-`, at most 63 characters)",
            esc(name)
        )));
    }
    let unknown = match check_name(ctx, name)? {
        Name::Known => None,
        Name::Unknown(why) | Name::Unchecked(why) => Some(why),
    };
    if let Some(why) = &unknown
        && !force
    {
        return Err(Refusal::Request(format!(
            "{why}. Check the name (`tend plan` lists every resource); to set it anyway, add --force"
        )));
    }
    // The same rules as annotations in Git: a typo is refused, never
    // stored; said in the command's flags, not in annotation names.
    let parsed = parse_override_strings(annotations).map_err(|m| in_flags(&m))?;
    let Some(spec) = parsed.overrides else {
        return Err(Refusal::from("give --pause or --ignore-fields"));
    };
    ctx.store.set_local_override(name, annotations, ctx.now)?;
    let mut out = format!(
        "set a local override on {name} (reported as source local until Git carries an override){}\n",
        if ctx.by_agent {
            "; the running agent honours it from now on"
        } else {
            ""
        }
    );
    // An expiry already past is allowed (a runbook rehearses with one), but
    // in an emergency it is more likely a typo in the date.
    if let Some(OverrideExpiry::At(at)) = spec.expires
        && at <= ctx.now
    {
        let honoured = match spec.on_expiry {
            OnExpiry::Hold => "still honoured (on expiry: hold)",
            OnExpiry::Resume => "not honoured (on expiry: resume)",
        };
        out.push_str(&format!(
            "warning: --expires {} is already past: the override is reported EXPIRED from the start and {honoured}; was another date meant?\n",
            spec.expires_text.as_deref().unwrap_or("")
        ));
    }
    if let Some(why) = unknown {
        out.push_str(&format!(
            "warning: {why}: the override is orphaned and protects nothing until a declaration of that name exists\n"
        ));
    }
    Ok(out)
}

/// An override's problem said with `tend override set`'s flags: the
/// person typed `--expires`, not `tend.dev/override-expires`.
fn in_flags(message: &str) -> String {
    use crate::model::overrides::{
        IGNORE_FIELDS, OVERRIDE_EXPIRES, OVERRIDE_ON_EXPIRY, OVERRIDE_REASON, PAUSED,
    };
    [
        (format!("`{PAUSED}: \"true\"`"), "--pause"),
        (format!("`{PAUSED}`"), "--pause"),
        (format!("`{IGNORE_FIELDS}`"), "--ignore-fields"),
        (IGNORE_FIELDS.to_string(), "--ignore-fields"),
        (format!("`{OVERRIDE_EXPIRES}`"), "--expires"),
        (format!("`{OVERRIDE_REASON}`"), "--reason"),
        (format!("`{OVERRIDE_ON_EXPIRY}`"), "--on-expiry"),
    ]
    .iter()
    .fold(message.to_string(), |m, (from, to)| {
        m.replace(from.as_str(), to)
    })
}

fn override_clear(ctx: &Context<'_>, name: &str) -> Result<String, Refusal> {
    Ok(match ctx.store.clear_local_override(name)? {
        true => format!("cleared the local override of {}\n", esc(name)),
        false => format!("{} has no local override\n", esc(name)),
    })
}

fn approve(ctx: &Context<'_>, names: &[String], reason: &str) -> Result<String, Refusal> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(Refusal::from(
            "--reason must say why (a ticket, a change request)",
        ));
    }
    let pending: Vec<String> = ctx
        .store
        .tombstones()?
        .into_iter()
        .filter_map(Result::ok)
        .filter(|t| t.last.spec.deletion_policy == DeletionPolicy::Delete)
        .map(|t| t.name)
        .collect();
    let unknown: Vec<&str> = names
        .iter()
        .filter(|n| !pending.contains(n))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(Refusal::Request(format!(
            "no removed declaration with deletionPolicy Delete is named {}: `tend deletions list` shows the pending deletions",
            esc(&unknown.join(", "))
        )));
    }
    let mut out = String::new();
    for name in names {
        ctx.store.approve_deletion(name, reason, ctx.now)?;
        out.push_str(&format!(
            "approved the deletion of {}: {}\n",
            esc(name),
            esc(reason)
        ));
    }
    Ok(out)
}

fn reset_attempts(ctx: &Context<'_>, name: &str) -> Result<String, Refusal> {
    refuse_unknown(ctx, name)?;
    Ok(match ctx.store.reset_attempts(name)? {
        true => format!(
            "forgot the failed update attempts of {}: the next cycle tries its fields again\n",
            esc(name)
        ),
        false => format!("{} has no failed update attempts\n", esc(name)),
    })
}

fn reconcile(ctx: &Context<'_>, names: &[String]) -> Result<String, Refusal> {
    if !ctx.by_agent && names.is_empty() {
        return Err(
            "no agent is running on this state, so nothing reconciles continuously: `tend apply` runs one cycle now, `systemctl start tend` starts the agent"
                .into(),
        );
    }
    for name in names {
        refuse_unknown(ctx, name)?;
    }
    // A named resource the provider refused an operation of is retried:
    // its failure is forgotten, and the next cycle sends it again.
    let mut out = String::new();
    for name in names {
        if ctx.store.clear_failure(name)? {
            out.push_str(&format!(
                "{}: the refused operation is sent again (a new attempt)\n",
                esc(name)
            ));
        }
    }
    out.push_str(&match (ctx.by_agent, names.is_empty()) {
        (true, true) => "the agent fetches the source and reconciles every resource now\n".into(),
        (true, false) => format!(
            "the agent fetches the source and reconciles every resource now, {} included\n",
            esc(&names.join(", "))
        ),
        (false, _) => {
            "no agent is running on this state: `tend apply` runs the next cycle\n".into()
        }
    });
    Ok(out)
}

fn suspend(
    ctx: &Context<'_>,
    reason: &str,
    expires: Option<&str>,
    on_expiry: Option<&str>,
) -> Result<String, Refusal> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(Refusal::from(
            "--reason must say why (an incident, a change freeze)",
        ));
    }
    let expires = match expires
        .map(crate::model::overrides::parse_expiry)
        .transpose()?
    {
        None => None,
        Some(OverrideExpiry::At(at)) => Some(at),
        Some(OverrideExpiry::After(after)) => Some(crate::time::add(ctx.now, after)),
    };
    let on_expiry = match on_expiry {
        None | Some("hold") => OnExpiry::Hold,
        Some("resume") => OnExpiry::Resume,
        Some(other) => {
            return Err(Refusal::Request(format!(
                "--on-expiry must be hold or resume, found `{}`",
                esc(other)
            )));
        }
    };
    let suspension = Suspension {
        reason: reason.to_string(),
        since: ctx.now,
        expires,
        on_expiry,
        by: ctx.by.clone(),
    };
    let replaced = ctx.store.suspension()?.is_some();
    ctx.store.set_suspension(&suspension)?;
    Ok(format!(
        "{}suspended: {}\n",
        if replaced {
            "replaced the suspension in force; "
        } else {
            ""
        },
        suspension.describe(ctx.now)
    ))
}

fn resume(ctx: &Context<'_>) -> Result<String, Refusal> {
    Ok(match ctx.store.clear_suspension()? {
        true => format!(
            "resumed: {}\n",
            if ctx.by_agent {
                "the agent acts again from its next cycle (started now)"
            } else {
                "the agent acts again when it runs"
            }
        ),
        false => "the agent is not suspended\n".to_string(),
    })
}
