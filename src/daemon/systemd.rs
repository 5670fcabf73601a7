//! Telling systemd how the agent is (`Type=notify`): ready, a status line,
//! the watchdog, reloading, stopping. Without `NOTIFY_SOCKET` every call
//! does nothing.
//!
//! Messages go through one thread of their own: sending on the notify
//! socket blocks while its receiver's queue is full, and the agent's loop
//! must never wait on that. When the thread falls behind, status lines
//! are dropped (the next one replaces them anyway).

use std::sync::OnceLock;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use sd_notify::NotifyState;

/// The notifier thread's queue.
fn notifier() -> Option<&'static SyncSender<Vec<String>>> {
    static SENDER: OnceLock<Option<SyncSender<Vec<String>>>> = OnceLock::new();
    SENDER
        .get_or_init(|| {
            std::env::var_os("NOTIFY_SOCKET")?;
            let (tx, rx) = sync_channel::<Vec<String>>(16);
            std::thread::Builder::new()
                .name("tend-sd-notify".into())
                .spawn(move || {
                    for lines in rx {
                        let states: Vec<NotifyState<'_>> =
                            lines.iter().map(|l| NotifyState::Custom(l)).collect();
                        if let Err(e) = sd_notify::notify(&states) {
                            tracing::debug!("cannot notify the service manager: {e}");
                        }
                    }
                })
                .ok()?;
            Some(tx)
        })
        .as_ref()
}

fn send(states: &[NotifyState<'_>]) {
    let Some(tx) = notifier() else { return };
    let lines = states.iter().map(ToString::to_string).collect();
    if let Err(TrySendError::Full(_)) = tx.try_send(lines) {
        tracing::debug!("the service manager is not reading notifications; one dropped");
    }
}

/// Startup is finished (after the first cycle).
pub(super) fn ready() {
    send(&[NotifyState::Ready]);
}

/// Startup is finished, and the status line that goes with it, in one
/// message (so no one reads the ready service's previous status).
pub(super) fn ready_with_status(line: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(line)]);
}

/// The one-line status `systemctl status` shows.
pub(super) fn status(line: &str) {
    send(&[NotifyState::Status(line)]);
}

pub(super) fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// Reloading the configuration (`READY=1` follows when done).
pub(super) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

pub(super) fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// How often to ping the watchdog: half of `WATCHDOG_USEC`, if set.
pub(super) fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|d| d / 2)
}
