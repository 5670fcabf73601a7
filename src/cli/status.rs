//! `tend status [NAME]`: the running agent's last report, from its
//! `/v1/status` when it answers, else the last `latest.json` in
//! `reports_dir`.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use clap::Args;

use super::plan::{ReportFormat, print_report};
use super::{exit, session};
use crate::status::Report;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One resource (its metadata.name); every resource when absent.
    pub name: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
}

/// Where the report came from, for the first line.
enum Origin {
    Agent(String),
    File(std::path::PathBuf),
}

async fn from_agent(url: &str) -> Option<Report> {
    let client = crate::provider::tls::http_client_for(url)
        .timeout(Duration::from_secs(3))
        .build()
        .ok()?;
    let response = client.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    serde_json::from_slice(&response.bytes().await.ok()?).ok()
}

fn from_file(config: &crate::config::Config) -> Option<(Report, std::path::PathBuf)> {
    let dir = config.reports_dir();
    crate::status::files::ReportFiles::new(&dir, 0)
        .read_latest()
        .map(|r| (r, dir.join("latest.json")))
}

pub fn run(config_path: &Path, args: &StatusArgs) -> io::Result<u8> {
    let config = match session::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let runtime = match session::runtime() {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let url = format!("http://{}/v1/status", config.server.listen);
    let found = match runtime.block_on(from_agent(&url)) {
        Some(report) => Some((report, Origin::Agent(url.clone()))),
        None => from_file(&config).map(|(r, f)| (r, Origin::File(f))),
    };
    let Some((mut report, origin)) = found else {
        session::fail(format!(
            "no running agent answers at {url}, and no report was written in {} ([status] reports_dir); is `tend run` running?",
            config.reports_dir().display()
        ));
        return Ok(exit::ERROR);
    };
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
    if args.format == ReportFormat::Text {
        let from = match &origin {
            Origin::Agent(url) => format!("the running agent ({url})"),
            Origin::File(file) => format!("{} (no agent answered)", file.display()),
        };
        writeln!(io::stdout(), "from {from}")?;
    }
    print_report(args.format, &report, "tend status")?;
    Ok(if report.has_errors() {
        exit::ERROR
    } else {
        exit::OK
    })
}
