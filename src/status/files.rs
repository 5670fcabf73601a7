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
//! * What a process knew of the files when it last wrote them is recorded
//!   beside them ([`FilesRecord`]), and a new process takes it instead of
//!   reading `latest.json` and the newest history entry back, for as long
//!   as both are the files it describes.
//! * Files are streamed to disk, never built whole in memory: at 10,000
//!   resources the three renderings are megabytes each.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::Digest;

use super::files_record::FilesRecord;
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
    /// Whether the last writer's record was looked for (once, before the
    /// first file is written: see [`ReportFiles::recall`]).
    recalled: bool,
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
            recalled: false,
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
        self.recall();
        if report_digest.is_some_and(|d| self.newest_report.as_deref() == Some(d)) {
            self.write_renderings(report, title, false)?;
        } else {
            let digest = self.write_latest(report, title)?;
            self.history_of(report, digest)?;
            self.newest_report = report_digest.map(str::to_string);
        }
        self.record(report);
        Ok(())
    }

    /// The three `latest.*` files only; returns `latest.json`'s content
    /// digest, for [`ReportFiles::add_history`].
    pub(crate) fn write_latest(
        &mut self,
        report: &Report,
        title: &str,
    ) -> Result<String, ReportFilesError> {
        self.recall();
        self.write_renderings(report, title, true)
            .map(|digest| digest.unwrap_or_default())
    }

    /// Once, before this process first writes a file: what the last writer
    /// recorded of the files, while they are still the ones it described,
    /// stands in for reading them back (the newest history entry's
    /// content digest, and the report digest `latest.json` says the same
    /// as). The history's part holds only while its newest entry is the
    /// one recorded.
    fn recall(&mut self) {
        if std::mem::replace(&mut self.recalled, true) {
            return;
        }
        let Some(record) = FilesRecord::read(&self.dir) else {
            return;
        };
        let newest_entry = self.newest_entry();
        if self.keep == 0 || (newest_entry.is_some() && record.newest_entry == newest_entry) {
            self.newest = self.newest.take().or(record.content);
            self.newest_report = self.newest_report.take().or(record.report);
        }
    }

    /// The newest history entry's file name, if any.
    fn newest_entry(&self) -> Option<String> {
        entries(&self.dir.join("history"))
            .ok()
            .and_then(|mut names| names.pop())
    }

    /// Records what this process knows of the files just written (see
    /// [`FilesRecord`]); a record that cannot be written is stale, not
    /// wrong, and only costs the next process a read.
    fn record(&self, report: &Report) {
        let newest_entry = match self.keep {
            0 => None,
            _ => self.newest_entry(),
        };
        let record = FilesRecord {
            report: self.newest_report.clone(),
            content: self.newest.clone().filter(|_| newest_entry.is_some()),
            newest_entry,
            source_since: report.source.error.as_ref().map(|e| e.since.clone()),
            status_branch_since: report.status_branch.as_ref().map(|b| b.since.clone()),
            ..FilesRecord::default()
        };
        if let Err(e) = record.write(&self.dir) {
            tracing::debug!("reports: cannot record what was written: {e}");
        }
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
        sync_path(&self.dir).map_err(at(&self.dir))?;
        Ok(digest)
    }

    /// Adds `latest.json` (of `report`, whose content digest is `digest`)
    /// to the history when what it says changed.
    pub(crate) fn add_history(
        &mut self,
        report: &Report,
        digest: String,
    ) -> Result<(), ReportFilesError> {
        self.recall();
        self.history_of(report, digest)?;
        self.record(report);
        Ok(())
    }

    /// [`ReportFiles::add_history`], unrecorded.
    fn history_of(&mut self, report: &Report, digest: String) -> Result<(), ReportFilesError> {
        // Whichever report that was, the history is now compared by
        // content again (see `write`).
        self.newest_report = None;
        if self.keep == 0 {
            return Ok(());
        }
        let history = self.dir.join("history");
        self.add_to_history(&history, &self.dir.join("latest.json"), report, digest)
            .map_err(at(&history))?;
        sync_path(&self.dir).map_err(at(&self.dir))
    }

    /// The report in `latest.json`, if there is a readable one.
    pub(crate) fn read_latest(&self) -> Option<Report> {
        let bytes = fs::read(self.dir.join("latest.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Since when `latest.json` says the source and the status branch have
    /// been failing (a one-shot command carries both on): its resources
    /// are passed over, not read into entries. What the last writer
    /// recorded is taken instead while it describes the file.
    pub(crate) fn read_last_failures(&self) -> LastFailures {
        if let Some(record) = FilesRecord::read(&self.dir) {
            return LastFailures {
                source_since: record.source_since,
                status_branch_since: record.status_branch_since,
            };
        }
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
        sync_path(history)
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
use crate::files::{sync_path, write_atomically_with};

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    /// A report of one resource made at `minute`, `reason` its entry's.
    fn report(minute: u32, reason: &str) -> Report {
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
    }

    /// A report whose digest is that of the newest history entry's report
    /// adds no entry and is written whole; any other is compared by its
    /// content, as without a digest.
    #[test]
    fn a_report_known_by_its_digest_adds_no_history_entry_and_is_written() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut files = ReportFiles::new(dir.path(), 10);
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

    /// A new process takes the last writer's record for what it would
    /// read back: the report digest `latest.json` was written for, and the
    /// newest history entry's content digest. Each is shown trusted with
    /// files that (against the contract) say something else. Files that
    /// are not the recorded ones are read again.
    #[test]
    fn a_new_process_takes_the_last_writer_s_record_while_the_files_are_its() -> Outcome {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let history = || entries(&dir.path().join("history")).expect("the history");
        let latest = || fs::read_to_string(dir.path().join("latest.json")).expect("latest.json");
        let process = || ReportFiles::new(dir.path(), 10);
        process()
            .write(&report(0, ""), "t", Some("d1"))
            .expect("written");
        assert_eq!(history().len(), 1);
        // The recorded report digest: this report is not hashed.
        process()
            .write(&report(1, "trusted"), "t", Some("d1"))
            .expect("written");
        assert_eq!(history().len(), 1, "the recorded digest was not taken");
        assert!(latest().contains("trusted"), "latest.json was not written");
        // The recorded content digest of the newest entry (a one-shot
        // command writes `latest.json` beside the status branch, then adds
        // it to the history): the entry is not read back. It is replaced
        // here by one that says something else; read, it would differ.
        let newest = dir.path().join("history").join(&history()[0]);
        fs::remove_file(&newest)?;
        fs::write(&newest, r#"{"resources": ["something else"]}"#)?;
        let mut files = process();
        let digest = files.write_latest(&report(2, ""), "t").expect("written");
        files.add_history(&report(2, ""), digest).expect("added");
        assert_eq!(history().len(), 1, "the newest entry was read back");
        // Another entry made newest: the recorded content is not its.
        let mut files = process();
        let added = dir.path().join("history/20270115T090000Z-000.json");
        fs::write(&added, r#"{"resources": ["another"]}"#)?;
        let digest = files.write_latest(&report(3, ""), "t").expect("written");
        files.add_history(&report(3, ""), digest).expect("added");
        assert_eq!(history().len(), 3, "a stale record's content was taken");
        // `latest.json` written by someone else: the report digest is not
        // taken, the report is compared by content.
        fs::remove_file(&added)?;
        let replaced = dir.path().join("replaced.json");
        fs::write(&replaced, latest())?;
        fs::rename(&replaced, dir.path().join("latest.json"))?;
        process()
            .write(&report(4, "drifted"), "t", Some("d1"))
            .expect("written");
        assert_eq!(history().len(), 3, "a stale record's digest was taken");
        assert!(
            latest().contains("drifted") && history().iter().any(|n| n.contains("T0804")),
            "{:?}",
            history()
        );
        Ok(())
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

    /// Written by tend, the failures are taken from its record (shown by
    /// a `latest.json` that, against the contract, says otherwise); a
    /// `latest.json` written by anything else is read.
    #[test]
    fn the_last_failures_are_taken_from_the_record_of_the_file_tend_wrote() -> Outcome {
        let dir = tempfile::tempdir()?;
        let mut failing = report(0, "");
        failing.status_branch = Some(super::super::report::StatusBranchReport {
            branch: "tend-status".into(),
            error: "rejected".into(),
            since: "2027-01-15T07:00:00Z".into(),
        });
        let mut files = ReportFiles::new(dir.path(), 0);
        files.write(&failing, "t", None).expect("written");
        let path = dir.path().join("latest.json");
        let said = fs::read_to_string(&path)?;
        let other = said.replace("2027-01-15T07:00:00Z", "2027-01-15T06:00:00Z");
        // In place: the same file, as recorded (length and time kept).
        let meta = fs::metadata(&path)?;
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(other.as_bytes()))?;
        fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(meta.modified()?))?;
        let since = |files: &ReportFiles| files.read_last_failures().status_branch_since;
        let files = ReportFiles::new(dir.path(), 0);
        assert_eq!(since(&files).as_deref(), Some("2027-01-15T07:00:00Z"));
        let replaced = dir.path().join("replaced.json");
        fs::write(&replaced, &other)?;
        fs::rename(&replaced, &path)?;
        assert_eq!(since(&files).as_deref(), Some("2027-01-15T06:00:00Z"));
        Ok(())
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
