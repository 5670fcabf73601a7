//! A commit status on the source commit (GitHub, GitLab, Gitea): the
//! fleet's state in one line, `tend: 38 in sync, 2 drifted`, with a link
//! to the report.
//!
//! # Guarantees
//! * A status is sent when what it says changes (the commit, the state or
//!   the line), not every cycle: the last one sent is kept in the state.
//! * Only the newest status waits in the queue: an older one not yet
//!   delivered is superseded, so a late delivery never overwrites a newer
//!   state.

use serde_json::json;

use crate::config::notify::NotifyFormat;
use crate::engine::State;
use crate::status::report::Report;

/// What a commit status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommitStatus {
    pub commit: String,
    pub state: Outcome,
    pub description: String,
    pub target_url: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Everything as declared (overrides included: they are intended).
    Success,
    /// tend is still converging (drift, missing, deletions under way).
    Pending,
    /// Something needs a human: errors, Blocked, Stalled, Unconvergeable,
    /// Failed, an unreadable source.
    Failure,
}

/// The longest description the forges keep (GitHub's limit).
const MAX_DESCRIPTION: usize = 140;

impl CommitStatus {
    /// The status of `report`'s commit; `None` without a commit.
    pub(crate) fn of(report: &Report, target_url: Option<&str>) -> Option<Self> {
        let commit = report.source.commit.clone()?;
        let s = &report.summary;
        let needs_a_human = report.has_errors()
            || report.resources.iter().any(|r| {
                matches!(
                    r.state,
                    State::Blocked | State::Stalled | State::Unconvergeable
                )
            });
        let state = if needs_a_human {
            Outcome::Failure
        } else if s.drifted + s.missing + s.deleting > 0 {
            Outcome::Pending
        } else {
            Outcome::Success
        };
        let mut parts = vec![format!("{} in sync", s.in_sync)];
        for (n, what) in [
            (s.drifted, "drifted"),
            (s.missing, "missing"),
            (s.blocked, "blocked"),
            (s.overridden, "overridden"),
            (s.deleting, "deleting"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        match s.errors {
            0 => {}
            1 => parts.push("1 error".into()),
            n => parts.push(format!("{n} errors")),
        }
        if report.source.error.is_some() {
            parts.push("source unreadable".into());
        }
        let mut description = format!("tend: {}", parts.join(", "));
        if description.len() > MAX_DESCRIPTION {
            let mut end = MAX_DESCRIPTION - 1;
            while !description.is_char_boundary(end) {
                end -= 1;
            }
            description.truncate(end);
            description.push('…');
        }
        Some(CommitStatus {
            commit,
            state,
            description,
            target_url: target_url.map(str::to_string),
        })
    }

    /// What identifies what was sent (the receiver is sent it again only
    /// when this changes).
    pub(crate) fn mark(&self) -> String {
        format!(
            "{} {:?} {} {}",
            self.commit,
            self.state,
            self.description,
            self.target_url.as_deref().unwrap_or("")
        )
    }

    /// The request body for the forge `format`, the status named
    /// `context`.
    pub(crate) fn body(&self, format: NotifyFormat, context: &str) -> String {
        let state = match (format, self.state) {
            (_, Outcome::Success) => "success",
            (_, Outcome::Pending) => "pending",
            (NotifyFormat::Gitlab, Outcome::Failure) => "failed",
            (_, Outcome::Failure) => "failure",
        };
        let mut body = json!({
            "state": state,
            "description": self.description,
        });
        // GitLab names it `name` (`context` is an alias it also takes).
        let key = if format == NotifyFormat::Gitlab {
            "name"
        } else {
            "context"
        };
        body[key] = json!(context);
        if let Some(url) = &self.target_url {
            body["target_url"] = json!(url);
        }
        body.to_string()
    }
}

/// Where the status of `commit` is posted, from the repository's API URL
/// (`https://api.github.com/repos/OWNER/REPO`,
/// `https://gitlab.example/api/v4/projects/ID`,
/// `https://gitea.example/api/v1/repos/OWNER/REPO`).
pub(crate) fn url(repository: &str, commit: &str) -> String {
    format!("{}/statuses/{commit}", repository.trim_end_matches('/'))
}
