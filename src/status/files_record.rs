//! What tend last wrote to `reports_dir`, recorded beside the files
//! (`.latest-record.json`) so that a new process need not read them back:
//! `latest.json`'s digests (its report digest, its content digest, and
//! the history entry that says the same) and since when it says the
//! source and the status branch have been failing.
//!
//! At 10,000 resources a one-shot `tend apply` read `latest.json` whole
//! for its two failure times and read and hashed the newest history entry
//! to know whether its own report adds one: a fifth of its own time.
//!
//! # Guarantees
//! * A record is trusted only while `latest.json` is the very file it
//!   describes (same inode, length and modification time); the history's
//!   digest only while the newest entry is the one it names. A file
//!   written by anything else, restored, or removed makes it stale, and
//!   the files are read as before.
//! * A record another build of tend wrote is not trusted (the digests are
//!   this build's), as the parse cache's entries are not.
//! * It is written after the files it describes, and not synced: lost or
//!   half written in a crash, it is stale or unreadable, never wrong.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::UNIX_EPOCH;

/// The record's file name in `reports_dir`.
pub(super) const RECORD: &str = ".latest-record.json";

/// What identifies one `latest.json`: a rewrite renames a new file over
/// it (a new inode), and anything else that changes it moves its length
/// or modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Stamp {
    inode: u64,
    len: u64,
    modified_secs: u64,
    modified_nanos: u32,
}

impl Stamp {
    fn of_latest(dir: &Path) -> Option<Stamp> {
        let meta = fs::metadata(dir.join("latest.json")).ok()?;
        let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
        Some(Stamp {
            inode: meta.ino(),
            len: meta.len(),
            modified_secs: modified.as_secs(),
            modified_nanos: modified.subsec_nanos(),
        })
    }
}

/// What the last writer of the report files knew of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FilesRecord {
    /// The build of tend that wrote it (`parse_cache::build_id`, set by
    /// [`FilesRecord::write`]).
    pub build: String,
    /// The `latest.json` described (stamped by [`FilesRecord::write`]);
    /// `None` never matches.
    pub latest: Option<Stamp>,
    /// The report digest `latest.json` was written for, if known.
    pub report: Option<String>,
    /// The content digest of the newest history entry.
    pub content: Option<String>,
    /// The newest history entry's file name, when `content` is its.
    pub newest_entry: Option<String>,
    /// `latest.json`'s `source.error.since`.
    pub source_since: Option<String>,
    /// `latest.json`'s `statusBranch.since`.
    pub status_branch_since: Option<String>,
}

impl FilesRecord {
    /// The record in `dir`, if there is one and it describes the
    /// `latest.json` there now.
    pub(super) fn read(dir: &Path) -> Option<FilesRecord> {
        let bytes = fs::read(dir.join(RECORD)).ok()?;
        let record: FilesRecord = serde_json::from_slice(&bytes).ok()?;
        (record.build == crate::source::parse_cache::build_id()
            && record.latest.is_some()
            && record.latest == Stamp::of_latest(dir))
        .then_some(record)
    }

    /// Records this as what `dir` holds, stamped with the `latest.json`
    /// there now (written just before). A record that cannot be written
    /// leaves the old one, which no longer matches.
    pub(super) fn write(mut self, dir: &Path) -> io::Result<()> {
        self.latest = Stamp::of_latest(dir);
        crate::source::parse_cache::build_id().clone_into(&mut self.build);
        let mut tmp = tempfile::Builder::new()
            .prefix(".latest-record.")
            .suffix(".tmp")
            // As the report files: 0666 less the umask.
            .permissions(fs::Permissions::from_mode(0o666))
            .tempfile_in(dir)?;
        tmp.write_all(&serde_json::to_vec(&self).map_err(io::Error::other)?)?;
        tmp.persist(dir.join(RECORD)).map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    fn recorded(dir: &Path) -> FilesRecord {
        FilesRecord {
            report: Some("r".into()),
            content: Some("c".into()),
            newest_entry: Some("20270115T080000Z-000.json".into()),
            source_since: Some("2027-01-15T08:00:00Z".into()),
            ..FilesRecord::default()
        }
        .write(dir)
        .expect("record written");
        FilesRecord::read(dir).expect("the record describes latest.json")
    }

    /// A record describes one `latest.json`: another file renamed over it
    /// (even of the same length), or none, makes it stale.
    #[test]
    fn a_record_is_read_only_while_latest_json_is_the_file_it_describes() -> Outcome {
        let dir = tempfile::tempdir()?;
        assert_eq!(FilesRecord::read(dir.path()), None, "no record yet");
        fs::write(dir.path().join("latest.json"), "{\"a\": 1}\n")?;
        let record = recorded(dir.path());
        assert_eq!(record.report.as_deref(), Some("r"));
        assert_eq!(record.content.as_deref(), Some("c"));
        // Replaced as tend replaces it, same length.
        let other = dir.path().join("other.json");
        fs::write(&other, "{\"a\": 2}\n")?;
        fs::rename(&other, dir.path().join("latest.json"))?;
        assert_eq!(FilesRecord::read(dir.path()), None, "a new latest.json");
        recorded(dir.path());
        fs::remove_file(dir.path().join("latest.json"))?;
        assert_eq!(FilesRecord::read(dir.path()), None, "no latest.json");
        // Half written: unreadable, not trusted.
        fs::write(dir.path().join("latest.json"), "{}\n")?;
        recorded(dir.path());
        fs::write(dir.path().join(RECORD), "{\"latest\": {\"ino")?;
        assert_eq!(FilesRecord::read(dir.path()), None, "a torn record");
        // Another build's.
        let record = recorded(dir.path());
        let mut json = serde_json::to_value(&record)?;
        json["build"] = "0.0.1 1 1".into();
        fs::write(dir.path().join(RECORD), json.to_string())?;
        assert_eq!(FilesRecord::read(dir.path()), None, "another build's");
        Ok(())
    }
}
