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
use crate::provider::AnyProvider;

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

pub(super) fn run(config_path: &Path, args: &ImportArgs) -> io::Result<u8> {
    match import(config_path, args) {
        Ok(code) => Ok(code),
        Err(Refused(message)) => {
            session::fail(message);
            Ok(exit::ERROR)
        }
    }
}

/// Why nothing is imported (said as `tend: …`, exit 1).
struct Refused(String);

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Self {
        Refused(format!("cannot write the output: {e}"))
    }
}

fn import(config_path: &Path, args: &ImportArgs) -> Result<u8, Refused> {
    let filter = filter(args).map_err(Refused)?;
    let agent = match session::open_agent(config_path, Access::ReadOnly) {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    let Some(runtime) = agent.runtimes().get(&args.provider).cloned() else {
        let known: Vec<&str> = agent.runtimes().keys().map(String::as_str).collect();
        return Err(Refused(format!(
            "no provider named `{}` is configured (configured: {})",
            esc(&args.provider),
            known.join(", ")
        )));
    };
    let source_path = agent.source_settings().path.clone();
    let target = locate(
        args.dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&source_path)),
    )?;
    if args.output == ImportOutput::Branch {
        let branch = branch_name(&args.provider)?;
        let Some(in_repo) = &target.in_repo else {
            return Err(Refused(format!(
                "--output branch needs --dir inside a Git working tree (where the files go in the repository comes from it): {} is not in one",
                target.disk.display()
            )));
        };
        if !inside(in_repo, &source_path) {
            return Err(Refused(format!(
                "--output branch: {in_repo} is outside the source's path ({source_path}), so tend would never read the files pushed to {branch}; give a --dir under it"
            )));
        }
    }
    let tokio = session::runtime().map_err(|_| Refused("cannot start the async runtime".into()))?;
    let read = tokio.block_on(session::snapshot(&agent, false));
    if let Some(failure) = &read.failure {
        return Err(Refused(format!(
            "source: {}; the tracked branch says which databases are declared already, so nothing is imported",
            failure.error
        )));
    }
    let Some(snapshot) = read.snapshot else {
        return Err(Refused(
            "the tracked branch has no commit tend accepted: nothing is imported".into(),
        ));
    };
    let mut err = io::stderr().lock();
    let (known, existing_files) = declared(&snapshot, &target, &mut err)?;
    let system = system_databases(&agent, &args.provider, &runtime.provider);
    let covered = crate::import::covered(&known, &args.provider);
    // Only a database the import may write is worth a connection (the
    // PostgreSQL provider reads extensions in the database itself).
    let worth_reading =
        |db: &str| !system.contains_key(db) && !covered.contains(db) && filter.keeps(db);
    let provider_failed = |e: crate::provider::ProviderError| {
        Refused(format!(
            "provider {}: {}; nothing is written",
            esc(&args.provider),
            esc(&e.to_string())
        ))
    };
    let (observations, defaults) = tokio
        .block_on(async {
            let listed = runtime
                .provider
                .observe_every_database(&worth_reading)
                .await?;
            let defaults = server_defaults(&runtime.provider).await?;
            Ok((listed, defaults))
        })
        .map_err(provider_failed)?;
    let capabilities = runtime.capabilities();
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
    if let Some(in_repo) = &target.in_repo
        && !inside(in_repo, &source_path)
        && !plan.imported.is_empty()
    {
        writeln!(
            err,
            "tend: warning: {in_repo} is outside the source's path ({source_path}): tend does not read files there"
        )?;
    }
    if plan.imported.is_empty() {
        writeln!(err, "nothing to import")?;
        return Ok(exit::OK);
    }
    let when = crate::time::rfc3339(agent.clock().now());
    match args.output {
        ImportOutput::Files => Ok(write_files(&target, &plan, &mut err)?),
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
            let files: Vec<(String, String)> = plan
                .imported
                .iter()
                .map(|one| (one.file.clone(), one.text.clone()))
                .collect();
            let branch = branch_name(&args.provider)?;
            Ok(super::propose::push_to_branch(
                &agent,
                &branch,
                &files,
                true,
                &snapshot.commit,
                &message,
                &mut err,
            )?)
        }
    }
}

/// `tend/import/PROVIDER`, when that is a valid branch name.
fn branch_name(provider: &str) -> Result<String, Refused> {
    let branch = format!("tend/import/{provider}");
    if git2::Reference::is_valid_name(&format!("refs/heads/{branch}")) {
        Ok(branch)
    } else {
        Err(Refused(format!(
            "--output branch: `{}` is not a valid Git branch name (from the provider's name): use --output files or patch",
            esc(&branch)
        )))
    }
}

/// Whether the repository path `dir` is the source's `path` or under it.
fn inside(dir: &str, path: &str) -> bool {
    path == "." || dir == path || dir.starts_with(&format!("{path}/"))
}

/// What is declared already (the tracked branch's declarations, then
/// those of the files in the target directory, committed or not) and the
/// files that exist (in the same form as the new files' paths).
fn declared(
    snapshot: &crate::source::Snapshot,
    target: &Target,
    err: &mut impl Write,
) -> Result<(Vec<Known>, BTreeSet<String>), Refused> {
    let mut known: Vec<Known> = snapshot
        .declarations
        .declarations
        .iter()
        .map(|d| Known::of(d, d.file.display().to_string()))
        .collect();
    let mut existing: BTreeSet<String> = snapshot
        .files
        .iter()
        .map(|(path, _)| path.clone())
        .collect();
    if !target.disk.exists() {
        return Ok((known, existing));
    }
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
    let names = std::fs::read_dir(&target.disk)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<io::Result<Vec<String>>>()
        })
        .map_err(|e| {
            Refused(format!(
                "cannot list {}: {e}; without it tend cannot tell which files exist",
                target.disk.display()
            ))
        })?;
    existing.extend(names.iter().map(|f| join(&target.label, f)));
    Ok((known, existing))
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
fn locate(dir: PathBuf) -> Result<Target, Refused> {
    let dir = lexical(&dir);
    let given = dir.display().to_string();
    let given = if given == "." { String::new() } else { given };
    let disk = if dir.is_absolute() {
        dir
    } else {
        let cwd = std::env::current_dir()
            .map_err(|e| Refused(format!("cannot tell the current directory: {e}")))?;
        lexical(&cwd.join(&dir))
    };
    let in_repo = repository_path(&disk);
    let label = in_repo.clone().unwrap_or(given);
    Ok(Target {
        disk,
        in_repo,
        label,
    })
}

/// `path` with `.` dropped and `..` taken back lexically (`./a/../b/` is
/// `b`), without asking the file system.
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir) => {}
                _ => out.push(".."),
            },
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
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
    // Templates (`datistemplate`) are never listed; these are the
    // administration databases of the managed services.
    for (database, service) in [
        ("rdsadmin", "Amazon RDS"),
        ("cloudsqladmin", "Cloud SQL"),
        ("azure_maintenance", "Azure Database for PostgreSQL"),
        ("azure_sys", "Azure Database for PostgreSQL"),
    ] {
        out.insert(
            database.to_string(),
            format!("{service} keeps it for its own administration"),
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
        && let Some(database) = pg.database_on_this_server(url)
    {
        out.entry(database)
            .or_insert_with(|| "tend's state ([state] url) lives there".to_string());
    }
    out
}

/// Field values a database has when nobody set them: PostgreSQL's no
/// connection limit, connections allowed, and the encoding and locale of
/// `template1` (what `CREATE DATABASE` copies).
async fn server_defaults(
    provider: &AnyProvider,
) -> Result<Defaults, crate::provider::ProviderError> {
    let mut defaults = Defaults::new();
    let AnyProvider::Postgres(pg) = provider else {
        return Ok(defaults);
    };
    defaults.insert("connectionLimit".into(), json!(-1));
    defaults.insert("allowConnections".into(), json!(true));
    if let Some(template) = pg.template().await? {
        for field in ["encoding", "locale"] {
            if let Some(value) = template.fields.get(field) {
                defaults.insert(field.into(), value.clone());
            }
        }
    }
    Ok(defaults)
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
    fn directories_are_normalised_without_the_file_system() {
        for (given, normal) in [
            ("./a/../b/", "b"),
            ("databases/", "databases"),
            ("../x", "../x"),
            ("a/../../x", "../x"),
            ("/a/..", "/"),
            ("/..", "/"),
            (".", "."),
            ("a/..", "."),
        ] {
            assert_eq!(lexical(Path::new(given)), Path::new(normal), "{given}");
        }
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
