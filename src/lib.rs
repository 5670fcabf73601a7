//! tend: a GitOps pull agent for `ManagedDatabase` declarations.
//!
//! `model` (declarations, and the observations and calls the engine
//! and the providers share) · `config` · `source` (the Git branch) ·
//! `provider` (where databases live) · `engine` (the pure decision
//! core: it depends on `model`, `time` and `sabotage` only) ·
//! `reconcile` (the one reconcile path: inputs, routing, observation,
//! planning, effects) · `executor` (operations, journalled)
//! · `journal` (the state store) · `memories` (what the agent
//! remembers of each resource between cycles, cached) · `propose` (handing a change made
//! at the provider back to Git) · `agent` (the long-lived agent the
//! commands open) · `status` (reports) · `cli` (commands) · `clock`
//! and `time` (time, injected and overflow-safe) · `escape` (outside
//! text made safe for a terminal) · `sabotage` (deliberate bugs, test
//! builds only) · `process` (exit codes, the heap, acting as the state
//! dir's owner).
//!
//! Every module is private to the crate, and its items are `pub(crate)`
//! (the `unreachable_pub` lint holds that): what the binary calls is
//! re-exported below, and the integration tests, benchmarks, fuzz targets
//! and the reference HTTP provider reach the crate through [`testing`]
//! alone.

#![warn(unreachable_pub)]

mod agent;
mod cause;
mod cli;
mod clock;
mod config;
mod control;
mod daemon;
mod engine;
mod escape;
mod executor;
mod files;
mod import;
mod journal;
mod memories;
mod model;
mod process;
mod propose;
mod provider;
mod reconcile;
mod sabotage;
mod server;
mod source;
mod status;
mod telemetry;
pub mod testing;
mod time;

// What `src/main.rs` calls: the binary is a thin shell around these.
pub use cli::{parse, run_parsed};
pub use process::{failpoint, heap};
