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
//!   day's history away in an hour. A report whose report digest
//!   (`report_digest::digest`, which covers at least what the content
//!   digest does) is that of the last one this process found the newest
//!   entry to say is neither hashed nor compared.
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
    /// The report digest (`report_digest::digest`) of the last report
    /// this process wrote whose content is the newest history entry's: a
    /// report with the same digest says the same, so its `latest.json` is
    /// written without hashing it and no history entry is added. At
    /// 100,000 resources the hashing was a third of writing the files.
    newest_report: Option<String>,
}

/// Keys of the pretty JSON whose values move every cycle: left out of the
/// content digest.
const VOLATILE: &[&str] = &["\"generatedAt\":", "\"observedAt\":", "\"failures\":"];

/// Hashes pretty-printed report JSON line by line, leaving out the lines
/// of [`VOLATILE`] keys (pretty JSON puts every scalar key on a line of
/// its own).
///
/// It streams: serde writes a report token by token, and a line is only
/// held back until its first bytes after the indentation say whether it
/// is volatile (no longer than a key); the rest of the line goes straight
/// to the hash or is passed over. The digest is that of every
/// kept line's bytes, newline included, in order.
#[derive(Default)]
struct ContentHasher {
    hasher: sha2::Sha256,
    /// The current line's bytes while it is undecided.
    head: Vec<u8>,
    /// What is known of the current line.
    line: LineKind,
}

/// Whether the current line is hashed.
#[derive(Default, Clone, Copy, PartialEq)]
enum LineKind {
    /// Its first bytes are still coming (held in `head`).
    #[default]
    Undecided,
    Kept,
    Volatile,
}

impl ContentHasher {
    /// What the line starting with `head` is; `None` while what came of
    /// it after the indentation could still begin a volatile key
    /// (`complete`: the line ended).
    fn kind_of(head: &[u8], complete: bool) -> Option<LineKind> {
        let trimmed = head.trim_ascii_start();
        if VOLATILE.iter().any(|k| trimmed.starts_with(k.as_bytes())) {
            Some(LineKind::Volatile)
        } else if complete
            || !trimmed.is_empty() && !VOLATILE.iter().any(|k| k.as_bytes().starts_with(trimmed))
        {
            Some(LineKind::Kept)
        } else {
            None
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|b| *b == b'\n');
            let (piece, ends) = match newline {
                Some(at) => (&bytes[..=at], true),
                None => (bytes, false),
            };
            bytes = &bytes[piece.len()..];
            match self.line {
                LineKind::Kept => self.hasher.update(piece),
                LineKind::Volatile => {}
                LineKind::Undecided => {
                    self.head.extend_from_slice(piece);
                    if let Some(kind) = Self::kind_of(&self.head, ends) {
                        if kind == LineKind::Kept {
                            self.hasher.update(&self.head);
                        }
                        self.head.clear();
                        self.line = kind;
                    }
                }
            }
            if ends {
                self.line = LineKind::Undecided;
            }
        }
    }

    fn finish(self) -> String {
        let digest = self.finish_bytes();
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn finish_bytes(mut self) -> [u8; 32] {
        if self.line == LineKind::Undecided
            && Self::kind_of(&self.head, true) == Some(LineKind::Kept)
        {
            self.hasher.update(&self.head);
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
    // Written out whole first: serde writes token by token, and the
    // hasher is cheapest fed in one piece.
    let mut json = Vec::with_capacity(1024);
    let _ = serde_json::to_writer_pretty(&mut json, value);
    json.push(b'\n');
    let mut hasher = ContentHasher::default();
    hasher.feed(&json);
    hasher.finish_bytes()
}

/// A write error on `path`.
fn at(path: &Path) -> impl FnOnce(io::Error) -> ReportFilesError {
    let path = path.to_path_buf();
    move |source| ReportFilesError::Write { path, source }
}

/// Since when the last report written said something has been failing
/// (RFC 3339, as written), for a one-shot command that carries it on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LastFailures {
    /// The source's failure (`source.error.since`).
    pub(crate) source_since: Option<String>,
    /// The status branch's failure (`statusBranch.since`).
    pub(crate) status_branch_since: Option<String>,
}

/// The part of `latest.json` [`LastFailures`] is read from; the rest of
/// the file (the resources' entries) is skipped over.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LastReportHead {
    #[serde(default)]
    source: Option<LastSource>,
    #[serde(default)]
    status_branch: Option<LastSince>,
}

#[derive(serde::Deserialize)]
struct LastSource {
    #[serde(default)]
    error: Option<LastSince>,
}

#[derive(serde::Deserialize)]
struct LastSince {
    since: String,
}

/// Writes what it is given to a file and, if any, to a [`ContentHasher`].
struct Tee<W> {
    file: W,
    hasher: Option<ContentHasher>,
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        if let Some(hasher) = &mut self.hasher {
            hasher.feed(&buf[..n]);
        }
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
            newest_report: None,
        }
    }

    /// Writes the three `latest.*` files and, when the content changed, a
    /// history entry. `title` heads the Markdown and HTML (`tend apply`).
    /// `report_digest`: the report's digest, when known (see
    /// `newest_report`).
    pub(crate) fn write(
        &mut self,
        report: &Report,
        title: &str,
        report_digest: Option<&str>,
    ) -> Result<(), ReportFilesError> {
        if report_digest.is_some_and(|d| self.newest_report.as_deref() == Some(d)) {
            self.write_renderings(report, title, false)?;
            return Ok(());
        }
        let digest = self.write_latest(report, title)?;
        self.add_history(report, digest)?;
        self.newest_report = report_digest.map(str::to_string);
        Ok(())
    }

    /// The three `latest.*` files only; returns `latest.json`'s content
    /// digest, for [`ReportFiles::add_history`].
    pub(crate) fn write_latest(
        &self,
        report: &Report,
        title: &str,
    ) -> Result<String, ReportFilesError> {
        self.write_renderings(report, title, true)
            .map(|digest| digest.unwrap_or_default())
    }

    /// The three `latest.*` files; `latest.json`'s content digest when
    /// `hash`.
    fn write_renderings(
        &self,
        report: &Report,
        title: &str,
        hash: bool,
    ) -> Result<Option<String>, ReportFilesError> {
        fs::create_dir_all(&self.dir).map_err(at(&self.dir))?;
        let json_path = self.dir.join("latest.json");
        let digest = write_atomically_with(&json_path, |file| {
            // Buffered before the tee: serde writes token by token.
            let mut tee = io::BufWriter::with_capacity(
                64 * 1024,
                Tee {
                    file,
                    hasher: hash.then(ContentHasher::default),
                },
            );
            serde_json::to_writer_pretty(&mut tee, report).map_err(io::Error::other)?;
            tee.write_all(b"\n")?;
            let tee = tee.into_inner().map_err(|e| e.into_error())?;
            Ok(tee.hasher.map(ContentHasher::finish))
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
        sync_dir(&self.dir).map_err(at(&self.dir))?;
        Ok(digest)
    }

    /// Adds `latest.json` (of `report`, whose content digest is `digest`)
    /// to the history when what it says changed.
    pub(crate) fn add_history(
        &mut self,
        report: &Report,
        digest: String,
    ) -> Result<(), ReportFilesError> {
        // Whichever report that was, the history is now compared by
        // content again (see `write`).
        self.newest_report = None;
        if self.keep == 0 {
            return Ok(());
        }
        let history = self.dir.join("history");
        self.add_to_history(&history, &self.dir.join("latest.json"), report, digest)
            .map_err(at(&history))?;
        sync_dir(&self.dir).map_err(at(&self.dir))
    }

    /// The report in `latest.json`, if there is a readable one.
    pub(crate) fn read_latest(&self) -> Option<Report> {
        let bytes = fs::read(self.dir.join("latest.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Since when `latest.json` says the source and the status branch have
    /// been failing (a one-shot command carries both on): its resources
    /// are passed over, not read into entries.
    pub(crate) fn read_last_failures(&self) -> LastFailures {
        fs::read(self.dir.join("latest.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<LastReportHead>(&bytes).ok())
            .map(|head| LastFailures {
                source_since: head.source.and_then(|s| s.error).map(|e| e.since),
                status_branch_since: head.status_branch.map(|b| b.since),
            })
            .unwrap_or_default()
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

    /// A report whose digest is that of the newest history entry's report
    /// adds no entry and is written whole; any other is compared by its
    /// content, as without a digest.
    #[test]
    fn a_report_known_by_its_digest_adds_no_history_entry_and_is_written() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut files = ReportFiles::new(dir.path(), 10);
        let report = |minute: u32, reason: &str| -> Report {
            let at = format!("2027-01-15T08:{minute:02}:00Z");
            serde_json::from_value(serde_json::json!({
                "formatVersion": 1, "generatedAt": at,
                "agent": {"id": "agent", "version": "0"},
                "source": {"url": "/repo", "branch": "main"},
                "summary": super::super::report::Summary::default(),
                "resources": [{"name": "orders", "file": "orders.yaml", "state": "InSync",
                               "action": "None", "reason": reason, "drift": [],
                               "observedAt": at}],
                "errors": [],
            }))
            .expect("a report")
        };
        let history = || {
            entries(&dir.path().join("history"))
                .expect("the history")
                .len()
        };
        let latest = || fs::read_to_string(dir.path().join("latest.json")).expect("latest.json");
        let mut write = |report: Report, digest: Option<&'static str>| {
            files
                .write(&report, "t", digest)
                .expect("the report files written")
        };
        write(report(0, ""), Some("d1"));
        assert_eq!(history(), 1);
        write(report(1, ""), Some("d1"));
        assert_eq!(history(), 1, "the same report added an entry");
        // The digest is trusted, not the content checked again: shown
        // with a report that (against the contract) says something else.
        write(report(1, "trusted"), Some("d1"));
        assert_eq!(history(), 1, "the known digest was checked by content");
        assert!(
            latest().contains("trusted") && latest().contains("08:01:00Z"),
            "latest.json was not written"
        );
        // Another digest for the same content (the times moved): the
        // content decides.
        write(report(2, ""), Some("d2"));
        assert_eq!(history(), 1);
        write(report(3, "drifted"), Some("d3"));
        assert_eq!(history(), 2, "a new report added no entry");
        // Back to what the first said: new against the newest entry.
        write(report(4, ""), Some("d1"));
        assert_eq!(history(), 3, "a report like an older entry added none");
        write(report(5, ""), None);
        write(report(6, "drifted"), None);
        assert_eq!(history(), 4);
        assert!(latest().contains("08:06:00Z"));
    }

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

    #[test]
    fn the_last_failures_are_read_from_the_head_of_latest_json() {
        let dir = tempfile::tempdir().unwrap();
        let files = ReportFiles::new(dir.path(), 0);
        assert_eq!(files.read_last_failures(), LastFailures::default());
        let latest = r#"{
  "formatVersion": 1,
  "source": {"url": "u", "branch": "main", "commit": null,
             "error": {"message": "m", "since": "2027-01-15T08:00:00Z", "failures": 3}},
  "resources": [{"name": "a", "anything": [1, {"since": "not this one"}]}],
  "errors": [],
  "statusBranch": {"branch": "tend-status", "error": "e", "since": "2027-01-15T09:00:00Z"}
}"#;
        fs::write(dir.path().join("latest.json"), latest).unwrap();
        assert_eq!(
            files.read_last_failures(),
            LastFailures {
                source_since: Some("2027-01-15T08:00:00Z".into()),
                status_branch_since: Some("2027-01-15T09:00:00Z".into()),
            }
        );
        let working = r#"{"source": {"url": "u", "branch": "main"}, "resources": []}"#;
        fs::write(dir.path().join("latest.json"), working).unwrap();
        assert_eq!(files.read_last_failures(), LastFailures::default());
    }

    /// The streaming hasher digests what hashing each whole kept line
    /// does, however the text is cut: lines that begin like a volatile
    /// key and are not one, short lines, an unterminated last line.
    #[test]
    fn the_streamed_digest_is_that_of_the_kept_lines() {
        let text = "{\n  \"generatedAt\": \"1\",\n  \"generated\": 2,\n  \"\"\n  \"observedAtX\": 1,\n\n    \"observedAt\": \"3\"\n  \"failures\": 4,\n  \"fail\": [\n\"generatedAt\": 5\n  }\n    \"gen";
        let reference = |text: &str| {
            let mut hasher = sha2::Sha256::new();
            for line in text.split_inclusive('\n') {
                if !VOLATILE.iter().any(|k| line.trim_start().starts_with(k)) {
                    hasher.update(line.as_bytes());
                }
            }
            let digest: [u8; 32] = hasher.finalize().into();
            digest
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let expected = reference(text);
        assert_ne!(
            expected,
            reference(&text.replace("\"generated\"", "\"generatex\""))
        );
        for size in 1..=text.len() {
            let mut h = ContentHasher::default();
            for piece in text.as_bytes().chunks(size) {
                h.feed(piece);
            }
            assert_eq!(h.finish(), expected, "pieces of {size} bytes");
        }
        assert_eq!(
            content_digest(text.replace("\"1\"", "\"9\"").as_bytes()),
            expected
        );
    }
}
