//! `tend import --provider NAME`: declarations for the databases a provider
//! already has and no declaration covers, as files, a patch or a branch.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use regex::Regex;
use serde_json::json;

use super::{exit, session};
use crate::agent::Agent;
use crate::escape::terminal as esc;
use crate::import::{Defaults, Filter, Heading, ImportInput, ImportPlan, Known, plan_import};
use crate::journal::Access;
use crate::model::load_paths;
use crate::provider::{AnyProvider, Observation};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportOutput {
    /// New files in `--dir` (never one that exists).
    Files,
    /// A unified diff adding the files, on stdout (`git apply`).
    Patch,
    /// A commit on `tend/import/PROVIDER` in the source remote.
    Branch,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The configured provider whose databases are imported.
    #[arg(long)]
    pub provider: String,
    /// Only databases whose name this regular expression matches.
    #[arg(long = "match", value_name = "REGEX")]
    pub only: Option<String>,
    /// Leave out databases whose name this regular expression matches
    /// (repeatable).
    #[arg(long, value_name = "REGEX")]
    pub exclude: Vec<String>,
    /// The directory the declarations go to (default: the source's
    /// `path`, from the current directory: run it at the top of a
    /// checkout of the declarations repository).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "files")]
    pub output: ImportOutput,
    /// Also the fields whose value is the server's default, and each
    /// extension's version and schema.
    #[arg(long)]
    pub all_fields: bool,
    /// The `$schema` of the editor modeline (default: the committed
    /// schema at docs/schema/managed-database.schema.json of the
    /// repository, relative to the directory).
    #[arg(long, value_name = "PATH_OR_URL")]
    pub schema: Option<String>,
}

/// Where the files go.
struct Target {
    /// The directory on disk.
    disk: PathBuf,
    /// Its path in the Git working tree around it (`/`-separated, `""`
    /// for the top), when there is one.
    in_repo: Option<String>,
    /// How the files' paths are written: `in_repo`, else as given.
    label: String,
}

pub fn run(config_path: &Path, args: &ImportArgs) -> io::Result<u8> {
    let filter = match filter(args) {
        Ok(f) => f,
        Err(message) => {
            session::fail(message);
            return Ok(exit::ERROR);
        }
    };
    let agent = match session::open_agent(config_path, Access::ReadOnly) {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    let Some(runtime) = agent.runtimes().get(&args.provider).cloned() else {
        let known: Vec<&str> = agent.runtimes().keys().map(String::as_str).collect();
        session::fail(format!(
            "no provider named `{}` is configured (configured: {})",
            esc(&args.provider),
            known.join(", ")
        ));
        return Ok(exit::ERROR);
    };
    let target = locate(
        args.dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&agent.source_settings().path)),
    );
    if args.output == ImportOutput::Branch && target.in_repo.is_none() {
        session::fail(format!(
            "--output branch needs --dir inside a Git working tree (where the files go in the repository comes from it): {} is not in one",
            target.disk.display()
        ));
        return Ok(exit::ERROR);
    }
    let tokio = match session::runtime() {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let (read, listed) = tokio.block_on(async {
        let read = session::snapshot(&agent).await;
        if read.failure.is_some() || read.snapshot.is_none() {
            return (read, None);
        }
        let shallow: Vec<String> = system_databases(&agent, &args.provider, &runtime.provider)
            .into_keys()
            .collect();
        let listed = runtime.provider.observe_every_database(&shallow).await;
        (read, Some(listed))
    });
    if let Some(failure) = &read.failure {
        session::fail(format!(
            "source: {}; the tracked branch says which databases are declared already, so nothing is imported",
            failure.error
        ));
        return Ok(exit::ERROR);
    }
    let (Some(snapshot), Some(listed)) = (read.snapshot, listed) else {
        session::fail("the tracked branch has no commit tend accepted: nothing is imported");
        return Ok(exit::ERROR);
    };
    let observations = match listed {
        Ok(list) => list,
        Err(e) => {
            session::fail(format!(
                "provider {}: {}; nothing is written",
                esc(&args.provider),
                esc(&e.to_string())
            ));
            return Ok(exit::ERROR);
        }
    };
    let system = system_databases(&agent, &args.provider, &runtime.provider);
    let defaults = server_defaults(&runtime.provider, &observations);
    let capabilities = runtime.capabilities();

    let mut known: Vec<Known> = snapshot
        .declarations
        .declarations
        .iter()
        .map(|d| Known::of(d, d.file.display().to_string()))
        .collect();
    let mut existing_files: BTreeSet<String> = snapshot
        .files
        .iter()
        .map(|(path, _)| path.clone())
        .collect();
    let mut err = io::stderr().lock();
    if target.disk.is_dir() {
        let local = load_paths(std::slice::from_ref(&target.disk));
        if !local.diagnostics.is_empty() {
            writeln!(
                err,
                "tend: warning: {} problem(s) in the files of {} (`tend validate {}` lists them): what those files declare is not known to this import",
                local.diagnostics.len(),
                target.disk.display(),
                target.disk.display()
            )?;
        }
        known.extend(local.declarations.iter().map(|d| {
            let file = match d.file.strip_prefix(&target.disk) {
                Ok(inside) => join(&target.label, &inside.to_string_lossy()),
                Err(_) => d.file.display().to_string(),
            };
            Known::of(d, file)
        }));
        existing_files.extend(
            files_in(&target.disk)
                .into_iter()
                .map(|f| join(&target.label, &f)),
        );
    }
    let provider_kind = agent
        .config()
        .providers
        .get(&args.provider)
        .map_or("?", |c| c.kind().as_str());
    let schema_ref = args
        .schema
        .clone()
        .unwrap_or_else(|| default_schema_ref(&target.label));
    let input = ImportInput {
        heading: Heading {
            schema_ref: &schema_ref,
            provider: &args.provider,
            provider_kind,
            spell_provider: agent.config().providers.len() > 1,
        },
        agent_id: agent.agent_id(),
        capabilities: &capabilities,
        defaults: &defaults,
        all_fields: args.all_fields,
        known: &known,
        system: &system,
        filter: &filter,
        dir: &target.label,
        existing_files: &existing_files,
    };
    let listed = observations.len();
    let plan = plan_import(&input, observations);
    summarize(&mut err, &args.provider, provider_kind, listed, &plan)?;
    if let Some(in_repo) = &target.in_repo {
        let path = &agent.source_settings().path;
        let inside = path == "." || in_repo == path || in_repo.starts_with(&format!("{path}/"));
        if !inside && !plan.imported.is_empty() {
            writeln!(
                err,
                "tend: warning: {in_repo} is outside the source's path ({path}): tend does not read files there"
            )?;
        }
    }
    if plan.imported.is_empty() {
        writeln!(err, "nothing to import")?;
        return Ok(exit::OK);
    }
    let when = crate::time::rfc3339(agent.clock().now());
    match args.output {
        ImportOutput::Files => write_files(&target, &plan, &mut err),
        ImportOutput::Patch => {
            let mut out = io::stdout().lock();
            write!(
                out,
                "tend import from provider {} ({provider_kind}) at {when}, on top of commit {}: {} declaration(s)\n\n",
                args.provider,
                snapshot.commit,
                plan.imported.len()
            )?;
            for one in &plan.imported {
                write!(out, "{}", new_file_diff(&one.file, &one.text))?;
            }
            Ok(exit::OK)
        }
        ImportOutput::Branch => {
            let message = commit_message(
                &args.provider,
                provider_kind,
                &when,
                &snapshot.commit,
                &plan,
            );
            push_branch(
                &agent,
                &args.provider,
                &plan,
                &snapshot.commit,
                &message,
                &mut err,
            )
        }
    }
}

/// `--match` and `--exclude` compiled, or what is wrong with one.
fn filter(args: &ImportArgs) -> Result<Filter, String> {
    let compile = |flag: &str, text: &str| {
        Regex::new(text).map_err(|e| format!("{flag} {text:?} is not a regular expression: {e}"))
    };
    Ok(Filter {
        only: args
            .only
            .as_deref()
            .map(|t| compile("--match", t))
            .transpose()?,
        except: args
            .exclude
            .iter()
            .map(|t| compile("--exclude", t))
            .collect::<Result<_, _>>()?,
    })
}

/// `dir` on disk and in the Git working tree around it.
fn locate(dir: PathBuf) -> Target {
    let given = dir.display().to_string();
    let given = given.trim_start_matches("./").trim_end_matches('/');
    let given = if given == "." { "" } else { given }.to_string();
    let disk = if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir().map(|c| c.join(&dir)).unwrap_or(dir)
    };
    let in_repo = repository_path(&disk);
    let label = in_repo.clone().unwrap_or(given);
    Target {
        disk,
        in_repo,
        label,
    }
}

/// The path of `dir` (which need not exist yet) in the Git working tree
/// around it.
fn repository_path(dir: &Path) -> Option<String> {
    crate::source::libgit2();
    let mut existing = dir.to_path_buf();
    let mut missing = Vec::new();
    while !existing.exists() {
        missing.push(existing.file_name()?.to_os_string());
        existing = existing.parent()?.to_path_buf();
    }
    let repo = git2::Repository::discover(&existing).ok()?;
    let top = repo.workdir()?.canonicalize().ok()?;
    let mut full = existing.canonicalize().ok()?;
    for part in missing.iter().rev() {
        full.push(part);
    }
    let inside = full.strip_prefix(&top).ok()?;
    let parts: Vec<String> = inside
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    Some(parts.join("/"))
}

/// The file names directly in `dir`.
fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn join(dir: &str, file: &str) -> String {
    if dir.is_empty() {
        file.to_string()
    } else {
        format!("{dir}/{file}")
    }
}

/// The committed schema at the repository's top, relative to `dir`.
fn default_schema_ref(dir: &str) -> String {
    let depth = dir
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .count();
    format!(
        "{}docs/schema/managed-database.schema.json",
        "../".repeat(depth)
    )
}

/// Databases of the provider that are not a tenant's, with why.
fn system_databases(
    agent: &Agent,
    provider_name: &str,
    provider: &AnyProvider,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let AnyProvider::Postgres(pg) = provider else {
        return out;
    };
    out.insert(
        "postgres".to_string(),
        "the maintenance database every PostgreSQL server has".to_string(),
    );
    for template in ["template0", "template1"] {
        out.insert(
            template.to_string(),
            "a template database of the server".to_string(),
        );
    }
    if let Some(maintenance) = pg.maintenance_database() {
        out.entry(maintenance).or_insert_with(|| {
            format!("tend's catalog (tend.databases) lives there ([providers.{provider_name}] url)")
        });
    }
    let state = &agent.config().state;
    if state.backend == crate::config::StateBackend::Postgres
        && let Some(url) = &state.url
        && pg.same_server(url)
        && let Some(database) = url
            .parse::<tokio_postgres::Config>()
            .ok()
            .and_then(|c| c.get_dbname().map(str::to_string))
    {
        out.entry(database)
            .or_insert_with(|| "tend's state ([state] url) lives there".to_string());
    }
    out
}

/// Field values a database has when nobody set them: PostgreSQL's no
/// connection limit, connections allowed, and the encoding and locale of
/// `template1` (what `CREATE DATABASE` copies).
fn server_defaults(provider: &AnyProvider, observations: &[Observation]) -> Defaults {
    let mut defaults = Defaults::new();
    if !matches!(provider, AnyProvider::Postgres(_)) {
        return defaults;
    }
    defaults.insert("connectionLimit".into(), json!(-1));
    defaults.insert("allowConnections".into(), json!(true));
    if let Some(template) = observations.iter().find(|o| o.database_name == "template1") {
        for field in ["encoding", "locale"] {
            if let Some(value) = template.fields.get(field) {
                defaults.insert(field.into(), value.clone());
            }
        }
    }
    defaults
}

/// What was found and decided, on stderr.
fn summarize(
    err: &mut impl Write,
    provider: &str,
    kind: &str,
    listed: usize,
    plan: &ImportPlan,
) -> io::Result<()> {
    writeln!(
        err,
        "provider {} ({kind}) shows {listed} database(s): {} to import, {} declared already, {} left aside by --match/--exclude, {} not imported",
        esc(provider),
        plan.imported.len(),
        plan.declared,
        plan.filtered,
        plan.not_imported.len()
    )?;
    for one in &plan.not_imported {
        writeln!(
            err,
            "  not imported: {}: {}",
            esc(&one.database),
            esc(&one.why)
        )?;
    }
    for one in &plan.imported {
        for left in &one.left_out {
            writeln!(
                err,
                "  {} ({}): {} left out: {}",
                esc(&one.file),
                esc(&one.database),
                esc(&left.field),
                esc(&left.why)
            )?;
        }
    }
    Ok(())
}

/// Each file created beside the others, never over one that exists.
fn write_files(target: &Target, plan: &ImportPlan, err: &mut impl Write) -> io::Result<u8> {
    if let Err(e) = std::fs::create_dir_all(&target.disk) {
        writeln!(err, "tend: cannot create {}: {e}", target.disk.display())?;
        return Ok(exit::ERROR);
    }
    let mut out = io::stdout().lock();
    for one in &plan.imported {
        let file_name = one.file.rsplit('/').next().unwrap_or(&one.file);
        let path = target.disk.join(file_name);
        let written = tempfile::NamedTempFile::new_in(&target.disk).and_then(|mut temp| {
            temp.write_all(one.text.as_bytes())?;
            temp.as_file().sync_all()?;
            temp.persist_noclobber(&path).map_err(|e| e.error)?;
            Ok(())
        });
        if let Err(e) = written {
            writeln!(
                err,
                "tend: cannot write {}: {e}; the files listed above it were written",
                path.display()
            )?;
            return Ok(exit::ERROR);
        }
        writeln!(out, "wrote {} ({})", one.file, esc(&one.database))?;
    }
    writeln!(
        err,
        "review them, commit, and `tend plan` shows each as Adopt with no field change"
    )?;
    Ok(exit::OK)
}

/// A unified diff that adds `file` holding `text` (`git apply`, `patch -p1`).
fn new_file_diff(file: &str, text: &str) -> String {
    let diff = similar::TextDiff::from_lines("", text)
        .unified_diff()
        .context_radius(3)
        .header("/dev/null", &format!("b/{file}"))
        .to_string();
    format!("diff --git a/{file} b/{file}\nnew file mode 100644\n{diff}")
}

/// The import branch's commit message: what, from where, when.
fn commit_message(provider: &str, kind: &str, when: &str, base: &str, plan: &ImportPlan) -> String {
    let mut out = format!(
        "import: declare {} database(s) of provider {provider}\n\nImported by tend import from provider {provider} ({kind}) at {when}, on top of commit {base}. Each declaration adopts its database (tend.dev/adopt) with no field change:\n",
        plan.imported.len()
    );
    for one in &plan.imported {
        out.push_str(&format!("  {} ({})\n", one.file, one.database));
    }
    let left: Vec<String> = plan
        .imported
        .iter()
        .flat_map(|one| {
            one.left_out
                .iter()
                .map(move |l| format!("  {}: {}: {}\n", one.name, l.field, l.why))
        })
        .collect();
    if !left.is_empty() {
        out.push_str("\nLeft out (declare by hand if tend should manage them):\n");
        out.extend(left);
    }
    if !plan.not_imported.is_empty() {
        out.push_str("\nNot imported:\n");
        for one in &plan.not_imported {
            out.push_str(&format!("  {}: {}\n", one.database, one.why));
        }
    }
    out
}

fn push_branch(
    agent: &Agent,
    provider: &str,
    plan: &ImportPlan,
    base: &str,
    message: &str,
    err: &mut impl Write,
) -> io::Result<u8> {
    let files: Vec<(String, String)> = plan
        .imported
        .iter()
        .map(|one| (one.file.clone(), one.text.clone()))
        .collect();
    let branch = format!("tend/import/{provider}");
    super::propose::push_to_branch(agent, &branch, &files, base, message, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modeline_points_at_the_repository_top() {
        assert_eq!(
            default_schema_ref("databases"),
            "../docs/schema/managed-database.schema.json"
        );
        assert_eq!(
            default_schema_ref("examples/databases"),
            "../../docs/schema/managed-database.schema.json"
        );
        assert_eq!(
            default_schema_ref(""),
            "docs/schema/managed-database.schema.json"
        );
    }

    #[test]
    fn a_new_file_diff_applies_as_a_creation() {
        let diff = new_file_diff("db/a.yaml", "x: 1\n");
        assert!(
            diff.starts_with("diff --git a/db/a.yaml b/db/a.yaml\nnew file mode 100644\n--- /dev/null\n+++ b/db/a.yaml\n@@ -0,0 +1 @@\n+x: 1\n"),
            "{diff}"
        );
    }
}
