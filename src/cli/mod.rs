//! The command line (README.md, docs/reports.md): argument types and dispatch. Each
//! command is a small function in its own module returning an exit code.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

mod apply;
mod command_error;
mod completions;
mod config_check;
mod deletions;
mod import;
mod logging;
mod operator;
mod overrides;
mod plan;
mod progress;
mod propose;
mod provider;
mod sandbox;
mod schema;
mod session;
mod state;
mod status;
mod validate;

pub(crate) use crate::process::exit;
use crate::process::heap;

/// `tend --version`: the version, the commit it was built from, and the
/// cargo features (`build.rs`).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TEND_COMMIT"),
    ", features: ",
    env!("TEND_FEATURES"),
    ")"
);

/// tend: keeps databases in the state declared in Git, honours emergency
/// overrides, and reports what it saw.
#[derive(Debug, Parser)]
#[command(name = "tend", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// Configuration file.
    #[arg(
        long,
        global = true,
        env = "TEND_CONFIG",
        default_value = "/etc/tend/tend.toml"
    )]
    pub config: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: follow the branch, reconcile continuously, serve
    /// metrics, status and webhooks (the systemd service runs this).
    Run,
    /// Check declaration files and report every problem with file:line:column.
    Validate(validate::ValidateArgs),
    /// Print the JSON Schema (draft-07) of a declaration, for editors.
    Schema,
    /// One read-only cycle: observe, decide, print what tend would do.
    Plan(plan::PlanArgs),
    /// One full cycle (snapshot, observe, decide, execute, confirm, report), then exit:
    /// 0 all in sync, 2 something still pending, 1 error.
    Apply(apply::ApplyArgs),
    /// The running agent's last report (from its HTTP server, else the
    /// last report file).
    Status(status::StatusArgs),
    /// Inspect the state dir.
    #[command(subcommand)]
    State(state::StateCommand),
    /// Pending deletions, and approving those the mass-deletion guard holds.
    #[command(subcommand)]
    Deletions(deletions::DeletionsCommand),
    /// Break-glass overrides on this host, for when Git is unreachable.
    #[command(subcommand)]
    Override(overrides::OverrideCommand),
    /// Everything tend knows about one declaration, and why it decides as it does.
    Explain(plan::ExplainArgs),
    /// Hand a change made at the provider back to Git: the declaration
    /// edit that declares what the provider shows (a patch, or a branch).
    Propose(propose::ProposeArgs),
    /// Declarations for the databases a provider already has and no
    /// declaration covers, adopting each with no field change (files, a
    /// patch, or a branch).
    Import(import::ImportArgs),
    /// The sandbox provider's dashboard: change external state as an operator would.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// HTTP providers: check that a server keeps the contract.
    #[command(subcommand)]
    Provider(provider::ProviderCommand),
    /// The configuration file: check it before a start or a reload.
    #[command(subcommand)]
    Config(config_check::ConfigCommand),
    /// Make the running agent fetch the source and reconcile every
    /// resource now (NAMEs, when given, must be known).
    Reconcile(ReconcileArgs),
    /// Freeze every change: the agent observes and reports, and changes
    /// nothing until `tend resume` (or the expiry).
    Suspend(SuspendArgs),
    /// End a freeze set with `tend suspend`.
    Resume,
    /// Print the shell completion script (bash, zsh or fish).
    Completions {
        #[arg(value_enum)]
        shell: completions::Shell,
    },
    /// Write the man pages (tend.1 and one per subcommand) into DIR.
    #[command(hide = true)]
    Man { dir: PathBuf },
}

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// Resources to reconcile (their metadata.name); every one when absent.
    pub names: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct SuspendArgs {
    /// Why (an incident, a change freeze). Required.
    #[arg(long)]
    pub reason: String,
    /// RFC 3339 time or a duration (`4h`) counted from now.
    #[arg(long)]
    pub expires: Option<String>,
    /// At the expiry: `hold` (default: stay frozen, reported expired) or
    /// `resume`.
    #[arg(long, value_name = "hold|resume")]
    pub on_expiry: Option<String>,
}

/// Output format of report-like commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// The parsed command line, or the exit code after clap printed why not
/// (usage errors exit `1`, `--help` and `--version` `0`). A usage error
/// exits `1`, not clap's `2`: `2` means "changes pending" to scripts using
/// `--detailed-exitcode`, and a typo must never look like that.
pub fn parse<I, T>(args: I) -> Result<Cli, u8>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            exit::ERROR
        } else {
            exit::OK
        }
    })
}

impl Cli {
    /// Whether this command line runs the long-lived agent (`tend run`).
    pub fn runs_the_agent(&self) -> bool {
        matches!(self.command, Command::Run)
    }
}

/// Sets up logging and runs a parsed command line.
pub fn run_parsed(cli: Cli) -> u8 {
    logging::init(cli.runs_the_agent());
    let code = run(cli);
    tracing::debug!("done");
    code
}

pub(crate) fn run(cli: Cli) -> u8 {
    let result = match cli.command {
        Command::Run => Ok(crate::daemon::run(&cli.config)),
        Command::Validate(args) => validate::run(&args),
        Command::Schema => schema::run(),
        Command::Plan(args) => plan::run_plan(&cli.config, &args),
        Command::Apply(args) => apply::run_apply(&cli.config, &args),
        Command::State(command) => state::run(&cli.config, &command),
        Command::Status(args) => status::run(&cli.config, &args),
        Command::Deletions(command) => deletions::run(&cli.config, &command),
        Command::Override(command) => overrides::run(&cli.config, &command),
        Command::Explain(args) => plan::run_explain(&cli.config, &args),
        Command::Propose(args) => propose::run(&cli.config, &args),
        Command::Import(args) => import::run(&cli.config, &args),
        Command::Sandbox(command) => sandbox::run(&cli.config, &command),
        Command::Provider(command) => provider::run(&command),
        Command::Config(command) => config_check::run(&cli.config, &command),
        Command::Reconcile(args) => operator::run(
            &cli.config,
            &crate::control::Request::Reconcile { names: args.names },
        ),
        Command::Suspend(args) => operator::run(
            &cli.config,
            &crate::control::Request::Suspend {
                reason: args.reason,
                expires: args.expires,
                on_expiry: args.on_expiry,
            },
        ),
        Command::Resume => operator::run(&cli.config, &crate::control::Request::Resume),
        Command::Completions { shell } => completions::completions(shell),
        Command::Man { dir } => completions::man(&dir),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`tend validate … | head`): not our error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => {
            let _ = writeln!(io::stderr(), "tend: cannot write output: {e}");
            exit::ERROR
        }
    }
}
