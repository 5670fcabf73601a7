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
    tls: bool,
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
        Self::start_inner(false)
    }

    /// A cluster that accepts only TLS connections on loopback, with a
    /// certificate for 127.0.0.1 signed by a test CA (`ca_file()`).
    pub fn start_with_tls() -> Self {
        Self::start_inner(true)
    }

    /// The test CA's certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn start_inner(tls: bool) -> Self {
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
            tls,
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
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            pg.port,
            pg.dir.path().display()
        );
        if tls {
            pg.make_certificates();
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
                pg.dir.path().display()
            ));
            std::fs::write(
                pg.dir.path().join("data/pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
            )
            .unwrap();
        }
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

    fn make_certificates(&self) {
        let d = self.dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .expect("openssl is needed for TLS tests");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tend-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.crt",
            "-extfile",
            "server.ext",
        ]);
        std::fs::set_permissions(d.join("server.key"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        if self.as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(d.join("server.key"))
                .arg(d.join("server.crt"))
                .status()
                .unwrap();
            assert!(status.success());
        }
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
