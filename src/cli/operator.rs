//! How a command that changes the state reaches it: through the running
//! agent when there is one (its control channel), otherwise by writing the
//! state itself as the state dir's owner.
//!
//! # Guarantees
//! * Beside a running agent the command never writes the state: the agent
//!   does, and says what it did. An agent that holds the state and does
//!   not answer (starting, stopping) is a refusal, never a write beside it.
//! * Without one, a command run as root acts as the state dir's owner
//!   (the service's user): every file it makes is that user's, and nothing
//!   asks for a `chown`.
//! * Neither way needs the source: the names are checked against the
//!   agent's snapshot, or the last accepted commit read from the state dir
//!   (Git may be what is down).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::command_error::CommandError;
use super::{exit, session};
use crate::config::Config;
use crate::control::{Answer, Request, actions, client};
use crate::journal::{Access, Holder, StateStore};
use crate::source::Source;

/// Carries `request` out and prints the answer; the exit code.
pub(super) fn run(config_path: &Path, request: &Request) -> io::Result<u8> {
    let config = match Config::load(config_path) {
        Ok(config) => config,
        // Break-glass while the file is being edited: the agent runs on
        // the configuration it loaded, and its socket is still where the
        // file said.
        Err(e) => {
            let socket = socket_of_unloadable(config_path);
            return match client::send(&socket, request) {
                Ok(Some(answer)) => {
                    session::fail(format!(
                        "warning: {e}; the running agent at {} carried this out on the configuration it loaded before",
                        socket.display()
                    ));
                    print(&answer)
                }
                _ => {
                    session::fail(e);
                    Ok(exit::CONFIG)
                }
            };
        }
    };
    let socket = config.control_socket();
    match client::send(&socket, request) {
        Ok(Some(answer)) => return print(&answer),
        Ok(None) => {}
        Err(e) => {
            session::fail(e);
            return Ok(exit::ERROR);
        }
    }
    match crate::journal::lock::holder(&config.state_dir) {
        Ok(Holder::Agent(pid)) => {
            session::fail(format!(
                "the agent (pid {pid}) holds the state in {} but does not answer on its control socket {}: it is starting or stopping. Try again in a moment; `systemctl status tend` says what it is doing",
                config.state_dir.display(),
                socket.display()
            ));
            return Ok(exit::ERROR);
        }
        // A one-shot writer (`tend apply`): SQLite keeps the two apart,
        // and the next cycle reads what this writes.
        Ok(Holder::Free | Holder::Command(_)) => {}
        Err(e) => return Ok(session::state_failed(&e)),
    }
    print(&directly(&config, request)?)
}

/// The request carried out by this command on the state itself.
fn directly(config: &Config, request: &Request) -> io::Result<Answer> {
    // Who asked, before acting as the state's owner.
    let by = who_am_i();
    if let Err(code) = become_state_owner(config, &[]) {
        return Ok(Answer {
            code,
            ..Answer::default()
        });
    }
    let store = match StateStore::open_configured(config, true) {
        Ok(Some(store)) => store,
        Ok(None) => {
            return Ok(Answer::refused(format!(
                "the state {} could not be created\n",
                config.state_dir.display()
            )));
        }
        Err(e) => {
            return Ok(Answer {
                code: session::state_failed(&e),
                ..Answer::default()
            });
        }
    };
    let accepted = accepted_declarations(config);
    let ctx = actions::Context {
        store: &store,
        declarations: accepted
            .as_ref()
            .map(Option::as_deref)
            .map_err(|e| e as &(dyn std::error::Error + Send + Sync)),
        now: std::time::SystemTime::now(),
        by,
        by_agent: false,
    };
    Ok(actions::carry_out(request, &ctx))
}

/// Acts as the state dir's owner when run as root ([`crate::process::owner`]),
/// reading every secret the configuration names (and `also`) first: they
/// may be root-only. `Err`: the exit code, after saying why.
pub(super) fn become_state_owner(config: &Config, also: &[PathBuf]) -> Result<(), u8> {
    crate::config::secret::preload(
        config
            .secret_files()
            .into_iter()
            .chain(also.iter().cloned()),
    );
    crate::process::owner::act_as_owner_of(&config.state_dir)
        .map(|_| ())
        .map_err(|e| {
            session::fail(e);
            exit::ERROR
        })
}

/// `uid N (pid P)` of this process.
fn who_am_i() -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    format!("uid {uid} (pid {})", std::process::id())
}

/// The declarations of the last accepted commit, read from the state
/// dir's Git data without fetching and without the source's credentials.
pub(super) fn accepted_declarations(
    config: &Config,
) -> Result<Option<std::sync::Arc<crate::source::Snapshot>>, CommandError> {
    let settings = crate::source::tracker::SourceSettings::offline(config)?;
    Ok(Source::open(&config.state_dir, settings, Access::ReadOnly)
        .and_then(Source::accepted_snapshot)?)
}

/// Prints what the agent (or this command) answered; its exit code.
fn print(answer: &Answer) -> io::Result<u8> {
    write!(io::stdout(), "{}", answer.stdout)?;
    write!(io::stderr(), "{}", answer.stderr)?;
    Ok(answer.code)
}

/// Where the control socket is when the configuration does not load: the
/// file's `[control] socket` or `state_dir` if it still says one, else the
/// defaults (relative paths from the file's directory, as when it loads).
fn socket_of_unloadable(config_path: &Path) -> PathBuf {
    let base = config_path.parent().unwrap_or(Path::new("."));
    let setting = |section, key| session::setting_of_unloadable(config_path, section, key);
    setting("control", "socket")
        .map(|socket| base.join(socket))
        .or_else(|| setting("", "state_dir").map(|dir| base.join(dir).join("control.sock")))
        .unwrap_or_else(|| PathBuf::from("/var/lib/tend/control.sock"))
}
