//! The report contract (`formatVersion: 1`, camelCase, docs/reports.md).
//! Changing a field here is a breaking change for every consumer.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Config;
use crate::engine::{Action, DriftOrigin, State};
use crate::model::Diagnostic;
use crate::provider::{OperationId, OperationKind};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub format_version: u32,
    /// When the report was made (RFC 3339). Empty in reports written
    /// before it was added.
    #[serde(default)]
    pub generated_at: String,
    pub agent: AgentInfo,
    pub source: SourceInfo,
    pub summary: Summary,
    /// Shared with the parts it was merged from (the running agent holds
    /// each provider's report and the merged one: one copy of each
    /// resource's entry, not two).
    pub resources: Vec<Arc<ResourceReport>>,
    pub errors: Vec<ErrorReport>,
    /// Local overrides on names with no declaration and no resource
    /// (`tend override set --force`, or a declaration removed since): they
    /// protect nothing. Absent when there are none, so a report without
    /// them reads as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphaned_overrides: Vec<OrphanedOverrideReport>,
    /// The status branch could not be written: why, and since when.
    /// Absent while it works (or is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_branch: Option<StatusBranchReport>,
    /// The agent-wide freeze (`tend suspend`), while one is set: every
    /// change is held. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<SuspensionReport>,
    /// What the cycle of `tend apply` ran: its printed report only (the
    /// report files and the status branch do not carry it, so a cycle
    /// with nothing to do leaves them as they were). Absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedReport>,
}

/// The operations one `tend apply` cycle ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedReport {
    /// Operations run (each an intent journalled and sent).
    pub operations: usize,
    /// Those the provider confirmed done.
    pub done: usize,
    /// Those failed or refused (the resources say why).
    pub failed: usize,
}

/// `tend suspend` as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SuspensionReport {
    pub reason: String,
    /// When it was set (RFC 3339).
    pub since: String,
    /// Who set it (`uid 0 (pid 4242)`).
    pub by: String,
    /// When it ends (RFC 3339); `null`: at `tend resume`.
    pub expires: Option<String>,
    pub expired: bool,
    /// `hold` or `resume`.
    pub on_expiry: String,
    /// Whether it holds changes now (an expired one with `on-expiry:
    /// resume` does not, and is shown until `tend resume` clears it).
    pub in_force: bool,
}

impl SuspensionReport {
    /// The freeze `s` as seen at `now`.
    pub fn of(s: &crate::engine::Suspension, now: SystemTime) -> Self {
        SuspensionReport {
            reason: s.reason.clone(),
            since: rfc3339(s.since),
            by: s.by.clone(),
            expires: s.expires.map(rfc3339),
            expired: s.expired(now),
            on_expiry: match s.on_expiry {
                crate::model::OnExpiry::Hold => "hold".into(),
                crate::model::OnExpiry::Resume => "resume".into(),
            },
            in_force: s.in_force(now),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusBranchReport {
    pub branch: String,
    pub error: String,
    /// When writing it started failing (RFC 3339).
    pub since: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrphanedOverrideReport {
    pub name: String,
    pub reason: String,
    pub set_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentInfo {
    pub id: String,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceInfo {
    pub url: String,
    pub branch: String,
    /// The commit the declarations come from: while the source fails, the
    /// last accepted one (the branch may be ahead of it).
    pub commit: Option<String>,
    /// The commit's committer time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_time: Option<String>,
    /// Why the branch could not be read (fetch, rewind refused, every file
    /// invalid …): the resources are decided from `commit`, the last
    /// accepted commit. Absent while the source works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SourceErrorReport>,
}

impl SourceInfo {
    /// The source of a report decided from `commit` (no failure: the
    /// running agent marks its merged report with one).
    pub(crate) fn of(
        config: &Config,
        commit: Option<String>,
        commit_time: Option<SystemTime>,
    ) -> Self {
        SourceInfo {
            url: crate::config::redacted_url(&config.source.url),
            branch: config.source.branch.clone(),
            commit,
            commit_time: commit_time.map(rfc3339),
            error: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceErrorReport {
    pub message: String,
    /// When the source started failing (RFC 3339).
    pub since: String,
    /// Consecutive failed polls.
    pub failures: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub total: usize,
    pub in_sync: usize,
    pub drifted: usize,
    pub missing: usize,
    pub blocked: usize,
    pub overridden: usize,
    pub deleting: usize,
    pub errors: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceReport {
    pub name: String,
    pub file: String,
    pub state: State,
    pub action: Action,
    /// The rule that decided (`drift-grace`, `deletion-guard`, …: `tend
    /// explain` names the same). Absent in reports written before it was
    /// added.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub rule: Cow<'static, str>,
    pub reason: Cow<'static, str>,
    pub drift: Vec<DriftReport>,
    /// Boxed, as `operation` is: most resources have neither, and a
    /// fleet's report holds ten thousand of these, a few at a time.
    #[serde(rename = "override")]
    pub override_: Option<Box<OverrideReport>>,
    pub operation: Option<Box<OperationReport>>,
    /// When the provider's answer about it was produced (written as RFC
    /// 3339); absent when it could not be observed. Held as a time, not as
    /// its text: a fleet's report holds one for every resource, and the
    /// text is only needed when the report is written.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::optional_rfc3339"
    )]
    pub observed_at: Option<SystemTime>,
    /// Declared fields the provider could not observe this time (the
    /// extensions of a database that refuses connections): neither in sync
    /// nor drifted, unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unobserved: Vec<String>,
    /// When the held action falls due (drift grace, deletion delay, an
    /// override's expiry; RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acts_at: Option<String>,
    /// `tend propose NAME` when the resource has out-of-band drift that
    /// tend leaves alone (an override, `driftPolicy: Report`): the way to
    /// keep the change in Git.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propose: Option<String>,
    /// The tend agent whose ownership marker the database carries, when
    /// that is another agent than this one (`Blocked`). A state rebuilt
    /// without its agent id, or a changed `agent_id`, makes a whole fleet
    /// look so: the renderings then say it once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriftReport {
    pub field: String,
    pub desired: Value,
    pub observed: Value,
    pub origin: DriftOrigin,
    /// An override leaves this field alone: the difference is reported,
    /// never corrected. Absent when `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignored: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverrideReport {
    /// Comma-separated sources: `annotation`, `local`, `provider`.
    pub source: String,
    /// `paused`, `ignore-fields` or both.
    pub kind: String,
    pub fields: Vec<String>,
    pub reason: String,
    /// RFC 3339, or `null` for an override without expiry.
    pub expires: Option<String>,
    pub expired: bool,
    /// When tend first saw the oldest of the overrides (RFC 3339).
    /// `firstSeen`, as the report contract (docs/reports.md) names it;
    /// reports written before read back through the alias.
    #[serde(
        default,
        rename = "firstSeen",
        alias = "first_seen",
        skip_serializing_if = "Option::is_none"
    )]
    pub first_seen: Option<String>,
}

impl OverrideReport {
    /// Folded from several sources: `expires` is then the first of their
    /// expiries, and another may hold on after it (or have none).
    pub fn is_folded(&self) -> bool {
        self.source.contains(',')
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperationReport {
    pub id: OperationId,
    pub kind: OperationKind,
    /// `planned` in a plan; `pending`, `done` in the journal.
    pub state: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorReport {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl From<&Diagnostic> for ErrorReport {
    fn from(d: &Diagnostic) -> Self {
        ErrorReport {
            file: d.file.display().to_string(),
            line: d.line,
            column: d.column,
            message: d.message.clone(),
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    crate::time::rfc3339(t)
}

impl Report {
    /// Marks the report as made while the source fails: its resources are
    /// decided from the last accepted commit. `previous_since`: when an
    /// earlier report saw the source failing (a one-shot command knows
    /// only its own attempt), so the age of the failure survives processes.
    pub fn with_source_failure(
        mut self,
        failure: &crate::source::SourceFailure,
        previous_since: Option<&str>,
    ) -> Self {
        let since = previous_since
            .filter(|s| humantime::parse_rfc3339(s).is_ok_and(|t| t <= failure.since))
            .map_or_else(|| rfc3339(failure.since), str::to_string);
        self.source.error = Some(SourceErrorReport {
            message: failure.error.to_string(),
            since,
            failures: failure.failures,
        });
        self
    }

    /// Whether anything is pending (exit code 2 with `--detailed-exitcode`).
    pub fn has_pending(&self) -> bool {
        self.resources.iter().any(|r| {
            r.action != Action::None || !matches!(r.state, State::InSync | State::Released)
        })
    }

    /// Whether anything is an error (exit code 1): a resource, a
    /// declaration file, or the source.
    pub fn has_errors(&self) -> bool {
        self.summary.errors > 0 || self.source.error.is_some()
    }

    /// The fleet gauges of `/metrics`, counted from this report (so
    /// `/metrics` and `/v1/status` count the same resources).
    pub fn fleet(&self) -> crate::telemetry::Fleet {
        const STATES: [State; 11] = [
            State::InSync,
            State::Drifted,
            State::Missing,
            State::Overridden,
            State::Blocked,
            State::Unconvergeable,
            State::Deleting,
            State::Stalled,
            State::Released,
            State::Error,
            State::Failed,
        ];
        let states = STATES
            .iter()
            .map(|state| {
                let count = self.resources.iter().filter(|r| r.state == *state).count();
                (state.as_str(), count)
            })
            .collect();
        let drifted_fields = ["declared", "out-of-band"]
            .into_iter()
            .map(|origin| {
                let count = self
                    .resources
                    .iter()
                    .flat_map(|r| &r.drift)
                    .filter(|d| super::render::origin(d.origin) == origin)
                    .count();
                (origin, count)
            })
            .collect();
        let overrides = || self.resources.iter().filter_map(|r| r.override_.as_ref());
        let override_expiries = self
            .resources
            .iter()
            .filter_map(|r| {
                let o = r.override_.as_ref().filter(|o| !o.expired)?;
                let at = humantime::parse_rfc3339(o.expires.as_deref()?).ok()?;
                let secs = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
                Some((r.name.clone(), i64::try_from(secs).unwrap_or(i64::MAX)))
            })
            .collect();
        crate::telemetry::Fleet {
            states,
            drifted_fields,
            overrides_active: overrides().filter(|o| !o.expired).count(),
            overrides_expired: overrides().filter(|o| o.expired).count(),
            override_expiries,
            pending_deletions: self
                .resources
                .iter()
                .filter(|r| matches!(r.state, State::Deleting | State::Stalled))
                .count(),
            suspended: self.suspended.as_ref().is_some_and(|s| s.in_force),
        }
    }
}

impl Summary {
    /// `1 resource`, `6 resources`: how every rendering opens the counts.
    pub fn resources(&self) -> String {
        match self.total {
            1 => "1 resource".to_string(),
            n => format!("{n} resources"),
        }
    }

    /// The counts of `resources` and `errors` declaration errors. A
    /// released database is shown, but no longer one of the resources
    /// tend manages: the counts add up to the total without it.
    pub fn of(resources: &[Arc<ResourceReport>], errors: usize) -> Self {
        let mut summary = Summary {
            errors,
            ..Summary::default()
        };
        for r in resources {
            if r.state != State::Released {
                summary.total += 1;
            }
            match r.state {
                State::InSync => summary.in_sync += 1,
                State::Drifted | State::Unconvergeable => summary.drifted += 1,
                State::Missing => summary.missing += 1,
                State::Blocked => summary.blocked += 1,
                State::Overridden => summary.overridden += 1,
                State::Deleting | State::Stalled => summary.deleting += 1,
                // A refused operation is an error until it is resolved:
                // it must never read as healthy.
                State::Error | State::Failed => summary.errors += 1,
                State::Released => {}
            }
        }
        summary
    }
}

impl Report {
    /// One report from the reports of disjoint parts of the fleet (the
    /// daemon's provider workers): resources by name (a name reported by
    /// several parts — an unreadable state row has no provider — once),
    /// declaration errors once, the newest commit.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a Report>) -> Option<Report> {
        let parts: Vec<&Report> = parts.into_iter().collect();
        let mut merged = (*parts.first()?).clone();
        let resources: Vec<&[Arc<ResourceReport>]> =
            parts.iter().map(|p| p.resources.as_slice()).collect();
        merged.resources = super::sorted_merge::merge_by_key(&resources, |r| r.name.as_str());
        merged.merge_fields(&parts);
        Some(merged)
    }

    /// Everything of a merge of `parts` but the resources (see
    /// [`Report::merge`]); the summary counts the resources held.
    pub(crate) fn merge_fields(&mut self, parts: &[&Report]) {
        let Some((first, rest)) = parts.split_first() else {
            return;
        };
        self.generated_at.clone_from(&first.generated_at);
        // The newest commit's source (of equal committer times, the first
        // part's): a status file must not keep an older one as its
        // `decidedFrom` when the older part's entries come to say the same.
        let newest = parts.iter().rev().max_by_key(|p| &p.source.commit_time);
        let newest = newest.copied().unwrap_or(first);
        self.source.clone_from(&newest.source);
        self.errors.clone_from(&first.errors);
        self.suspended.clone_from(&first.suspended);
        self.orphaned_overrides
            .clone_from(&first.orphaned_overrides);
        for part in rest {
            if part.generated_at > self.generated_at {
                self.generated_at.clone_from(&part.generated_at);
            }
            self.errors.extend(part.errors.iter().cloned());
            // Every part reads the same state: the newest report's word.
            if part.generated_at >= self.generated_at {
                self.suspended.clone_from(&part.suspended);
            }
            self.orphaned_overrides
                .extend(part.orphaned_overrides.iter().cloned());
        }
        self.errors.sort_by(|a, b| {
            (&a.file, a.line, a.column, &a.message).cmp(&(&b.file, b.line, b.column, &b.message))
        });
        self.errors.dedup_by(|a, b| {
            (&a.file, a.line, a.column, &a.message) == (&b.file, b.line, b.column, &b.message)
        });
        // Every part computes the same orphans (they do not depend on the
        // part): kept once.
        self.orphaned_overrides.sort_by(|a, b| a.name.cmp(&b.name));
        self.orphaned_overrides.dedup_by(|a, b| a.name == b.name);
        self.summary = Summary::of(&self.resources, self.errors.len());
    }
}

/// A report with nothing decided (no snapshot to decide from): the source
/// failure it is then marked with says why.
pub(crate) fn empty_report(config: &Config, agent_id: &str, now: SystemTime) -> Report {
    Report {
        format_version: 1,
        generated_at: rfc3339(now),
        agent: AgentInfo {
            id: agent_id.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        },
        source: SourceInfo {
            url: crate::config::redacted_url(&config.source.url),
            branch: config.source.branch.clone(),
            commit: None,
            commit_time: None,
            error: None,
        },
        summary: Summary::default(),
        resources: Vec::new(),
        errors: Vec::new(),
        orphaned_overrides: Vec::new(),
        status_branch: None,
        suspended: None,
        applied: None,
    }
}

/// The most resources a rendering (text, Markdown, HTML) lists one by one
/// whatever their state: above it, the quiet ones (see
/// [`ResourceReport::is_quiet`]) are counted, not listed, so that what
/// needs attention is what a person reads (`--all` lists them; the JSON
/// always holds every one).
pub(crate) const LISTED_IN_FULL: usize = 1_000;

impl Report {
    /// Whether renderings list the quiet resources: a report of at most
    /// [`LISTED_IN_FULL`] resources, or `all` asked for.
    pub fn lists_quiet(&self, all: bool) -> bool {
        all || self.resources.len() <= LISTED_IN_FULL
    }

    /// Each resource's entry, in name order.
    pub fn entries(&self) -> impl Iterator<Item = &ResourceReport> {
        self.resources.iter().map(Arc::as_ref)
    }

    /// The resources a rendering lists (see [`Report::lists_quiet`]), and
    /// how many quiet ones it leaves out.
    pub fn listed(&self, all: bool) -> (Vec<&ResourceReport>, usize) {
        if self.lists_quiet(all) {
            return (self.entries().collect(), 0);
        }
        let listed: Vec<&ResourceReport> = self.entries().filter(|r| !r.is_quiet()).collect();
        let left_out = self.resources.len() - listed.len();
        (listed, left_out)
    }
}

impl ResourceReport {
    /// In sync with nothing more to say: no action, no drift, no
    /// override, nothing unobserved, nothing due, nothing to keep.
    pub fn is_quiet(&self) -> bool {
        self.state == State::InSync
            && self.action == Action::None
            && self.drift.is_empty()
            && self.override_.is_none()
            && self.unobserved.is_empty()
            && self.acts_at.is_none()
            && self.propose.is_none()
    }

    /// Whether this is a release shown once after it happened (not a
    /// release still to be made).
    pub fn is_shown_release(&self) -> bool {
        self.state == State::Released
            && self.action == Action::None
            && self.rule == crate::engine::Rule::Release.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn one_resource_is_one_resource() {
        let count = |total| {
            Summary {
                total,
                ..Summary::default()
            }
            .resources()
        };
        assert_eq!(count(0), "0 resources");
        assert_eq!(count(1), "1 resource");
        assert_eq!(count(2), "2 resources");
    }
}
