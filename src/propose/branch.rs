//! `tend propose --output branch`: the proposal as a commit on
//! `tend/propose/<name>` in the source remote, on top of the tracked
//! branch's commit it was made from.
//!
//! # Guarantees
//! * Never the tracked branch, and never a force-push over commits someone
//!   else made: a proposal branch whose commits beyond the tracked branch
//!   are not all this agent's is refused, with what to do.
//! * A proposal branch this agent made is updated as a fast-forward: a
//!   commit on its tip, or, when the tracked branch moved, a merge of the
//!   tip and the new tracked commit (so the pull request shows only the
//!   proposal). Nothing is ever force-pushed: a push that meets a commit
//!   someone made meanwhile is refused.
//! * Proposing the same change again makes no commit.
//!
//! Blocking (libgit2).

use std::path::PathBuf;

use git2::{Oid, Repository, Signature};

use super::Proposal;
use crate::source::SourceError;
use crate::source::auth::Credentials;
use crate::source::transport::{self, PushOutcome};

/// Why the proposal branch was not written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ProposalBranchError {
    #[error(
        "{branch} has commits that are not tend's ({commits}): tend never overwrites them. Merge or close that pull request, or delete the branch, then run the command again"
    )]
    HumanCommits { branch: String, commits: String },
    #[error("{branch}: {source}")]
    Remote {
        branch: String,
        #[source]
        source: SourceError,
    },
    #[error("{branch}: the push was refused ({message})")]
    Refused { branch: String, message: String },
    #[error(
        "{branch} is the tracked branch: tend writes proposals and imports only on a branch of their own"
    )]
    TrackedBranch { branch: String },
    #[error(
        "{branch}: {file} exists on the tracked branch, and tend never overwrites a file with a new one; nothing is pushed"
    )]
    Exists { branch: String, file: String },
    #[error("{branch}: local Git data: {source}")]
    Repository {
        branch: String,
        #[source]
        source: crate::cause::Cause,
    },
}

/// What the branch holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BranchOutcome {
    /// A new branch.
    Created(String),
    /// A commit on top of this agent's earlier proposal.
    Updated(String),
    /// The tracked branch moved: a merge of the proposal and its new tip.
    Rebuilt(String),
    /// The branch already proposes exactly this.
    Unchanged(String),
}

impl std::fmt::Display for BranchOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BranchOutcome::Created(c) => write!(f, "created at {c}"),
            BranchOutcome::Updated(c) => write!(f, "updated to {c}"),
            BranchOutcome::Rebuilt(c) => {
                write!(
                    f,
                    "updated to {c} (a merge with the tracked branch's new tip)"
                )
            }
            BranchOutcome::Unchanged(c) => write!(f, "unchanged at {c} (it already proposes this)"),
        }
    }
}

/// Where and as whom proposals are pushed.
#[derive(Debug, Clone)]
pub(crate) struct ProposalBranch {
    pub repo_dir: PathBuf,
    pub url: String,
    pub credentials: Credentials,
    pub agent_id: String,
    /// The tracked branch (the base of every proposal).
    pub base_branch: String,
}

/// `tend/propose/<name>`.
pub(crate) fn branch_name(name: &str) -> String {
    format!("tend/propose/{name}")
}

impl ProposalBranch {
    fn author(&self) -> String {
        format!("tend ({})", self.agent_id)
    }

    /// Commits `proposal` (made from the tracked commit `base`) with
    /// `message` on its branch and pushes it.
    pub(crate) fn push(
        &self,
        proposal: &Proposal,
        base: &str,
        message: &str,
    ) -> Result<BranchOutcome, ProposalBranchError> {
        self.push_files(
            &branch_name(&proposal.name),
            &[(proposal.file.clone(), proposal.after.clone())],
            false,
            base,
            message,
        )
    }

    /// Commits `files` (repository paths and their text, on top of the
    /// tracked commit `base`) with `message` on `branch` and pushes it,
    /// under the guarantees above. `new_files`: a path the tracked commit
    /// has is refused, never replaced (`tend import`).
    pub(crate) fn push_files(
        &self,
        branch: &str,
        files: &[(String, String)],
        new_files: bool,
        base: &str,
        message: &str,
    ) -> Result<BranchOutcome, ProposalBranchError> {
        let branch = branch.to_string();
        if branch == self.base_branch {
            return Err(ProposalBranchError::TrackedBranch { branch });
        }
        let git = |e: git2::Error| ProposalBranchError::Repository {
            branch: branch.clone(),
            source: crate::cause::Cause::git(&e),
        };
        let remote = |source: SourceError| ProposalBranchError::Remote {
            branch: branch.clone(),
            source,
        };
        let fetched = local_ref(&branch, "heads");
        let tip = transport::fetch_branch(
            &self.repo_dir,
            &self.url,
            &self.credentials,
            &branch,
            &fetched,
        )
        .map_err(remote)?;
        crate::source::libgit2();
        let repo = Repository::open_bare(&self.repo_dir).map_err(git)?;
        let base_id = Oid::from_str(base).map_err(git)?;
        let base_commit = repo.find_commit(base_id).map_err(git)?;
        // The tree: the tracked commit's, with the files written.
        let mut tree = base_commit.tree().map_err(git)?.id();
        for (path, text) in files {
            if new_files
                && base_commit
                    .tree()
                    .map_err(git)?
                    .get_path(std::path::Path::new(path))
                    .is_ok()
            {
                return Err(ProposalBranchError::Exists {
                    branch,
                    file: path.clone(),
                });
            }
            let blob = repo.blob(text.as_bytes()).map_err(git)?;
            let current = repo.find_tree(tree).map_err(git)?;
            tree = replace_file(&repo, &current, path, blob).map_err(git)?;
        }
        let (parents, outcome): (Vec<git2::Commit<'_>>, fn(String) -> BranchOutcome) = match tip {
            None => (vec![base_commit], BranchOutcome::Created),
            Some(tip) => {
                let others = self.foreign_commits(&repo, tip, base_id).map_err(git)?;
                if !others.is_empty() {
                    return Err(ProposalBranchError::HumanCommits {
                        branch,
                        commits: others.join(", "),
                    });
                }
                let tip_commit = repo.find_commit(tip).map_err(git)?;
                if tip_commit.tree_id() == tree {
                    return Ok(BranchOutcome::Unchanged(tip.to_string()));
                }
                if tip == base_id || repo.graph_descendant_of(tip, base_id).unwrap_or(false) {
                    (vec![tip_commit], BranchOutcome::Updated)
                } else {
                    (vec![tip_commit, base_commit], BranchOutcome::Rebuilt)
                }
            }
        };
        let signature = Signature::now(&self.author(), "tend@localhost").map_err(git)?;
        let tree = repo.find_tree(tree).map_err(git)?;
        let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
        let commit = repo
            .commit(None, &signature, &signature, message, &tree, &parents)
            .map_err(git)?;
        let outgoing = local_ref(&branch, "outgoing");
        repo.reference(&outgoing, commit, true, "tend propose")
            .map_err(git)?;
        match transport::push(
            &self.repo_dir,
            &self.url,
            &self.credentials,
            &outgoing,
            &branch,
        )
        .map_err(remote)?
        {
            PushOutcome::Pushed => Ok(outcome(commit.to_string())),
            PushOutcome::Rejected(message) => Err(ProposalBranchError::Refused { branch, message }),
        }
    }

    /// The commits from `base` to `tip` not authored by this agent.
    fn foreign_commits(
        &self,
        repo: &Repository,
        tip: Oid,
        base: Oid,
    ) -> Result<Vec<String>, git2::Error> {
        let mut walk = repo.revwalk()?;
        walk.push(tip)?;
        // Commits the tracked branch has are nobody's proposal (a merge of
        // the tracked branch brings in commits by anyone).
        let _ = walk.hide(base);
        let author = self.author();
        let mut out = Vec::new();
        for id in walk {
            let id = id?;
            let commit = repo.find_commit(id)?;
            if commit.author().name().ok() != Some(author.as_str()) {
                let short = id.to_string();
                out.push(format!(
                    "{} by {}",
                    short.get(..12).unwrap_or(&short),
                    commit.author().name().unwrap_or("?")
                ));
            }
        }
        Ok(out)
    }

    /// Deletes this agent's proposal branch of `name` when it holds only
    /// this agent's commits (the declaration caught up). Whether it was
    /// deleted.
    pub(crate) fn delete_if_ours(
        &self,
        name: &str,
        base: &str,
    ) -> Result<bool, ProposalBranchError> {
        let branch = branch_name(name);
        let git = |e: git2::Error| ProposalBranchError::Repository {
            branch: branch.clone(),
            source: crate::cause::Cause::git(&e),
        };
        let fetched = format!("refs/tend/propose/heads/{name}");
        let Some(tip) = transport::fetch_branch(
            &self.repo_dir,
            &self.url,
            &self.credentials,
            &branch,
            &fetched,
        )
        .map_err(|source| ProposalBranchError::Remote {
            branch: branch.clone(),
            source,
        })?
        else {
            return Ok(false);
        };
        crate::source::libgit2();
        let repo = Repository::open_bare(&self.repo_dir).map_err(git)?;
        let base = Oid::from_str(base).map_err(git)?;
        if !self
            .foreign_commits(&repo, tip, base)
            .map_err(git)?
            .is_empty()
        {
            return Ok(false);
        }
        transport::delete_branch(&self.repo_dir, &self.url, &self.credentials, &branch).map_err(
            |source| ProposalBranchError::Remote {
                branch: branch.clone(),
                source,
            },
        )?;
        Ok(true)
    }
}

/// The local ref that holds `branch` (`tend/propose/orders`) as
/// fetched (`heads`) or as about to be pushed (`outgoing`):
/// `refs/tend/propose/heads/orders`.
fn local_ref(branch: &str, role: &str) -> String {
    match branch.rsplit_once('/') {
        Some((kind, rest)) => format!("refs/{kind}/{role}/{rest}"),
        None => format!("refs/tend/{role}/{branch}"),
    }
}

/// `tree` with the file at `path` (slash-separated) set to `blob`.
fn replace_file(
    repo: &Repository,
    tree: &git2::Tree<'_>,
    path: &str,
    blob: Oid,
) -> Result<Oid, git2::Error> {
    let (first, rest) = match path.split_once('/') {
        Some((dir, rest)) => (dir, Some(rest)),
        None => (path, None),
    };
    let mut builder = repo.treebuilder(Some(tree))?;
    match rest {
        None => {
            let mode = tree.get_name(first).map_or(0o100644, |e| e.filemode());
            builder.insert(first, blob, mode)?;
        }
        Some(rest) => {
            let sub = match tree.get_name(first) {
                Some(entry) => repo.find_tree(entry.id())?,
                None => repo.find_tree(repo.treebuilder(None)?.write()?)?,
            };
            let id = replace_file(repo, &sub, rest, blob)?;
            builder.insert(first, id, 0o040000)?;
        }
    }
    builder.write()
}

/// The web page that opens a pull (merge) request for `branch` against
/// `base`, for a remote on GitHub, GitLab or Gitea (Codeberg); `None` for
/// any other host. String formatting only: nothing is asked of the host.
pub(crate) fn pull_request_url(remote: &str, base: &str, branch: &str) -> Option<String> {
    let (host, path) = if let Some(rest) = remote.strip_prefix("git@") {
        let (host, path) = rest.split_once(':')?;
        (host.to_string(), path.to_string())
    } else {
        let rest = remote.split_once("://")?.1;
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        let (host, path) = rest.split_once('/')?;
        (host.split(':').next()?.to_string(), path.to_string())
    };
    let path = path.trim_end_matches('/').trim_end_matches(".git");
    let host_lower = host.to_ascii_lowercase();
    if host_lower.contains("github") {
        Some(format!(
            "https://{host}/{path}/compare/{base}...{branch}?expand=1"
        ))
    } else if host_lower.contains("gitlab") {
        Some(format!(
            "https://{host}/{path}/-/merge_requests/new?merge_request%5Bsource_branch%5D={branch}&merge_request%5Btarget_branch%5D={base}"
        ))
    } else if host_lower.contains("gitea") || host_lower.contains("codeberg") {
        Some(format!("https://{host}/{path}/compare/{base}...{branch}"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::pull_request_url;

    #[test]
    fn pull_request_pages_for_the_hosts_teams_use() {
        assert_eq!(
            pull_request_url("git@github.com:acme/dbs.git", "main", "tend/propose/orders")
                .as_deref(),
            Some("https://github.com/acme/dbs/compare/main...tend/propose/orders?expand=1")
        );
        assert_eq!(
            pull_request_url(
                "https://gitlab.com/acme/platform/dbs.git",
                "main",
                "tend/propose/orders"
            )
            .as_deref(),
            Some(
                "https://gitlab.com/acme/platform/dbs/-/merge_requests/new?merge_request%5Bsource_branch%5D=tend/propose/orders&merge_request%5Btarget_branch%5D=main"
            )
        );
        assert_eq!(
            pull_request_url(
                "ssh://git@gitea.internal:2222/acme/dbs",
                "main",
                "tend/propose/x"
            )
            .as_deref(),
            Some("https://gitea.internal/acme/dbs/compare/main...tend/propose/x")
        );
        assert_eq!(pull_request_url("file:///srv/git/dbs", "main", "b"), None);
    }
}
