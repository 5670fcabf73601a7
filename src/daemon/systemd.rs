//! Telling systemd how the agent is (`Type=notify`): ready, a status line,
//! the watchdog, reloading, stopping. Without `NOTIFY_SOCKET` every call
//! does nothing.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("cannot notify the service manager: {e}");
    }
}

/// Startup is finished (after the first cycle).
pub fn ready() {
    send(&[NotifyState::Ready]);
}

/// The one-line status `systemctl status` shows.
pub fn status(line: &str) {
    send(&[NotifyState::Status(line)]);
}

pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// Reloading the configuration (`READY=1` follows when done).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// How often to ping the watchdog: half of `WATCHDOG_USEC`, if set.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|d| d / 2)
}
