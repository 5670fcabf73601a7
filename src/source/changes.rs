//! What a new commit changed, declaration by declaration: what lets the
//! running agent reconcile after a commit only the declarations it touched
//! instead of the whole fleet.
//!
//! # Guarantees
//! * A declaration is parsed from its file's path and bytes alone, and a
//!   blob id names the bytes: a declaration found under the same name, in
//!   the same file, whose path kept its blob, is the same declaration.
//!   Every other name present in either snapshot is listed.
//! * Names are compared over both snapshots whole, not only over the files
//!   that changed: a name that a changed file makes a duplicate (dropped
//!   from the set with every copy) shows as removed, though the copy that
//!   stays in an unchanged file is unchanged.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};

use super::Snapshot;
use crate::model::Declaration;

/// A declaration a commit changed, added or removed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Changed<'s> {
    pub name: &'s str,
    /// As the earlier snapshot declared it (`None`: added).
    pub before: Option<&'s Declaration>,
    /// As the later snapshot declares it (`None`: removed).
    pub after: Option<&'s Declaration>,
}

/// Where a changed declaration is in the two snapshots' sorted lists:
/// `before` in the earlier one's, `after` in the later one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChangeAt {
    pub before: Option<usize>,
    pub after: Option<usize>,
}

impl Snapshot {
    /// The declarations that differ between `before` and this snapshot,
    /// sorted by name. Linear in the two snapshots (a merge of sorted
    /// lists); nothing is compared field by field.
    #[cfg(test)]
    pub(crate) fn changes_since<'s>(&'s self, before: &'s Snapshot) -> Vec<Changed<'s>> {
        self.change_positions(before)
            .into_iter()
            .map(|at| self.change_at(before, at))
            .collect()
    }

    /// A change of [`Snapshot::change_positions`] over `before`, as the
    /// declarations it names.
    pub(crate) fn change_at<'s>(&'s self, before: &'s Snapshot, at: ChangeAt) -> Changed<'s> {
        let (old, new) = (
            &before.declarations.declarations,
            &self.declarations.declarations,
        );
        let (before, after) = (
            at.before.map(|i| old[i].as_ref()),
            at.after.map(|j| new[j].as_ref()),
        );
        Changed {
            name: after.or(before).map_or("", |d| d.name()),
            before,
            after,
        }
    }

    /// [`Snapshot::changes_since`] as positions in the two lists (which a
    /// caller can keep for others without borrowing either snapshot).
    pub(crate) fn change_positions(&self, before: &Snapshot) -> Vec<ChangeAt> {
        if std::ptr::eq(self, before) || self.commit == before.commit {
            return Vec::new();
        }
        let touched = touched_files(&before.files, &self.files);
        let in_touched = |d: &Declaration| d.file.to_str().is_none_or(|f| touched.contains(f));
        let (old, new) = (
            &before.declarations.declarations,
            &self.declarations.declarations,
        );
        let (mut i, mut j) = (0, 0);
        let mut changes = Vec::new();
        while i < old.len() || j < new.len() {
            let order = match (old.get(i), new.get(j)) {
                // One object in both: the later snapshot took it over
                // from the earlier one's parse results, for the same path
                // and blob. Unchanged, without comparing names and files
                // (at 100,000 declarations, tens of milliseconds of each
                // commit's path).
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {
                    i += 1;
                    j += 1;
                    continue;
                }
                (Some(a), Some(b)) => a.name().cmp(b.name()),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match order {
                Ordering::Less => {
                    changes.push(ChangeAt {
                        before: Some(i),
                        after: None,
                    });
                    i += 1;
                }
                Ordering::Greater => {
                    changes.push(ChangeAt {
                        before: None,
                        after: Some(j),
                    });
                    j += 1;
                }
                Ordering::Equal => {
                    let (a, b) = (&old[i], &new[j]);
                    // Compared as bytes: `Path`'s equality parses
                    // components, 100,000 times over at this scale.
                    if a.file.as_os_str() != b.file.as_os_str() || in_touched(b) {
                        changes.push(ChangeAt {
                            before: Some(i),
                            after: Some(j),
                        });
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        changes
    }
}

/// The changes between the last two snapshots asked about, kept for the
/// next asker of the same two: after a commit every provider's worker asks
/// for the same pair, and at 100,000 declarations each merge took tens of
/// milliseconds of the threads the workers share, one worker after the
/// other. The weak references keep each address from being reused while
/// it is known here, so the comparison is exact.
#[derive(Debug, Default)]
pub(crate) struct KeptChanges {
    last: Mutex<Option<KeptPair>>,
}

/// Two snapshots and the changes between them.
type KeptPair = (Weak<Snapshot>, Weak<Snapshot>, Arc<[ChangeAt]>);

impl KeptChanges {
    /// [`Snapshot::change_positions`] of `after` since `before`, merged
    /// once per pair (an asker meanwhile waits for it).
    pub(crate) fn between(&self, before: &Arc<Snapshot>, after: &Arc<Snapshot>) -> Arc<[ChangeAt]> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((b, a, changes)) = last.as_ref()
            && std::ptr::eq(b.as_ptr(), Arc::as_ptr(before))
            && std::ptr::eq(a.as_ptr(), Arc::as_ptr(after))
        {
            return changes.clone();
        }
        let changes: Arc<[ChangeAt]> = after.change_positions(before).into();
        *last = Some((
            Arc::downgrade(before),
            Arc::downgrade(after),
            changes.clone(),
        ));
        changes
    }
}

/// The paths whose blob differs between two sorted file lists (added,
/// removed or rewritten).
fn touched_files<'s>(
    before: &'s [(String, git2::Oid)],
    after: &'s [(String, git2::Oid)],
) -> HashSet<&'s str> {
    let (mut i, mut j) = (0, 0);
    let mut touched = HashSet::new();
    while i < before.len() || j < after.len() {
        let order = match (before.get(i), after.get(j)) {
            (Some(a), Some(b)) => a.0.cmp(&b.0),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match order {
            Ordering::Less => {
                touched.insert(before[i].0.as_str());
                i += 1;
            }
            Ordering::Greater => {
                touched.insert(after[j].0.as_str());
                j += 1;
            }
            Ordering::Equal => {
                if before[i].1 != after[j].1 {
                    touched.insert(after[j].0.as_str());
                }
                i += 1;
                j += 1;
            }
        }
    }
    touched
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::load::FileContents;
    use crate::model::{DeclarationSet, parse_file};
    use std::time::SystemTime;

    fn manifest(name: &str, limit: u32) -> String {
        format!(
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  connectionLimit: {limit}\n"
        )
    }

    /// A snapshot of `files` (path, content) at `commit`; a blob id is the
    /// content's.
    fn snapshot(commit: &str, files: &[(&str, String)]) -> Snapshot {
        let mut files: Vec<(&str, String)> = files.to_vec();
        files.sort();
        let contents: Vec<FileContents> = files
            .iter()
            .map(|(path, text)| parse_file(std::path::Path::new(path), text.as_bytes()))
            .collect();
        Snapshot {
            commit: commit.to_string(),
            commit_time: SystemTime::UNIX_EPOCH,
            files: files
                .iter()
                .map(|(path, text)| {
                    let id = git2::Oid::hash_object(git2::ObjectType::Blob, text.as_bytes())
                        .expect("hashing a blob");
                    (path.to_string(), id)
                })
                .collect(),
            declarations: DeclarationSet::from_files(contents),
            provider_groups: Default::default(),
        }
    }

    fn names(changes: &[Changed<'_>]) -> Vec<(String, bool, bool)> {
        changes
            .iter()
            .map(|c| (c.name.to_string(), c.before.is_some(), c.after.is_some()))
            .collect()
    }

    #[test]
    fn only_the_declarations_of_touched_files_are_listed() {
        let before = snapshot(
            "a",
            &[
                ("orders.yaml", manifest("orders", 10)),
                ("billing.yaml", manifest("billing", 5)),
                ("gone.yaml", manifest("gone", 5)),
            ],
        );
        let after = snapshot(
            "b",
            &[
                ("orders.yaml", manifest("orders", 11)),
                ("billing.yaml", manifest("billing", 5)),
                ("new.yaml", manifest("new", 5)),
            ],
        );
        assert_eq!(
            names(&after.changes_since(&before)),
            vec![
                ("gone".to_string(), true, false),
                ("new".to_string(), false, true),
                ("orders".to_string(), true, true),
            ]
        );
        assert!(after.changes_since(&after).is_empty());
    }

    #[test]
    fn a_declaration_moved_to_another_file_is_listed() {
        let before = snapshot("a", &[("orders.yaml", manifest("orders", 10))]);
        let after = snapshot("b", &[("db/orders.yaml", manifest("orders", 10))]);
        assert_eq!(
            names(&after.changes_since(&before)),
            vec![("orders".to_string(), true, true)]
        );
    }

    #[test]
    fn a_duplicate_made_in_another_file_removes_the_untouched_copy() {
        let before = snapshot("a", &[("orders.yaml", manifest("orders", 10))]);
        let after = snapshot(
            "b",
            &[
                ("orders.yaml", manifest("orders", 10)),
                ("copy.yaml", manifest("orders", 10)),
            ],
        );
        assert_eq!(
            names(&after.changes_since(&before)),
            vec![("orders".to_string(), true, false)]
        );
        // And the copy removed again: declared again, untouched file.
        assert_eq!(
            names(&before.changes_since(&after)),
            vec![("orders".to_string(), false, true)]
        );
    }

    #[test]
    fn every_worker_asking_for_one_pair_gets_the_one_merge() {
        let before = Arc::new(snapshot("a", &[("orders.yaml", manifest("orders", 10))]));
        let after = Arc::new(snapshot("b", &[("orders.yaml", manifest("orders", 11))]));
        let kept = KeptChanges::default();
        let first = kept.between(&before, &after);
        assert!(
            Arc::ptr_eq(&first, &kept.between(&before, &after)),
            "merged twice"
        );
        let changes: Vec<_> = first
            .iter()
            .map(|at| after.change_at(&before, *at))
            .collect();
        assert_eq!(names(&changes), names(&after.changes_since(&before)));
        // Another pair is merged again.
        let back = kept.between(&after, &before);
        assert!(!Arc::ptr_eq(&first, &back));
        assert_eq!(back.len(), 1);
    }
}
