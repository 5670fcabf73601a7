//! The parse cache written on a thread of its own, beside the cycles: the
//! running agent's for every new commit, a one-shot command's for the
//! commit it polled.
//!
//! # Guarantees
//! * Writes follow each other: a write waits for the one before it, so
//!   the newest snapshot's cache is the one left on disk.
//! * The running agent's write waits for the source to be quiet
//!   ([`QUIET`]) and is dropped when a newer snapshot's supersedes it: at
//!   100,000 files a write is 0.3 s of a core and 50 MB of disk, which a
//!   burst of commits would pay at each and the next commit's cycle and
//!   status commit would wait beside. The parse results for the next
//!   commit are made at once all the same. A write not made (the agent
//!   stopped first) costs the next process the parsing of the files
//!   changed since the cache on disk, nothing else: each file's results
//!   are keyed by its blob.
//! * A snapshot whose set has a diagnostic (a name declared twice, known
//!   only once the set is built) is not written: its files' own results
//!   are no longer known, and an older cache costs parsing, nothing else.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use git2::Oid;

use super::parse_cache::{self, ParsedTree};
use super::snapshot::Snapshot;

/// How long the running agent's parse cache write waits for a newer
/// snapshot before it is made.
const QUIET: Duration = Duration::from_secs(5);

/// How long snapshots may supersede each other's writes: a source whose
/// declarations change more often than [`QUIET`] still has its cache
/// written this often.
const MAX_UNWRITTEN: Duration = Duration::from_secs(60);

/// Starts writing the parse cache of `snapshot` (of `tree`, at source path
/// `path`) to `file`, after `previous` is done; the parse results made on
/// the way go to `made`, for the next commit's poll. With `quiet`, they
/// go there at once, and the write waits for the quiet time; it is made
/// at once when the receiver's sender sends (the source goes), and not at
/// all when that sender goes without sending (a newer write supersedes
/// it).
fn start(
    previous: Option<JoinHandle<()>>,
    (file, path, tree): (PathBuf, String, Oid),
    snapshot: Arc<Snapshot>,
    made: Arc<Mutex<Option<ParsedTree>>>,
    quiet: Option<(Duration, Receiver<()>)>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tend-parse-cache".into())
        .spawn(move || {
            // Made from the snapshot's own declarations (shared, not
            // copied), of its tree whole: the next commit's tree is listed
            // over them (see `relisting`).
            let of_tree = || {
                snapshot.parse_results().map(|mut parses| {
                    parses.tree = Some(parse_cache::object_id(tree));
                    parses
                })
            };
            let parses = match quiet {
                None => of_tree(),
                Some((wait, superseded)) => {
                    // For the next commit at once; the snapshot is kept
                    // (the source holds it too, until the next) to make
                    // them again for the write if a poll took them.
                    let parses = of_tree();
                    let made_now = parses.is_some();
                    if let Some(parses) = parses {
                        *made.lock().unwrap_or_else(|p| p.into_inner()) = Some(parses);
                    }
                    match superseded.recv_timeout(wait) {
                        // Quiet, or told to write now (the source goes).
                        Err(RecvTimeoutError::Timeout) | Ok(()) => {}
                        Err(RecvTimeoutError::Disconnected) => {
                            tracing::debug!(
                                "source: parse cache write superseded by a newer snapshot's"
                            );
                            return;
                        }
                    }
                    let taken = || made.lock().unwrap_or_else(|p| p.into_inner()).take();
                    made_now.then(|| taken().or_else(of_tree)).flatten()
                }
            };
            drop(snapshot);
            let Some(parses) = parses else {
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
                tracing::debug!("source: parse cache not written for a set with diagnostics");
                return;
            };
            if let Some(previous) = previous {
                let _ = previous.join();
            }
            let mut declarations = parses.declarations.as_slice();
            let entries = parses.files.iter().map(|f| {
                let (own, rest) = declarations.split_at(f.declarations.min(declarations.len()));
                declarations = rest;
                let view = parse_cache::FileView {
                    declarations: own.iter().map(Arc::as_ref).collect(),
                    diagnostics: &f.diagnostics,
                };
                (
                    f.path.as_str(),
                    Oid::from_bytes(&f.blob).unwrap_or(Oid::ZERO_SHA1),
                    view,
                )
            });
            parse_cache::store_logged(&file, &path, tree, entries, ", beside the cycles");
            // (Unless a newer write has put its own there since.)
            let mut slot = made.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(parses);
            }
        })
}

/// The source's parse cache writes: the thread writing (or waiting to
/// write) the newest, and what tells a waiting one to give way or write
/// now. When this goes, a waiting write is made at once and the newest is
/// finished: the next process reads it whole.
#[derive(Debug, Default)]
pub(super) struct Writes {
    writing: Option<JoinHandle<()>>,
    /// Held while a write waits for a quiet source: dropped, it tells that
    /// write a newer one supersedes it; sent on, to write now.
    pending: Option<std::sync::mpsc::Sender<()>>,
    /// Since when the writes waiting for a quiet source have superseded
    /// each other (bounded by [`MAX_UNWRITTEN`]).
    unwritten_since: Option<std::time::Instant>,
}

impl Writes {
    /// Writes the parse cache of `snapshot` (see [`start`]) after the
    /// write before it; with `quiet` (the running agent), once the source
    /// is quiet, superseding the write waiting.
    pub(super) fn schedule(
        &mut self,
        target: (PathBuf, String, Oid),
        snapshot: Arc<Snapshot>,
        made: Arc<Mutex<Option<ParsedTree>>>,
        quiet: bool,
    ) {
        let previous = self.writing.take();
        // The last one written is what a finished thread left.
        let now = std::time::Instant::now();
        let waiting = previous.as_ref().is_some_and(|p| !p.is_finished());
        let since = match self.unwritten_since {
            Some(since) if waiting => since,
            _ => now,
        };
        let overdue = now.duration_since(since) >= MAX_UNWRITTEN;
        self.unwritten_since = (!overdue).then_some(since);
        // Replacing the sender (or dropping it, for a write made at once)
        // makes the one waiting give way.
        self.pending = None;
        let quiet = (quiet && !overdue).then(|| {
            let (pending, superseded) = std::sync::mpsc::channel();
            self.pending = Some(pending);
            (QUIET, superseded)
        });
        let file = target.0.clone();
        match start(previous, target, snapshot, made, quiet) {
            Ok(handle) => self.writing = Some(handle),
            Err(e) => tracing::warn!(
                "cannot start writing the parse cache {}: {e}; the next process parses every file",
                file.display()
            ),
        }
    }

    /// Writes the parse cache of `target`'s tree as a delta over the base
    /// on disk (see [`parse_cache::delta_write`]): `entries` are the
    /// results of the delta's changed files, `files` the whole's count.
    /// With `beside`, on a thread of its own after the write before it;
    /// else at once, on the caller's.
    pub(super) fn delta(
        &mut self,
        beside: bool,
        (file, path, tree): (PathBuf, String, Oid),
        (files, delta): (usize, parse_cache::CacheDelta),
        entries: Vec<(String, Oid, crate::model::load::FileContents)>,
    ) {
        let write = move |when: &str| {
            parse_cache::delta_write::store_logged(
                &file, &path, tree, files, &delta, &entries, when,
            );
        };
        if !beside {
            self.settle();
            write("");
            return;
        }
        // Superseding a whole write waiting for a quiet source: the delta
        // is of a newer tree.
        let previous = self.writing.take();
        self.pending = None;
        self.unwritten_since = None;
        let spawned = std::thread::Builder::new()
            .name("tend-parse-cache".into())
            .spawn(move || {
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
                write(", beside the cycles");
            });
        match spawned {
            Ok(handle) => self.writing = Some(handle),
            Err(e) => tracing::warn!(
                "cannot start writing the parse cache's delta: {e}; the next process parses the files changed"
            ),
        }
    }

    /// Before a write made on the caller's thread: the one waiting gives
    /// way, the one writing finishes.
    pub(super) fn settle(&mut self) {
        self.pending = None;
        if let Some(writing) = self.writing.take() {
            let _ = writing.join();
        }
    }

    /// The newest write, for the caller to wait for ([`CacheWriting`]).
    pub(super) fn take(&mut self) -> CacheWriting {
        CacheWriting(self.writing.take())
    }
}

impl Drop for Writes {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            let _ = pending.send(());
        }
        if let Some(writing) = self.writing.take() {
            let _ = writing.join();
        }
    }
}

/// The parse cache being written beside a one-shot command's cycle
/// ([`super::Source::poll_once_writing_beside`]): finished when this goes,
/// so the next process reads it whole (and no temporary file is left
/// behind).
#[derive(Debug, Default)]
#[must_use = "dropping it waits for the parse cache's write"]
pub(crate) struct CacheWriting(pub(super) Option<JoinHandle<()>>);

impl Drop for CacheWriting {
    fn drop(&mut self) {
        if let Some(writing) = self.0.take() {
            let _ = writing.join();
        }
    }
}
