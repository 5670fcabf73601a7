//! Where log lines go: the systemd journal (structured fields: resource,
//! operation, provider …) when stderr is the journal (`JOURNAL_STREAM`),
//! JSON lines with `TEND_LOG_FORMAT=json`, human text otherwise. `TEND_LOG`
//! filters (default `tend=info`).
//!
//! No log line carries a secret: secrets are read from files into the
//! components that use them and never formatted (errors name the setting
//! and the file, not the content).

use std::io::{self, IsTerminal};
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn filter() -> (EnvFilter, bool) {
    match EnvFilter::try_from_env("TEND_LOG") {
        Ok(chosen) => (chosen, true),
        Err(_) => (EnvFilter::new("tend=info"), false),
    }
}

/// Whether stderr is the journal stream systemd connected (its device and
/// inode as `JOURNAL_STREAM` names them).
fn stderr_is_journal() -> bool {
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.split_once(':') else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Installs the logger for this process. `long_running`: `tend run`,
/// whose text lines outside the journal carry the wall-clock time (a
/// terminal or a container log has none of its own to tell when an agent
/// did something; a one-shot command's lines need none).
pub(super) fn init(long_running: bool) {
    let (filter, debugging) = filter();
    if std::env::var("TEND_LOG_FORMAT").as_deref() == Ok("json") {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(io::stderr)
            .with_target(false)
            .try_init();
        return;
    }
    if stderr_is_journal()
        && let Ok(journald) = tracing_journald::layer()
    {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(
                journald
                    .with_syslog_identifier("tend".into())
                    // Fields as docs/operations.md names them (`PROVIDER`, not
                    // the layer's default `F_PROVIDER`).
                    .with_field_prefix(None),
            )
            .try_init();
        return;
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_target(false);
    // With `TEND_LOG` set, each line carries the time since start, which
    // is what phase timings need; otherwise `tend run` carries the UTC
    // time and a one-shot command none.
    let _ = if debugging {
        builder
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .try_init()
    } else if long_running {
        builder
            .with_timer(tracing_subscriber::fmt::time::SystemTime)
            .try_init()
    } else {
        builder.without_time().try_init()
    };
}
