//! What a report says, as one digest: the key the status branch is
//! published under (see `publish.rs`), so that a report that says the same
//! thing as the last one costs no render, no fetch and no push.
//!
//! # Guarantees
//! * Two reports get the same digest exactly when they say the same thing:
//!   the same resources' entries and the same report-wide fields, leaving
//!   out the times that move every cycle (when the report was made, when
//!   each resource was observed, how many polls of a failing source
//!   failed; see [`super::files::value_digest`]).
//! * An entry's digest is kept between reports while the entry is the same
//!   object (the board shares an entry that did not change, and an entry
//!   never changes once published): at 100,000 resources, writing every
//!   entry out as JSON again cost half a second of each status commit. The
//!   weak references keep each address from being reused while it is
//!   known here.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use sha2::Digest;

use super::files::value_digest;
use super::report::{Report, ResourceReport};

/// The digest of each entry of the last report digested, by address.
#[derive(Debug, Default)]
pub(crate) struct ReportDigests {
    entries: HashMap<usize, (Weak<ResourceReport>, [u8; 32])>,
    /// How many entries the last digest wrote out (not kept).
    digested: usize,
}

impl ReportDigests {
    /// The digest of `report` (hex): of its report-wide fields, then of
    /// each entry in order. Keeps the entries' digests for the next report
    /// (and forgets those of entries it no longer holds).
    pub(crate) fn digest(&mut self, report: &Report) -> String {
        let mut hasher = sha2::Sha256::new();
        hasher.update(value_digest(&shell(report)));
        let mut next = HashMap::with_capacity(report.resources.len());
        self.digested = 0;
        for entry in &report.resources {
            let address = Arc::as_ptr(entry) as usize;
            let kept = match self.entries.remove(&address) {
                Some(kept) => kept,
                None => {
                    self.digested += 1;
                    (Arc::downgrade(entry), value_digest(entry.as_ref()))
                }
            };
            hasher.update(kept.1);
            next.insert(address, kept);
        }
        self.entries = next;
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// How many entries the last digest wrote out: those not kept.
    pub(crate) fn digested(&self) -> usize {
        self.digested
    }
}

/// `report` without its resources' entries.
fn shell(report: &Report) -> Report {
    Report {
        format_version: report.format_version,
        generated_at: report.generated_at.clone(),
        agent: report.agent.clone(),
        source: report.source.clone(),
        summary: report.summary.clone(),
        resources: Vec::new(),
        errors: report.errors.clone(),
        orphaned_overrides: report.orphaned_overrides.clone(),
        status_branch: report.status_branch.clone(),
        suspended: report.suspended.clone(),
        applied: report.applied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(entries: &[(&str, &str, &str)]) -> Report {
        let mut report: Report = serde_json::from_value(serde_json::json!({
            "formatVersion": 1, "generatedAt": "2027-01-15T08:00:00Z",
            "agent": {"id": "agent", "version": "0"},
            "source": {"url": "/repo", "branch": "main"},
            "summary": super::super::report::Summary::default(),
            "resources": [], "errors": [],
        }))
        .expect("a report");
        report.resources = entries
            .iter()
            .map(|(name, reason, observed_at)| {
                Arc::new(
                    serde_json::from_value(serde_json::json!({
                        "name": name, "file": format!("{name}.yaml"), "state": "InSync",
                        "action": "None", "reason": reason, "drift": [],
                        "observedAt": observed_at,
                    }))
                    .expect("a resource report"),
                )
            })
            .collect();
        report
    }

    #[test]
    fn a_report_s_digest_changes_with_what_it_says_and_not_with_its_times() {
        let mut kept = ReportDigests::default();
        let first = report(&[("billing", "", "08:00"), ("orders", "", "08:00")]);
        let digest = kept.digest(&first);
        // Computed afresh, or from the entries kept: the same digest.
        assert_eq!(ReportDigests::default().digest(&first), digest);
        assert_eq!(kept.digest(&first), digest);
        let mut later = report(&[("billing", "", "08:01"), ("orders", "", "08:01")]);
        later.generated_at = "2027-01-15T08:01:00Z".into();
        assert_eq!(kept.digest(&later), digest, "a time that moves changed it");
        let changed = report(&[("billing", "", "08:00"), ("orders", "drifted", "08:00")]);
        assert_ne!(kept.digest(&changed), digest);
        let fewer = report(&[("billing", "", "08:00")]);
        assert_ne!(kept.digest(&fewer), digest);
        let mut failing = report(&[("billing", "", "08:00"), ("orders", "", "08:00")]);
        failing.source.commit = Some("c0ffee".into());
        assert_ne!(
            kept.digest(&failing),
            digest,
            "a report-wide field was left out"
        );
    }

    #[test]
    fn an_entry_s_digest_is_kept_while_it_is_the_same_object_and_forgotten_after() {
        let mut kept = ReportDigests::default();
        let mut first = report(&[("billing", "", "08:00"), ("orders", "", "08:00")]);
        let digest = kept.digest(&first);
        assert_eq!(kept.digested(), 2);
        assert_eq!(kept.digest(&first), digest);
        assert_eq!(kept.digested(), 0, "an entry was written out again");
        // A new entry for the same name is digested, and the old one's
        // digest forgotten.
        let mut orders = (*first.resources[1]).clone();
        orders.reason = "drifted".into();
        first.resources[1] = Arc::new(orders);
        assert_ne!(kept.digest(&first), digest);
        assert_eq!(kept.digested(), 1);
        assert_eq!(kept.entries.len(), 2, "an entry no longer held was kept");
    }
}
