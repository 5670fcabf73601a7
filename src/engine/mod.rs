//! The decision core: pure functions from what Git declares, what the
//! provider shows and what tend remembers to what may safely happen next.
//! No I/O, no clock: `now` is an argument.
//!
//! Every rule that decides lives here and is named by a [`Rule`]:
//! [`decide`] (one resource), [`deletion`] (the mass-deletion guard),
//! [`intents`] (replay, supersession and the pending-intent gate).

pub mod decide;
pub(crate) mod deletion;
pub(crate) mod desired;
pub(crate) mod intents;
pub(crate) mod overrides;
pub(crate) mod suspension;

pub use decide::{
    Action, DecideInput, Decision, Drift, DriftOrigin, FailedAttempts, Memory, OperationFailure,
    Policy, Rule, State, Subject, Tombstone, decide, observed_fingerprint,
};
pub(crate) use decide::{Released, Renamed, each_difference};
pub(crate) use deletion::DeletionLimits;
pub use deletion::{DeletionGate, DeletionGuard, HeldDeletion};
pub use overrides::{OverrideInput, OverrideSource};
pub use suspension::Suspension;
