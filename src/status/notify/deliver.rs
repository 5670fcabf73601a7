//! Queueing and delivering notifications.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Transition, conditions, payload, stored, transitions};
use crate::config::notify::{NotifyEvent, NotifyFormat};
use crate::config::{Config, ConfigError, secret};
use crate::journal::{PendingNotification, QueuedNotification, StateError, StateStore, blocking};
use crate::status::report::Report;

/// One receiver, built from its `[[notify]]` entry (secrets read).
#[derive(Clone)]
pub struct Receiver {
    pub name: String,
    /// Never logged: a receiver URL can be a secret.
    url: String,
    pub format: NotifyFormat,
    pub events: Vec<NotifyEvent>,
    secret: Option<Vec<u8>>,
    pub timeout: Duration,
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
pub struct Delivered {
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

/// The receivers of one agent and the HTTP client that reaches them.
pub struct Notifier {
    receivers: Vec<Receiver>,
    client: reqwest::Client,
    warn_before: Duration,
}

impl Notifier {
    /// The receivers `config` names, or `None` when it names none.
    pub fn from_config(config: &Config) -> Result<Option<Self>, ConfigError> {
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
            receivers.push(Receiver {
                name,
                url,
                format: entry.format,
                events: entry.events.clone(),
                secret,
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
        }))
    }

    /// Finds the transitions from the conditions last notified to those of
    /// `report`, and queues one message per transition and receiver that
    /// wants it, in one transaction with the new conditions (blocking:
    /// SQLite). Returns the transitions.
    pub fn record(
        &self,
        store: &StateStore,
        report: &Report,
        now: SystemTime,
    ) -> Result<Vec<Transition>, StateError> {
        let before = store.notify_conditions()?;
        let current = conditions(report, now, self.warn_before);
        let changes = transitions(&before, &current, report);
        let current = stored(&current);
        if changes.is_empty() && current == before {
            return Ok(changes);
        }
        let mut queued: Vec<QueuedNotification> = Vec::new();
        for t in &changes {
            for r in self
                .receivers
                .iter()
                .filter(|r| r.events.contains(&t.event))
            {
                queued.push((
                    r.name.clone(),
                    t.event.as_str().to_string(),
                    t.subject.clone(),
                    payload::body(r.format, t, report),
                ));
            }
        }
        store.record_notifications(&current, &queued, now)?;
        Ok(changes)
    }

    /// Sends every queued message that is due, all receivers at once, each
    /// attempt bounded by its receiver's timeout. A failure is tried
    /// again later (5 s, doubling, at most 5 minutes apart); a message
    /// older than a day, or for a receiver no longer configured, is given
    /// up and logged.
    pub async fn deliver_due(
        &self,
        store: &Arc<StateStore>,
        now: SystemTime,
    ) -> Result<Delivered, StateError> {
        let due = blocking(store, move |s| s.due_notifications(now, 1000)).await?;
        let mut done = Delivered::default();
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
    let mut request = client
        .post(&receiver.url)
        .timeout(receiver.timeout)
        .header("Content-Type", "application/json")
        .header("X-Tend-Event", &message.event)
        .body(message.body.clone());
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
pub async fn run(
    notifier: Arc<Notifier>,
    store: Arc<StateStore>,
    wake: Arc<tokio::sync::Notify>,
    mut stop: tokio::sync::watch::Receiver<bool>,
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
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Err(e) = notifier.deliver_due(&store, SystemTime::now()).await {
            tracing::warn!("notifications: {e}");
        }
    }
}
