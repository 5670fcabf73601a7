//! `tend status [NAME]`: the running agent's last report, from its
//! `/v1/status` when it answers, else the last `latest.json` in
//! `reports_dir`.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use clap::Args;

use super::plan::{ReportArgs, ReportFormat, print_report};
use super::{exit, session};
use crate::status::Report;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One resource (its metadata.name); every resource when absent.
    pub name: Option<String>,
    #[command(flatten)]
    pub output: ReportArgs,
}

/// Where the report came from, for the first line.
enum Origin {
    Agent(String),
    /// The report file, and why the agent's report was not used.
    File(std::path::PathBuf, String),
}

/// What the agent at `[server] listen` said.
enum AgentAnswer {
    Report(Box<Report>),
    /// It is up but has no report to give (still starting, or a standby of
    /// an agent group): why, in its own words.
    NoReport(String),
    /// Nothing answered.
    Unreachable,
}

/// Asks the agent at `base` for its report, with the bearer token of
/// `[server] token_file` when one is set.
async fn from_agent(base: &str, token: Option<&[u8]>) -> AgentAnswer {
    let Ok(client) = crate::provider::tls::http_client_for(base)
        .timeout(Duration::from_secs(3))
        .build()
    else {
        return AgentAnswer::Unreachable;
    };
    let mut request = client.get(format!("{base}/v1/status"));
    if let Some(token) = token {
        request = request.bearer_auth(String::from_utf8_lossy(token));
    }
    let Ok(response) = request.send().await else {
        return AgentAnswer::Unreachable;
    };
    let status = response.status();
    let body = response.bytes().await.unwrap_or_default();
    if status.is_success() {
        return match serde_json::from_slice(&body) {
            Ok(report) => AgentAnswer::Report(Box::new(report)),
            Err(e) => AgentAnswer::NoReport(format!("its /v1/status is not a report ({e})")),
        };
    }
    // /readyz says what it is doing: starting, or standing by for a leader.
    let readiness = match client.get(format!("{base}/readyz")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let said = format!(
        "/v1/status: {status} {}",
        String::from_utf8_lossy(&body).trim()
    );
    AgentAnswer::NoReport(match readiness.trim() {
        "" => said,
        ready => format!("{ready}; {said}"),
    })
}

fn from_file(config: &crate::config::Config) -> Option<(Report, std::path::PathBuf)> {
    let dir = config.reports_dir();
    crate::status::files::ReportFiles::new(&dir, 0)
        .read_latest()
        .map(|r| (r, dir.join("latest.json")))
}

/// The address the running agent answers on when the configuration file
/// does not load: its `[server] listen` if the file still says one, else
/// the default. The agent runs on the configuration it loaded before the
/// edit, and an operator needs its report most exactly then.
fn listen_of_unloadable(config_path: &Path) -> std::net::SocketAddr {
    session::setting_of_unloadable(config_path, "server", "listen")
        .and_then(|listen| listen.parse().ok())
        .unwrap_or_else(|| crate::config::ServerConfig::default().listen)
}

pub(super) fn run(config_path: &Path, args: &StatusArgs) -> io::Result<u8> {
    let runtime = match session::runtime() {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let config = match crate::config::Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            let listen = listen_of_unloadable(config_path);
            let base = format!("http://{listen}");
            return match runtime.block_on(from_agent(&base, None)) {
                AgentAnswer::Report(report) => {
                    session::fail(format!(
                        "warning: {e}; this is the report of the agent running at {base}, on the configuration it loaded before (`tend config check` says what to fix)"
                    ));
                    show(args, *report, Origin::Agent(format!("{base}/v1/status")))
                }
                _ => {
                    session::fail(format!(
                        "{e}; and no running agent answers at {base} with a report"
                    ));
                    Ok(exit::CONFIG)
                }
            };
        }
    };
    let base = format!("http://{}", config.server.listen);
    let url = format!("{base}/v1/status");
    // Without the agent's report: why (when no file helps either), and
    // what the file fallback's first line says.
    // A token that cannot be read is asked without (the agent says 401).
    let token = config.server_token().ok().flatten();
    let (failure, note) = match runtime.block_on(from_agent(&base, token.as_deref())) {
        AgentAnswer::Report(report) => {
            // Another tend on this port (another configuration on the
            // host) would be reported as this one's agent: compared with
            // the configured agent_id, else the one the state keeps.
            if let Some((ours, whence)) = expected_agent_id(&config)
                && report.agent.id != ours
            {
                session::fail(format!(
                    "the agent answering at {url} is agent `{}`, not `{ours}` ({whence}): another tend listens on [server] listen; stop it or give this one another address",
                    report.agent.id
                ));
                return Ok(exit::ERROR);
            }
            return show(args, *report, Origin::Agent(url));
        }
        AgentAnswer::NoReport(why) => (
            format!(
                "the agent at {base} is running but has no report yet ({why}); its first finished cycle makes one (if it stays so, see docs/runbooks/daemon-not-ready.md)"
            ),
            "the running agent has no report yet",
        ),
        AgentAnswer::Unreachable => (
            format!(
                "no running agent answers at {url}, and no report was written in {} ([status] reports_dir); is `tend run` running?",
                config.reports_dir().display()
            ),
            "no agent answered",
        ),
    };
    match from_file(&config) {
        Some((report, file)) => show(args, report, Origin::File(file, note.to_string())),
        None => {
            session::fail(failure);
            Ok(exit::ERROR)
        }
    }
}

/// The agent id this configuration's agent has, and where it comes from:
/// `agent_id` in the file, else the one its state keeps (read only;
/// `None` when neither says, or the state cannot be read now).
fn expected_agent_id(config: &crate::config::Config) -> Option<(String, &'static str)> {
    if let Some(id) = &config.agent_id {
        return Some((id.clone(), "this configuration's agent_id"));
    }
    let store = crate::journal::StateStore::open_configured(config, false).ok()??;
    let kept = store.agent_id_for_reading(None).ok()??;
    Some((kept, "the agent id this configuration's state keeps"))
}

/// Prints `report` (one resource of it with a name), from `origin`.
fn show(args: &StatusArgs, mut report: Report, origin: Origin) -> io::Result<u8> {
    if let Some(name) = &args.name {
        report.resources.retain(|r| &r.name == name);
        if report.resources.is_empty() {
            session::fail(format!(
                "no resource named `{name}` in the agent's last report"
            ));
            return Ok(exit::ERROR);
        }
        report.summary = crate::status::report::Summary::of(&report.resources, report.errors.len());
    }
    if args.output.format == ReportFormat::Text {
        let from = match &origin {
            Origin::Agent(url) => format!("the running agent ({url})"),
            Origin::File(file, note) => format!("{} ({note})", file.display()),
        };
        writeln!(io::stdout(), "from {from}")?;
    }
    print_report(&args.output, &report, "tend status")?;
    Ok(if report.has_errors() {
        exit::ERROR
    } else {
        exit::OK
    })
}
