//! What tend tells operators: the report (DESIGN.md §7, §9) and its
//! renderings.

pub mod board;
pub mod render;
pub mod report;

pub use report::{Report, build_report};
