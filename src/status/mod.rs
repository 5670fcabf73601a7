//! What tend tells operators: the report (docs/reports.md) and its
//! renderings.

pub(crate) mod auto_propose;
pub(crate) mod board;
pub(crate) mod branch;
pub(crate) mod branch_files;
mod decided_read;
pub(crate) mod files;
mod files_record;
pub(crate) mod html;
pub(crate) mod kept_renders;
pub(crate) mod last_operations;
pub(crate) mod notify;
pub(crate) mod publish;
pub mod render;
pub(crate) mod report;
pub(crate) mod report_digest;
mod report_from_plan;
mod sorted_merge;
mod times_only;
pub(crate) mod writer;

pub(crate) use report::Report;
pub use report_from_plan::build_report;

#[cfg(test)]
mod scale_tests;
