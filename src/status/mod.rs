//! What tend tells operators: the report (DESIGN.md §7, §9) and its
//! renderings.

pub mod board;
pub mod files;
pub mod html;
pub mod render;
pub mod report;
pub mod writer;

pub use report::{Report, build_report};
