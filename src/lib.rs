//! tend: a GitOps pull agent for `ManagedDatabase` declarations.
//!
//! The modules follow DESIGN.md §2: [`model`] (declarations), [`config`],
//! [`provider`] (where databases live), [`engine`] (the pure decision core),
//! [`cycle`] (observe and decide), [`status`] (reports), [`cli`] (commands).

pub mod cli;
pub mod config;
pub mod cycle;
pub mod engine;
pub mod executor;
pub mod journal;
pub mod model;
pub mod provider;
pub mod source;
pub mod status;
