//! `tend state show|check` (read-only), `tend state reset-attempts` and
//! `tend state migrate` (a SQLite state copied into PostgreSQL).

use std::io::{self, Write};
use std::path::Path;

use clap::Subcommand;

use super::{exit, session};
use crate::journal::StateStore;

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// A readable summary of the state dir.
    Show,
    /// Integrity check, unreadable rows included (exit 1 on problems).
    Check,
    /// Forget the failed update attempts of a resource, so a field held
    /// `Unconvergeable` is tried again (carried out by the running agent
    /// when there is one).
    ResetAttempts {
        /// The declaration's metadata.name.
        name: String,
    },
    /// Copy the state into a new file (SQLite's online backup: safe beside
    /// the running agent); restore it as docs/runbooks/state-recovery.md
    /// says.
    Backup {
        /// The file to write (must not exist).
        file: std::path::PathBuf,
    },
    /// Copy this agent's SQLite state into an empty PostgreSQL schema, the
    /// first step to running two or more agents (docs/operations.md).
    /// Stop the agent first: the state dir's lock is taken.
    Migrate {
        /// libpq-style URL of the target database (no password in it).
        #[arg(long = "to", value_name = "URL")]
        to: String,
        /// The schema to create the state in (must hold no state).
        #[arg(long, default_value = "tend_state")]
        schema: String,
        /// File holding the password.
        #[arg(long, value_name = "FILE")]
        password_file: Option<std::path::PathBuf>,
        /// CA certificates (PEM) that verify the server.
        #[arg(long, value_name = "FILE")]
        tls_ca_file: Option<std::path::PathBuf>,
    },
}

pub(super) fn run(config_path: &Path, command: &StateCommand) -> io::Result<u8> {
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let check = match command {
        StateCommand::ResetAttempts { name } => {
            return super::operator::run(
                config_path,
                &crate::control::Request::ResetAttempts { name: name.clone() },
            );
        }
        StateCommand::Migrate {
            to,
            schema,
            password_file,
            tls_ca_file,
        } => {
            let password = match password_file
                .as_deref()
                .map(|f| crate::config::secret::read("--password-file", f))
                .transpose()
            {
                Ok(p) => p,
                Err(e) => {
                    session::fail(e);
                    return Ok(exit::CONFIG);
                }
            };
            let target = crate::journal::PgStateSettings {
                url: to.clone(),
                password,
                schema: schema.clone(),
                tls_ca_file: tls_ca_file.clone(),
            };
            return migrate(&config, &target);
        }
        StateCommand::Backup { file } => return backup(&config, file),
        StateCommand::Show => false,
        StateCommand::Check => true,
    };
    let store = match StateStore::open_configured(&config, false) {
        Ok(Some(store)) => store,
        Ok(None) => {
            writeln!(
                io::stdout(),
                "no state yet in {} (nothing was applied)",
                config.state_dir.display()
            )?;
            return Ok(exit::OK);
        }
        Err(e) => return Ok(session::state_failed(&e)),
    };
    let result = if !check {
        store
            .summary()
            .and_then(|s| Ok(s + &leader_line(&store, &config)?))
            .map(|s| (s, exit::OK))
    } else {
        store.check().map(|problems| {
            if problems.is_empty() {
                (format!("{}: ok\n", store.location()), exit::OK)
            } else {
                (
                    problems
                        .iter()
                        .map(|p| format!("{}: {p}\n", store.location()))
                        .collect(),
                    exit::ERROR,
                )
            }
        })
    };
    match result {
        Ok((text, code)) => {
            write!(io::stdout(), "{text}")?;
            Ok(code)
        }
        Err(e) => Ok(session::state_failed(&e)),
    }
}

/// `tend state backup FILE`: a consistent copy of the SQLite state,
/// read-only on the state (whoever runs it, the state dir is untouched).
fn backup(config: &crate::config::Config, file: &std::path::Path) -> io::Result<u8> {
    let store = match StateStore::open_configured(config, false) {
        Ok(Some(store)) => store,
        Ok(None) => {
            session::fail(format!(
                "no state in {}: nothing to back up",
                config.state_dir.display()
            ));
            return Ok(exit::ERROR);
        }
        Err(e) => return Ok(session::state_failed(&e)),
    };
    match store.backup_to(file) {
        Ok(()) => {
            writeln!(
                io::stdout(),
                "backed up {} to {} (restore: docs/runbooks/state-recovery.md)",
                store.location(),
                file.display()
            )?;
            Ok(exit::OK)
        }
        Err(e) => Ok(session::state_failed(&e)),
    }
}

/// `tend state migrate`: the SQLite state copied into PostgreSQL.
fn migrate(
    config: &crate::config::Config,
    target: &crate::journal::PgStateSettings,
) -> io::Result<u8> {
    if config.state.backend == crate::config::StateBackend::Postgres {
        session::fail(
            "[state] backend is postgres already: `tend state migrate` copies a SQLite state dir into PostgreSQL",
        );
        return Ok(exit::CONFIG);
    }
    let also: Vec<std::path::PathBuf> = target.tls_ca_file.iter().cloned().collect();
    if let Err(code) = super::operator::become_state_owner(config, &also) {
        return Ok(code);
    }
    let copied = (|| {
        let _lock = crate::journal::StateLock::acquire(&config.state_dir)?;
        let Some(source) = StateStore::open(&config.state_dir, true)? else {
            return Ok(None);
        };
        let target_store = StateStore::open_postgres(target, true)?.ok_or_else(|| {
            crate::journal::StateError::Refused {
                path: target.location(),
                problem: "the schema could not be created".into(),
            }
        })?;
        source
            .copy_into(&target_store)
            .map(|rows| Some((rows, target_store.location().to_string())))
    })();
    match copied {
        Ok(None) => {
            writeln!(
                io::stdout(),
                "no state in {}: nothing to copy (a new group starts with an empty schema)",
                config.state_dir.display()
            )?;
            Ok(exit::OK)
        }
        Ok(Some((rows, location))) => {
            let mut out = io::stdout();
            writeln!(
                out,
                "copied {} into {location}:",
                config.state_dir.display()
            )?;
            for (table, n) in rows {
                writeln!(out, "  {table}: {n}")?;
            }
            writeln!(
                out,
                "next: set [state] backend = \"postgres\", url = {:?}, schema = {:?} (and password_file) in every agent's configuration, then start them (docs/operations.md). The state dir's state.db is left as it was.",
                target.url, target.schema
            )?;
            Ok(exit::OK)
        }
        Err(e) => Ok(session::state_failed(&e)),
    }
}

/// The leader of the agent group, for a shared (PostgreSQL) state.
fn leader_line(
    store: &StateStore,
    config: &crate::config::Config,
) -> Result<String, crate::journal::StateError> {
    if store.backend() != crate::journal::BackendKind::Postgres {
        return Ok(String::new());
    }
    let agent_id = match &config.agent_id {
        Some(id) => id.clone(),
        None => store.meta("agent_id")?.unwrap_or_default(),
    };
    Ok(match store.lease(&agent_id)? {
        None => format!("  leader: none (agent group {agent_id} never had one)\n"),
        Some(lease) => {
            let when = if lease.is_live() {
                format!(
                    "lease expires in {}",
                    crate::time::duration_ms(crate::time::since(lease.expires, lease.read_at))
                )
            } else {
                format!(
                    "lease EXPIRED {} ago: no agent leads (docs/runbooks/leader-lease.md)",
                    crate::time::duration_ms(crate::time::since(lease.read_at, lease.expires))
                )
            };
            format!(
                "  leader: {} on host {} (pid {}), token {}, {when}\n  leader since: {}, last renewed: {}\n",
                lease.holder,
                lease.host,
                lease.pid,
                lease.token,
                crate::time::rfc3339(lease.acquired),
                crate::time::rfc3339(lease.renewed),
            )
        }
    })
}
