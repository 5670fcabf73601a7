//! `tend validate PATH…`

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::{Format, exit};
use crate::model::load::load_paths_warning;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Files or directories (directories are searched for *.yaml and *.yml).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// `text`: problems on stderr as file:line:column: message, then a
    /// summary; `json`: one JSON object on stdout.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

pub(super) fn run(args: &ValidateArgs) -> io::Result<u8> {
    let loaded = load_paths_warning(&args.paths);
    let set = loaded.set;
    let code = if set.diagnostics.is_empty() {
        exit::OK
    } else {
        exit::ERROR
    };
    match args.format {
        Format::Text => {
            let mut err = io::stderr().lock();
            for w in &loaded.warnings {
                writeln!(err, "warning: {w}")?;
            }
            for d in &set.diagnostics {
                writeln!(err, "{d}")?;
            }
            let plural = |n: usize, word: &str| {
                if n == 1 {
                    format!("{n} {word}")
                } else {
                    format!("{n} {word}s")
                }
            };
            writeln!(
                io::stdout(),
                "{}, {}",
                plural(set.declarations.len(), "declaration"),
                plural(set.diagnostics.len(), "error")
            )?;
        }
        Format::Json => {
            let mut report = json!({
                "declarations": set.declarations.len(),
                "errors": set.diagnostics,
            });
            // Present only when something was skipped.
            if !loaded.warnings.is_empty() {
                report["warnings"] = json!(loaded.warnings);
            }
            let mut out = io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        }
    }
    Ok(code)
}
