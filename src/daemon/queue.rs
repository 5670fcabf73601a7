//! The keyed work queue of one provider worker: each resource waits for
//! at most one due time (the decision's `act_at`: a `drift_grace` or
//! `deletion_delay` that ends, an override that expires). Repeated
//! wake-ups for one resource coalesce into its one entry.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

/// Resources waiting for a time, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DueQueue {
    due: BTreeMap<String, SystemTime>,
}

impl DueQueue {
    /// After a cycle over `decided`: each decided resource waits for its
    /// new due time, or leaves the queue when it has none.
    pub(crate) fn update<'a>(
        &mut self,
        decided: impl IntoIterator<Item = &'a str>,
        due: impl IntoIterator<Item = (String, SystemTime)>,
    ) {
        for name in decided {
            self.due.remove(name);
        }
        self.due.extend(due);
    }

    /// The soonest due time.
    pub(crate) fn next(&self) -> Option<SystemTime> {
        self.due.values().min().copied()
    }

    /// Takes every resource due at `now`.
    pub(crate) fn take_due(&mut self, now: SystemTime) -> BTreeSet<String> {
        let due: BTreeSet<String> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &due {
            self.due.remove(name);
        }
        due
    }

    pub(crate) fn clear(&mut self) {
        self.due.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn one_entry_per_resource_and_only_due_ones_are_taken() {
        let mut q = DueQueue::default();
        q.update(
            ["a", "b"],
            [("a".to_string(), t(10)), ("b".to_string(), t(20))],
        );
        q.update(["a"], [("a".to_string(), t(15))]);
        assert_eq!(q.len(), 2, "a's wake-ups coalesce");
        assert_eq!(q.next(), Some(t(15)));
        assert_eq!(q.take_due(t(16)), BTreeSet::from(["a".to_string()]));
        assert_eq!(q.next(), Some(t(20)));
        q.update(["b"], []);
        assert_eq!(q.len(), 0, "decided without a due time: gone");
    }
}
