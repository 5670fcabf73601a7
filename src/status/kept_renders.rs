//! The status branch's render digests, kept in the state dir between
//! processes (`status-inputs`): the next process (`tend apply` from a
//! timer, a restarted agent) renders only the resources whose inputs
//! changed since the commit they were rendered for, not every file.
//!
//! # Invariants
//! * Only a cache: a missing, unreadable or damaged file, one written by
//!   another build of tend (whose files may render differently), or one
//!   for another commit than the branch's tip, is ignored, and every file
//!   is rendered.
//! * A digest is the render's own ([`super::branch_files::InputsDigest`]):
//!   a damaged one matches no resource's inputs, so its file is rendered.
//! * The file is replaced atomically, so a crash leaves the old digests
//!   (for an older commit: ignored) or the new ones.
//! * The report entries' digests are kept only with the state's
//!   finished-operations mark at that render, and only when the state
//!   remembers what that render decided each file from (the publisher
//!   leaves them out otherwise): an entry that says the same, and whose
//!   last operation did not change since the mark, has the same inputs.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::branch_files::InputsDigest;
use super::report_digest::EntryDigests;
use crate::journal::FinishedMark;
use crate::model::hash::{bytes_of_hex, push_hex};

/// What the first line starts with (bumped when the layout changes).
const MAGIC: &str = "tend-status-inputs 3";

/// What a render left for the next process.
#[derive(Debug, PartialEq)]
pub(crate) struct KeptRenders {
    /// The commit the digests were rendered for.
    pub commit: String,
    /// Each resource's inputs.
    pub inputs: HashMap<String, InputsDigest>,
    /// The report entries' digests and the finished-operations mark at
    /// that render (see the module's invariants).
    pub entries: Option<(EntryDigests, FinishedMark)>,
}

/// The file in the state dir.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("status-inputs")
}

/// What the last render kept; `None` when the file is missing, damaged or
/// another build's.
pub(crate) fn load(file: &Path) -> Option<KeptRenders> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut lines = text.lines();
    let header = lines.next()?.strip_prefix(MAGIC)?.strip_prefix(' ')?;
    let (commit, build) = header.split_once(' ')?;
    if build != crate::source::parse_cache::build_id() {
        return None;
    }
    let entries = match lines.next()?.strip_prefix("entries ")? {
        "-" => None,
        counts => {
            let mut counts = counts.split(' ').map(str::parse::<i64>);
            let mark = FinishedMark {
                count: counts.next()?.ok()?,
                newest_ms: counts.next()?.ok()?,
                recent: counts.next()?.ok()?,
            };
            let kept = counts.next()?.ok()?;
            // (Not sized by the count: a damaged one must not allocate.)
            let mut entries = Vec::new();
            for _ in 0..kept {
                entries.push(bytes_of_hex::<16>(lines.next()?)?);
            }
            Some((EntryDigests::of(&entries), mark))
        }
    };
    // Counted: a file cut short at a line's end would otherwise leave
    // resources out, whose files would never be removed over the commit.
    let count: usize = lines.next()?.strip_prefix("inputs ")?.parse().ok()?;
    // Sized by the count only as far as the text could hold that many
    // lines (a digest, a space and a name each): a damaged count must not
    // allocate.
    let mut inputs = HashMap::with_capacity(count.min(text.len() / 66));
    for line in lines {
        let (hex, name) = line.split_once(' ')?;
        inputs.insert(name.to_string(), bytes_of_hex::<32>(hex)?);
    }
    if inputs.len() != count {
        return None;
    }
    Some(KeptRenders {
        commit: commit.to_string(),
        inputs,
        entries,
    })
}

/// Writes the digests rendered for `commit`. Digests with a name that
/// would not fit one line (a damaged state's) are not kept at all, and the
/// file goes: over the commit, the next render names only what changed,
/// and a resource the file left out would never have its file removed.
pub(crate) fn store(
    file: &Path,
    commit: &str,
    inputs: &HashMap<String, InputsDigest>,
    entries: Option<(&EntryDigests, FinishedMark)>,
) -> std::io::Result<()> {
    if inputs.keys().any(|name| name.contains(['\n', '\r'])) {
        return match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let build = crate::source::parse_cache::build_id();
    let mut text = String::with_capacity(inputs.len() * 130);
    let _ = writeln!(text, "{MAGIC} {commit} {build}");
    match entries {
        Some((entries, mark)) => {
            let _ = writeln!(
                text,
                "entries {} {} {} {}",
                mark.count,
                mark.newest_ms,
                mark.recent,
                entries.len()
            );
            for entry in entries.iter() {
                push_hex(&mut text, entry);
                text.push('\n');
            }
        }
        None => text.push_str("entries -\n"),
    }
    let _ = writeln!(text, "inputs {}", inputs.len());
    for (name, digest) in inputs {
        push_hex(&mut text, digest);
        text.push(' ');
        text.push_str(name);
        text.push('\n');
    }
    super::files::write_atomically(file, text.as_bytes())
}

/// Keeps `rendered` (the commit and each resource's inputs) and its
/// `entries` for the next process, or removes the file when nothing was
/// rendered; a failure is a warning (the next process renders every
/// file).
pub(crate) fn keep_logged(
    file: &Path,
    rendered: Option<&(String, HashMap<String, InputsDigest>)>,
    entries: Option<(&EntryDigests, FinishedMark)>,
) {
    let written = match rendered {
        Some((commit, inputs)) => store(file, commit, inputs, entries),
        None => match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    };
    if let Err(e) = written {
        tracing::warn!(
            "status branch: cannot keep what was rendered in {}: {e}; the next process renders every file",
            file.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn digests_come_back_as_written_and_a_damaged_file_reads_as_none() -> Outcome {
        let dir = tempfile::tempdir()?;
        let file = path(dir.path());
        assert!(load(&file).is_none(), "no file");
        let inputs: HashMap<String, InputsDigest> = [
            ("orders".to_string(), [7u8; 32]),
            ("billing".to_string(), [255u8; 32]),
        ]
        .into();
        let mark = FinishedMark {
            count: 12,
            newest_ms: 345,
            recent: 6,
        };
        let entries = EntryDigests::of(&[[1u8; 16], [0xab; 16]]);
        store(&file, "c0ffee", &inputs, Some((&entries, mark)))?;
        let kept = KeptRenders {
            commit: "c0ffee".to_string(),
            inputs: inputs.clone(),
            entries: Some((entries, mark)),
        };
        assert_eq!(load(&file).as_ref(), Some(&kept));
        store(&file, "c0ffee", &inputs, None)?;
        let without = KeptRenders {
            entries: None,
            ..kept
        };
        assert_eq!(load(&file).as_ref(), Some(&without), "the entries left out");

        let entries = EntryDigests::of(&[[1u8; 16]]);
        store(&file, "c0ffee", &inputs, Some((&entries, mark)))?;
        let text = std::fs::read_to_string(&file)?;
        for damaged in [
            text.replacen("tend-status-inputs 3", "tend-status-inputs 2", 1),
            text.replacen(crate::source::parse_cache::build_id(), "0.0.1 1 1", 1),
            text.replacen(" orders", "orders", 1),
            text.replacen("07", "zz", 1),
            text.replacen("0101", "01", 1),
            text.replacen("entries 12 345 6 1", "entries 12 345 6 2", 1),
            text.replacen("entries 12 345 6 1", "entries 12 345 1", 1),
            text.replacen("entries 12 345 6 1", "entries 12 345 6 999999999999999", 1),
            text.replacen("\ninputs 2\n", "\ninputs 3\n", 1),
            text.lines().take(4).map(|l| format!("{l}\n")).collect(),
        ] {
            assert_ne!(damaged, text);
            std::fs::write(&file, damaged)?;
            assert_eq!(load(&file), None);
        }
        Ok(())
    }

    #[test]
    fn digests_with_a_name_that_does_not_fit_a_line_are_not_kept() -> Outcome {
        let dir = tempfile::tempdir()?;
        let file = path(dir.path());
        let fine: HashMap<String, InputsDigest> = [("orders".to_string(), [7u8; 32])].into();
        store(&file, "c0ffee", &fine, None)?;
        // Left out, its file would never be removed over the commit.
        let mut damaged = fine.clone();
        damaged.insert("a\nb".to_string(), [1u8; 32]);
        store(&file, "c0ffee", &damaged, None)?;
        assert_eq!(load(&file), None, "kept without one of its resources");
        assert!(!file.exists());
        Ok(())
    }
}
