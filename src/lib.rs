//! tend: a GitOps pull agent for `ManagedDatabase` declarations.
//!
//! See `DESIGN.md` (shared design record) and `docs/` for the design; the
//! modules follow its §2: [`model`] (declarations), [`cli`] (commands).

pub mod cli;
pub mod model;
