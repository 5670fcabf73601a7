//! `tend import` against real providers: a PostgreSQL cluster made by
//! hand (createdb, ALTER DATABASE … SET, extensions, owners), the
//! reference DBaaS server with its capabilities, and the sandbox; each
//! import committed as it is, then `tend plan` adopts with no field change
//! and `tend apply` changes nothing but the markers.

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::TendCommand;
use support::config::TendConfig;
use support::git::{GitDaemon, TestRepo, git};
use support::postgres::Postgres;
use support::reference::ReferenceServer;

const ORDERS: &str = "apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: orders
spec:
  connectionLimit: 10
";

/// `tend --config CONFIG ARGS` in `cwd`, expecting `code`.
fn tend(config: &Path, cwd: &Path, args: &[&str], code: i32) -> support::RunOutput {
    let config = config.display().to_string();
    let mut all = vec!["--config", config.as_str()];
    all.extend_from_slice(args);
    TendCommand::new(&all)
        .current_dir(cwd)
        .env("TEND_LOG", "warn")
        .expect_code(code)
}

/// The `wrote FILE (DATABASE)` lines of a files import, as (file, database).
fn written(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("wrote "))
        .map(|l| {
            let (file, db) = l.split_once(" (").unwrap();
            (file.to_string(), db.trim_end_matches(')').to_string())
        })
        .collect()
}

/// After an import was committed: `tend plan` adopts each of `names` with
/// no drift (and decides nothing else for them), and after `tend apply`
/// every resource is in sync with nothing to do.
fn plan_adopts_then_apply_settles(config: &Path, cwd: &Path, names: &[String]) {
    let plan = tend(config, cwd, &["plan", "--format", "json"], 0).json();
    for name in names {
        let r = plan["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no resource {name} in {plan:#}"));
        assert_eq!(r["action"], "Adopt", "{name}: {r:#}");
        assert_eq!(r["drift"], json!([]), "{name}: no field change: {r:#}");
    }
    tend(config, cwd, &["apply"], 0);
    let plan = tend(
        config,
        cwd,
        &["plan", "--format", "json", "--detailed-exitcode"],
        0,
    )
    .json();
    for r in plan["resources"].as_array().unwrap() {
        assert_eq!(r["state"], "InSync", "{r:#}");
        assert_eq!(r["action"], "None", "{r:#}");
    }
}

/// Everything PostgreSQL's catalog says about the databases: the row,
/// its oid, settings and comment (compared before and after).
fn catalog(pg: &Postgres) -> String {
    pg.psql(
        "SELECT string_agg(concat_ws('|', d.datname, d.oid, pg_get_userbyid(d.datdba), pg_encoding_to_char(d.encoding), d.datcollate, d.datctype, d.datconnlimit, d.datallowconn, array_to_string(s.setconfig, ','), shobj_description(d.oid, 'pg_database')), E'\\n' ORDER BY d.datname) \
         FROM pg_database d LEFT JOIN pg_db_role_setting s ON s.setdatabase = d.oid AND s.setrole = 0",
    )
}

fn extensions(pg: &Postgres, database: &str) -> String {
    pg.psql_in(
        database,
        "SELECT string_agg(e.extname || '@' || e.extversion || '/' || n.nspname, ',' ORDER BY e.extname) FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace",
    )
}

#[test]
fn a_hand_made_postgres_server_is_imported_and_adopted_with_no_change() {
    let pg = Postgres::start();
    let repo = TestRepo::new();
    repo.write("databases/orders.yaml", ORDERS);
    repo.commit("orders");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tend.toml");
    std::fs::write(
        &config,
        format!(
            "agent_id = \"pg-agent\"\nstate_dir = \"state\"\n[source]\nurl = \"{}\"\npath = \"databases\"\n[status]\nbranch = \"\"\n[providers.main]\nkind = \"postgres\"\nurl = \"{}\"\n",
            repo.url(),
            pg.url()
        ),
    )
    .unwrap();
    tend(&config, repo.path(), &["apply"], 0);

    // Twelve databases made by hand, as a team has them before tend.
    for role in ["app_a", "app_b", "Reporting Team"] {
        pg.psql(&format!("CREATE ROLE \"{role}\""));
    }
    for sql in [
        "CREATE DATABASE billing OWNER app_a CONNECTION LIMIT 25",
        "CREATE DATABASE \"Café Orders\" OWNER app_b",
        "CREATE DATABASE analytics OWNER \"Reporting Team\"",
        "ALTER DATABASE analytics SET work_mem = '64MB'",
        "ALTER DATABASE analytics SET statement_timeout = '30s'",
        "CREATE DATABASE search OWNER app_a",
        "CREATE DATABASE archive_2024 ALLOW_CONNECTIONS false",
        "COMMENT ON DATABASE archive_2024 IS 'Closed books of 2024: read-only'",
        "CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
        "CREATE DATABASE tenant_01",
        "CREATE DATABASE tenant_02 CONNECTION LIMIT 5",
        "CREATE DATABASE tenant_03",
        "ALTER DATABASE tenant_03 SET search_path = '\"$user\", public, app'",
        "CREATE DATABASE tenant_04 OWNER app_b",
        "ALTER DATABASE tenant_04 SET TimeZone = 'UTC'",
        "ALTER DATABASE tenant_04 SET DateStyle = 'ISO, DMY'",
        "CREATE DATABASE golden_image IS_TEMPLATE true",
        "CREATE DATABASE tenant_05",
        "CREATE DATABASE tenant_06 OWNER app_a ENCODING 'UTF8' TEMPLATE template0",
        "COMMENT ON DATABASE tenant_05 IS 'it''s tenant #5: \"quoted\"'",
    ] {
        pg.psql(sql);
    }
    pg.psql_in("search", "CREATE EXTENSION pg_trgm");
    pg.psql_in("search", "CREATE SCHEMA ext");
    pg.psql_in("search", "CREATE EXTENSION citext SCHEMA ext");
    let before = catalog(&pg);
    let search_extensions = extensions(&pg, "search");

    // --all-fields writes the server's defaults and the extensions'
    // versions too (a patch: nothing on disk).
    let run = tend(
        &config,
        repo.path(),
        &[
            "import",
            "--provider",
            "main",
            "--match",
            "^(analytics|search)$",
            "--all-fields",
            "--output",
            "patch",
        ],
        0,
    );
    let encoding = pg
        .psql("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = 'template1'");
    let trgm = pg.psql_in(
        "search",
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_trgm'",
    );
    assert!(
        run.stdout.contains(&format!("+  encoding: {encoding}\n"))
            && run
                .stdout
                .contains("+  connectionLimit: -1\n+  allowConnections: true\n")
            && run.stdout.contains(&format!(
                "+    - name: pg_trgm\n+      version: \"{trgm}\"\n+      schema: public\n"
            )),
        "{}",
        run.stdout
    );
    assert!(!repo.path().join("databases/analytics.yaml").exists());

    let run = tend(&config, repo.path(), &["import", "--provider", "main"], 0);
    let files = written(&run.stdout);
    let databases: Vec<&str> = files.iter().map(|(_, db)| db.as_str()).collect();
    assert_eq!(
        databases,
        [
            "analytics",
            "archive_2024",
            "billing",
            "Café Orders",
            "latin",
            "search",
            "tenant_01",
            "tenant_02",
            "tenant_03",
            "tenant_04",
            "tenant_05",
            "tenant_06"
        ],
        "sorted by file; orders is declared, the system and template databases are not tenants'\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("1 declared already")
            && run
                .stderr
                .contains("not imported: postgres: the maintenance database")
            && !run.stderr.contains("template1")
            && !run.stderr.contains("golden_image"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("databases/archive-2024.yaml (archive_2024): extensions left out: the provider could not observe it"),
        "a database that refuses connections shows no extensions: said, not guessed\n{}",
        run.stderr
    );
    let text = |file: &str| std::fs::read_to_string(repo.path().join(file)).unwrap();
    assert_eq!(
        text("databases/caf-orders.yaml"),
        "# yaml-language-server: $schema=../docs/schema/managed-database.schema.json
# Imported by `tend import` from provider \"main\" (postgres).
apiVersion: tend.dev/v1alpha1
kind: ManagedDatabase
metadata:
  name: caf-orders
  annotations:
    tend.dev/adopt: \"true\"
spec:
  databaseName: Café Orders
  owner: app_b
"
    );
    let analytics = text("databases/analytics.yaml");
    assert!(
        analytics.ends_with(
            "spec:\n  owner: Reporting Team\n  parameters:\n    statement_timeout: 30s\n    work_mem: 64MB\n"
        ),
        "defaults (encoding, locale, no limit, connections allowed) left out:\n{analytics}"
    );
    let search = text("databases/search.yaml");
    assert!(
        search.ends_with(
            "  owner: app_a\n  extensions:\n    - name: citext\n      schema: ext\n    - pg_trgm\n"
        ),
        "{search}"
    );
    assert!(
        text("databases/latin.yaml").contains("  encoding: LATIN1\n  locale: C\n"),
        "not the server's default: written"
    );
    assert!(text("databases/tenant-02.yaml").contains("  connectionLimit: 5\n"));
    assert!(
        text("databases/tenant-04.yaml")
            .ends_with("  parameters:\n    DateStyle: iso, dmy\n    TimeZone: UTC\n"),
        "settings under the server's spelling: {}",
        text("databases/tenant-04.yaml")
    );
    assert!(
        text("databases/tenant-05.yaml")
            .contains("  comment: \"it's tenant #5: \\\"quoted\\\"\"\n")
    );
    tend(&config, repo.path(), &["validate", "databases"], 0);

    repo.commit("import");
    let names: Vec<String> = files
        .iter()
        .map(|(f, _)| {
            f.trim_start_matches("databases/")
                .trim_end_matches(".yaml")
                .to_string()
        })
        .collect();
    plan_adopts_then_apply_settles(&config, repo.path(), &names);
    assert_eq!(
        pg.psql("SELECT count(*) FROM tend.databases WHERE agent_id = 'pg-agent'"),
        "13",
        "orders and the twelve adopted carry tend's marker"
    );
    assert_eq!(
        pg.psql("SELECT declaration FROM tend.databases WHERE database_name = 'Café Orders'"),
        "caf-orders"
    );
    assert_eq!(
        catalog(&pg),
        before,
        "no database, setting, owner, comment or oid changed"
    );
    assert_eq!(extensions(&pg, "search"), search_extensions);
    // Imported again: nothing left to import, nothing written.
    let run = tend(&config, repo.path(), &["import", "--provider", "main"], 0);
    assert!(
        run.stdout.is_empty() && run.stderr.contains("nothing to import"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_dbaas_is_imported_with_the_fields_its_capabilities_list() {
    let server =
        ReferenceServer::start(&["--fields", "engine,version,size,storageGb,region,comment"]);
    for (name, fields) in [
        (
            "reports",
            json!({"engine": "postgres", "version": "16", "size": "db-small", "storageGb": 50, "region": "eu-west-1"}),
        ),
        (
            "Legacy Reports",
            json!({"engine": "mysql", "version": "8.0", "size": "db-large", "storageGb": 500, "region": "us-east-1", "comment": "made in the console"}),
        ),
    ] {
        assert_eq!(server.create_directly(name, fields), 201);
    }
    let repo = TestRepo::new();
    repo.write("README.md", "declarations\n");
    repo.commit("empty");
    let dir = tempfile::tempdir().unwrap();
    let config = dbaas_config(dir.path(), &repo, &server.url(), "5s");
    let run = tend(
        &config,
        repo.path(),
        &["import", "--provider", "dbaas", "--dir", "."],
        0,
    );
    assert_eq!(
        written(&run.stdout),
        [
            (
                "legacy-reports.yaml".to_string(),
                "Legacy Reports".to_string()
            ),
            ("reports.yaml".to_string(), "reports".to_string())
        ],
        "{}",
        run.stderr
    );
    let legacy = std::fs::read_to_string(repo.path().join("legacy-reports.yaml")).unwrap();
    assert!(
        legacy.starts_with("# yaml-language-server: $schema=docs/schema/managed-database.schema.json\n# Imported by `tend import` from provider \"dbaas\" (http).\n")
            && legacy.ends_with(
                "spec:\n  databaseName: Legacy Reports\n  comment: made in the console\n  engine: mysql\n  version: \"8.0\"\n  size: db-large\n  storageGb: 500\n  region: us-east-1\n"
            ),
        "{legacy}"
    );
    repo.commit("import");
    let fields_before: std::collections::BTreeMap<&str, Value> = ["Legacy Reports", "reports"]
        .into_iter()
        .map(|name| (name, server.database(name).unwrap()["fields"].clone()))
        .collect();
    plan_adopts_then_apply_settles(
        &config,
        repo.path(),
        &["legacy-reports".to_string(), "reports".to_string()],
    );
    for (name, declaration) in [("Legacy Reports", "legacy-reports"), ("reports", "reports")] {
        let db = server.database(name).unwrap();
        assert_eq!(db["labels"]["tend.dev/owner-declaration"], declaration);
        assert_eq!(db["fields"], fields_before[name], "nothing else changed");
    }
}

/// A configuration whose one provider, `dbaas`, is the http server at
/// `endpoint`.
fn dbaas_config(dir: &Path, repo: &TestRepo, endpoint: &str, timeout: &str) -> std::path::PathBuf {
    TendConfig::new(dir, &repo.url())
        .without_section("providers.sandbox")
        .section("providers.dbaas", "kind", "\"http\"")
        .section("providers.dbaas", "endpoint", &format!("\"{endpoint}\""))
        .section("providers.dbaas", "timeout", &format!("\"{timeout}\""))
        .write()
}

/// A sandbox fleet, its repository and configuration.
struct Fleet {
    repo: TestRepo,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Fleet {
    fn new(url: Option<&str>) -> Self {
        let repo = TestRepo::new();
        repo.write("databases/orders.yaml", ORDERS);
        repo.write(
            "databases/billing.yaml",
            "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: billing\nspec:\n  databaseName: billing_v2\n",
        );
        repo.commit("declarations");
        let dir = tempfile::tempdir().unwrap();
        let config = TendConfig::new(dir.path(), url.unwrap_or(&repo.url()))
            .source("path", "\"databases\"")
            .sandbox("provisioning_delay", "\"0s\"")
            .write();
        let fleet = Fleet { repo, dir, config };
        fleet.tend(&["apply"], 0);
        for (name, sets) in [
            (
                "legacy_app",
                &[
                    "owner=legacy",
                    "connectionLimit=20",
                    "parameters.work_mem=8MB",
                ][..],
            ),
            ("billing", &["comment=the old billing"][..]),
            ("tenant_01", &[][..]),
            ("tenant_02", &["size=db-small"][..]),
            ("tenant_03", &[][..]),
            ("Tenant-01", &[][..]),
        ] {
            let mut args = vec!["sandbox", "edit", "--create", name];
            for set in sets {
                args.extend(["--set", set]);
            }
            fleet.tend(&args, 0);
        }
        fleet.tend(
            &[
                "sandbox",
                "edit",
                "--create",
                "theirs",
                "--label",
                "tend.dev/owner-agent=eu-2",
                "--label",
                "tend.dev/owner-declaration=theirs",
            ],
            0,
        );
        fleet
    }

    fn tend(&self, args: &[&str], code: i32) -> support::RunOutput {
        tend(&self.config, self.repo.path(), args, code)
    }
}

#[test]
fn imports_are_deterministic_filtered_and_never_overwrite_or_take_a_name() {
    let fleet = Fleet::new(None);
    let run = fleet.tend(&["import", "--provider", "sandbox"], 0);
    let files = written(&run.stdout);
    assert_eq!(
        files.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
        [
            "databases/legacy-app.yaml",
            "databases/tenant-01-58d5636b.yaml",
            "databases/tenant-01-6da7d67c.yaml",
            "databases/tenant-02.yaml",
            "databases/tenant-03.yaml",
        ],
        "two databases with one derived name are told apart by their hash\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(
            "not imported: billing: its name would be `billing`, which the declaration in databases/billing.yaml already has (for database \"billing_v2\")"
        ) && run.stderr.contains("not imported: theirs: agent `eu-2` owns it (declaration `theirs`)"),
        "{}",
        run.stderr
    );
    let texts: Vec<Vec<u8>> = files
        .iter()
        .map(|(f, _)| std::fs::read(fleet.repo.path().join(f)).unwrap())
        .collect();

    // The same fleet again: byte-identical files.
    for (f, _) in &files {
        std::fs::remove_file(fleet.repo.path().join(f)).unwrap();
    }
    let again = fleet.tend(&["import", "--provider", "sandbox"], 0);
    assert_eq!(written(&again.stdout), files);
    for ((f, _), text) in files.iter().zip(&texts) {
        assert_eq!(
            &std::fs::read(fleet.repo.path().join(f)).unwrap(),
            text,
            "{f}"
        );
    }

    // A file that exists is never overwritten, even one that declares
    // nothing the import knows.
    for (f, _) in &files {
        std::fs::remove_file(fleet.repo.path().join(f)).unwrap();
    }
    fleet.repo.write(
        "databases/tenant-02.yaml",
        "# placeholder, not a declaration\n",
    );
    let run = fleet.tend(
        &[
            "import",
            "--provider",
            "sandbox",
            "--match",
            "^tenant_",
            "--exclude",
            "_03$",
        ],
        0,
    );
    assert_eq!(
        written(&run.stdout),
        [(
            "databases/tenant-01-58d5636b.yaml".to_string(),
            "tenant_01".to_string()
        )],
        "a name does not depend on the filters: Tenant-01 still shares it\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("not imported: tenant_02: databases/tenant-02.yaml exists, and tend import never overwrites a file")
            && run.stderr.contains("5 left aside by --match/--exclude"),
        "{}",
        run.stderr
    );
    assert_eq!(
        std::fs::read_to_string(fleet.repo.path().join("databases/tenant-02.yaml")).unwrap(),
        "# placeholder, not a declaration\n"
    );
    // A local file that declares a database covers it, committed or not.
    let run = fleet.tend(
        &["import", "--provider", "sandbox", "--match", "^tenant_01$"],
        0,
    );
    assert!(
        run.stderr.contains("3 declared already") && run.stderr.contains("nothing to import"),
        "{}",
        run.stderr
    );

    // A bad expression is refused before anything is read.
    let run = fleet.tend(&["import", "--provider", "sandbox", "--match", "("], 1);
    assert!(
        run.stderr
            .contains("--match \"(\" is not a regular expression"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_patch_applies_and_the_result_adopts_with_no_change() {
    let fleet = Fleet::new(None);
    let run = fleet.tend(
        &[
            "import",
            "--provider",
            "sandbox",
            "--exclude",
            "^Tenant",
            "--output",
            "patch",
        ],
        0,
    );
    assert!(
        run.stdout
            .starts_with("tend import from provider sandbox (sandbox) at "),
        "{}",
        run.stdout
    );
    let patch = fleet.dir.path().join("import.patch");
    std::fs::write(&patch, &run.stdout).unwrap();
    fleet
        .repo
        .git(&["apply", "--index", &patch.display().to_string()]);
    let added = fleet.repo.git(&["diff", "--cached", "--name-only"]);
    assert_eq!(
        added,
        "databases/legacy-app.yaml\ndatabases/tenant-01-58d5636b.yaml\ndatabases/tenant-02.yaml\ndatabases/tenant-03.yaml"
    );
    let legacy =
        std::fs::read_to_string(fleet.repo.path().join("databases/legacy-app.yaml")).unwrap();
    assert!(
        legacy.ends_with(
            "spec:\n  owner: legacy\n  connectionLimit: 20\n  parameters:\n    work_mem: 8MB\n"
        ),
        "{legacy}"
    );
    fleet.repo.commit("import");
    let before = field_lines(&fleet.tend(&["sandbox", "list"], 0).stdout);
    plan_adopts_then_apply_settles(
        &fleet.config,
        fleet.repo.path(),
        &[
            "legacy-app".into(),
            "tenant-01-58d5636b".into(),
            "tenant-02".into(),
            "tenant-03".into(),
        ],
    );
    let after = fleet.tend(&["sandbox", "list"], 0).stdout;
    assert_eq!(
        field_lines(&after),
        before,
        "only markers changed:\n{after}"
    );
    assert_eq!(
        after.matches("owner-agent=test-agent").count(),
        6,
        "orders, billing_v2 and the four adopted:\n{after}"
    );
}

/// `tend sandbox list` without the labels: each database's name and
/// fields.
fn field_lines(list: &str) -> String {
    list.lines()
        .filter(|l| !l.trim_start().starts_with("label "))
        .map(|l| l.split("  id=").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two databases of the fleet, as a commit on the import branch.
const BRANCH_IMPORT: &[&str] = &[
    "import",
    "--provider",
    "sandbox",
    "--match",
    "^(legacy_app|tenant_02)$",
    "--output",
    "branch",
];

#[test]
fn the_branch_output_commits_on_an_import_branch_of_a_real_remote() {
    let served = tempfile::tempdir().unwrap();
    let seed = TestRepo::new();
    seed.write("databases/orders.yaml", ORDERS);
    seed.commit("declarations");
    seed.bare_clone(served.path());
    let daemon = GitDaemon::start_writable(served.path());
    let url = daemon.url("repo.git");
    let fleet = Fleet::new(Some(&url));
    // The operator's checkout of the same remote: where --dir lives.
    let work = tempfile::tempdir().unwrap();
    git(work.path(), &["clone", "-q", &url, "checkout"]);
    let checkout = work.path().join("checkout");
    let main = git(&checkout, &["rev-parse", "origin/main"]);
    let run = tend(&fleet.config, &checkout, BRANCH_IMPORT, 0);
    assert!(
        run.stdout.starts_with("tend/import/sandbox: created at "),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        !checkout.join("databases/legacy-app.yaml").exists(),
        "the branch output writes nothing into the working tree"
    );
    git(&checkout, &["fetch", "-q", "origin"]);
    assert_eq!(
        git(&checkout, &["rev-parse", "origin/main"]),
        main,
        "never the tracked branch"
    );
    let log = git(
        &checkout,
        &[
            "log",
            "--format=%an|%P|%s",
            "-1",
            "origin/tend/import/sandbox",
        ],
    );
    assert_eq!(
        log,
        format!("tend (test-agent)|{main}|import: declare 2 database(s) of provider sandbox")
    );
    let body = git(
        &checkout,
        &["log", "-1", "--format=%b", "origin/tend/import/sandbox"],
    );
    assert!(
        body.contains("Imported by tend import from provider sandbox (sandbox) at ")
            && body.contains("  databases/legacy-app.yaml (legacy_app)"),
        "{body}"
    );
    let shown = git(
        &checkout,
        &[
            "show",
            "origin/tend/import/sandbox:databases/tenant-02.yaml",
        ],
    );
    assert!(
        shown.contains("tend.dev/adopt: \"true\"") && shown.contains("size: db-small"),
        "{shown}"
    );
    // Again: the branch already holds exactly this.
    let run = tend(&fleet.config, &checkout, BRANCH_IMPORT, 0);
    assert!(run.stdout.contains(": unchanged at "), "{}", run.stdout);

    // Files pushed outside the source's path would never be read.
    let run = tend(
        &fleet.config,
        &checkout,
        &[
            "import",
            "--provider",
            "sandbox",
            "--dir",
            "elsewhere",
            "--output",
            "branch",
        ],
        1,
    );
    assert!(
        run.stderr
            .contains("--output branch: elsewhere is outside the source's path (databases)"),
        "{}",
        run.stderr
    );

    // A --dir outside any working tree cannot say where the files go.
    let outside = tempfile::tempdir().unwrap();
    let run = tend(
        &fleet.config,
        outside.path(),
        &[
            "import",
            "--provider",
            "sandbox",
            "--dir",
            "decls",
            "--output",
            "branch",
        ],
        1,
    );
    assert!(
        run.stderr
            .contains("--output branch needs --dir inside a Git working tree"),
        "{}",
        run.stderr
    );
    drop(daemon);
}

#[test]
fn a_provider_that_cannot_be_read_writes_nothing() {
    let repo = TestRepo::new();
    repo.write("README.md", "declarations\n");
    repo.commit("empty");
    let dir = tempfile::tempdir().unwrap();
    let closed = support::git::free_port();
    let config = dbaas_config(
        dir.path(),
        &repo,
        &format!("http://127.0.0.1:{closed}"),
        "2s",
    );
    let run = tend(
        &config,
        repo.path(),
        &["import", "--provider", "dbaas", "--dir", "databases"],
        1,
    );
    assert!(
        run.stderr.contains("provider dbaas: ") && run.stderr.contains("nothing is written"),
        "{}",
        run.stderr
    );
    assert!(!repo.path().join("databases").exists());
    let run = tend(&config, repo.path(), &["import", "--provider", "nope"], 1);
    assert!(
        run.stderr
            .contains("no provider named `nope` is configured (configured: dbaas)"),
        "{}",
        run.stderr
    );
}
