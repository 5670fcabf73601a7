//! Fetching the tracked branch into a bare repository in the state dir.

use std::cell::RefCell;
use std::path::Path;

use git2::{AutotagOption, ErrorClass, ErrorCode, FetchOptions, FetchPrune, Oid, Repository};

use super::SourceError;
use super::auth::{Credentials, TokenScheme};

/// What to fetch.
#[derive(Debug, Clone)]
pub(crate) struct FetchSettings<'a> {
    pub url: &'a str,
    pub branch: &'a str,
    /// Depth of the first fetch only: later fetches are incremental from
    /// there, so the ancestry the anti-rollback check needs is present.
    pub depth: Option<u32>,
    pub credentials: &'a Credentials,
}

/// The local ref the tracked branch is fetched into.
pub(crate) fn tracking_ref(branch: &str) -> String {
    format!("refs/tend/source/heads/{branch}")
}

/// Where a fetch puts the branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FetchInto {
    /// The writer's tracking ref ([`tracking_ref`]).
    Tracking,
    /// A ref of this process alone, deleted after the fetch: a reader
    /// (`tend plan`) beside a running writer never takes the writer's ref
    /// locks, and never moves what the writer last fetched.
    Private,
}

fn private_ref(branch: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "refs/tend/readers/{}-{}-{}/heads/{branch}",
        now.as_secs(),
        std::process::id(),
        now.subsec_nanos()
    )
}

/// A reader's ref older than this was left by a reader that died (a fetch
/// takes seconds): the writer deletes it.
const STALE_READER_REF: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the ref lock files a killed writer left in the bare repository
/// at `dir`: libgit2 takes `<ref>.lock` while it moves a ref, and a
/// process killed in between leaves it, after which every fetch fails
/// ("failed to lock file … for writing") until someone deletes it. Only
/// the writer calls this, holding the state dir's lock, so no other
/// process is moving tend's own refs; readers' private refs
/// (`refs/tend/readers/`) are left to them, and `packed-refs.lock` is
/// removed only when it is older than any live operation could be.
/// `config.lock` is taken only while the repository is created (by the
/// writer, which holds the state dir's lock): one left behind is from a
/// writer killed then, and would fail every later open.
pub(crate) fn remove_stale_locks(dir: &Path) {
    let mut stack = vec![dir.join("refs").join("tend")];
    let readers = dir.join("refs").join("tend").join("readers");
    let mut removed = Vec::new();
    let config = dir.join("config.lock");
    if std::fs::remove_file(&config).is_ok() {
        removed.push(config);
    }
    while let Some(at) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path == readers {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "lock")
                && std::fs::remove_file(&path).is_ok()
            {
                removed.push(path);
            }
        }
    }
    let packed = dir.join("packed-refs.lock");
    let old = std::fs::metadata(&packed)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > STALE_READER_REF);
    if old && std::fs::remove_file(&packed).is_ok() {
        removed.push(packed);
    }
    for path in removed {
        tracing::warn!(
            "source: removed {}, left by a tend that was killed while writing it",
            path.display()
        );
    }
}

/// Opens the bare repository at `dir`, creating it on first use.
pub(crate) fn open_or_init(dir: &Path) -> Result<Repository, SourceError> {
    super::libgit2();
    let unusable = |e: git2::Error| SourceError::Repository {
        path: dir.display().to_string(),
        source: crate::cause::Cause::explained(
            if e.class() == git2::ErrorClass::Os {
                // The system refused (too many open files, a full disk): the
                // repository is likely fine, and deleting it fixes nothing.
                format!(
                    "{} (the operating system refused; the repository itself may be fine: do not delete it, fix what the message names — too many open files: raise LimitNOFILE)",
                    e.message()
                )
            } else {
                format!("{} (delete the directory to fetch afresh)", e.message())
            },
            e,
        ),
    };
    match Repository::open_bare(dir) {
        Ok(repo) => Ok(repo),
        Err(e) if e.code() == ErrorCode::NotFound => Repository::init_bare(dir).map_err(unusable),
        Err(e) => Err(unusable(e)),
    }
}

/// Fetches the branch; returns its commit, or `None` when the remote does
/// not have the branch (the tracking ref is pruned, never left stale).
pub(crate) fn fetch(
    dir: &Path,
    settings: &FetchSettings<'_>,
    into: FetchInto,
) -> Result<Option<Oid>, SourceError> {
    let repo = open_or_init(dir)?;
    if into == FetchInto::Tracking {
        sweep_reader_refs(&repo);
    }
    let tracking = tracking_ref(settings.branch);
    let first = repo.find_reference(&tracking).is_err();
    let local = match into {
        FetchInto::Tracking => tracking,
        FetchInto::Private => private_ref(settings.branch),
    };
    let refspec = format!("+refs/heads/{}:{local}", settings.branch);

    let host_error: RefCell<Option<SourceError>> = RefCell::new(None);
    let headers = settings.credentials.headers();
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut options = FetchOptions::new();
    options
        .remote_callbacks(super::transport::callbacks(
            settings.url,
            settings.credentials,
            &host_error,
        ))
        .download_tags(AutotagOption::None)
        .prune(FetchPrune::On)
        .update_fetchhead(false)
        .follow_redirects(super::transport::redirects(settings.credentials))
        .custom_headers(&header_refs);
    // A reader never makes the repository shallow: that is the writer's
    // choice, made at its first fetch.
    if first
        && into == FetchInto::Tracking
        && let Some(depth) = settings.depth
    {
        options.depth(i32::try_from(depth).unwrap_or(i32::MAX));
    }

    // A local path that is not there: libgit2 would call it an
    // "unsupported URL protocol".
    let local_path = settings.url.strip_prefix("file://").unwrap_or(settings.url);
    let scp_like = !settings.url.contains("://")
        && settings
            .url
            .split('/')
            .next()
            .is_some_and(|first| first.contains(':') || first.contains('@'));
    if (!settings.url.contains("://") || settings.url.starts_with("file://"))
        && !scp_like
        && !std::path::Path::new(local_path).exists()
    {
        return Err(SourceError::Fetch {
            url: settings.url.to_string(),
            message: format!(
                "the local repository {local_path} does not exist (or tend cannot see it); check [source] url"
            ),
            cause: None,
        });
    }
    if let Some(source) = super::wake::local_git_dir(settings.url) {
        let have = repo.refname_to_id(&tracking_ref(settings.branch)).ok();
        let depth = if first { settings.depth } else { None };
        check_local_tree_depth(&source, settings, have, depth)?;
    }
    let mut remote = repo
        .remote_anonymous(settings.url)
        .map_err(|e| git_failed(settings.url, &e))?;
    if let Err(e) = remote.fetch(&[&refspec], Some(&mut options), None) {
        drop(options);
        if let Some(host) = host_error.borrow_mut().take() {
            return Err(host);
        }
        return Err(classify(settings.url, &e, settings.credentials));
    }
    drop(options);
    match repo.find_reference(&local) {
        Ok(mut r) => {
            let target = r.target();
            if into == FetchInto::Private {
                // The objects stay; only this process's name for them goes.
                let _ = r.delete();
            }
            Ok(target)
        }
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(SourceError::Repository {
            path: dir.display().to_string(),
            source: crate::cause::Cause::git(&e),
        }),
    }
}

/// How deep the trees of a local source may nest. libgit2 copies objects
/// from a local repository by walking each tree recursively, so a commit
/// nesting directories 100,000 deep overflows the stack of the process
/// that fetches it. C git refuses trees deeper than 4,096 levels
/// (`core.maxTreeDepth`), so a server never sends one; for a local source
/// tend applies the same bound itself, before libgit2 walks anything.
pub(crate) const MAX_TREE_DEPTH: usize = 4096;

/// Refuses a local source whose new commits (those after `have`, at most
/// `depth` of them on a shallow first fetch) hold a tree nested deeper
/// than [`MAX_TREE_DEPTH`]. The walk is iterative and visits each tree
/// once: the objects libgit2 would copy anyway.
fn check_local_tree_depth(
    source: &Path,
    settings: &FetchSettings<'_>,
    have: Option<Oid>,
    depth: Option<u32>,
) -> Result<(), SourceError> {
    let refused = |message: String| SourceError::Fetch {
        url: settings.url.to_string(),
        message,
        cause: None,
    };
    let git = |e: git2::Error| git_failed(settings.url, &e);
    let repo = Repository::open(source).map_err(git)?;
    let Ok(head) = repo.refname_to_id(&format!("refs/heads/{}", settings.branch)) else {
        // A missing branch is reported by the fetch itself.
        return Ok(());
    };
    let mut walk = repo.revwalk().map_err(git)?;
    walk.push(head).map_err(git)?;
    if let Some(have) = have
        && repo.find_commit(have).is_ok()
    {
        walk.hide(have).map_err(git)?;
    }
    let limit = depth.map_or(usize::MAX, |d| d as usize);
    // Each tree's height (levels of directories, itself included), once
    // per tree: a tree reached by several paths counts at its deepest.
    let mut height: std::collections::HashMap<Oid, usize> = std::collections::HashMap::new();
    for commit in walk.take(limit) {
        let commit = commit.map_err(git)?;
        let root = repo.find_commit(commit).map_err(git)?.tree_id();
        let mut stack = vec![(root, false)];
        while let Some((id, children_done)) = stack.pop() {
            if height.contains_key(&id) {
                continue;
            }
            let tree = repo.find_tree(id).map_err(git)?;
            let subtrees = tree
                .iter()
                .filter(|e| e.kind() == Some(git2::ObjectType::Tree))
                .map(|e| e.id());
            if children_done {
                let below = subtrees
                    .map(|child| height.get(&child).copied().unwrap_or(0))
                    .max()
                    .unwrap_or(0);
                if below + 1 > MAX_TREE_DEPTH {
                    return Err(refused(format!(
                        "commit {commit} nests directories more than {MAX_TREE_DEPTH} levels deep: tend does not fetch it, as copying it would exhaust the stack. Remove that commit from the branch"
                    )));
                }
                height.insert(id, below + 1);
            } else {
                stack.push((id, true));
                stack.extend(
                    subtrees
                        .filter(|child| !height.contains_key(child))
                        .map(|child| (child, false)),
                );
            }
        }
    }
    Ok(())
}

/// Deletes the private refs of readers that died before deleting their
/// own (a `tend plan` killed mid-fetch): a ref under `refs/tend/readers/`
/// names when it was made, and only one older than [`STALE_READER_REF`]
/// goes. (Its process id is there too, but under systemd's `ProtectProc`
/// another user's process is invisible, so liveness cannot be told.)
fn sweep_reader_refs(repo: &Repository) {
    let Ok(refs) = repo.references_glob("refs/tend/readers/*") else {
        return;
    };
    let mut dead: Vec<String> = Vec::new();
    for r in refs.flatten() {
        let Ok(name) = r.name() else { continue };
        let made = name
            .strip_prefix("refs/tend/readers/")
            .and_then(|rest| rest.split(['-', '/']).next())
            .and_then(|secs| secs.parse::<u64>().ok())
            .map(|secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        // A name tend did not make (no time in it) is left alone.
        if made.is_some_and(|made| {
            crate::time::since(std::time::SystemTime::now(), made) > STALE_READER_REF
        }) {
            dead.push(name.to_string());
        }
    }
    for name in dead {
        if let Ok(mut r) = repo.find_reference(&name) {
            let _ = r.delete();
        }
    }
}

/// A fetch libgit2 failed, reported in its words.
fn git_failed(url: &str, e: &git2::Error) -> SourceError {
    SourceError::Fetch {
        url: url.to_string(),
        message: e.message().to_string(),
        cause: Some(crate::cause::Cause::git(e)),
    }
}

fn classify(url: &str, e: &git2::Error, credentials: &Credentials) -> SourceError {
    if e.message().to_ascii_lowercase().contains("timed out") {
        return super::transport::failed_fetch(url, e);
    }
    let mut message = e.message().to_string();
    let redirect = ["301", "302", "303", "307", "308", "redirect"]
        .iter()
        .any(|code| message.contains(code));
    if redirect && credentials.has_token() {
        message.push_str(
            "; the server redirected elsewhere, and with a token tend follows no redirect to another host (the token would go wherever it points): set [source] url to the final location",
        );
    }
    let refused = e.code() == ErrorCode::Auth || message.contains("authentication");
    if refused && credentials.token_scheme == TokenScheme::Bearer && credentials.has_token() {
        message = format!("the server refused the bearer token (Authorization: Bearer): {message}");
    }
    let auth = e.code() == ErrorCode::Auth
        || e.class() == ErrorClass::Http && (message.contains("401") || message.contains("403"))
        || message.starts_with("the server refused")
        || message.contains("authentication");
    let cause = Some(crate::cause::Cause::git(e));
    if auth {
        SourceError::Auth {
            url: url.to_string(),
            message,
            cause,
        }
    } else {
        SourceError::Fetch {
            url: url.to_string(),
            message,
            cause,
        }
    }
}
