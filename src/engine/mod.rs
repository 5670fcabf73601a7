//! The decision core (DESIGN.md §2): pure functions from what Git declares,
//! what the provider shows and what tend remembers to what may safely happen
//! next. No I/O, no clock: `now` is an argument.

pub mod decide;
pub mod desired;
pub mod overrides;

pub use decide::{
    Action, DecideInput, Decision, Drift, DriftOrigin, Memory, Policy, Rule, State, Subject,
    Tombstone, decide,
};
pub use overrides::{EffectiveOverride, OverrideInput, OverrideSource};
