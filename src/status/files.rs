//! The report files in `reports_dir`: `latest.json` (the report contract),
//! `latest.md`, `latest.html`, and a bounded history.
//!
//! # Guarantees
//! * A reader never sees half a file: each is written beside its final
//!   name, flushed to disk, then renamed over it (and the directory is
//!   synced, so the rename survives a crash).
//! * `history/` keeps at most `keep_reports` JSON reports, named by the
//!   time they were made (`20270115T080000Z-000.json`), so names sort by
//!   time. A report is added only when what it says changed from the
//!   newest one kept ([`content_digest`]): a quiet fleet does not rotate a
//!   day's history away in an hour.
//! * Files are streamed to disk, never built whole in memory: at 10,000
//!   resources the three renderings are megabytes each.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::Digest;

use super::report::Report;
use super::{html, render};

/// Why report files could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReportFilesError {
    /// A file or directory under `reports_dir` could not be written.
    #[error("cannot write {path}: {source}; check that [status] reports_dir is writable by tend")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where the reports go, and how many to keep.
#[derive(Debug, Clone)]
pub(crate) struct ReportFiles {
    dir: PathBuf,
    keep: usize,
    /// The content digest of the newest history entry, once known (read
    /// from disk at the first write).
    newest: Option<String>,
}

/// Keys of the pretty JSON whose values move every cycle: left out of the
/// content digest.
const VOLATILE: &[&str] = &["\"generatedAt\":", "\"observedAt\":", "\"failures\":"];

/// Hashes pretty-printed report JSON line by line, leaving out the lines
/// of [`VOLATILE`] keys (pretty JSON puts every scalar key on a line of
/// its own).
#[derive(Default)]
struct ContentHasher {
    hasher: sha2::Sha256,
    line: Vec<u8>,
}

impl ContentHasher {
    fn line_done(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let trimmed = text.trim_start();
        if !VOLATILE.iter().any(|k| trimmed.starts_with(k)) {
            self.hasher.update(&self.line);
        }
        self.line.clear();
    }

    fn feed(&mut self, bytes: &[u8]) {
        for chunk in bytes.split_inclusive(|b| *b == b'\n') {
            self.line.extend_from_slice(chunk);
            if chunk.ends_with(b"\n") {
                self.line_done();
            }
        }
    }

    fn finish(self) -> String {
        let digest = self.finish_bytes();
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn finish_bytes(mut self) -> [u8; 32] {
        if !self.line.is_empty() {
            self.line_done();
        }
        self.hasher.finalize().into()
    }
}

/// A digest of what a report's pretty JSON says, leaving out the times
/// that move every cycle (when it was made, when each resource was
/// observed, how many polls of a failing source failed): two reports with
/// the same digest say the same thing about the fleet.
pub(crate) fn content_digest(json: &[u8]) -> String {
    let mut hasher = ContentHasher::default();
    hasher.feed(json);
    hasher.finish()
}

/// The [`content_digest`] of `value`'s pretty JSON, computed without
/// writing it.
pub(crate) fn value_digest(value: &impl serde::Serialize) -> [u8; 32] {
    let mut tee = Tee {
        file: io::sink(),
        hasher: ContentHasher::default(),
    };
    let _ = serde_json::to_writer_pretty(&mut tee, value);
    let _ = tee.write_all(b"\n");
    tee.hasher.finish_bytes()
}

/// Writes what it is given to a file and to a [`ContentHasher`].
struct Tee<W> {
    file: W,
    hasher: ContentHasher,
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.feed(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// `std::fmt::Write` onto an `io::Write`, keeping the first I/O error.
struct FmtIo<W> {
    inner: W,
    error: Option<io::Error>,
}

impl<W: Write> std::fmt::Write for FmtIo<W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.inner.write_all(s.as_bytes()).map_err(|e| {
            self.error.get_or_insert(e);
            std::fmt::Error
        })
    }
}

impl ReportFiles {
    pub(crate) fn new(dir: &Path, keep: usize) -> Self {
        ReportFiles {
            dir: dir.to_path_buf(),
            keep,
            newest: None,
        }
    }

    /// Writes the three `latest.*` files and, when the content changed, a
    /// history entry. `title` heads the Markdown and HTML (`tend apply`).
    pub(crate) fn write(&mut self, report: &Report, title: &str) -> Result<(), ReportFilesError> {
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReportFilesError::Write { path, source }
        };
        fs::create_dir_all(&self.dir).map_err(at(&self.dir))?;
        let json_path = self.dir.join("latest.json");
        let digest = write_atomically_with(&json_path, |file| {
            let mut tee = Tee {
                file,
                hasher: ContentHasher::default(),
            };
            serde_json::to_writer_pretty(&mut tee, report).map_err(io::Error::other)?;
            tee.write_all(b"\n")?;
            Ok(tee.hasher.finish())
        })
        .map_err(at(&json_path))?;
        for (name, markdown) in [("latest.md", true), ("latest.html", false)] {
            let path = self.dir.join(name);
            write_atomically_with(&path, |file| {
                let mut out = FmtIo {
                    inner: file,
                    error: None,
                };
                if markdown {
                    render::markdown_into(&mut out, report, title, false);
                } else {
                    html::page_into(&mut out, report, title);
                }
                out.error.map_or(Ok(()), Err)
            })
            .map_err(at(&path))?;
        }
        if self.keep > 0 {
            let history = self.dir.join("history");
            self.add_to_history(&history, &json_path, report, digest)
                .map_err(at(&history))?;
        }
        sync_dir(&self.dir).map_err(at(&self.dir))
    }

    /// The report in `latest.json`, if there is a readable one.
    pub(crate) fn read_latest(&self) -> Option<Report> {
        let bytes = fs::read(self.dir.join("latest.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn add_to_history(
        &mut self,
        history: &Path,
        latest: &Path,
        report: &Report,
        digest: String,
    ) -> io::Result<()> {
        fs::create_dir_all(history)?;
        let mut kept = entries(history)?;
        if self.newest.is_none() {
            self.newest = kept
                .last()
                .and_then(|newest| fs::read(history.join(newest)).ok())
                .map(|bytes| content_digest(&bytes));
        }
        if self.newest.as_deref() != Some(digest.as_str()) {
            // Reports made in the same second are numbered after the
            // newest of that second, so names keep sorting by time.
            let stem = compact_time(&report.generated_at);
            let next = kept
                .iter()
                .filter_map(|n| n.strip_prefix(&format!("{stem}-"))?.strip_suffix(".json"))
                .filter_map(|n| n.parse::<u32>().ok())
                .max()
                .map_or(0, |n| n + 1);
            let name = format!("{stem}-{next:03}.json");
            // latest.json is replaced by a rename, never rewritten: a hard
            // link keeps this version without copying it.
            let entry = history.join(&name);
            if fs::hard_link(latest, &entry).is_err() {
                fs::copy(latest, &entry)?;
            }
            kept.push(name);
            kept.sort();
            self.newest = Some(digest);
        }
        let excess = kept.len().saturating_sub(self.keep);
        for old in &kept[..excess] {
            fs::remove_file(history.join(old))?;
        }
        sync_dir(history)
    }
}

/// The history entries, oldest first.
fn entries(history: &Path) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(history)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// `2027-01-15T08:00:00Z` as `20270115T080000Z`: sortable, and a valid
/// file name everywhere.
fn compact_time(rfc3339: &str) -> String {
    let compact: String = rfc3339
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    if compact.is_empty() {
        "unknown".into()
    } else {
        compact
    }
}

pub(crate) use crate::files::write_atomically;
use crate::files::write_atomically_with;

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_names_sort_by_time() {
        assert_eq!(compact_time("2027-01-15T08:00:00Z"), "20270115T080000Z");
        assert!(compact_time("2027-01-15T08:00:00Z") < compact_time("2027-01-15T10:00:00Z"));
        assert_eq!(compact_time(""), "unknown");
    }

    #[test]
    fn the_content_digest_ignores_the_times_that_move() {
        let a = b"{\n  \"generatedAt\": \"1\",\n  \"resources\": [\n    {\n      \"name\": \"x\",\n      \"observedAt\": \"1\"\n    }\n  ]\n}";
        let b = b"{\n  \"generatedAt\": \"2\",\n  \"resources\": [\n    {\n      \"name\": \"x\",\n      \"observedAt\": \"2\"\n    }\n  ]\n}";
        let c = b"{\n  \"generatedAt\": \"2\",\n  \"resources\": [\n    {\n      \"name\": \"y\",\n      \"observedAt\": \"2\"\n    }\n  ]\n}";
        assert_eq!(content_digest(a), content_digest(b));
        assert_ne!(content_digest(b), content_digest(c));
        // Fed in pieces, the same digest.
        let mut h = ContentHasher::default();
        for piece in a.chunks(7) {
            h.feed(piece);
        }
        assert_eq!(h.finish(), content_digest(a));
    }
}
