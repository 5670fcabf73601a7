//! The parse cache written on a thread of its own, beside the cycles: the
//! running agent's for every new commit, a one-shot command's for the
//! commit it polled.
//!
//! # Guarantees
//! * Writes follow each other: a write waits for the one before it, so
//!   the newest snapshot's cache is the one left on disk.
//! * A snapshot whose set has a diagnostic (a name declared twice, known
//!   only once the set is built) is not written: its files' own results
//!   are no longer known, and an older cache costs parsing, nothing else.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use git2::Oid;

use super::parse_cache::{self, ParsedTree};
use super::snapshot::Snapshot;

/// Starts writing the parse cache of `snapshot` (of `tree`, at source path
/// `path`) to `file`, after `previous` is done; the parse results made on
/// the way go to `made`, for the next commit's poll.
pub(super) fn start(
    previous: Option<JoinHandle<()>>,
    (file, path, tree): (PathBuf, String, Oid),
    snapshot: Arc<Snapshot>,
    made: Arc<Mutex<Option<ParsedTree>>>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tend-parse-cache".into())
        .spawn(move || {
            // Made from the snapshot's own declarations (shared, not
            // copied).
            let parses = snapshot.parse_results();
            drop(snapshot);
            if let Some(previous) = previous {
                let _ = previous.join();
            }
            let Some(parses) = parses else {
                tracing::debug!("source: parse cache not written for a set with diagnostics");
                return;
            };
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
            *made.lock().unwrap_or_else(|p| p.into_inner()) = Some(parses);
        })
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
