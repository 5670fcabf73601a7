//! The library's core through its API: the decision table, proposals, the seeded simulation, the spec hash, the state store, the module graph.
//!
//! One test binary per theme: each links the whole crate once.

#[path = "../support/mod.rs"]
mod support;

mod agent;
mod decide;
mod fuzz_corpus;
mod layers;
mod propose;
mod simulation;
mod spec_hash;
mod state_store;
