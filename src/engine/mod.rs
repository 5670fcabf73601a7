//! The decision core: pure functions from what Git declares, what the
//! provider shows and what tend remembers to what may safely happen next.
//! No I/O, no clock: `now` is an argument.
//!
//! Every rule that decides lives here and is named by a [`Rule`]:
//! [`decide`] (one resource), [`deletion`] (the mass-deletion guard),
//! [`intents`] (replay, supersession and the pending-intent gate).

pub mod decide;
pub mod deletion;
pub mod desired;
pub mod intents;
pub mod overrides;
pub mod suspension;

pub use decide::{
    Action, DecideInput, Decision, Drift, DriftOrigin, FailedAttempts, Memory, OperationFailure,
    Policy, Released, Renamed, Rule, State, Subject, Tombstone, decide, each_difference,
    observed_fingerprint, values_match,
};
pub use deletion::{DeletionGate, DeletionGuard, DeletionLimits, HeldDeletion};
pub use overrides::{EffectiveOverride, OverrideInput, OverrideSource};
pub use suspension::Suspension;
