//! The benchmarks (ignored tests; `scripts/bench.sh` runs them) and the test that keeps `scripts/bench.sh quick` alive.
//!
//! One test binary per theme: each links the whole crate once.

#[path = "../support/mod.rs"]
mod support;

mod apply;
mod daemon;
mod ha;
mod http;
mod plan;
mod postgres;
mod scale;
mod script;
mod source;
