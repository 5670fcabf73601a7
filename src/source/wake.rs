//! Wake-ups for the source: the poll interval with ±10% jitter, a trigger
//! other modules fire (webhook, `SIGHUP`), and for a local repository a
//! filesystem watch on its refs. Bursts coalesce: any number of wake-ups
//! before the next fetch cause one fetch.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::SourceError;

/// Fires a fetch as soon as possible. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Trigger(Arc<Notify>);

impl Trigger {
    pub fn fire(&self) {
        // One stored permit: repeated fires before the wait coalesce.
        self.0.notify_one();
    }
}

/// Why the source woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeReason {
    Interval,
    Triggered,
}

/// The wake-up sources of one tracked repository.
pub struct Wakeups {
    trigger: Trigger,
    interval: Duration,
    _watcher: Option<notify::RecommendedWatcher>,
}

/// The Git directory of a local repository URL (a path or `file://`), if
/// it is one.
pub(crate) fn local_git_dir(url: &str) -> Option<PathBuf> {
    let path = Path::new(url.strip_prefix("file://").unwrap_or(url));
    if url.contains("://") && !url.starts_with("file://") {
        return None;
    }
    let dot_git = path.join(".git");
    if dot_git.is_dir() {
        Some(dot_git)
    } else if path.join("refs").is_dir() {
        Some(path.to_path_buf())
    } else {
        None
    }
}

impl Wakeups {
    /// Sets up wake-ups; for a local repository also watches its refs.
    pub fn new(interval: Duration, url: &str) -> Result<Self, SourceError> {
        let trigger = Trigger::default();
        let watcher = match local_git_dir(url) {
            Some(git_dir) => Some(watch(&git_dir, trigger.clone())?),
            None => None,
        };
        Ok(Wakeups {
            trigger,
            interval,
            _watcher: watcher,
        })
    }

    pub fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }

    /// Waits for the next wake-up: the trigger, or the interval (with
    /// jitter), or `backoff` instead of the interval after a failure.
    pub async fn next(&self, backoff: Option<Duration>) -> WakeReason {
        let wait = backoff.unwrap_or_else(|| jitter(self.interval));
        tokio::select! {
            _ = self.trigger.0.notified() => WakeReason::Triggered,
            _ = tokio::time::sleep(wait) => WakeReason::Interval,
        }
    }
}

fn watch(git_dir: &Path, trigger: Trigger) -> Result<notify::RecommendedWatcher, SourceError> {
    let err = |e: notify::Error| SourceError::Io {
        path: git_dir.display().to_string(),
        source: crate::cause::Cause::explained(format!("cannot watch for new commits: {e}"), e),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Only changes: reading the refs (every fetch does) is an access
        // event, and waking on it would fetch forever.
        if event.is_ok_and(|e| e.kind.is_create() || e.kind.is_modify() || e.kind.is_remove()) {
            trigger.fire();
        }
    })
    .map_err(err)?;
    // Loose refs change under refs/; packed-refs and HEAD in the Git dir.
    watcher
        .watch(&git_dir.join("refs"), RecursiveMode::Recursive)
        .map_err(err)?;
    watcher
        .watch(git_dir, RecursiveMode::NonRecursive)
        .map_err(err)?;
    Ok(watcher)
}

/// `interval` ± 10%, so many agents do not poll one server in lockstep.
pub(crate) fn jitter(interval: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    let unit = (hasher.finish() % 2001) as f64 / 1000.0 - 1.0; // -1.0 ..= 1.0
    interval.mul_f64(1.0 + 0.1 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let base = Duration::from_secs(100);
        for _ in 0..200 {
            let j = jitter(base);
            assert!(
                j >= Duration::from_secs(90) && j <= Duration::from_secs(110),
                "{j:?}"
            );
        }
    }
}

#[cfg(test)]
mod coalescing {
    use super::*;

    #[test]
    fn a_burst_of_triggers_wakes_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let wakeups =
                Wakeups::new(Duration::from_millis(300), "https://example.invalid/x.git").unwrap();
            let trigger = wakeups.trigger();
            for _ in 0..10 {
                trigger.fire();
            }
            assert_eq!(wakeups.next(None).await, WakeReason::Triggered);
            assert_eq!(wakeups.next(None).await, WakeReason::Interval);
        });
    }
}
