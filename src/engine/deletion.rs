//! The mass-deletion guard: a circuit breaker, not a throttle.
//!
//! # Guarantees
//! * When the deletions that are due exceed `max_deletions`, or
//!   `max_deletion_percent` of the managed resources, **none** of them
//!   happens: each is held, and reported with the counts and the limit.
//! * A trip is remembered (the held names and how many were due together),
//!   so the hold lasts until an operator acts, not until a later cycle
//!   happens to count fewer: it ends when the limits allow every deletion
//!   that was due together, when the declarations are restored (their
//!   tombstones go), or name by name through an approval
//!   (`tend deletions approve`).
//! * Below the limits, due deletions proceed.
//!
//! Pure: the caller passes the candidates, the remembered trip and the
//! time.

use std::collections::HashMap;
use std::time::SystemTime;

use super::decide::Policy;
use super::decide::Tombstone;
use crate::model::DeletionPolicy;

/// The configured limits (`[reconcile]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeletionLimits {
    pub max_deletions: usize,
    pub max_percent: u8,
}

impl DeletionLimits {
    /// How many deletions may be due at once among `managed` resources:
    /// the smaller of `max_deletions` and the percentage (at least one, so
    /// a small fleet can still lose a database without an approval).
    pub fn limit(&self, managed: usize) -> usize {
        let by_percent = (managed * usize::from(self.max_percent) / 100).max(1);
        self.max_deletions.min(by_percent)
    }
}

/// A remembered hold of one deletion (a row in the state store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldDeletion {
    /// When the guard tripped.
    pub since: SystemTime,
    /// How many deletions were due together when it tripped (or since).
    pub due_together: usize,
}

/// A deletion that is due, for the guard to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueDeletion<'a> {
    pub name: &'a str,
    /// An operator approved this deletion by name.
    pub approved: bool,
}

/// Whether a removed declaration's deletion counts as due: deletionPolicy
/// Delete, `deletion_delay` passed, and not requested yet (a requested one
/// was allowed when it was requested).
pub(crate) fn is_due(tomb: &Tombstone, policy: &Policy, now: SystemTime) -> bool {
    tomb.last.spec.deletion_policy == DeletionPolicy::Delete
        && tomb.delete_requested_at.is_none()
        && now >= crate::time::add(tomb.removed_at, policy.deletion_delay)
}

/// The guard's verdict for one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionGuard {
    /// Deletions due now.
    pub due: usize,
    /// Resources tend manages (the percentage's base).
    pub managed: usize,
    /// The limit for `managed` resources.
    pub limit: usize,
    /// Set while the guard holds deletions.
    pub trip: Option<HeldDeletion>,
    /// The tree declares nothing: no deletion at all (an empty tree is far
    /// more likely a mistake than the end of every database).
    pub empty_tree: bool,
}

/// What the guard says about one deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionGate {
    Allowed,
    /// Held by the guard, but an operator approved it.
    Approved {
        reason: String,
    },
    /// Held by the guard.
    Held {
        due: usize,
        limit: usize,
        managed: usize,
        since: SystemTime,
    },
    /// Held because the tree declares nothing.
    EmptyTree,
}

impl DeletionGate {
    pub fn allows(&self) -> bool {
        matches!(self, DeletionGate::Allowed | DeletionGate::Approved { .. })
    }
}

impl DeletionGuard {
    /// Counts the due deletions against the limits, with the remembered
    /// holds (`held`: name → hold).
    pub fn evaluate(
        due: &[DueDeletion<'_>],
        held: &HashMap<String, HeldDeletion>,
        managed: usize,
        limits: DeletionLimits,
        empty_tree: bool,
        now: SystemTime,
    ) -> Self {
        let limit = limits.limit(managed);
        let remembered = held.values().max_by_key(|h| h.due_together).copied();
        let tripped_before = remembered.is_some_and(|h| h.due_together > limit);
        let trip = if due.len() > limit || tripped_before {
            Some(HeldDeletion {
                since: held.values().map(|h| h.since).min().unwrap_or(now),
                due_together: remembered.map_or(0, |h| h.due_together).max(due.len()),
            })
        } else {
            None
        };
        DeletionGuard {
            due: due.len(),
            managed,
            limit,
            trip,
            empty_tree,
        }
    }

    /// The gate for one resource's deletion; `approval`: the reason of its
    /// approval, if an operator gave one.
    pub fn gate(&self, approval: Option<&str>) -> DeletionGate {
        if self.empty_tree {
            return DeletionGate::EmptyTree;
        }
        match (self.trip, approval) {
            (None, _) => DeletionGate::Allowed,
            (Some(_), Some(reason)) => DeletionGate::Approved {
                reason: reason.to_string(),
            },
            (Some(trip), None) => DeletionGate::Held {
                due: trip.due_together,
                limit: self.limit,
                managed: self.managed,
                since: trip.since,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    const LIMITS: DeletionLimits = DeletionLimits {
        max_deletions: 5,
        max_percent: 30,
    };

    fn due(names: &[&'static str]) -> Vec<DueDeletion<'static>> {
        names
            .iter()
            .map(|name| DueDeletion {
                name,
                approved: false,
            })
            .collect()
    }

    #[test]
    fn the_limit_is_the_smaller_of_count_and_percentage_and_at_least_one() {
        assert_eq!(LIMITS.limit(9), 2);
        assert_eq!(LIMITS.limit(100), 5);
        assert_eq!(LIMITS.limit(2), 1);
        let none = DeletionLimits {
            max_deletions: 0,
            max_percent: 10,
        };
        assert_eq!(none.limit(100), 0, "max_deletions = 0 holds every deletion");
    }

    #[test]
    fn below_the_limit_every_due_deletion_is_allowed() {
        let guard =
            DeletionGuard::evaluate(&due(&["a", "b"]), &HashMap::new(), 9, LIMITS, false, t(0));
        assert_eq!(guard.trip, None);
        assert_eq!(guard.gate(None), DeletionGate::Allowed);
    }

    #[test]
    fn over_the_limit_none_is_allowed_and_the_counts_are_given() {
        let guard = DeletionGuard::evaluate(
            &due(&["a", "b", "c", "d", "e"]),
            &HashMap::new(),
            9,
            LIMITS,
            false,
            t(0),
        );
        assert_eq!(
            guard.gate(None),
            DeletionGate::Held {
                due: 5,
                limit: 2,
                managed: 9,
                since: t(0)
            }
        );
        assert_eq!(
            guard.gate(Some("INC-1")),
            DeletionGate::Approved {
                reason: "INC-1".into()
            }
        );
    }

    #[test]
    fn a_trip_holds_until_the_limits_allow_everything_that_was_due_together() {
        // Five were due together; three were approved and deleted: the two
        // left are within the limit now, but stay held.
        let held: HashMap<String, HeldDeletion> = ["d", "e"]
            .into_iter()
            .map(|n| {
                (
                    n.to_string(),
                    HeldDeletion {
                        since: t(0),
                        due_together: 5,
                    },
                )
            })
            .collect();
        let guard = DeletionGuard::evaluate(&due(&["d", "e"]), &held, 6, LIMITS, false, t(60));
        assert!(matches!(
            guard.gate(None),
            DeletionGate::Held { due: 5, since, .. } if since == t(0)
        ));
        // The operator raises the limits so that all five would be allowed.
        let raised = DeletionLimits {
            max_deletions: 10,
            max_percent: 100,
        };
        let guard = DeletionGuard::evaluate(&due(&["d", "e"]), &held, 6, raised, false, t(60));
        assert_eq!(guard.gate(None), DeletionGate::Allowed);
    }

    #[test]
    fn an_empty_tree_deletes_nothing() {
        let guard = DeletionGuard::evaluate(&due(&["a"]), &HashMap::new(), 9, LIMITS, true, t(0));
        assert_eq!(guard.gate(Some("approved")), DeletionGate::EmptyTree);
    }
}
