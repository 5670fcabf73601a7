//! What a one-shot's status commit reads of what each file was decided
//! from (`decidedFrom`): over the render it goes on from, the rows of the
//! files it renders, and of those gone since, not every resource's (at
//! 10,000 resources the whole read was most of a one-file `tend apply`'s
//! state read).
//!
//! # Invariants
//! * Only over a render the state's rows are known to match (the
//!   publisher trusts its entries): a file kept over it has a row, since a
//!   render keeps a digest of its own only for a file it remembered a
//!   `decidedFrom` of, and [`super::branch_files::AHEAD_OF_REPORT`] (made
//!   again) for any other.
//! * Only for a publisher that publishes once: the running agent holds
//!   every row for its next render.
//! * A file gone since the render has its row read, so it is forgotten
//!   with the file.

use std::collections::{HashMap, HashSet};

use super::branch_files::InputsDigest;
use super::report::Report;
use crate::journal::{DecidedFrom, StateError, StateStore};

/// The most rows read by name; with more, every row is read.
const BY_NAME_AT_MOST: usize = 200;

/// The rows of the report's resources not `kept` (by place), and of the
/// resources of `base` (the render's digests) no longer reported.
pub(crate) fn of_rendered(
    store: &StateStore,
    report: &Report,
    kept: &[bool],
    base: &HashMap<String, InputsDigest>,
) -> Result<DecidedFrom, StateError> {
    let mut names: Vec<&str> = Vec::new();
    // (A resource kept is in the render's digests.)
    let mut in_base = 0;
    for (r, kept) in report.resources.iter().zip(kept) {
        if *kept {
            in_base += 1;
        } else {
            in_base += usize::from(base.contains_key(&r.name));
            names.push(&r.name);
        }
    }
    // Looked for only when some are gone.
    if in_base < base.len() {
        let reported: HashSet<&str> = report.resources.iter().map(|r| r.name.as_str()).collect();
        names.extend(
            base.keys()
                .map(String::as_str)
                .filter(|name| !reported.contains(name)),
        );
    }
    if names.len() > BY_NAME_AT_MOST {
        return store.status_decided();
    }
    store.status_decided_of(&names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::DecidedAt;

    type Outcome = Result<(), Box<dyn std::error::Error>>;

    /// The rows of the files rendered and of those gone are read, not
    /// those of the files kept; with more than a few hundred, every row.
    #[test]
    fn only_the_rows_of_files_rendered_or_gone_are_read() -> Outcome {
        let dir = tempfile::tempdir()?;
        let store = StateStore::open(dir.path(), true)?.ok_or("no state store")?;
        let names: Vec<String> = (0..300).map(|i| format!("db-{i:03}")).collect();
        let rows: Vec<_> = names
            .iter()
            .map(|name| {
                let at = DecidedAt {
                    digest: [7; 32],
                    commit: "c0ffee".into(),
                };
                (name.clone(), Some(at))
            })
            .collect();
        store.record_status_decided(&rows)?;
        let base: HashMap<String, InputsDigest> =
            names.iter().map(|name| (name.clone(), [1; 32])).collect();
        // db-299 is gone; db-001 is rendered; the rest kept.
        let reported: Vec<(&str, &str)> = names[..299].iter().map(|n| (n.as_str(), "")).collect();
        let report = super::super::branch_files::tests::report(&reported);
        let mut kept = vec![true; 299];
        kept[1] = false;
        let read = of_rendered(&store, &report, &kept, &base)?;
        let mut read: Vec<&String> = read.keys().collect();
        read.sort();
        assert_eq!(read, ["db-001", "db-299"]);
        // Every file rendered: every row.
        let read = of_rendered(&store, &report, &[false; 299], &base)?;
        assert_eq!(read.len(), 300);
        Ok(())
    }
}
