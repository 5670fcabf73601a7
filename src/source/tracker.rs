//! Tracking the branch: poll → snapshot, with the parse cache, the
//! anti-rollback check and the keep-last-good rule.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use git2::{Oid, Repository};

use super::SourceError;
use super::auth::Credentials;
use super::cache_writer::{self, CacheWriting};
use super::fetch::{FetchInto, FetchSettings, fetch};
use super::parse_cache::{self, CacheDelta, ParsedTree, object_id};
use super::reader_repo::ReaderRepo;
use super::trust::{Trust, Verifier};
use super::{relisting::list_files_over, snapshot::Snapshot, snapshot::declarations_tree};
use crate::config::ConfigError;
use crate::journal::Access;
use crate::model::load::FileContents;
use crate::model::{DeclarationSet, parse_file};

/// A tree's declaration files (path, blob id), their parse results, whether
/// results of files no longer in the tree were dropped, and the cache delta.
type ParsedFiles = (
    Vec<(String, Oid)>,
    Vec<FileContents>,
    bool,
    Option<CacheDelta>,
);

/// What to track.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    pub url: String,
    pub branch: String,
    pub path: String,
    pub depth: Option<u32>,
    pub allow_rewind: bool,
    pub credentials: Credentials,
    /// `verify`, `verify_all` and their keys.
    pub trust: Trust,
}

impl SourceSettings {
    /// The source settings without the credentials a fetch needs: for
    /// reading the last accepted commit from the state dir's Git data,
    /// which works while Git (or the secrets) cannot be reached.
    pub fn offline(config: &crate::config::Config) -> Result<SourceSettings, ConfigError> {
        let s = &config.source;
        Ok(SourceSettings {
            url: s.url.clone(),
            branch: s.branch.clone(),
            path: s.path.clone(),
            depth: s.depth,
            allow_rewind: s.allow_rewind,
            trust: Trust::from_config(s).map_err(|e| ConfigError::Trust(Box::new(e)))?,
            credentials: Credentials::default(),
        })
    }

    /// The source settings, with secrets read from their files (a missing,
    /// empty or oversized one is a configuration error).
    pub fn from_config(config: &crate::config::Config) -> Result<SourceSettings, ConfigError> {
        let s = &config.source;
        let mut settings = SourceSettings::offline(config)?;
        settings.credentials = Credentials {
            token: s
                .token_file
                .as_deref()
                .map(|file| crate::config::secret::read("[source] token_file", file))
                .transpose()?,
            token_scheme: s.token_scheme,
            token_username: s.token_username.clone(),
            ssh_key_file: s.ssh_key_file.clone(),
            known_hosts_file: s.known_hosts_file.clone(),
        };
        Ok(settings)
    }
}

/// The current failure of the source, kept until a poll succeeds.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFailure {
    pub error: SourceError,
    /// When the source started failing (its age is `now - since`).
    pub since: SystemTime,
    /// Consecutive failed polls.
    pub failures: u32,
}

/// The result of one poll.
#[derive(Debug, Clone)]
pub struct PollOutcome {
    /// The last good snapshot (after this poll); `None` until one succeeded.
    pub snapshot: Option<Arc<Snapshot>>,
    /// This poll produced a new snapshot.
    pub changed: bool,
    pub failure: Option<SourceFailure>,
}

/// A tracked branch. Not `Sync`: one owner polls it (on `spawn_blocking`).
pub struct Source {
    settings: SourceSettings,
    /// The bare repository objects are read from: the state dir's; for a
    /// reader, after its first fetch, its own ([`ReaderRepo`]).
    repo_dir: PathBuf,
    /// A reader's own repository, which it fetches into (set up at its
    /// first fetch, or handed over by [`Source::with_reader_repo`]).
    reader: Option<Arc<ReaderRepo>>,
    state_dir: PathBuf,
    accepted_file: PathBuf,
    /// Writers record accepted commits and the parse cache in the state
    /// dir and fetch into the tracking ref; readers (`plan`) do neither.
    access: Access,
    accepted: Option<Oid>,
    /// Parse results of the last snapshot, for the next poll.
    cache: Option<ParsedTree>,
    /// The on-disk parse cache (`parse_cache`), read once per process.
    cache_file: PathBuf,
    cache_loaded: bool,
    /// The on-disk cache being read while the first fetch runs.
    cache_loading: Option<std::thread::JoinHandle<ParsedTree>>,
    /// The on-disk cache being written beside the cycles (the running
    /// agent's, a one-shot command's written beside).
    cache_writes: cache_writer::Writes,
    /// The last snapshot's parse results, made by that thread beside the
    /// cycles (the running agent): the next commit takes them instead of
    /// copying them on its own path.
    parses_made: Arc<std::sync::Mutex<Option<ParsedTree>>>,
    /// How many times a commit took those (for tests: a new one may be
    /// made again at any moment after).
    parses_made_taken: u64,
    /// Keep parse results in memory for the next poll (false for
    /// [`Source::poll_once`] and [`Source::parses_on_disk`]).
    retain_parses: bool,
    /// Read the on-disk parse cache again at every new head instead of
    /// keeping a copy in memory ([`Source::parses_on_disk`]).
    reread_disk_cache: bool,
    /// Whether a fetch that brought a new head packs the Git cache on a
    /// thread of its own when it is due (the running agent:
    /// [`Source::packing_beside`]).
    packs_beside: bool,
    /// Write the parse cache on a thread of its own, whose end the caller
    /// waits for ([`Source::poll_once_writing_beside`]).
    write_beside: bool,
    last_good: Option<Arc<Snapshot>>,
    failure: Option<SourceFailure>,
    parses: u64,
    /// Signature checks of new heads, cached by commit.
    verifier: Verifier,
}

impl Source {
    /// Opens the source's Git data under `state_dir/source`.
    pub fn open(
        state_dir: &Path,
        settings: SourceSettings,
        access: Access,
    ) -> Result<Self, SourceError> {
        let dir = state_dir.join("source");
        // A reader never creates anything in the state dir.
        if access == Access::Writer {
            fs::create_dir_all(&dir).map_err(|e| SourceError::Io {
                path: dir.display().to_string(),
                source: crate::cause::Cause::new(e),
            })?;
        }
        // The parse cache is read on another thread from here on, beside
        // libgit2's first use (it initialises TLS: tens of milliseconds)
        // and the fetch; the first poll that moves the head joins it.
        let cache_file = parse_cache::cache_path(&dir);
        let cache_loading = {
            let (file, path) = (cache_file.clone(), settings.path.clone());
            std::thread::Builder::new()
                .name("tend-parse-cache".into())
                .spawn(move || parse_cache::load(&file, &path))
                .ok()
        };
        // libgit2's first use in a process initialises it (TLS: tens of
        // milliseconds); done here, on its own, so logs show what a fetch
        // costs a new process apart from tend's own work.
        let started = std::time::Instant::now();
        super::libgit2();
        let _ = Oid::from_str("0000000000000000000000000000000000000000");
        tracing::debug!("source: libgit2 initialised in {:?}", started.elapsed());
        let accepted_file = dir.join("accepted-commit");
        let accepted = match fs::read_to_string(&accepted_file) {
            Ok(text) => Some(
                Oid::from_str(text.trim()).map_err(|e| SourceError::Repository {
                    path: accepted_file.display().to_string(),
                    source: crate::cause::Cause::explained(
                        format!(
                            "not a commit id ({}); restore it or delete the file to accept any head",
                            e.message()
                        ),
                        e,
                    ),
                })?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(SourceError::Io {
                    path: accepted_file.display().to_string(),
                    source: crate::cause::Cause::new(e),
                });
            }
        };
        if access == Access::Writer {
            super::fetch::remove_stale_locks(&super::repo_dir(state_dir));
        }
        Ok(Source {
            verifier: Verifier::new(settings.trust.clone()),
            settings,
            repo_dir: super::repo_dir(state_dir),
            reader: None,
            state_dir: state_dir.to_path_buf(),
            accepted_file,
            access,
            accepted,
            cache: None,
            cache_file,
            cache_loaded: false,
            cache_loading,
            cache_writes: cache_writer::Writes::default(),
            parses_made: Arc::default(),
            parses_made_taken: 0,
            retain_parses: true,
            reread_disk_cache: false,
            packs_beside: false,
            write_beside: false,
            last_good: None,
            failure: None,
            parses: 0,
        })
    }

    pub fn settings(&self) -> &SourceSettings {
        &self.settings
    }

    /// A reader fetches into `reader` (kept by its caller, who reads the
    /// fetched objects after this `Source` is gone: `tend propose`).
    pub fn with_reader_repo(mut self, reader: Arc<ReaderRepo>) -> Self {
        if self.access == Access::ReadOnly {
            self.repo_dir = reader.dir.clone();
            self.reader = Some(reader);
        }
        self
    }

    /// How many files were parsed since this `Source` was opened.
    pub fn parse_count(&self) -> u64 {
        self.parses
    }

    /// Whether the running writer's thread has made the last snapshot's
    /// parse results for the next commit (and they were not taken yet).
    pub fn parse_results_made(&self) -> bool {
        self.parses_made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// How many commits took the parse results the running writer's
    /// thread made (rather than copying or reading them).
    pub fn parse_results_taken(&self) -> u64 {
        self.parses_made_taken
    }

    /// The last accepted commit (persisted).
    pub fn accepted_commit(&self) -> Option<String> {
        self.accepted.map(|o| o.to_string())
    }

    /// Fetches and, when the head moved, builds a new snapshot. Never
    /// replaces the last good snapshot with a failure.
    pub fn poll(&mut self, now: SystemTime) -> PollOutcome {
        crate::process::failpoint::stop_point(crate::process::failpoint::BEFORE_FETCH);
        let changed = match self.try_poll(now) {
            Ok(changed) => {
                self.failure = None;
                changed
            }
            Err(error) => {
                let (since, failures) = match &self.failure {
                    Some(f) => (f.since, f.failures + 1),
                    None => (now, 1),
                };
                self.failure = Some(SourceFailure {
                    error,
                    since,
                    failures,
                });
                self.fall_back_to_accepted()
            }
        };
        PollOutcome {
            snapshot: self.last_good.clone(),
            changed,
            failure: self.failure.clone(),
        }
    }

    /// With no snapshot in this process yet (a start, or a one-shot
    /// command, while the source fails), the last accepted commit's, read
    /// from the local Git data: the desired state tend last accepted stays
    /// in force, as it does for a process that saw it before the failure.
    /// Whether one was built.
    fn fall_back_to_accepted(&mut self) -> bool {
        let Some(accepted) = self.accepted else {
            return false;
        };
        if self.last_good.is_some() {
            return false;
        }
        match self.snapshot_at(accepted) {
            Ok(built) => built,
            Err(e) => {
                tracing::warn!(
                    "source: the last accepted commit {accepted} cannot be read from the local Git data either: {e}"
                );
                false
            }
        }
    }

    /// For a long-running writer (`tend run`): the parse cache on disk is
    /// written beside the cycles, on a thread of its own, which then makes
    /// the snapshot's parse results for the next commit (they share the
    /// snapshot's declarations: what they add is the list of files). A
    /// commit that comes before that thread is done copies them from the
    /// snapshot; a snapshot with a diagnostic has none, and the next head
    /// reads the parse cache on disk.
    pub fn parses_on_disk(mut self) -> Self {
        if self.access == Access::Writer {
            self.retain_parses = false;
            self.reread_disk_cache = true;
        }
        self
    }

    /// For a long-running writer (`tend run`): a fetch that brought a new
    /// head packs the Git cache when it is due (see
    /// [`super::cache_pack`]), on a thread of its own. A one-shot command
    /// packs at its end instead.
    pub fn packing_beside(mut self) -> Self {
        self.packs_beside = self.access == Access::Writer;
        self
    }

    /// One poll by a process that polls once (`tend apply`, `tend plan`):
    /// the parse results go into the snapshot instead of being copied
    /// into a cache no later poll would read.
    pub fn poll_once(mut self, now: SystemTime) -> PollOutcome {
        self.retain_parses = false;
        self.poll(now)
    }

    /// [`Source::poll_once`] whose parse cache, when a new commit changed
    /// it, is written on a thread of its own while the caller's cycle
    /// runs (a one-shot `tend apply` of a one-file commit waited 30 ms for
    /// it at 10,000 files). The write is finished when the returned
    /// [`CacheWriting`] goes: hold it until the command ends.
    pub(crate) fn poll_once_writing_beside(
        mut self,
        now: SystemTime,
    ) -> (PollOutcome, CacheWriting) {
        self.retain_parses = false;
        self.write_beside = self.access == Access::Writer;
        let outcome = self.poll(now);
        (outcome, self.cache_writes.take())
    }

    /// The snapshot of the last accepted commit, built from the local Git
    /// data without fetching: what `tend override set` checks a name
    /// against while Git may be unreachable. `None` when no commit was
    /// accepted yet.
    pub fn accepted_snapshot(mut self) -> Result<Option<Arc<Snapshot>>, SourceError> {
        let Some(accepted) = self.accepted else {
            return Ok(None);
        };
        self.retain_parses = false;
        self.snapshot_at(accepted)?;
        Ok(self.last_good.take())
    }

    fn try_poll(&mut self, now: SystemTime) -> Result<bool, SourceError> {
        let head = self.fetch_head()?;
        if self.settings.trust.is_enabled()
            && Some(head) != self.accepted
            && self
                .last_good
                .as_ref()
                .is_none_or(|s| s.commit != head.to_string())
        {
            let repo =
                Repository::open_bare(&self.repo_dir).map_err(|e| SourceError::Repository {
                    path: self.repo_dir.display().to_string(),
                    source: crate::cause::Cause::git(&e),
                })?;
            self.verifier.check(&repo, head, self.accepted, now)?;
        }
        let changed = self.snapshot_at(head)?;
        if changed && self.packs_beside {
            super::cache_pack::pack_beside(&self.repo_dir);
        }
        Ok(changed)
    }

    /// Builds the snapshot of `head` unless it is the current one.
    fn snapshot_at(&mut self, head: Oid) -> Result<bool, SourceError> {
        if self
            .last_good
            .as_ref()
            .is_some_and(|s| s.commit == head.to_string())
        {
            return Ok(false);
        }
        let repo = Repository::open_bare(&self.repo_dir).map_err(|e| SourceError::Repository {
            path: self.repo_dir.display().to_string(),
            source: crate::cause::Cause::git(&e),
        })?;
        if let Some(old) = self.accepted
            && old != head
            && !self.settings.allow_rewind
            && !descends_from(&repo, head, old)
        {
            return Err(SourceError::Rewind {
                old: old.to_string(),
                new: head.to_string(),
            });
        }
        let started = std::time::Instant::now();
        let (commit_time, tree_id) = declarations_tree(&repo, head, &self.settings.path)?;
        let previous = self.take_previous_parses(started);
        let parses_before = self.parses;
        let cached_tree = previous.tree;
        let tree_bytes = object_id(tree_id);
        if previous.tree == Some(tree_bytes) {
            // The same tree: the same files with the same bytes. The
            // snapshot takes the cached declarations over as they are.
            if self.retain_parses {
                self.cache = Some(previous.clone());
            }
            return self.accept_snapshot(head, commit_time, previous);
        }
        let (files, contents, stale, delta) = self.parse_tree(&repo, head, tree_id, previous)?;
        tracing::debug!(
            "source: {} files parsed, {} from the cache, in {:?}",
            self.parses - parses_before,
            files.len() as u64 - (self.parses - parses_before),
            started.elapsed()
        );
        let all_invalid = !contents.is_empty()
            && contents
                .iter()
                .all(|c| c.declarations.is_empty() && !c.diagnostics.is_empty());
        // Written only when it changed; a failure costs the next process
        // some parsing, nothing else. The running agent writes it from the
        // snapshot once that is out, on a thread of its own: at 100,000
        // files the write is half a second no commit should wait for.
        let store = self.access == Access::Writer
            && (cached_tree != Some(tree_bytes) || self.parses > parses_before || stale);
        // A one-shot writes the files changed since the cache's base when
        // it read one (the running agent writes it whole, once quiet).
        let delta = delta.filter(|_| store && !self.reread_disk_cache);
        let later = store
            && delta.is_none()
            && (self.reread_disk_cache || self.write_beside)
            && contents.iter().all(|c| c.diagnostics.is_empty());
        if let Some(delta) = delta {
            let entries = parse_cache::delta_write::entries_of(&delta, &files, &contents);
            let target = (self.cache_file.clone(), self.settings.path.clone(), tree_id);
            self.cache_writes
                .delta(self.write_beside, target, (files.len(), delta), entries);
        } else if store && !later {
            // After the one being written beside (the newest is last), or
            // instead of the one waiting for a quiet source.
            self.cache_writes.settle();
            let entries = files
                .iter()
                .zip(&contents)
                .map(|((path, blob), c)| (path.as_str(), *blob, c.into()));
            parse_cache::store_logged(&self.cache_file, &self.settings.path, tree_id, entries, "");
        }
        // The parse results are kept even when the snapshot is refused, so a
        // fix that touches one file re-parses only that file. A one-shot
        // poll keeps none: the snapshot is all it needs.
        if self.retain_parses || all_invalid {
            self.cache = Some(ParsedTree::from_contents(
                Some(tree_bytes),
                files
                    .iter()
                    .zip(&contents)
                    .map(|((path, blob), c)| (path.clone(), object_id(*blob), c.clone())),
            ));
        }
        if all_invalid {
            return Err(SourceError::AllFilesInvalid {
                commit: head.to_string(),
                files: contents.len(),
                first: super::first_problems(contents.iter().flat_map(|c| &c.diagnostics)),
            });
        }
        let snapshot = Snapshot {
            commit: head.to_string(),
            commit_time,
            files,
            declarations: DeclarationSet::from_files(contents),
            provider_groups: Default::default(),
        };
        self.accept(head)?;
        let snapshot = Arc::new(snapshot);
        if later {
            self.store_parses_later(tree_id, snapshot.clone());
        }
        self.last_good = Some(snapshot);
        Ok(true)
    }

    /// Writes the parse cache of `snapshot` on a thread of its own, after
    /// the one writing the previous one (see [`super::cache_writer`]).
    fn store_parses_later(&mut self, tree: Oid, snapshot: Arc<Snapshot>) {
        let target = (self.cache_file.clone(), self.settings.path.clone(), tree);
        let made = self.parses_made.clone();
        // The running agent's waits for a quiet source.
        let quiet = self.reread_disk_cache;
        self.cache_writes.schedule(target, snapshot, made, quiet);
    }

    /// Lists the files under the tree (over `previous`'s listing) and parses
    /// those whose blob changed (the rest come from `previous`). Returns the
    /// files, their contents and whether `previous` held files no longer in
    /// the tree. On a failure the parse results are kept for the next try.
    fn parse_tree(
        &mut self,
        repo: &Repository,
        head: Oid,
        tree_id: Oid,
        previous: ParsedTree,
    ) -> Result<ParsedFiles, SourceError> {
        let listed = match list_files_over(repo, head, tree_id, &self.settings.path, &previous) {
            Ok(files) => files,
            Err(e) => {
                // Keep the parse results for the next attempt.
                self.cache = Some(previous);
                return Err(e);
            }
        };
        // An entry that cannot be read (a name that is not UTF-8, a
        // subtree nested too deep) is an error of its own, in place of
        // its contents, and cached like any file's.
        let mut problems: HashMap<String, String> = HashMap::new();
        // Sized to the files, not collected in place: the snapshot keeps
        // this list, and the listing's own buffer (grown by doubling, its
        // entries larger) would stay with it, half of it unused (4.6 MB at
        // 100,000 files).
        let mut files: Vec<(String, Oid)> = Vec::with_capacity(listed.len());
        for f in listed {
            if let Some(problem) = f.problem {
                problems.insert(f.path.clone(), problem);
            }
            files.push((f.path, f.id));
        }
        // Entries are taken out of the cache in path order; what is passed
        // over belongs to files no longer in the tree (or changed).
        let mut cached = parse_cache::CachedFiles::new(previous);
        let mut contents = Vec::with_capacity(files.len());
        for (path, blob_id) in &files {
            let parsed = match cached.take(path, object_id(*blob_id)) {
                Some(parsed) => parsed,
                None if problems.contains_key(path) => FileContents {
                    declarations: Vec::new(),
                    diagnostics: vec![crate::model::Diagnostic {
                        file: path.into(),
                        line: 1,
                        column: 1,
                        message: problems.remove(path).unwrap_or_default(),
                    }],
                },
                None => match repo.find_blob(*blob_id) {
                    Ok(blob) => {
                        self.parses += 1;
                        parse_file(Path::new(path), blob.content())
                    }
                    Err(e) => {
                        // Keep what was parsed, and what was not looked
                        // at yet, for the next attempt.
                        self.cache = Some(ParsedTree::from_contents(
                            None,
                            files
                                .iter()
                                .zip(contents)
                                .map(|((path, blob), contents)| {
                                    (path.clone(), object_id(*blob), contents)
                                })
                                .chain(cached.rest()),
                        ));
                        return Err(SourceError::Repository {
                            path: self.repo_dir.display().to_string(),
                            source: crate::cause::Cause::explained(
                                format!("blob {blob_id} of {path}: {}", e.message()),
                                e,
                            ),
                        });
                    }
                },
            };
            contents.push(parsed);
        }
        let (stale, delta) = cached.finish();
        Ok((files, contents, stale, delta))
    }

    /// Fetches the branch and returns its head (a missing branch is an
    /// error: an empty result must never read as "no declarations").
    fn fetch_head(&mut self) -> Result<Oid, SourceError> {
        let settings = FetchSettings {
            url: &self.settings.url,
            branch: &self.settings.branch,
            depth: self.settings.depth,
            credentials: &self.settings.credentials,
        };
        let fetch_started = std::time::Instant::now();
        let into = match self.access {
            Access::Writer => FetchInto::Tracking,
            Access::ReadOnly => {
                if self.reader.is_none() {
                    let reader = super::reader_repo::prepare(&self.state_dir, &self.settings.url)?;
                    self.repo_dir = reader.dir.clone();
                    self.reader = Some(Arc::new(reader));
                }
                FetchInto::Private
            }
        };
        let fetched = fetch(&self.repo_dir, &settings, into);
        tracing::debug!("source: fetched in {:?}", fetch_started.elapsed());
        fetched?.ok_or_else(|| SourceError::BranchMissing {
            url: self.settings.url.clone(),
            branch: self.settings.branch.clone(),
        })
    }

    /// The parse results to reuse: the last poll's, else (first poll of
    /// the process) the parse cache read beside the fetch.
    fn take_previous_parses(&mut self, started: std::time::Instant) -> ParsedTree {
        let copied = || {
            let parses = self
                .last_good
                .as_deref()
                .and_then(Snapshot::parse_results)?;
            tracing::debug!(
                "source: parse results of {} files copied from the last snapshot in {:?}",
                parses.files.len(),
                started.elapsed()
            );
            Some(parses)
        };
        let made = || {
            let parses = self
                .parses_made
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()?;
            tracing::debug!(
                "source: parse results of {} files made beside the cycles",
                parses.files.len()
            );
            Some(parses)
        };
        match self.cache.take() {
            Some(previous) => previous,
            // The running agent's writer thread made them from the last
            // snapshot (any snapshot's results are good for reuse: each
            // file's are keyed by its path and blob).
            None if self.reread_disk_cache
                && let Some(parses) = made() =>
            {
                self.parses_made_taken += 1;
                parses
            }
            // Not made yet (a commit right after the last): copying the
            // snapshot's costs a fraction of reading the disk cache again
            // (0.78 s at 100,000 files).
            None if self.reread_disk_cache
                && let Some(parses) = copied() =>
            {
                parses
            }
            None if !self.cache_loaded || self.reread_disk_cache => {
                self.cache_loaded = true;
                // A reader thread that could not start is replaced by a read
                // here; one that died (a bug) costs parsing, not the process.
                let loaded = match self.cache_loading.take().map(|h| h.join()) {
                    Some(Ok(loaded)) => loaded,
                    Some(Err(_)) => {
                        tracing::warn!(
                            "reading the parse cache {} failed; every file is parsed",
                            self.cache_file.display()
                        );
                        ParsedTree::default()
                    }
                    None => parse_cache::load(&self.cache_file, &self.settings.path),
                };
                tracing::debug!(
                    "source: parse cache of {} files loaded in {:?}",
                    loaded.files.len(),
                    started.elapsed()
                );
                loaded
            }
            None => ParsedTree::default(),
        }
    }

    /// A snapshot of an unchanged tree, from its parse results.
    fn accept_snapshot(
        &mut self,
        head: Oid,
        commit_time: SystemTime,
        parsed: ParsedTree,
    ) -> Result<bool, SourceError> {
        let all_invalid = !parsed.files.is_empty()
            && parsed.declarations.is_empty()
            && parsed.files.iter().all(|f| !f.diagnostics.is_empty());
        if all_invalid {
            return Err(SourceError::AllFilesInvalid {
                commit: head.to_string(),
                files: parsed.files.len(),
                first: super::first_problems(parsed.files.iter().flat_map(|f| &f.diagnostics)),
            });
        }
        let mut files = Vec::with_capacity(parsed.files.len());
        let mut diagnostics = Vec::new();
        for file in parsed.files {
            diagnostics.extend(file.diagnostics);
            let blob = Oid::from_bytes(&file.blob).map_err(|e| SourceError::Repository {
                path: self.repo_dir.display().to_string(),
                source: crate::cause::Cause::git(&e),
            })?;
            files.push((file.path, blob));
        }
        let declarations =
            DeclarationSet::from_parsed(parsed.declarations, diagnostics, files.len());
        self.accept(head)?;
        self.last_good = Some(Arc::new(Snapshot {
            commit: head.to_string(),
            commit_time,
            files,
            declarations,
            provider_groups: Default::default(),
        }));
        Ok(true)
    }

    fn accept(&mut self, head: Oid) -> Result<(), SourceError> {
        if self.access == Access::Writer && self.accepted != Some(head) {
            let io = |e: std::io::Error| SourceError::Io {
                path: self.accepted_file.display().to_string(),
                source: crate::cause::Cause::new(e),
            };
            crate::files::write_atomically(&self.accepted_file, format!("{head}\n").as_bytes())
                .map_err(io)?;
        }
        self.accepted = Some(head);
        Ok(())
    }
}

/// Whether `head` descends from `old` (anti-rollback).
///
/// libgit2's `graph_descendant_of` answers `false` in a shallow repository
/// (`depth`) even when `old` is `head`'s parent: its merge-base walk stops
/// at the grafted boundary. There, the parents are walked through the
/// fetched commits instead: every commit after the boundary was fetched
/// (fetches after the first are not shallow), and a parent that is absent
/// lies behind the boundary, where `old` cannot be (it was fetched).
fn descends_from(repo: &Repository, head: Oid, old: Oid) -> bool {
    if !repo.is_shallow() {
        return repo.graph_descendant_of(head, old).unwrap_or(false);
    }
    let mut seen = std::collections::HashSet::new();
    let mut next = vec![head];
    while let Some(id) = next.pop() {
        if id == old {
            return true;
        }
        if !seen.insert(id) {
            continue;
        }
        if let Ok(commit) = repo.find_commit(id) {
            next.extend(commit.parent_ids());
        }
    }
    false
}
