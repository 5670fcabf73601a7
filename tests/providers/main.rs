//! The Git source and the providers against real servers: Git transports and signatures, PostgreSQL, the HTTP contract.
//!
//! One test binary per theme: each links the whole crate once.

#[path = "../support/mod.rs"]
mod support;

mod contract_schemathesis;
mod http_provider;
mod minimal_dbaas;
mod postgres_provider;
mod signed_commits;
mod source_git;
mod ssh_transport;
