//! `tend completions SHELL` and `tend man DIR`: the shell completions and
//! the man pages, generated from the command definitions themselves, so
//! they never fall behind them (the package ships both).

use std::io::{self, Write};
use std::path::Path;

use clap::CommandFactory;

use super::{Cli, exit};

/// The shells completions are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Prints the completion script of `shell`.
pub(super) fn completions(shell: Shell) -> io::Result<u8> {
    let mut command = Cli::command();
    let mut out = io::stdout().lock();
    let generator = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(generator, &mut command, "tend", &mut out);
    out.flush()?;
    Ok(exit::OK)
}

/// Writes `tend.1` and one page per subcommand (`tend-override-set.1`)
/// into `dir`; prints the files written.
pub(super) fn man(dir: &Path) -> io::Result<u8> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    write_pages(dir, Cli::command(), "tend", &mut written)?;
    let mut out = io::stdout().lock();
    for file in &written {
        writeln!(out, "{}", file.display())?;
    }
    Ok(exit::OK)
}

fn write_pages(
    dir: &Path,
    command: clap::Command,
    name: &str,
    written: &mut Vec<std::path::PathBuf>,
) -> io::Result<()> {
    let command = command
        .display_name(name.to_string())
        .bin_name(name.replace('-', " "));
    let file = dir.join(format!("{name}.1"));
    let mut bytes = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut bytes)?;
    std::fs::write(&file, bytes)?;
    written.push(file);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        write_pages(dir, sub.clone(), &sub_name, written)?;
    }
    Ok(())
}
