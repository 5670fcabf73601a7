//! The reference provider server (`examples/reference_provider.rs`) on a
//! free loopback port, with its admin endpoint for faults and counts;
//! stopped on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::git::free_port;

/// The example's binary, built beside the tests (`cargo nextest run` and
/// `cargo test` build examples; a run filtered to one `--test` does not,
/// and then it is built here, once, with the tests' profile). A binary
/// older than the example's source or the wire types it shares with tend
/// is built again: a stale server would test the old code.
fn binary() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("examples").join("reference_provider");
    BUILT.call_once(|| {
        let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let sources = [
            "examples/reference_provider.rs",
            "src/provider/http/wire.rs",
        ]
        .map(|s| modified(&super::repo_root().join(s)));
        let fresh = modified(&path)
            .is_some_and(|built| sources.iter().flatten().all(|source| *source <= built));
        if fresh {
            return;
        }
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        super::without_package_env(&mut cargo)
            .args(["build", "--example", "reference_provider"])
            .current_dir(super::repo_root());
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("cannot run cargo");
        assert!(
            status.success(),
            "cargo build --example reference_provider failed"
        );
    });
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --example reference_provider`",
        path.display()
    );
    path
}

pub struct ReferenceServer {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl ReferenceServer {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// The same server again over its data file (a crash and a restart).
    pub fn restart(mut self, extra: &[&str]) -> Self {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        Self::start_in(dir, extra)
    }

    fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        let port = free_port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("server.log"))
            .unwrap();
        let child = Command::new(binary())
            .args(["--listen", &format!("127.0.0.1:{port}"), "--data"])
            .arg(dir.path().join("data.json"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("cannot start the reference provider");
        let server = ReferenceServer { child, port, dir };
        super::eventually(
            &format!("the reference provider listening on {port}"),
            Duration::from_secs(10),
            || super::holds(TcpStream::connect(("127.0.0.1", port)).is_ok()),
            String::new,
        );
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One request; the status and the body as JSON (`Null` when empty).
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
        self.request_with(method, path, &[], body)
    }

    /// A database made at the DBaaS by someone else (not tend): `POST
    /// /v1/databases` with its own idempotency key.
    pub fn create_directly(&self, name: &str, fields: serde_json::Value) -> u16 {
        let key = format!("{:064x}", name.len() as u128 * 7919 + self.port as u128);
        let body = serde_json::json!({"name": name, "fields": fields}).to_string();
        self.request_with("POST", "/v1/databases", &[("Idempotency-Key", &key)], &body)
            .0
    }

    /// One request with extra headers.
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, serde_json::Value) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let extra: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = if body.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string()))
        };
        (status, body)
    }

    /// Sets the faults (`POST /admin/faults`).
    pub fn faults(&self, faults: serde_json::Value) {
        let (status, body) = self.request("POST", "/admin/faults", &faults.to_string());
        assert_eq!(status, 200, "{body}");
    }

    /// `GET /admin/stats`.
    pub fn stats(&self) -> serde_json::Value {
        self.request("GET", "/admin/stats", "").1
    }

    /// How often the server did `what` (`creates`, `updates`, `replays`, …).
    pub fn count(&self, what: &str) -> u64 {
        self.stats()["counts"][what].as_u64().unwrap_or(0)
    }

    /// `GET /v1/databases/NAME` (spaces percent-encoded).
    pub fn database(&self, name: &str) -> Option<serde_json::Value> {
        let path = format!("/v1/databases/{}", name.replace(' ', "%20"));
        match self.request("GET", &path, "") {
            (200, body) => Some(body),
            (404, _) => None,
            (status, body) => panic!("GET {name}: {status} {body}"),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for ReferenceServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
