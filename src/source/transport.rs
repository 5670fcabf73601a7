//! What every conversation with the source remote shares: the credential
//! and host-key callbacks, the headers, the redirect policy; and the two
//! plain operations the status branch needs: fetch one branch into a local
//! ref, push one local ref to one branch (never forced).
//!
//! # Guarantees
//! * Credentials go to the configured origin only, and with a token no
//!   redirect to another host is followed (as for the tracked branch).
//! * [`push`] never forces: a remote branch that moved since it was
//!   fetched refuses the update, and the caller sees
//!   [`PushOutcome::Rejected`], never a lost commit.

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use git2::{FetchOptions, FetchPrune, Oid, PushOptions, RemoteCallbacks, RemoteRedirect};

use super::SourceError;
use super::auth::Credentials;
use crate::cause::Cause;

/// How long one fetch or push may take as a whole (`[source] timeout`),
/// in milliseconds.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(300_000);
/// The most one connection attempt waits.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most one read waits (a server that accepts and never answers).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Sets `[source] timeout` for the conversations that start from now (a
/// reload's new value applies to the next fetch).
pub(crate) fn set_timeout(timeout: Duration) {
    TIMEOUT_MS.store(
        u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// `[source] timeout`.
pub(crate) fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// The longest one conversation waits after [`cancel_conversations`]: a
/// silent server is cut by the read bound, any other at its next bytes.
pub(crate) fn cancel_wait() -> Duration {
    READ_TIMEOUT.min(timeout())
}

/// Bumped to cancel every conversation under way (the agent stops).
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Cancels every fetch and push under way, at their next bytes: a stop or
/// a reload does not wait out a slow transfer.
pub(crate) fn cancel_conversations() {
    EPOCH.fetch_add(1, Ordering::SeqCst);
}

/// libgit2's own bounds on a connection and on one read, from `[source]
/// timeout` as set when libgit2 is first used: a server that accepts and
/// never answers ends the conversation, it does not hold it forever.
///
/// # Safety
/// Writes libgit2's unsynchronised globals: call it once, before any
/// conversation (see [`super::libgit2`]).
pub(super) unsafe fn set_libgit2_timeouts() {
    let ms = |d: Duration| libc::c_int::try_from(d.as_millis()).unwrap_or(libc::c_int::MAX);
    let total = timeout();
    // SAFETY: the caller's.
    unsafe {
        if let Err(e) =
            git2::opts::set_server_connect_timeout_in_milliseconds(ms(CONNECT_TIMEOUT.min(total)))
        {
            tracing::warn!("libgit2: cannot bound connections: {e}");
        }
        if let Err(e) = git2::opts::set_server_timeout_in_milliseconds(ms(READ_TIMEOUT.min(total)))
        {
            tracing::warn!("libgit2: cannot bound reads: {e}");
        }
    }
}

/// The message of a conversation that ran out of time.
fn timed_out(limit: Duration) -> String {
    format!(
        "no answer, or not all of it, within {} ([source] timeout; one read waits at most {}): the server accepted the connection and then stalled",
        crate::time::duration(limit),
        crate::time::duration(READ_TIMEOUT.min(limit))
    )
}

/// A fetch that libgit2 ended on its own read or connect timeout.
pub(super) fn failed_fetch(url: &str, e: &git2::Error) -> SourceError {
    Way::Fetch.timeout_failure(url, e)
}

/// Whether libgit2's error is its own read or connect timeout.
fn is_timeout(e: &git2::Error) -> bool {
    let m = e.message().to_ascii_lowercase();
    m.contains("timed out") || m.contains("timeout")
}

/// Builds the callbacks for a remote at `url`; a host-key refusal, or the
/// conversation running past `[source] timeout` (checked whenever data
/// arrives: a server that trickles is cut off too), is kept in
/// `host_error` (libgit2 only passes a string back).
pub(crate) fn callbacks<'a>(
    url: &'a str,
    credentials: &'a Credentials,
    host_error: &'a RefCell<Option<SourceError>>,
) -> RemoteCallbacks<'a> {
    let mut attempts = 0;
    let port = ssh_port(url);
    let limit = timeout();
    let deadline = Instant::now() + limit;
    let epoch = EPOCH.load(Ordering::SeqCst);
    let in_time = move || {
        let cancelled = EPOCH.load(Ordering::SeqCst) != epoch;
        if Instant::now() < deadline && !cancelled {
            return true;
        }
        if host_error.borrow().is_none() {
            *host_error.borrow_mut() = Some(SourceError::Fetch {
                url: url.to_string(),
                message: if cancelled {
                    "cancelled: the agent is stopping".into()
                } else {
                    timed_out(limit)
                },
                cause: None,
            });
        }
        false
    };
    let mut callbacks = RemoteCallbacks::new();
    callbacks.transfer_progress(move |_| in_time());
    callbacks.sideband_progress(move |_| in_time());
    callbacks.credentials(move |at, username, allowed| {
        credentials.credential(url, at, username, allowed, &mut attempts)
    });
    callbacks.certificate_check(move |cert, host| {
        credentials
            .check_certificate(cert, host, port)
            .map_err(|e| {
                let message = e.to_string();
                *host_error.borrow_mut() = Some(e);
                git2::Error::from_str(&message)
            })
    });
    callbacks
}

/// The SSH port of `url`: `ssh://host:2222/…` names one; scp-like
/// `git@host:path` and every other URL mean 22.
fn ssh_port(url: &str) -> u16 {
    url.split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(""))
        .map(|authority| authority.rsplit_once('@').map_or(authority, |(_, h)| h))
        .and_then(|host| host.rsplit_once(':'))
        .filter(|(host, _)| !host.ends_with(']') || host.starts_with('['))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(22)
}

/// The redirect policy: with a token, none (a bearer header would go
/// wherever a redirect points; libgit2 still follows one to the same
/// host, and a basic challenge from elsewhere is refused by the
/// credential callback).
pub(crate) fn redirects(credentials: &Credentials) -> RemoteRedirect {
    if credentials.has_token() {
        RemoteRedirect::None
    } else {
        RemoteRedirect::Initial
    }
}

/// Which way a failed conversation went.
#[derive(Clone, Copy)]
enum Way {
    Fetch,
    Push,
}

impl Way {
    /// The error of a failed fetch or push, as this way names it.
    fn failure(self, url: String, message: String, cause: Option<Cause>) -> SourceError {
        match self {
            Way::Fetch => SourceError::Fetch {
                url,
                message,
                cause,
            },
            Way::Push => SourceError::Push {
                url,
                message,
                cause,
            },
        }
    }

    /// A fetch or push that libgit2 ended on its own read or connect
    /// timeout.
    fn timeout_failure(self, url: &str, e: &git2::Error) -> SourceError {
        let message = format!("{} ({})", timed_out(timeout()), e.message());
        self.failure(url.to_string(), message, Some(Cause::git(e)))
    }
}

fn failed(
    url: &str,
    e: &git2::Error,
    host_error: &RefCell<Option<SourceError>>,
    way: Way,
) -> SourceError {
    if let Some(host) = host_error.borrow_mut().take() {
        return match host {
            // The deadline, met while pushing.
            SourceError::Fetch {
                url,
                message,
                cause,
            } => way.failure(url, message, cause),
            host => host,
        };
    }
    if is_timeout(e) {
        return way.timeout_failure(url, e);
    }
    let url = url.to_string();
    let cause = Some(Cause::git(e));
    let mut message = e.message().to_string();
    if message.contains("non-bare") {
        message.push_str(
            ": the source is a local repository with a working tree, which libgit2 cannot push to; serve it as a bare repository, or set [status] branch = \"\" to write no status branch",
        );
    }
    // "the server refused …" is the credential callback's own refusal.
    if e.code() == git2::ErrorCode::Auth
        || message.contains("authentication")
        || message.starts_with("the server refused")
    {
        return SourceError::Auth {
            url,
            message,
            cause,
        };
    }
    way.failure(url, message, cause)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ssh_port_comes_from_the_url() {
        use super::ssh_port;
        assert_eq!(ssh_port("ssh://git@127.0.0.1:2222/srv/repo.git"), 2222);
        assert_eq!(ssh_port("ssh://git@git.example/repo.git"), 22);
        assert_eq!(ssh_port("git@git.example:team/repo.git"), 22);
        assert_eq!(ssh_port("ssh://[::1]:2200/repo.git"), 2200);
    }
}

/// Fetches `refs/heads/{branch}` of `url` into `local` in the bare
/// repository at `dir`: the branch's commit, or `None` when the remote
/// has no such branch (then `local` is deleted too).
pub(crate) fn fetch_branch(
    dir: &Path,
    url: &str,
    credentials: &Credentials,
    branch: &str,
    local: &str,
) -> Result<Option<Oid>, SourceError> {
    let repo = super::fetch::open_or_init(dir)?;
    let host_error = RefCell::new(None);
    let headers = credentials.headers();
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut options = FetchOptions::new();
    options
        .remote_callbacks(callbacks(url, credentials, &host_error))
        .download_tags(git2::AutotagOption::None)
        .prune(FetchPrune::On)
        .update_fetchhead(false)
        .follow_redirects(redirects(credentials))
        .custom_headers(&header_refs);
    let mut remote = repo
        .remote_anonymous(url)
        .map_err(|e| failed(url, &e, &host_error, Way::Fetch))?;
    // With pruning, a branch deleted at the remote deletes `local` too.
    let refspec = format!("+refs/heads/{branch}:{local}");
    remote
        .fetch(&[&refspec], Some(&mut options), None)
        .map_err(|e| failed(url, &e, &host_error, Way::Fetch))?;
    drop(options);
    Ok(repo.refname_to_id(local).ok())
}

/// What became of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PushOutcome {
    Pushed,
    /// The remote refused the update (someone pushed first, or a hook):
    /// its message.
    Rejected(String),
}

/// Pushes the local ref `local` of the bare repository at `dir` to
/// `refs/heads/{branch}` of `url`, as a fast-forward only.
pub(crate) fn push(
    dir: &Path,
    url: &str,
    credentials: &Credentials,
    local: &str,
    branch: &str,
) -> Result<PushOutcome, SourceError> {
    let repo = super::fetch::open_or_init(dir)?;
    let host_error = RefCell::new(None);
    let rejected: RefCell<Option<String>> = RefCell::new(None);
    let mut callbacks = callbacks(url, credentials, &host_error);
    callbacks.push_update_reference(|_, status| {
        if let Some(message) = status {
            *rejected.borrow_mut() = Some(message.to_string());
        }
        Ok(())
    });
    let headers = credentials.headers();
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut options = PushOptions::new();
    options
        .remote_callbacks(callbacks)
        .follow_redirects(redirects(credentials))
        .custom_headers(&header_refs);
    let mut remote = repo
        .remote_anonymous(url)
        .map_err(|e| failed(url, &e, &host_error, Way::Push))?;
    // No `+`: never forced.
    let refspec = format!("{local}:refs/heads/{branch}");
    match remote.push(&[&refspec], Some(&mut options)) {
        Ok(()) => {}
        // A local remote reports a non-fast-forward as an error, not
        // through the callback.
        Err(e) if e.code() == git2::ErrorCode::NotFastForward => {
            return Ok(PushOutcome::Rejected(e.message().to_string()));
        }
        Err(e) => return Err(failed(url, &e, &host_error, Way::Push)),
    }
    drop(options);
    Ok(match rejected.into_inner() {
        Some(message) => PushOutcome::Rejected(message),
        None => PushOutcome::Pushed,
    })
}

/// Deletes `refs/heads/{branch}` at `url` (a proposal branch whose change
/// Git now declares).
pub(crate) fn delete_branch(
    dir: &Path,
    url: &str,
    credentials: &Credentials,
    branch: &str,
) -> Result<PushOutcome, SourceError> {
    let repo = super::fetch::open_or_init(dir)?;
    let host_error = RefCell::new(None);
    let mut options = PushOptions::new();
    options
        .remote_callbacks(callbacks(url, credentials, &host_error))
        .follow_redirects(redirects(credentials));
    let mut remote = repo
        .remote_anonymous(url)
        .map_err(|e| failed(url, &e, &host_error, Way::Push))?;
    remote
        .push(&[&format!(":refs/heads/{branch}")], Some(&mut options))
        .map_err(|e| failed(url, &e, &host_error, Way::Push))?;
    Ok(PushOutcome::Pushed)
}

/// Fetches every branch of `url` under `refs/heads/{prefix}` into
/// `{local}` (pruned: a branch deleted there goes here too), and returns
/// their names with `prefix` left out.
pub(crate) fn fetch_branches(
    dir: &Path,
    url: &str,
    credentials: &Credentials,
    prefix: &str,
    local: &str,
) -> Result<Vec<String>, SourceError> {
    let repo = super::fetch::open_or_init(dir)?;
    let host_error = RefCell::new(None);
    let headers = credentials.headers();
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut options = FetchOptions::new();
    options
        .remote_callbacks(callbacks(url, credentials, &host_error))
        .download_tags(git2::AutotagOption::None)
        .prune(FetchPrune::On)
        .update_fetchhead(false)
        .follow_redirects(redirects(credentials))
        .custom_headers(&header_refs);
    let mut remote = repo
        .remote_anonymous(url)
        .map_err(|e| failed(url, &e, &host_error, Way::Fetch))?;
    let refspec = format!("+refs/heads/{prefix}*:{local}*");
    remote
        .fetch(&[&refspec], Some(&mut options), None)
        .map_err(|e| failed(url, &e, &host_error, Way::Fetch))?;
    drop(options);
    let glob = format!("{local}*");
    let names = repo
        .references_glob(&glob)
        .map_err(|e| failed(url, &e, &host_error, Way::Fetch))?
        .flatten()
        .filter_map(|r| {
            r.name()
                .ok()
                .and_then(|n| n.strip_prefix(local))
                .map(str::to_string)
        })
        .collect();
    Ok(names)
}
