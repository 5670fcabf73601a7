//! Configurations for tests, built instead of hand-assembled TOML: a
//! sandbox provider and a state dir in the test's directory by default,
//! and one method per section for the settings a test changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A `tend.toml` under construction. Values are TOML (`"10m"`, `5`).
#[derive(Debug, Clone)]
pub struct TendConfig {
    dir: PathBuf,
    top: BTreeMap<String, String>,
    sections: BTreeMap<String, BTreeMap<String, String>>,
    /// TOML appended as it is (`[[notify]]` entries).
    raw: String,
}

impl TendConfig {
    /// Agent `test-agent`, state in `dir/state`, the source at `url`, one
    /// sandbox provider, fast retries.
    pub fn new(dir: &Path, url: &str) -> Self {
        let mut config = TendConfig {
            dir: dir.to_path_buf(),
            top: BTreeMap::new(),
            sections: BTreeMap::new(),
            raw: String::new(),
        };
        config
            .set_top("agent_id", "\"test-agent\"")
            .set_top("state_dir", "\"state\"")
            .set("source", "url", &format!("\"{url}\""))
            .set("providers.sandbox", "kind", "\"sandbox\"")
            .set("reconcile", "retry_min_delay", "\"50ms\"")
            // Test repositories have working trees: no status branch
            // unless a test asks for one (against a bare remote).
            .set("status", "branch", "\"\"");
        config
    }

    /// A top-level key; `None` removes it.
    pub fn top(mut self, key: &str, value: Option<&str>) -> Self {
        match value {
            Some(v) => {
                self.set_top(key, v);
            }
            None => {
                self.top.remove(key);
            }
        }
        self
    }

    pub fn source(mut self, key: &str, value: &str) -> Self {
        self.set("source", key, value);
        self
    }

    pub fn reconcile(mut self, key: &str, value: &str) -> Self {
        self.set("reconcile", key, value);
        self
    }

    pub fn sandbox(mut self, key: &str, value: &str) -> Self {
        self.set("providers.sandbox", key, value);
        self
    }

    pub fn faults(mut self, key: &str, value: &str) -> Self {
        self.set("providers.sandbox.faults", key, value);
        self
    }

    /// Any `[section]` key (`providers.slow`, …).
    pub fn section(mut self, section: &str, key: &str, value: &str) -> Self {
        self.set(section, key, value);
        self
    }

    pub fn server(mut self, key: &str, value: &str) -> Self {
        self.set("server", key, value);
        self
    }

    pub fn status(mut self, key: &str, value: &str) -> Self {
        self.set("status", key, value);
        self
    }

    /// A `[[notify]]` entry from its keys (TOML values).
    pub fn notify(mut self, keys: &[(&str, &str)]) -> Self {
        self.raw.push_str("[[notify]]\n");
        for (k, v) in keys {
            self.raw.push_str(&format!("{k} = {v}\n"));
        }
        self
    }

    fn set_top(&mut self, key: &str, value: &str) -> &mut Self {
        self.top.insert(key.into(), value.into());
        self
    }

    /// Removes a whole `[section]` (the default sandbox provider, say).
    pub fn without_section(mut self, section: &str) -> Self {
        self.sections.remove(section);
        self
    }

    fn set(&mut self, section: &str, key: &str, value: &str) -> &mut Self {
        self.sections
            .entry(section.into())
            .or_default()
            .insert(key.into(), value.into());
        self
    }

    /// The TOML text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.top {
            out.push_str(&format!("{k} = {v}\n"));
        }
        for (section, keys) in &self.sections {
            out.push_str(&format!("[{section}]\n"));
            for (k, v) in keys {
                out.push_str(&format!("{k} = {v}\n"));
            }
        }
        out.push_str(&self.raw);
        out
    }

    /// Writes `dir/tend.toml` and returns its path.
    pub fn write(&self) -> PathBuf {
        let path = self.dir.join("tend.toml");
        std::fs::write(&path, self.text()).unwrap();
        path
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
}
