//! tend: a GitOps pull agent for `ManagedDatabase` declarations.
//!
//! [`model`] (declarations, and the observations and calls the engine
//! and the providers share) · [`config`] · [`source`] (the Git branch) ·
//! [`provider`] (where databases live) · [`engine`] (the pure decision
//! core: it depends on `model`, `time` and `sabotage` only) ·
//! [`reconcile`] (the one reconcile path: inputs, routing, observation,
//! planning, effects) · [`executor`] (operations, journalled)
//! · [`journal`] (the state store) · [`memories`] (what the agent
//! remembers of each resource between cycles, cached) · [`propose`] (handing a change made
//! at the provider back to Git) · [`agent`] (the long-lived agent the
//! commands open) · [`status`] (reports) · [`cli`] (commands) · [`clock`]
//! and [`time`] (time, injected and overflow-safe) · [`escape`] (outside
//! text made safe for a terminal) · [`sabotage`] (deliberate bugs, test
//! builds only) · [`process`] (exit codes, the heap, acting as the state
//! dir's owner).

pub mod agent;
pub mod cause;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod daemon;
pub mod engine;
pub mod escape;
pub mod executor;
pub mod files;
pub mod import;
pub mod journal;
pub mod memories;
pub mod model;
pub mod process;
pub mod propose;
pub mod provider;
pub mod reconcile;
pub mod sabotage;
pub mod server;
pub mod source;
pub mod status;
pub mod telemetry;
pub mod time;
