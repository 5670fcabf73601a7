//! tend as an operator meets it: the command line, the documents' commands, the reports, the install and the package, hostile input.
//!
//! One test binary per theme: each links the whole crate once.

#[path = "../support/mod.rs"]
mod support;

mod alert_rules;
mod docs;
mod first_hour;
mod hardening;
mod hostile_corpus;
mod import;
mod install;
mod operate;
mod package;
mod plan_e2e;
mod planted_links;
mod pre_commit;
mod report_html;
mod report_render;
mod state_format;
mod validate;
mod validate_corpus;
