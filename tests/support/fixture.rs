//! The fixture most tests start from: a Git repository of declarations,
//! a directory for tend's files, and a configuration written there (a
//! sandbox provider by default, `support::config::TendConfig`). A test
//! file with more to set up (a daemon's port, a PostgreSQL server) wraps
//! it and derefs to it.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tend::testing::provider::sandbox::SandboxProvider;

use super::config::TendConfig;
use super::git::TestRepo;
use super::{RunOutput, TendCommand};

pub struct Fixture {
    pub repo: TestRepo,
    pub dir: tempfile::TempDir,
    pub config: TendConfig,
}

impl Fixture {
    /// `files` (name, YAML) committed, and the default configuration.
    pub fn new<N: AsRef<str>, T: AsRef<str>>(files: &[(N, T)]) -> Self {
        Fixture::with_config(files, |config| config)
    }

    /// `files` committed, and the default configuration as `change` makes
    /// it.
    pub fn with_config<N: AsRef<str>, T: AsRef<str>>(
        files: &[(N, T)],
        change: impl FnOnce(TendConfig) -> TendConfig,
    ) -> Self {
        let repo = TestRepo::new();
        for (file, text) in files {
            repo.write(file.as_ref(), text.as_ref());
        }
        repo.commit("declarations");
        let dir = tempfile::tempdir().unwrap();
        let config = change(TendConfig::new(dir.path(), &repo.url()));
        config.write();
        Fixture { repo, dir, config }
    }

    /// Rewrites the configuration as `change` makes it.
    pub fn configure(&mut self, change: impl FnOnce(TendConfig) -> TendConfig) {
        self.config = change(self.config.clone());
        self.config.write();
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("tend.toml")
    }

    pub fn state(&self) -> PathBuf {
        self.config.state_dir()
    }

    /// `tend --config … ARGS` (logging warnings only), to adjust before
    /// running.
    pub fn command(&self, args: &[&str]) -> TendCommand {
        TendCommand::configured(self.config_path(), args).env("TEND_LOG", "warn")
    }

    /// `tend --config … ARGS`, which must exit `code`.
    pub fn tend(&self, args: &[&str], code: i32) -> RunOutput {
        self.command(args).expect_code(code)
    }

    /// `tend plan --format json`'s report.
    pub fn plan(&self, code: i32) -> Value {
        self.tend(&["plan", "--format", "json"], code).json()
    }

    /// `tend apply --format json`'s report (`support::applied` reads what
    /// it ran).
    pub fn apply(&self, code: i32) -> Value {
        self.tend(&["apply", "--format", "json"], code).json()
    }

    /// The state's SQLite database.
    pub fn state_db(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.state().join("state.db")).unwrap()
    }

    /// The default sandbox provider, as the test reads it.
    pub fn sandbox(&self) -> SandboxProvider {
        SandboxProvider::new("sandbox", &self.state(), Duration::ZERO, Default::default())
    }

    /// The databases the sandbox holds, by name.
    pub fn databases(&self) -> Vec<String> {
        self.sandbox()
            .load()
            .unwrap()
            .databases
            .keys()
            .cloned()
            .collect()
    }

    /// `connectionLimit` of `name` at the sandbox (`null`: no such
    /// database).
    pub fn limit_at_provider(&self, name: &str) -> Value {
        self.sandbox()
            .load()
            .unwrap()
            .databases
            .get(name)
            .map_or(Value::Null, |db| db.fields["connectionLimit"].clone())
    }
}

/// The resource `name` of a report (`plan`/`apply --format json`).
pub fn resource<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["resources"]
        .as_array()
        .and_then(|all| all.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("no resource {name} in {report:#}"))
}

/// An operator changes `name`'s connection limit in `sandbox`, behind
/// tend's back.
pub fn change_limit(sandbox: &SandboxProvider, name: &str, limit: i64) {
    let mut state = sandbox.load().unwrap();
    state
        .databases
        .get_mut(name)
        .unwrap()
        .fields
        .insert("connectionLimit", serde_json::json!(limit));
    sandbox.save(&state).unwrap();
}
