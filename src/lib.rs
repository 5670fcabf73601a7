//! tend: a GitOps pull agent for `ManagedDatabase` declarations.
//!
//! The modules follow DESIGN.md §2: [`model`] (declarations), [`provider`]
//! (where databases live), [`engine`] (the pure decision core), [`cli`]
//! (commands).

pub mod cli;
pub mod engine;
pub mod model;
pub mod provider;
