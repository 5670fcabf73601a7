//! The Git source (docs/source.md): fetch the tracked branch into the state
//! dir and read declarations straight from the fetched commit's tree.
//!
//! # Guarantees
//! * tend always knows which commit its desired state comes from.
//! * A broken fetch is never mistaken for "everything was deleted": a failed
//!   fetch, a missing branch or path, or a tree in which every file fails to
//!   parse keeps the last good snapshot. Only a successfully read commit can
//!   remove a declaration.
//! * A new head that does not descend from the last accepted commit is
//!   refused unless `allow_rewind` is set.
//! * With `verify` set, a new head that is not signed by an allowed key is
//!   refused (`trust`).
//!
//! All `git2` calls are blocking functions over paths; async callers run
//! them on `spawn_blocking` (a `Repository` is not `Sync`).

pub(crate) mod auth;
pub(crate) mod cache_pack;
pub(crate) mod cache_writer;
pub(crate) mod changes;
pub(crate) mod fetch;
pub(crate) mod parse_cache;
pub(crate) mod reader_repo;
pub(crate) mod relisting;
pub(crate) mod snapshot;
pub(crate) mod tracker;
pub(crate) mod transport;
pub(crate) mod trust;
pub(crate) mod wake;

use crate::config::redacted_url;
use std::time::Duration;

pub(crate) use cache_writer::CacheWriting;
pub(crate) use changes::KeptChanges;
pub use snapshot::Snapshot;
pub(crate) use tracker::SourceFailure;
pub use tracker::{PollOutcome, Source};
pub(crate) use wake::Trigger;
pub use wake::Wakeups;

/// Starts libgit2's one-time initialisation on a thread of its own, for a
/// command that will read the source after other start-up work (the
/// configuration, the state store, the providers).
///
/// The initialisation loads OpenSSL and the system's trusted roots, tens
/// of milliseconds of one core, whatever the source's transport: done
/// beside the rest of the start, a one-shot command does not wait for it
/// alone. The first libgit2 call waits for it to finish (libgit2's own
/// once-only guard), so nothing can use libgit2 half-initialised.
pub(crate) fn start_libgit2_init() {
    let spawned = std::thread::Builder::new()
        .name("libgit2-init".into())
        // Caching is on by default: this changes nothing but runs the
        // initialisation.
        .spawn(|| {
            libgit2();
            git2::opts::enable_caching(true)
        });
    if let Err(e) = spawned {
        tracing::debug!("libgit2 initialises on first use: {e}");
    }
}

static LIBGIT2: std::sync::Once = std::sync::Once::new();

/// Sets libgit2 up for tend, once per process; every path into libgit2
/// calls this first. The user's own Git configuration
/// (`~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`) is not read: what tend
/// does must not depend on who runs it (the service has no home), and a
/// command run as the state dir's owner with root's `HOME` kept would
/// fail on a `~/.gitconfig` it may not read ("failed to stat
/// '/root/.gitconfig'"). The system's `/etc/gitconfig` still applies.
pub(crate) fn libgit2() {
    LIBGIT2.call_once(|| {
        for level in [git2::ConfigLevel::Global, git2::ConfigLevel::XDG] {
            // SAFETY: libgit2's global options are not synchronised; this
            // runs once, and every path of tend into libgit2 passes here
            // first (the `Once` makes later callers wait for it).
            if let Err(e) = unsafe { git2::opts::set_search_path(level, "") } {
                tracing::debug!("libgit2: cannot ignore the {level:?} configuration: {e}");
            }
        }
        // A local source owned by another user (root's checkout, read by
        // the unit's dynamic user) is only fetched from: libgit2 runs no
        // hook or configured program of it. tend's own repositories are
        // checked by tend (the state dir's trust walk, the reader cache's
        // ownership), so libgit2's owner check only refused a read.
        // SAFETY: as above.
        if let Err(e) = unsafe { git2::opts::set_verify_owner_validation(false) } {
            tracing::debug!("libgit2: cannot turn its owner check off: {e}");
        }
        // Objects are not hashed again at every read. Every object in
        // tend's repositories was hashed when it came in (a fetched pack's
        // by the indexer, which names objects by their content; tend's own
        // status commits by libgit2 as it wrote them), and zlib's checksum
        // still catches a damaged object; Git itself does not hash objects
        // it reads either. At 100,000 resources, a status commit's push
        // read (and hashed) every tree of the branch's last commit: a
        // quarter of the push.
        git2::opts::strict_hash_verification(false);
        // SAFETY: as above.
        unsafe { transport::set_libgit2_timeouts() };
    });
}

/// The bare repository the source is fetched into, in `state_dir`.
pub(crate) fn repo_dir(state_dir: &std::path::Path) -> std::path::PathBuf {
    state_dir.join("source").join("repo.git")
}

/// `signed by X`, or `unsigned` when nobody signed.
fn signed_by(signer: &str) -> String {
    if signer == "unsigned" {
        signer.to_string()
    } else {
        format!("signed by {signer}")
    }
}

/// What went wrong reading the source. Every variant names what to do,
/// and shows the URL redacted ([`redacted_url`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SourceError {
    #[error(
        "cannot fetch {}: {message} (docs/runbooks/source-unreachable.md)",
        redacted_url(url)
    )]
    Fetch {
        url: String,
        message: String,
        /// libgit2's failure, when the message reports one.
        #[source]
        cause: Option<crate::cause::Cause>,
    },
    /// Pushing (the status branch) failed.
    #[error(
        "cannot push to {}: {message} (docs/runbooks/status-push-failing.md)",
        redacted_url(url)
    )]
    Push {
        url: String,
        message: String,
        #[source]
        cause: Option<crate::cause::Cause>,
    },
    #[error(
        "authentication to {} failed: {message}; check token_file / ssh_key_file in [source] (docs/runbooks/source-unreachable.md)",
        redacted_url(url)
    )]
    Auth {
        url: String,
        message: String,
        #[source]
        cause: Option<crate::cause::Cause>,
    },
    #[error("host key of {host} is not trusted: {message}")]
    HostKey { host: String, message: String },
    #[error(
        "branch `{branch}` does not exist at {}; check [source] branch",
        redacted_url(url)
    )]
    BranchMissing { url: String, branch: String },
    #[error("path `{path}` does not exist in commit {commit}; check [source] path")]
    PathMissing { path: String, commit: String },
    #[error(
        "refusing commit {new}: it does not descend from the last accepted commit {old} (history rewritten, or a stale mirror); set allow_rewind = true in [source] to accept it (docs/runbooks/history-rewritten.md)"
    )]
    Rewind { old: String, new: String },
    #[error(
        "refusing commit {commit}: {}: {reason}; it is not applied (docs/runbooks/unverified-commit.md)",
        signed_by(signer)
    )]
    Unverified {
        commit: String,
        /// Who signed it ("unsigned" when nobody did).
        signer: String,
        reason: String,
    },
    #[error(
        "every one of the {files} declaration files in commit {commit} fails to parse; keeping the last good snapshot. {first}"
    )]
    AllFilesInvalid {
        commit: String,
        files: usize,
        /// The first problems (`tend validate` on a checkout lists all).
        first: String,
    },
    #[error(
        "the tree under `{path}` in commit {commit} has more than {limit} entries (counting every path through shared subtrees): tend does not read it; split the repository or point [source] path at a smaller part"
    )]
    TreeTooLarge {
        path: String,
        commit: String,
        limit: usize,
    },
    #[error("local Git data in {path} is unusable: {source}")]
    Repository {
        path: String,
        #[source]
        source: crate::cause::Cause,
    },
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: crate::cause::Cause,
    },
}

/// The first few diagnostics of a refused commit, for its error message.
pub(crate) fn first_problems<'a>(
    diagnostics: impl Iterator<Item = &'a crate::model::Diagnostic>,
) -> String {
    let shown: Vec<String> = diagnostics.take(3).map(|d| d.to_string()).collect();
    format!(
        "First problems: {}{}",
        shown.join("; "),
        if shown.len() == 3 { "; …" } else { "" }
    )
}

impl SourceError {
    /// How long to wait before the next attempt after `failures`
    /// consecutive failures: exponential from 5 s, capped at 5 minutes.
    pub fn backoff(failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(6);
        Duration::from_secs(5u64 << exp).min(Duration::from_secs(300))
    }
}

/// Follows the branch until every receiver is gone: poll (on the blocking
/// pool), publish the outcome, wait for the next wake-up (backing off while
/// the source fails).
pub async fn follow(
    mut source: Source,
    wakeups: Wakeups,
    outcomes: tokio::sync::watch::Sender<Option<PollOutcome>>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        // A fetch under way is never abandoned on a thread of its own (the
        // next follower would fetch beside it): the follower ends between
        // fetches, and a fetch ends within `[source] timeout`.
        if stop.is_cancelled() {
            return;
        }
        let mut poll = tokio::task::spawn_blocking(move || {
            let outcome = source.poll(std::time::SystemTime::now());
            (source, outcome)
        });
        // A poll past its deadline (what no socket timeout bounds: a DNS
        // lookup that hangs, a stuck file system) is said as a source
        // failure while it is awaited, never a silent wait.
        let limit =
            transport::timeout() + transport::timeout().min(std::time::Duration::from_secs(30));
        let polled = match tokio::time::timeout(limit, &mut poll).await {
            Ok(polled) => polled,
            Err(_) => {
                let last = outcomes.borrow().clone();
                let stalled = SourceError::Fetch {
                    url: String::from("the source"),
                    message: format!(
                        "the fetch has not returned after {} (twice [source] timeout, at most 30 s more): something no timeout bounds is stuck (a DNS lookup, the file system); it is awaited",
                        crate::time::duration(limit)
                    ),
                    cause: None,
                };
                let failure = Some(tracker::SourceFailure {
                    error: stalled,
                    since: last
                        .as_ref()
                        .and_then(|o| o.failure.as_ref().map(|f| f.since))
                        .unwrap_or_else(std::time::SystemTime::now),
                    failures: last
                        .as_ref()
                        .and_then(|o| o.failure.as_ref().map(|f| f.failures))
                        .unwrap_or(0)
                        + 1,
                });
                let _ = outcomes.send(Some(PollOutcome {
                    snapshot: last.and_then(|o| o.snapshot),
                    changed: false,
                    failure,
                }));
                tokio::select! {
                    polled = &mut poll => polled,
                    _ = stop.cancelled() => return,
                }
            }
        };
        let Ok((returned, outcome)) = polled else {
            return;
        };
        source = returned;
        let backoff = outcome
            .failure
            .as_ref()
            .map(|f| SourceError::backoff(f.failures));
        if outcomes.send(Some(outcome)).is_err() {
            return;
        }
        tokio::select! {
            _ = wakeups.next(backoff) => {}
            _ = stop.cancelled() => return,
        }
    }
}
