//! A throwaway PostgreSQL cluster per test: `initdb` + `pg_ctl` in a
//! temporary directory on a free loopback port. `initdb` refuses root, so
//! when the tests run as root the cluster runs as the `postgres` OS user.
//! Missing binaries fail the test with the install command.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

fn find_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some(bin) = versions.pop() {
        return bin;
    }
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        && out.status.success()
    {
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if let Some(dir) = path.parent() {
            return dir.to_path_buf();
        }
    }
    panic!(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin: \
         install them with `apt-get update && apt-get install -y postgresql` (.ci/run does this)"
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Postgres {
    pub fn start() -> Self {
        let bin = find_bin();
        let dir = tempfile::Builder::new()
            .prefix("tend-pg-")
            .tempdir()
            .unwrap();
        let as_postgres = is_root();
        if as_postgres {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(
                status.success(),
                "chown to postgres failed (is there a `postgres` OS user?)"
            );
        }
        let pg = Postgres {
            port: super::git::free_port(),
            dir,
            bin,
            as_postgres,
        };
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
        );
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            pg.port,
            pg.dir.path().display()
        );
        pg.run(
            "pg_ctl",
            &[
                "-D",
                &pg.data(),
                "-o",
                &options,
                "-l",
                &pg.dir.path().join("log").display().to_string(),
                "-w",
                "start",
            ],
        );
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn command(&self, tool: &str, args: &[&str]) -> Command {
        let exe = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe).args(args);
            c
        } else {
            let mut c = Command::new(exe);
            c.args(args);
            c
        }
    }

    fn run(&self, tool: &str, args: &[&str]) -> String {
        let out = self
            .command(tool, args)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?} failed:\n{}\n{}\n(log: {})",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Connection URL of the maintenance database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs SQL with psql against `database`; returns unaligned output.
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        let port = self.port.to_string();
        self.run(
            "psql",
            &[
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                database,
                "-Atc",
                sql,
            ],
        )
        .trim()
        .to_string()
    }

    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command(
                "pg_ctl",
                &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
            )
            .output();
    }
}
