//! What tend tells operators: the report (docs/reports.md) and its
//! renderings.

pub mod auto_propose;
pub mod board;
pub mod branch;
pub mod branch_files;
pub mod files;
pub mod html;
pub mod notify;
pub mod publish;
pub mod render;
pub mod report;
pub mod writer;

pub use report::{Report, build_report};

#[cfg(test)]
mod scale_tests;
