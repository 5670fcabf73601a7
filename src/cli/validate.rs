//! `tend validate PATH…`

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::{Format, exit};
use crate::model::load_paths;

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

pub fn run(args: &ValidateArgs) -> io::Result<u8> {
    let set = load_paths(&args.paths);
    let code = if set.diagnostics.is_empty() {
        exit::OK
    } else {
        exit::ERROR
    };
    match args.format {
        Format::Text => {
            let mut err = io::stderr().lock();
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
            let report = json!({
                "declarations": set.declarations.len(),
                "errors": set.diagnostics,
            });
            let mut out = io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        }
    }
    Ok(code)
}
