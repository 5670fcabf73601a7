//! `[[notify]]`: the receivers transitions are sent to.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::values;

/// What a notification says happened. The names are the contract
/// (`events = [...]`, and the `event` of every payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyEvent {
    /// Out-of-band drift appeared on a resource (drift an override leaves
    /// alone is expected, and not news).
    DriftDetected,
    /// An override expires within `[status] warn_before`.
    OverrideExpiring,
    /// An override expired.
    OverrideExpired,
    Blocked,
    Stalled,
    Unconvergeable,
    /// The source cannot be read.
    SourceError,
    /// The agent was suspended (`tend suspend`): it changes nothing.
    Suspended,
    /// The provider refused an operation for good: the resource is
    /// `Failed` (not retried until something changes).
    OperationFailed,
    /// The mass-deletion guard tripped: the resource's deletion is held
    /// (with the counts and the approve command).
    DeletionHeld,
    /// A resource is in `Error`: not observed, or an invalid provider
    /// label; nothing is done about it.
    Error,
    /// Everything that was wrong with a resource (or the source) is gone.
    Recovered,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 12] = [
        NotifyEvent::DriftDetected,
        NotifyEvent::OverrideExpiring,
        NotifyEvent::OverrideExpired,
        NotifyEvent::Blocked,
        NotifyEvent::Stalled,
        NotifyEvent::Unconvergeable,
        NotifyEvent::SourceError,
        NotifyEvent::Suspended,
        NotifyEvent::OperationFailed,
        NotifyEvent::DeletionHeld,
        NotifyEvent::Error,
        NotifyEvent::Recovered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::DriftDetected => "drift-detected",
            NotifyEvent::OverrideExpiring => "override-expiring",
            NotifyEvent::OverrideExpired => "override-expired",
            NotifyEvent::Blocked => "blocked",
            NotifyEvent::Stalled => "stalled",
            NotifyEvent::Unconvergeable => "unconvergeable",
            NotifyEvent::SourceError => "source-error",
            NotifyEvent::Suspended => "suspended",
            NotifyEvent::OperationFailed => "operation-failed",
            NotifyEvent::DeletionHeld => "deletion-held",
            NotifyEvent::Error => "error",
            NotifyEvent::Recovered => "recovered",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// How a payload is shaped, and what the receiver is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotifyFormat {
    /// tend's own JSON (docs/reports.md).
    #[default]
    Json,
    /// A Slack incoming-webhook message (text and blocks).
    Slack,
    /// Alertmanager's API (`POST /api/v2/alerts`): an alert per condition
    /// while it holds (sent again every `resend`), resolved when it ends.
    Alertmanager,
    /// A commit status on the source commit, through GitHub's API.
    Github,
    /// … GitLab's API.
    Gitlab,
    /// … Gitea's (and Forgejo's) API.
    Gitea,
}

impl NotifyFormat {
    /// Whether the receiver is a forge's commit-status API: it is sent the
    /// fleet's state on each change, not transitions.
    pub fn is_commit_status(self) -> bool {
        matches!(
            self,
            NotifyFormat::Github | NotifyFormat::Gitlab | NotifyFormat::Gitea
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyFormat::Json => "json",
            NotifyFormat::Slack => "slack",
            NotifyFormat::Alertmanager => "alertmanager",
            NotifyFormat::Github => "github",
            NotifyFormat::Gitlab => "gitlab",
            NotifyFormat::Gitea => "gitea",
        }
    }
}

/// One `[[notify]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// The receiver's name in logs and the state dir (`notify-1`, … by
    /// default): a receiver URL can be a secret (a Slack webhook's is), so
    /// it is never logged.
    pub name: Option<String>,
    /// Where to POST (http or https).
    pub url: Option<String>,
    /// A file holding the URL instead (systemd `LoadCredential=`).
    pub url_file: Option<PathBuf>,
    #[serde(default)]
    pub format: NotifyFormat,
    /// The events this receiver gets (default: all). Not for commit
    /// statuses, which say the fleet's state.
    pub events: Option<Vec<NotifyEvent>>,
    /// Signs each body: `X-Tend-Signature: sha256=<hex HMAC-SHA256>`.
    pub secret_file: Option<PathBuf>,
    /// The API token (commit statuses: required; Alertmanager: sent as a
    /// bearer token when given), read from this file.
    pub token_file: Option<PathBuf>,
    /// A commit status's context (its name on the commit; default `tend`).
    pub context: Option<String>,
    /// Alertmanager: how often the alerts that hold are sent again; each
    /// ends `4 × resend` after it was sent unless sent again.
    #[serde(default = "one_minute", deserialize_with = "values::duration")]
    pub resend: Duration,
    /// How long one delivery may take.
    #[serde(default = "ten_seconds", deserialize_with = "values::duration")]
    pub timeout: Duration,
}

fn one_minute() -> Duration {
    Duration::from_secs(60)
}

fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}

/// The longest `timeout` accepted: a receiver that needs longer is broken.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(300);

impl NotifyConfig {
    /// The entry's name (`notify-<n>` for the `n`-th when it has none).
    pub fn name_at(&self, index: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("notify-{}", index + 1))
    }

    /// The events this receiver gets.
    pub fn events(&self) -> Vec<NotifyEvent> {
        self.events
            .clone()
            .unwrap_or_else(|| NotifyEvent::ALL.to_vec())
    }

    /// Checks what TOML cannot say; the message names the entry.
    pub fn check(&self, index: usize) -> Result<(), String> {
        let name = self.name_at(index);
        let format = self.format.as_str();
        if self.format.is_commit_status() {
            if self.token_file.is_none() {
                return Err(format!(
                    "[[notify]] {name}: format = \"{format}\" needs token_file (a token that may set commit statuses on the repository)"
                ));
            }
            if self.events.is_some() {
                return Err(format!(
                    "[[notify]] {name}: events does not apply to format = \"{format}\": a commit status says the fleet's state whenever it changes; remove events"
                ));
            }
        } else if self.context.is_some() {
            return Err(format!(
                "[[notify]] {name}: context is the name of a commit status: it applies to format github, gitlab or gitea only"
            ));
        }
        if self.format != NotifyFormat::Alertmanager && self.resend != one_minute() {
            return Err(format!(
                "[[notify]] {name}: resend applies to format = \"alertmanager\" only"
            ));
        }
        if self.resend < Duration::from_secs(1) || self.resend > Duration::from_secs(24 * 3600) {
            return Err(format!(
                "[[notify]] {name}: resend must be between 1s and 24h"
            ));
        }
        if let Some(context) = &self.context
            && (context.is_empty() || context.len() > 100 || context.chars().any(char::is_control))
        {
            return Err(format!(
                "[[notify]] {name}: context must be 1 to 100 characters without control characters"
            ));
        }
        match (&self.url, &self.url_file) {
            (Some(_), Some(_)) => {
                return Err(format!("[[notify]] {name}: give url or url_file, not both"));
            }
            (None, None) => {
                return Err(format!(
                    "[[notify]] {name}: give url (or url_file, a file holding it)"
                ));
            }
            (Some(url), None) => check_url(&name, url)?,
            (None, Some(_)) => {}
        }
        if self.events.as_ref().is_some_and(Vec::is_empty) {
            return Err(format!(
                "[[notify]] {name}: events is empty; leave it out to get every event"
            ));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(format!(
                "[[notify]] {name}: timeout must be more than 0 and at most {}",
                crate::time::duration(MAX_TIMEOUT)
            ));
        }
        if let Some(n) = &self.name
            && (n.is_empty() || n.len() > 63 || n.chars().any(char::is_control))
        {
            return Err(format!(
                "[[notify]] name {n:?} must be 1 to 63 characters without control characters"
            ));
        }
        Ok(())
    }
}

/// A receiver URL must be http or https (without credentials in it; a
/// token goes in the URL's path, as Slack's, or a signature secret).
pub(crate) fn check_url(name: &str, url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("[[notify]] {name}: url is not an http(s) URL"));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!(
            "[[notify]] {name}: url must be http or https, not {scheme}"
        ));
    }
    if rest.split('/').next().unwrap_or("").contains('@') {
        return Err(format!(
            "[[notify]] {name}: url carries credentials (user:password@): use secret_file to sign the body instead"
        ));
    }
    Ok(())
}
