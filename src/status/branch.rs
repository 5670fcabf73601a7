//! Writing the status branch: an orphan branch in the source remote
//! (`[status] branch`, default `tend-status`) that tend commits what it
//! observed to, with the source's credentials.
//!
//! # Guarantees
//! * Only `refs/heads/<status branch>` is ever pushed, never forced, never
//!   the tracked branch (the configuration refuses a status branch equal
//!   to it).
//! * A commit is made only when the files change: the new tree is
//!   compared with the tip's.
//! * A push refused because someone else pushed first is retried on the
//!   new tip (fetch, rebuild the files on it, push), with backoff, a
//!   bounded number of times; their commit stays in the history.
//! * tend does not write a branch whose `agent.yaml` names another agent
//!   or a newer status format: it says why instead.
//! * Files tend does not own (anything outside `status/`, `SUMMARY.md`
//!   and `agent.yaml`) are kept as they are.
//!
//! Blocking (libgit2): callers run it on the blocking pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::BackoffBuilder;
use git2::{Oid, Repository, Signature};

use super::branch_files::{AgentFile, FileContent, STATUS_FORMAT};
use crate::source::SourceError;
use crate::source::auth::Credentials;
use crate::source::transport::{self, PushOutcome};

/// Why the status branch was not written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum StatusBranchError {
    /// `agent.yaml` on the branch names another agent.
    #[error(
        "status branch `{branch}` belongs to agent `{found}`, not `{ours}`: tend does not write it. Give this agent a [status] branch of its own, or delete the branch if that agent is gone"
    )]
    OtherAgent {
        branch: String,
        found: String,
        ours: String,
    },
    /// `agent.yaml` on the branch has a newer status format.
    #[error(
        "status branch `{branch}` has status format {found}, newer than this tend's {ours}: a newer tend writes it, and this one does not. Upgrade tend, or give this agent another [status] branch"
    )]
    NewerFormat {
        branch: String,
        found: u32,
        ours: u32,
    },
    /// `agent.yaml` on the branch cannot be read.
    #[error(
        "status branch `{branch}` has an agent.yaml tend cannot read ({cause}): tend does not write a branch it cannot prove is its own. Fix or delete agent.yaml there"
    )]
    UnreadableAgentFile {
        branch: String,
        /// The YAML error.
        #[source]
        cause: crate::cause::Cause,
    },
    /// Fetching or pushing failed.
    #[error("status branch `{branch}`: {source}")]
    Remote {
        branch: String,
        #[source]
        source: SourceError,
    },
    /// Every push was refused.
    #[error(
        "status branch `{branch}`: the push was refused {attempts} times in a row ({message}); someone keeps pushing, or a hook or branch protection refuses tend's pushes: allow them for this branch"
    )]
    Rejected {
        branch: String,
        attempts: usize,
        message: String,
    },
    /// The local Git data failed.
    #[error("status branch `{branch}`: local Git data: {source}")]
    Repository {
        branch: String,
        #[source]
        source: crate::cause::Cause,
    },
}

/// What a publication did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Published {
    /// The files were already on the branch, at this tip (the one this
    /// attempt fetched, which may be newer than one fetched before).
    Unchanged(String),
    /// A commit was pushed.
    Committed(String),
    /// Nothing was written: the files were what changed over a commit,
    /// and the tip is no longer that commit (someone else pushed). Render
    /// every file and publish again.
    NeedsEveryFile,
}

/// The status branch of one agent.
#[derive(Debug, Clone)]
pub(crate) struct StatusBranch {
    /// The bare repository the source is fetched into (the status objects
    /// live beside it, under `refs/tend/status/`).
    pub repo_dir: PathBuf,
    pub url: String,
    pub branch: String,
    pub credentials: Credentials,
    pub agent_id: String,
    /// Pushes tried before giving up on a refusal.
    pub attempts: usize,
}

/// The files tend owns on the branch; the rest is kept.
fn owned(path: &str) -> bool {
    path == "SUMMARY.md" || path == "agent.yaml" || path == "status"
}

impl StatusBranch {
    /// The status branch `agent` writes (`None`: `[status] branch` is
    /// empty), in the source remote with the source's credentials.
    pub(crate) fn of(agent: &crate::agent::Agent) -> Option<StatusBranch> {
        let branch = &agent.config().status.branch;
        let source = agent.source_settings();
        (!branch.is_empty()).then(|| StatusBranch {
            repo_dir: crate::source::repo_dir(&agent.config().state_dir),
            url: source.url.clone(),
            branch: branch.clone(),
            credentials: source.credentials.clone(),
            agent_id: agent.agent_id().to_string(),
            attempts: 5,
        })
    }

    fn git(&self, e: git2::Error) -> StatusBranchError {
        StatusBranchError::Repository {
            branch: self.branch.clone(),
            source: crate::cause::Cause::git(&e),
        }
    }

    fn remote(&self, source: SourceError) -> StatusBranchError {
        StatusBranchError::Remote {
            branch: self.branch.clone(),
            source,
        }
    }

    fn fetched_ref(&self) -> String {
        format!("refs/tend/status/heads/{}", self.branch)
    }

    fn outgoing_ref(&self) -> String {
        format!("refs/tend/status/outgoing/{}", self.branch)
    }

    /// The branch's tip at the remote (fetched; `None`: no such branch).
    pub(crate) fn tip(&self) -> Result<Option<String>, StatusBranchError> {
        tracing::debug!(branch = %self.branch, "status branch: fetching the tip");
        transport::fetch_branch(
            &self.repo_dir,
            &self.url,
            &self.credentials,
            &self.branch,
            &self.fetched_ref(),
        )
        .map(|tip| tip.map(|t| t.to_string()))
        .map_err(|e| self.remote(e))
    }

    /// Puts `files` on the branch with `message`, as described in the
    /// module docs. `base`: the commit `files` are the changes over (the
    /// tip tend last published): a resource's file they do not name is
    /// kept as that commit holds it. `None`: `files` are every file.
    /// `fetched`: the tip [`StatusBranch::tip`] just fetched, which the
    /// first attempt builds on instead of fetching it again (a tip that
    /// moved since makes that push refused, and it is tried again at once
    /// over a fetched tip, as an attempt of its own is not spent on it).
    pub(crate) fn publish(
        &self,
        files: &BTreeMap<String, FileContent>,
        message: &str,
        base: Option<&str>,
        mut fetched: Option<Option<String>>,
    ) -> Result<Published, StatusBranchError> {
        let mut delays = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(self.attempts.saturating_sub(1))
            .with_jitter()
            .build();
        let mut refused = 0;
        loop {
            let reused = fetched.is_some();
            match self.try_publish(files, message, base, fetched.take())? {
                Attempt::Done(published) => return Ok(published),
                Attempt::Refused(why) if reused => {
                    tracing::info!(
                        branch = %self.branch,
                        "status branch: push refused ({why}); the tip moved since it was fetched: fetching it again"
                    );
                }
                Attempt::Refused(why) => {
                    refused += 1;
                    tracing::info!(
                        branch = %self.branch,
                        "status branch: push refused ({why}); fetching the new tip and rebuilding"
                    );
                    match delays.next() {
                        Some(delay) => std::thread::sleep(delay),
                        None => {
                            return Err(StatusBranchError::Rejected {
                                branch: self.branch.clone(),
                                attempts: refused,
                                message: why,
                            });
                        }
                    }
                }
            }
        }
    }

    fn try_publish(
        &self,
        files: &BTreeMap<String, FileContent>,
        message: &str,
        base: Option<&str>,
        fetched: Option<Option<String>>,
    ) -> Result<Attempt, StatusBranchError> {
        let tip = match fetched {
            Some(tip) => tip
                .map(|t| git2::Oid::from_str(&t))
                .transpose()
                .map_err(|e| self.git(e))?,
            None => transport::fetch_branch(
                &self.repo_dir,
                &self.url,
                &self.credentials,
                &self.branch,
                &self.fetched_ref(),
            )
            .map_err(|e| self.remote(e))?,
        };
        crate::source::libgit2();
        let repo = Repository::open_bare(&self.repo_dir).map_err(|e| self.git(e))?;
        let parent = match tip {
            Some(id) => Some(repo.find_commit(id).map_err(|e| self.git(e))?),
            None => None,
        };
        if let Some(parent) = &parent {
            self.check_owner(&repo, &parent.tree().map_err(|e| self.git(e))?)?;
        }
        // Changes over `base` apply to `base` itself only.
        if base.is_some() && parent.as_ref().map(|p| p.id().to_string()).as_deref() != base {
            return Ok(Attempt::Done(Published::NeedsEveryFile));
        }
        let over_base = base.is_some();
        let Some(tree_id) = self.build_tree(&repo, parent.as_ref(), files, over_base)? else {
            return Ok(Attempt::Done(Published::NeedsEveryFile));
        };
        if let Some(parent) = parent.as_ref().filter(|p| p.tree_id() == tree_id) {
            return Ok(Attempt::Done(Published::Unchanged(parent.id().to_string())));
        }
        let tree = repo.find_tree(tree_id).map_err(|e| self.git(e))?;
        let signature = Signature::now(&format!("tend ({})", self.agent_id), "tend@localhost")
            .map_err(|e| self.git(e))?;
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let commit = repo
            .commit(None, &signature, &signature, message, &tree, &parents)
            .map_err(|e| self.git(e))?;
        repo.reference(&self.outgoing_ref(), commit, true, "tend status")
            .map_err(|e| self.git(e))?;
        match transport::push(
            &self.repo_dir,
            &self.url,
            &self.credentials,
            &self.outgoing_ref(),
            &self.branch,
        )
        .map_err(|e| self.remote(e))?
        {
            PushOutcome::Pushed => {
                // What was pushed is now the branch's tip.
                let _ = repo.reference(&self.fetched_ref(), commit, true, "tend status pushed");
                Ok(Attempt::Done(Published::Committed(commit.to_string())))
            }
            PushOutcome::Rejected(why) => Ok(Attempt::Refused(why)),
        }
    }

    /// What [`super::branch_files::render`] does with each resource file:
    /// writes its blob into the repository the branch is built in and
    /// keeps the id, so a whole render holds ids, not files. A blob
    /// already there is only looked up: libgit2's write would touch its
    /// file (at 100,000 loose blobs, 4 s of a whole render after a
    /// restart). A repository that cannot be opened or written keeps the
    /// bytes: building the tree writes them then, or says what failed.
    pub(crate) fn blob_writer(&self) -> impl FnMut(Vec<u8>) -> FileContent + use<> {
        crate::source::libgit2();
        let repo = Repository::open_bare(&self.repo_dir).ok();
        move |bytes| {
            let Some(repo) = &repo else {
                return FileContent::Bytes(bytes);
            };
            let written = Oid::hash_object(git2::ObjectType::Blob, &bytes).and_then(|id| {
                if repo.odb()?.exists(id) {
                    Ok(id)
                } else {
                    repo.blob(&bytes)
                }
            });
            match written {
                Ok(id) => FileContent::Blob(id),
                Err(_) => FileContent::Bytes(bytes),
            }
        }
    }

    /// Refuses a branch another agent, or a newer tend, writes.
    fn check_owner(
        &self,
        repo: &Repository,
        tree: &git2::Tree<'_>,
    ) -> Result<(), StatusBranchError> {
        let Some(entry) = tree.get_name("agent.yaml") else {
            // A branch someone made by hand without agent.yaml: tend adds
            // its own (the branch's history stays).
            return Ok(());
        };
        let blob = repo.find_blob(entry.id()).map_err(|e| self.git(e))?;
        let agent: AgentFile = serde_norway::from_slice(blob.content()).map_err(|e| {
            StatusBranchError::UnreadableAgentFile {
                branch: self.branch.clone(),
                cause: crate::cause::Cause::new(e),
            }
        })?;
        if agent.agent_id != self.agent_id {
            return Err(StatusBranchError::OtherAgent {
                branch: self.branch.clone(),
                found: agent.agent_id,
                ours: self.agent_id.clone(),
            });
        }
        if agent.status_format > STATUS_FORMAT {
            return Err(StatusBranchError::NewerFormat {
                branch: self.branch.clone(),
                found: agent.status_format,
                ours: STATUS_FORMAT,
            });
        }
        Ok(())
    }

    /// The tip's tree with tend's files replaced by `files`.
    ///
    /// Built from the tip's own trees: a file whose bytes hash to the blob
    /// already there is left as it is (nothing written), and a shard of
    /// `status/` whose files are all unchanged keeps its tree; so a change
    /// of one resource writes one blob, its shard's tree, `status/` (one
    /// entry per shard) and the root.
    /// The root tree holding `files` (`over_base`: the changes over
    /// `parent`'s resource files, whose shards no change touches are kept
    /// whole); `None` when `parent` has no `status/` to change (every
    /// file must then be rendered).
    fn build_tree(
        &self,
        repo: &Repository,
        parent: Option<&git2::Commit<'_>>,
        files: &BTreeMap<String, FileContent>,
        over_base: bool,
    ) -> Result<Option<Oid>, StatusBranchError> {
        let base = match parent {
            Some(p) => Some(p.tree().map_err(|e| self.git(e))?),
            None => None,
        };
        let mut root = repo.treebuilder(None).map_err(|e| self.git(e))?;
        if let Some(base) = &base {
            for entry in base.iter() {
                let name = entry.name().unwrap_or_default();
                if !owned(name) {
                    root.insert(name, entry.id(), entry.filemode())
                        .map_err(|e| self.git(e))?;
                }
            }
        }
        let mut shards: BTreeMap<&str, BTreeMap<&str, &FileContent>> = BTreeMap::new();
        for (path, content) in files {
            match path.strip_prefix("status/").and_then(|p| p.split_once('/')) {
                Some((shard, name)) => {
                    shards.entry(shard).or_default().insert(name, content);
                }
                None => {
                    let name = Path::new(path)
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or(path);
                    let id = match content {
                        FileContent::Bytes(bytes) => {
                            let old = base.as_ref().and_then(|b| b.get_name(name));
                            self.blob(repo, old.as_ref(), bytes)?
                        }
                        FileContent::Blob(id) => *id,
                        // Only the resources' files are ever kept or removed.
                        FileContent::Removed => return Ok(None),
                    };
                    root.insert(name, id, 0o100644).map_err(|e| self.git(e))?;
                }
            }
        }
        // A shard no resource is in any more goes, and so does a flat
        // `status/` of the first format (its files are not shards).
        let old_status = base
            .as_ref()
            .and_then(|b| b.get_name("status"))
            .filter(|e| e.kind() == Some(git2::ObjectType::Tree))
            .and_then(|e| repo.find_tree(e.id()).ok());
        if over_base && old_status.is_none() {
            return Ok(None);
        }
        let start = old_status.as_ref().filter(|_| over_base);
        let mut status = repo.treebuilder(start).map_err(|e| self.git(e))?;
        for (shard, wanted) in &shards {
            let old = old_status
                .as_ref()
                .and_then(|s| s.get_name(shard))
                .filter(|e| e.kind() == Some(git2::ObjectType::Tree))
                .and_then(|e| repo.find_tree(e.id()).ok());
            let id = if over_base {
                self.shard_changed(repo, old.as_ref(), wanted)?
            } else {
                Some(self.shard_tree(repo, old.as_ref(), wanted)?)
            };
            match id {
                Some(id) => status.insert(shard, id, 0o040000).map(|_| ()),
                None if old.is_some() => status.remove(shard),
                None => Ok(()),
            }
            .map_err(|e| self.git(e))?;
        }
        if !status.is_empty() {
            let id = status.write().map_err(|e| self.git(e))?;
            root.insert("status", id, 0o040000)
                .map_err(|e| self.git(e))?;
        }
        root.write().map(Some).map_err(|e| self.git(e))
    }

    /// One shard of `status/`, `old`, with the changes `wanted` made to
    /// it; `None` when no file is left in it.
    fn shard_changed(
        &self,
        repo: &Repository,
        old: Option<&git2::Tree<'_>>,
        wanted: &BTreeMap<&str, &FileContent>,
    ) -> Result<Option<Oid>, StatusBranchError> {
        let mut builder = repo.treebuilder(old).map_err(|e| self.git(e))?;
        for (name, content) in wanted {
            match content {
                FileContent::Bytes(bytes) => {
                    let id =
                        Oid::hash_object(git2::ObjectType::Blob, bytes).map_err(|e| self.git(e))?;
                    self.put_blob(repo, &mut builder, name, id, Some(bytes))?;
                }
                FileContent::Blob(id) => self.put_blob(repo, &mut builder, name, *id, None)?,
                FileContent::Removed => {
                    if builder.get(name).map_err(|e| self.git(e))?.is_some() {
                        builder.remove(name).map_err(|e| self.git(e))?;
                    }
                }
            }
        }
        if builder.is_empty() {
            return Ok(None);
        }
        builder.write().map(Some).map_err(|e| self.git(e))
    }

    /// One shard of `status/` holding exactly the files of `wanted` (a
    /// whole render's: every one has its bytes or its blob): `old` itself when it
    /// holds the same files, else `old` with what changed.
    fn shard_tree(
        &self,
        repo: &Repository,
        old: Option<&git2::Tree<'_>>,
        wanted: &BTreeMap<&str, &FileContent>,
    ) -> Result<Oid, StatusBranchError> {
        let mut files = Vec::with_capacity(wanted.len());
        for (name, content) in wanted {
            match content {
                FileContent::Bytes(bytes) => {
                    let id =
                        Oid::hash_object(git2::ObjectType::Blob, bytes).map_err(|e| self.git(e))?;
                    files.push((*name, id, Some(bytes.as_slice())));
                }
                FileContent::Blob(id) => files.push((*name, *id, None)),
                FileContent::Removed => {}
            }
        }
        if let Some(old) = old
            && old.len() == files.len()
            && files
                .iter()
                .all(|(name, id, _)| old.get_name(name).is_some_and(|e| e.id() == *id))
        {
            return Ok(old.id());
        }
        let mut builder = repo.treebuilder(old).map_err(|e| self.git(e))?;
        if let Some(old) = old {
            for entry in old.iter() {
                let name = entry.name().unwrap_or_default().to_string();
                if !matches!(
                    wanted.get(name.as_str()),
                    Some(FileContent::Bytes(_) | FileContent::Blob(_))
                ) {
                    builder.remove(&name).map_err(|e| self.git(e))?;
                }
            }
        }
        for (name, id, bytes) in files {
            self.put_blob(repo, &mut builder, name, id, bytes)?;
        }
        builder.write().map_err(|e| self.git(e))
    }

    /// Puts the blob `id` at `name`, unless it is there already: written
    /// from `bytes`, or (`None`) already in the repository.
    fn put_blob(
        &self,
        repo: &Repository,
        builder: &mut git2::TreeBuilder<'_>,
        name: &str,
        id: Oid,
        bytes: Option<&[u8]>,
    ) -> Result<(), StatusBranchError> {
        let present = builder
            .get(name)
            .map_err(|e| self.git(e))?
            .is_some_and(|e| e.id() == id);
        if !present {
            let blob = match bytes {
                Some(bytes) => repo.blob(bytes).map_err(|e| self.git(e))?,
                None => id,
            };
            builder
                .insert(name, blob, 0o100644)
                .map_err(|e| self.git(e))?;
        }
        Ok(())
    }

    /// The blob of `bytes`: `old`'s when it is already that (nothing
    /// written).
    fn blob(
        &self,
        repo: &Repository,
        old: Option<&git2::TreeEntry<'_>>,
        bytes: &[u8],
    ) -> Result<Oid, StatusBranchError> {
        let id = Oid::hash_object(git2::ObjectType::Blob, bytes).map_err(|e| self.git(e))?;
        if old.is_some_and(|e| e.id() == id) {
            return Ok(id);
        }
        repo.blob(bytes).map_err(|e| self.git(e))
    }
}

enum Attempt {
    Done(Published),
    Refused(String),
}
