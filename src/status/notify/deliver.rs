//! Queueing and delivering notifications.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::commit_status::CommitStatus;
use super::{
    Condition, Transition, alertmanager, commit_status, conditions, payload, stored, transitions,
};
use crate::config::notify::{NotifyEvent, NotifyFormat};
use crate::config::{Config, ConfigError, secret};
use crate::journal::{PendingNotification, QueuedNotification, StateError, StateStore, blocking};
use crate::status::report::Report;

/// One receiver, built from its `[[notify]]` entry (secrets read).
#[derive(Clone)]
pub(crate) struct Receiver {
    pub name: String,
    /// Never logged: a receiver URL can be a secret.
    url: String,
    pub format: NotifyFormat,
    pub events: Vec<NotifyEvent>,
    secret: Option<Vec<u8>>,
    /// Never logged.
    token: Option<String>,
    /// A commit status's name.
    context: String,
    /// Alertmanager: how often the firing alerts are sent again.
    pub resend: Duration,
    pub timeout: Duration,
}

impl Receiver {
    fn wants(&self, event: NotifyEvent) -> bool {
        self.events.contains(&event)
    }
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("name", &self.name)
            .field("format", &self.format)
            .field("events", &self.events)
            .field("signed", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

/// How a delivery round went.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub sent: usize,
    /// Failed this time, tried again later.
    pub failed: usize,
    /// Given up (too old, or its receiver is no longer configured).
    pub dropped: usize,
}

/// A message not delivered after this long is given up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// When a message that failed `attempts` times is tried again.
fn backoff(attempts: u32) -> Duration {
    let exp = attempts.min(6);
    Duration::from_secs(5u64 << exp).min(MAX_BACKOFF)
}

/// An Alertmanager receiver's resolved alert is queued as
/// `resolved:<event>`: it supersedes the firing alert of that event and
/// subject still waiting, so a late retry of the firing one never lands
/// after it.
pub(crate) use crate::journal::store::RESOLVED_PREFIX;

/// The event a commit status is queued under.
pub(crate) use crate::journal::store::COMMIT_STATUS_EVENT as COMMIT_STATUS;

/// The receivers of one agent and the HTTP client that reaches them.
pub(crate) struct Notifier {
    receivers: Vec<Receiver>,
    client: reqwest::Client,
    warn_before: Duration,
    report_url: Option<String>,
    /// Alertmanager receivers: the alerts that hold now (as of the last
    /// report), and when they were last sent.
    firing: Mutex<BTreeMap<String, Firing>>,
}

/// The alerts that hold for one Alertmanager receiver, and when they were
/// last sent.
type Firing = (Vec<Value>, Option<SystemTime>);

impl Notifier {
    /// The receivers `config` names, or `None` when it names none.
    pub(crate) fn from_config(config: &Config) -> Result<Option<Self>, ConfigError> {
        if config.notify.is_empty() {
            return Ok(None);
        }
        let mut receivers = Vec::new();
        for (i, entry) in config.notify.iter().enumerate() {
            let name = entry.name_at(i);
            let url = match (&entry.url, &entry.url_file) {
                (Some(url), _) => url.clone(),
                (None, Some(file)) => {
                    let setting = format!("[[notify]] {name} url_file");
                    let url = secret::read(&setting, file)?;
                    crate::config::notify::check_url(&name, &url).map_err(|message| {
                        ConfigError::Secret {
                            setting,
                            path: file.clone(),
                            message,
                            cause: None,
                        }
                    })?;
                    url
                }
                (None, None) => unreachable_url(&name)?,
            };
            let secret = entry
                .secret_file
                .as_deref()
                .map(|file| {
                    secret::read(&format!("[[notify]] {name} secret_file"), file)
                        .map(String::into_bytes)
                })
                .transpose()?;
            let token = entry
                .token_file
                .as_deref()
                .map(|file| secret::read(&format!("[[notify]] {name} token_file"), file))
                .transpose()?;
            receivers.push(Receiver {
                name,
                url,
                format: entry.format,
                events: entry.events(),
                secret,
                token,
                context: entry.context.clone().unwrap_or_else(|| "tend".into()),
                resend: entry.resend,
                timeout: entry.timeout,
            });
        }
        let client = crate::provider::tls::http_client()
            .user_agent(concat!("tend/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ConfigError::Invalid {
                path: std::path::PathBuf::from("[[notify]]"),
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Some(Notifier {
            receivers,
            client,
            warn_before: config.status.warn_before,
            report_url: config.status.report_url.clone(),
            firing: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Finds the transitions from the conditions last notified to those of
    /// `report`, and queues one message per transition and receiver that
    /// wants it, in one transaction with the new conditions (blocking:
    /// SQLite). Returns the transitions.
    ///
    /// Alertmanager receivers are queued an alert for each condition that
    /// started and a resolved alert for each that ended; commit-status
    /// receivers the fleet's state when it differs from the one they were
    /// last sent.
    pub(crate) fn record(
        &self,
        store: &StateStore,
        report: &Report,
        now: SystemTime,
    ) -> Result<(Vec<Transition>, usize), StateError> {
        let before = store.notify_conditions()?;
        let current = conditions(report, now, self.warn_before);
        let changes = transitions(&before, &current, report);
        let ended: BTreeSet<(String, Condition)> = before
            .iter()
            .filter_map(|(s, c)| Some((s.clone(), Condition::parse(c)?)))
            .filter(|held| !current.contains(held))
            .collect();
        self.remember_firing(&current, report, now);
        let status = CommitStatus::of(report, self.report_url.as_deref());
        let marks_before = if self.receivers.iter().any(|r| r.format.is_commit_status()) {
            store.notify_marks()?
        } else {
            HashMap::new()
        };
        let url = self.report_url.as_deref();
        let mut queued: Vec<QueuedNotification> = Vec::new();
        let mut marks: Vec<(String, String)> = Vec::new();
        for r in &self.receivers {
            match r.format {
                NotifyFormat::Json | NotifyFormat::Slack => {
                    for t in changes.iter().filter(|t| r.wants(t.event)) {
                        queued.push((
                            r.name.clone(),
                            t.event.as_str().to_string(),
                            t.subject.clone(),
                            payload::body(r.format, t, report),
                        ));
                    }
                }
                NotifyFormat::Alertmanager => {
                    for t in changes.iter().filter(|t| r.wants(t.event)) {
                        let Some(c) = t.started() else { continue };
                        let alert = alertmanager::firing(&t.subject, c, report, url, now, r.resend);
                        queued.push((
                            r.name.clone(),
                            t.event.as_str().to_string(),
                            t.subject.clone(),
                            Value::Array(vec![alert]).to_string(),
                        ));
                    }
                    for (subject, c) in ended.iter().filter(|(_, c)| r.wants(c.event())) {
                        let alert = alertmanager::resolved(subject, *c, report, url, now);
                        queued.push((
                            r.name.clone(),
                            format!("{RESOLVED_PREFIX}{}", c.event().as_str()),
                            subject.clone(),
                            Value::Array(vec![alert]).to_string(),
                        ));
                    }
                }
                NotifyFormat::Github | NotifyFormat::Gitlab | NotifyFormat::Gitea => {
                    let Some(status) = &status else { continue };
                    let mark = status.mark();
                    if marks_before.get(&r.name) != Some(&mark) {
                        queued.push((
                            r.name.clone(),
                            COMMIT_STATUS.to_string(),
                            status.commit.clone(),
                            status.body(r.format, &r.context),
                        ));
                        marks.push((r.name.clone(), mark));
                    }
                }
            }
        }
        let current = stored(&current);
        if queued.is_empty() && marks.is_empty() && current == before {
            return Ok((changes, 0));
        }
        store.record_notifications(&current, &queued, &marks, now)?;
        Ok((changes, queued.len()))
    }

    /// Keeps, for each Alertmanager receiver, the alerts of the conditions
    /// that hold now (sent again every `resend`).
    fn remember_firing(
        &self,
        current: &BTreeSet<(String, Condition)>,
        report: &Report,
        now: SystemTime,
    ) {
        let mut firing = self.firing.lock().unwrap_or_else(|e| e.into_inner());
        for r in self
            .receivers
            .iter()
            .filter(|r| r.format == NotifyFormat::Alertmanager)
        {
            let alerts: Vec<Value> = current
                .iter()
                .filter(|(_, c)| r.wants(c.event()))
                .map(|(subject, c)| {
                    alertmanager::firing(
                        subject,
                        *c,
                        report,
                        self.report_url.as_deref(),
                        now,
                        r.resend,
                    )
                })
                .collect();
            let entry = firing.entry(r.name.clone()).or_insert((Vec::new(), None));
            entry.0 = alerts;
        }
    }

    /// Sends the alerts that hold to each Alertmanager receiver whose
    /// `resend` has passed since it was last sent them (best effort: the
    /// next round sends them again; a resolved alert goes through the
    /// queue). Returns how many receivers were sent to.
    async fn resend_alerts(&self, now: SystemTime) -> usize {
        let due: Vec<(Receiver, String)> = {
            let mut firing = self.firing.lock().unwrap_or_else(|e| e.into_inner());
            self.receivers
                .iter()
                .filter_map(|r| {
                    let (alerts, last) = firing.get_mut(&r.name)?;
                    let due = last.is_none_or(|t| crate::time::since(now, t) >= r.resend);
                    if !due || alerts.is_empty() {
                        return None;
                    }
                    *last = Some(now);
                    Some((r.clone(), alertmanager::restamp(alerts, now, r.resend)))
                })
                .collect()
        };
        let mut sent = 0;
        for (receiver, body) in due {
            let message = PendingNotification {
                id: 0,
                receiver: receiver.name.clone(),
                event: "alerts".into(),
                subject: String::new(),
                body,
                attempts: 0,
                created_at: now,
            };
            match send(&self.client, &receiver, &message).await {
                Ok(()) => sent += 1,
                Err(error) => tracing::warn!(
                    receiver = %receiver.name,
                    "notification: the firing alerts could not be sent again ({error}); tried again in {}",
                    crate::time::duration(receiver.resend)
                ),
            }
        }
        sent
    }

    /// The soonest an Alertmanager receiver's alerts are due again.
    fn next_resend(&self) -> Option<Duration> {
        self.receivers
            .iter()
            .filter(|r| r.format == NotifyFormat::Alertmanager)
            .map(|r| r.resend)
            .min()
    }

    /// Sends every queued message that is due, all receivers at once, each
    /// attempt bounded by its receiver's timeout. A failure is tried
    /// again later (5 s, doubling, at most 5 minutes apart); a message
    /// older than a day, or for a receiver no longer configured, is given
    /// up and logged.
    pub(crate) async fn deliver_due(
        &self,
        store: &Arc<StateStore>,
        now: SystemTime,
    ) -> Result<Delivered, StateError> {
        let due = blocking(store, move |s| s.due_notifications(now, 1000)).await?;
        let mut done = Delivered::default();
        done.sent += self.resend_alerts(now).await;
        let mut sends = tokio::task::JoinSet::new();
        for message in due {
            let Some(receiver) = self.receivers.iter().find(|r| r.name == message.receiver) else {
                tracing::warn!(
                    receiver = %message.receiver,
                    "notification: {} for {} dropped: the receiver is no longer configured",
                    message.event,
                    subject_name(&message.subject)
                );
                let id = message.id;
                blocking(store, move |s| s.notification_done(id)).await?;
                done.dropped += 1;
                continue;
            };
            let client = self.client.clone();
            let receiver = receiver.clone();
            sends.spawn(async move {
                let result = send(&client, &receiver, &message).await;
                (message, receiver.name, result)
            });
        }
        while let Some(joined) = sends.join_next().await {
            let Ok((message, receiver, result)) = joined else {
                continue;
            };
            let id = message.id;
            match result {
                Ok(()) => {
                    tracing::info!(
                        receiver = %receiver,
                        "notification sent: {} for {}",
                        message.event,
                        subject_name(&message.subject)
                    );
                    blocking(store, move |s| s.notification_done(id)).await?;
                    done.sent += 1;
                }
                Err(error) if crate::time::since(now, message.created_at) >= GIVE_UP_AFTER => {
                    tracing::warn!(
                        receiver = %receiver,
                        "notification: {} for {} given up after {} attempts over a day: {error}",
                        message.event,
                        subject_name(&message.subject),
                        message.attempts + 1
                    );
                    blocking(store, move |s| s.notification_done(id)).await?;
                    done.dropped += 1;
                }
                Err(error) => {
                    let next = crate::time::add(now, backoff(message.attempts));
                    tracing::warn!(
                        receiver = %receiver,
                        "notification: {} for {} failed ({error}); tried again at {}",
                        message.event,
                        subject_name(&message.subject),
                        crate::time::rfc3339(next)
                    );
                    blocking(store, move |s| s.notification_failed(id, &error, next)).await?;
                    done.failed += 1;
                }
            }
        }
        Ok(done)
    }
}

fn unreachable_url(name: &str) -> Result<String, ConfigError> {
    Err(ConfigError::Invalid {
        path: std::path::PathBuf::from("[[notify]]"),
        message: format!("[[notify]] {name}: give url or url_file"),
    })
}

fn subject_name(subject: &str) -> &str {
    if subject == super::SOURCE {
        "the source"
    } else if subject == super::AGENT {
        "the agent"
    } else {
        subject
    }
}

/// One POST; a 2xx answer is a delivery.
async fn send(
    client: &reqwest::Client,
    receiver: &Receiver,
    message: &PendingNotification,
) -> Result<(), String> {
    let url = if receiver.format.is_commit_status() {
        commit_status::url(&receiver.url, &message.subject)
    } else {
        receiver.url.clone()
    };
    let mut request = client
        .post(url)
        .timeout(receiver.timeout)
        .header("Content-Type", "application/json")
        .header("X-Tend-Event", &message.event)
        .body(message.body.clone());
    if let Some(token) = &receiver.token {
        request = match receiver.format {
            NotifyFormat::Github => request
                .header("Authorization", format!("Bearer {token}"))
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28"),
            NotifyFormat::Gitlab => request.header("PRIVATE-TOKEN", token),
            NotifyFormat::Gitea => request.header("Authorization", format!("token {token}")),
            _ => request.header("Authorization", format!("Bearer {token}")),
        };
    }
    if let Some(secret) = &receiver.secret {
        request = request.header(
            payload::SIGNATURE_HEADER,
            payload::signature(secret, message.body.as_bytes()),
        );
    }
    match request.send().await {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) => Err(format!("the receiver answered {}", response.status())),
        // The error's text can hold the URL: only its kind is said.
        Err(e) if e.is_timeout() => Err(format!(
            "no answer within {}",
            crate::time::duration_ms(receiver.timeout)
        )),
        Err(e) if e.is_connect() => Err("cannot connect to the receiver".into()),
        Err(_) => Err("the request failed".into()),
    }
}

/// The running agent's deliveries: whenever the status writer queues
/// messages (`wake`), or the next queued one falls due, sends what is due.
/// Ends when `stop` turns true.
pub(crate) async fn run(
    notifier: Arc<Notifier>,
    store: Arc<StateStore>,
    wake: Arc<tokio::sync::Notify>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let next = blocking(&store, |s| s.next_notification_due()).await;
        let wait = match next {
            Ok(Some(at)) => at.duration_since(SystemTime::now()).unwrap_or_default(),
            Ok(None) => Duration::from_secs(3600),
            Err(e) => {
                tracing::warn!("notifications: cannot read the queue: {e}");
                Duration::from_secs(60)
            }
        };
        let wait = notifier
            .next_resend()
            .map_or(wait, |resend| wait.min(resend));
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = notifier.deliver_due(&store, SystemTime::now()).await {
            tracing::warn!("notifications: {e}");
        }
    }
}
