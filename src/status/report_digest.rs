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
//! * An entry's digest is of its fields fed one by one, each framed by its
//!   length (or a tag), never of its JSON: every cycle builds new entries
//!   (each carries its observation's time), and at 100,000 resources
//!   writing each out as JSON again cost 70-480 ms of every status
//!   publication, against about a tenth of that now. The digest names the
//!   entry (its name is fed first), so two entries with the same digest are
//!   the same resource saying the same thing ([`EntryDigests`]).

use std::collections::HashSet;

use sha2::Digest;

use super::files::value_digest;
use super::report::{DriftReport, OperationReport, OverrideReport, Report, ResourceReport};
use crate::engine::DriftOrigin;

/// One entry's digest, cut to 128 bits: a collision between two of a
/// fleet's entries is as unlikely as one of the full digest for any
/// purpose here, and a set of them is half the size.
pub(crate) type EntryDigest = [u8; 16];

/// A report's digest, and each of its entries' in the report's order.
pub(crate) struct Digested {
    /// The digest of the whole report (hex).
    pub(crate) report: String,
    pub(crate) entries: Vec<EntryDigest>,
}

/// The digest of `report` (hex): of its report-wide fields, then of each
/// entry in order; and each entry's.
pub(crate) fn digest(report: &Report) -> Digested {
    let mut hasher = sha2::Sha256::new();
    hasher.update(value_digest(&shell(report)));
    let entries: Vec<EntryDigest> = report.resources.iter().map(|e| entry_digest(e)).collect();
    for entry in &entries {
        hasher.update(entry);
    }
    Digested {
        report: hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        entries,
    }
}

/// Entries' digests, as a set: "an entry that says exactly this was
/// there" (a digest names its resource).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct EntryDigests(HashSet<EntryDigest>);

impl EntryDigests {
    pub(crate) fn of(entries: &[EntryDigest]) -> Self {
        EntryDigests(entries.iter().copied().collect())
    }

    pub(crate) fn holds(&self, entry: &EntryDigest) -> bool {
        self.0.contains(entry)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &EntryDigest> {
        self.0.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Feeds fields to a hash, each framed so that no two sequences of fields
/// feed the same bytes.
struct Feed(sha2::Sha256);

impl Feed {
    fn str(&mut self, s: &str) {
        self.0.update((s.len() as u64).to_le_bytes());
        self.0.update(s.as_bytes());
    }

    fn opt(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.0.update([1]);
                self.str(s);
            }
            None => self.0.update([0]),
        }
    }

    fn strs(&mut self, all: &[String]) {
        self.0.update((all.len() as u64).to_le_bytes());
        for s in all {
            self.str(s);
        }
    }

    fn flag(&mut self, b: bool) {
        self.0.update([u8::from(b)]);
    }

    /// A JSON value, as its compact JSON, then a byte JSON never holds
    /// (`0xff` is in no UTF-8 text): a number's JSON does not end itself,
    /// and `10` then `20` must not feed what `102` then `0` does.
    fn value(&mut self, v: &serde_json::Value) {
        if serde_json::to_writer(&mut *self, v).is_err() {
            // Cannot happen for a `Value`; never equal to a written one.
            self.0.update(b"\0unserialisable");
        }
        self.0.update([0xff]);
    }
}

impl std::io::Write for Feed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The digest of what `entry` says, leaving out when it was observed
/// (but not whether).
pub(crate) fn entry_digest(entry: &ResourceReport) -> EntryDigest {
    // Destructured whole: a field added to the entry must be named here,
    // fed or left out on purpose.
    let ResourceReport {
        name,
        file,
        state,
        action,
        rule,
        reason,
        drift,
        override_,
        operation,
        observed_at,
        unobserved,
        acts_at,
        propose,
        owned_by,
    } = entry;
    let mut feed = Feed(sha2::Sha256::new());
    feed.str(name);
    feed.str(file);
    feed.str(state.as_str());
    feed.str(action.as_str());
    feed.str(rule);
    feed.str(reason);
    feed.0.update((drift.len() as u64).to_le_bytes());
    for d in drift {
        drift_fields(&mut feed, d);
    }
    match override_.as_deref() {
        Some(o) => {
            feed.flag(true);
            override_fields(&mut feed, o);
        }
        None => feed.flag(false),
    }
    match operation.as_deref() {
        Some(OperationReport { id, kind, state }) => {
            feed.flag(true);
            feed.str(&id.0);
            feed.str(kind.as_str());
            feed.str(state);
        }
        None => feed.flag(false),
    }
    // Whether it was observed, not when.
    feed.flag(observed_at.is_some());
    feed.strs(unobserved);
    feed.opt(acts_at.as_deref());
    feed.opt(propose.as_deref());
    feed.opt(owned_by.as_deref());
    let full: [u8; 32] = feed.0.finalize().into();
    let mut cut = [0; 16];
    cut.copy_from_slice(&full[..16]);
    cut
}

fn drift_fields(feed: &mut Feed, d: &DriftReport) {
    let DriftReport {
        field,
        desired,
        observed,
        origin,
        ignored,
    } = d;
    feed.str(field);
    feed.value(desired);
    feed.value(observed);
    feed.str(match origin {
        DriftOrigin::Declared => "declared",
        DriftOrigin::OutOfBand => "out-of-band",
    });
    feed.flag(*ignored);
}

fn override_fields(feed: &mut Feed, o: &OverrideReport) {
    let OverrideReport {
        source,
        kind,
        fields,
        reason,
        expires,
        expired,
        first_seen,
    } = o;
    feed.str(source);
    feed.str(kind);
    feed.strs(fields);
    feed.str(reason);
    feed.opt(expires.as_deref());
    feed.flag(*expired);
    feed.opt(first_seen.as_deref());
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
    use std::sync::Arc;

    use super::*;

    fn entry(name: &str, reason: &str, observed_at: &str) -> ResourceReport {
        serde_json::from_value(serde_json::json!({
            "name": name, "file": format!("{name}.yaml"), "state": "InSync",
            "action": "None", "reason": reason, "drift": [],
            "observedAt": format!("2027-01-15T{observed_at}:00Z"),
        }))
        .expect("a resource report")
    }

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
            .map(|(name, reason, observed_at)| Arc::new(entry(name, reason, observed_at)))
            .collect();
        report
    }

    #[test]
    fn a_report_s_digest_changes_with_what_it_says_and_not_with_its_times() {
        let first = report(&[("billing", "", "08:00"), ("orders", "", "08:00")]);
        let digest = super::digest(&first).report;
        let mut later = report(&[("billing", "", "08:01"), ("orders", "", "08:01")]);
        later.generated_at = "2027-01-15T08:01:00Z".into();
        assert_eq!(
            super::digest(&later).report,
            digest,
            "a time that moves changed it"
        );
        let changed = report(&[("billing", "", "08:00"), ("orders", "drifted", "08:00")]);
        assert_ne!(super::digest(&changed).report, digest);
        let fewer = report(&[("billing", "", "08:00")]);
        assert_ne!(super::digest(&fewer).report, digest);
        let mut failing = report(&[("billing", "", "08:00"), ("orders", "", "08:00")]);
        failing.source.commit = Some("c0ffee".into());
        assert_ne!(
            super::digest(&failing).report,
            digest,
            "a report-wide field was left out"
        );
    }

    /// Every field the entry shows but its observation time changes its
    /// digest, and fields that trade bytes between them do not collide.
    #[test]
    fn an_entry_s_digest_changes_with_every_field_it_shows() {
        let base: ResourceReport = serde_json::from_value(serde_json::json!({
            "name": "orders", "file": "orders.yaml", "state": "Drifted",
            "action": "Update", "rule": "drift", "reason": "drifted",
            "drift": [{"field": "connectionLimit", "desired": 10, "observed": 20,
                       "origin": "declared"}],
            "override": {"source": "annotation", "kind": "paused", "fields": ["owner"],
                         "reason": "incident", "expires": null, "expired": false},
            "operation": {"id": "op", "kind": "update", "state": "planned"},
            "observedAt": "2027-01-15T08:00:00Z", "unobserved": ["extensions"],
            "actsAt": "09:00", "propose": "tend propose orders", "ownedBy": "other",
        }))
        .expect("an entry");
        let digest = entry_digest(&base);
        let mut same = base.clone();
        same.observed_at = crate::time::parse_rfc3339("2027-01-15T08:05:00Z");
        assert!(same.observed_at.is_some());
        assert_eq!(
            entry_digest(&same),
            digest,
            "the observation's time counted"
        );
        same.observed_at = None;
        assert_ne!(
            entry_digest(&same),
            digest,
            "an entry observed and one not said the same"
        );
        type Change = Box<dyn Fn(&mut ResourceReport)>;
        let changes: Vec<(&str, Change)> = vec![
            ("name", Box::new(|e| e.name = "order".into())),
            ("file", Box::new(|e| e.file = "o.yaml".into())),
            (
                "state",
                Box::new(|e| e.state = crate::engine::State::InSync),
            ),
            (
                "action",
                Box::new(|e| e.action = crate::engine::Action::None),
            ),
            ("rule", Box::new(|e| e.rule = "in-sync".into())),
            ("reason", Box::new(|e| e.reason = "in sync".into())),
            ("drift", Box::new(|e| e.drift.clear())),
            ("drift value", Box::new(|e| e.drift[0].observed = 21.into())),
            (
                "drift origin",
                Box::new(|e| e.drift[0].origin = DriftOrigin::OutOfBand),
            ),
            ("drift ignored", Box::new(|e| e.drift[0].ignored = true)),
            ("override", Box::new(|e| e.override_ = None)),
            (
                "override expiry",
                Box::new(|e| {
                    if let Some(o) = e.override_.as_mut() {
                        o.expires = Some("10:00".into());
                    }
                }),
            ),
            ("operation", Box::new(|e| e.operation = None)),
            ("unobserved", Box::new(|e| e.unobserved.clear())),
            ("acts at", Box::new(|e| e.acts_at = None)),
            ("propose", Box::new(|e| e.propose = None)),
            ("owned by", Box::new(|e| e.owned_by = None)),
            // Bytes moved from one field to the next: strings, and the
            // two values of a drift (numbers do not end themselves).
            (
                "desired and observed",
                Box::new(|e| {
                    e.drift[0].desired = 102.into();
                    e.drift[0].observed = 0.into();
                }),
            ),
            (
                "name and file",
                Box::new(|e| {
                    e.name = "ordersorders".into();
                    e.file = ".yaml".into();
                }),
            ),
        ];
        for (what, change) in changes {
            let mut changed = base.clone();
            change(&mut changed);
            assert_ne!(
                entry_digest(&changed),
                digest,
                "{what} left the digest as it was"
            );
        }
    }

    #[test]
    fn a_set_of_entry_digests_knows_an_entry_that_says_the_same_thing() {
        let rendered = report(&[("billing", "", "08:00"), ("orders", "", "08:00")]);
        let kept = EntryDigests::of(&super::digest(&rendered).entries);
        let now = report(&[("billing", "", "08:01"), ("orders", "drifted", "08:01")]);
        let entries = super::digest(&now).entries;
        assert!(kept.holds(&entries[0]), "an entry whose time alone moved");
        assert!(!kept.holds(&entries[1]), "an entry that changed");
        // Another resource saying the same thing is not the same entry.
        let renamed = report(&[("invoices", "", "08:00")]);
        assert!(!kept.holds(&super::digest(&renamed).entries[0]));
    }
}
