//! A real `tend run` process for tests: started with a test-owned
//! `NOTIFY_SOCKET`, its log captured to a file, spoken to over loopback
//! HTTP, stopped with real signals.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `tend run`.
pub struct Daemon {
    pub child: Option<Child>,
    pub port: u16,
    pub log: PathBuf,
    pub notify: UnixDatagram,
    _notify_dir: tempfile::TempDir,
}

/// An HTTP response: status and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Daemon {
    /// Starts `tend --config CONFIG run` with `env`; the config must set
    /// `[server] listen = "127.0.0.1:PORT"`.
    pub fn start(config: &Path, port: u16, env: &[(&str, &str)]) -> Self {
        Self::start_with(config, port, env, |_| {})
    }

    /// [`Daemon::start`] as another OS user (the shipped unit's).
    pub fn start_as(
        config: &Path,
        port: u16,
        env: &[(&str, &str)],
        user: super::users::OsUser,
    ) -> Self {
        Self::start_with(config, port, env, |command| {
            user.apply(command);
        })
    }

    /// [`Daemon::start`] with a soft limit on open files of `soft` (the
    /// default soft limit of a systemd service is 1,024).
    pub fn start_with_file_limit(config: &Path, port: u16, soft: u64) -> Self {
        use std::os::unix::process::CommandExt;
        Self::start_with(config, port, &[], move |command| {
            // SAFETY: setrlimit is async-signal-safe.
            unsafe {
                command.pre_exec(move || {
                    let mut limit = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                    limit.rlim_cur = soft.min(limit.rlim_max);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                    Ok(())
                });
            }
        })
    }

    fn start_with(
        config: &Path,
        port: u16,
        env: &[(&str, &str)],
        prepare: impl FnOnce(&mut Command),
    ) -> Self {
        let notify_dir = tempfile::tempdir().unwrap();
        let socket = notify_dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&socket).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let log = config.with_extension("log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tend"));
        command
            .args(["--config", &config.display().to_string(), "run"])
            .current_dir(config.parent().unwrap())
            .env_remove("TEND_CONFIG")
            .env_remove("WATCHDOG_USEC")
            .env("TEND_LOG", "tend=debug")
            .env("NOTIFY_SOCKET", &socket)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            command.env(k, v);
        }
        prepare(&mut command);
        let child = command.spawn().unwrap();
        Daemon {
            child: Some(child),
            port,
            log,
            notify,
            _notify_dir: notify_dir,
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to `limit`) until `check` holds, polling; panics with the
    /// log otherwise.
    pub fn wait_for(&self, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        super::eventually(
            what,
            limit,
            || super::holds(check()),
            || format!("--- log\n{}", self.log()),
        );
    }

    /// Runs `n` cycles one after the other, each asked for through
    /// `POST /v1/reconcile` and waited for in the log.
    pub fn run_cycles(&self, n: usize) {
        let done = || self.log().matches("cycle done in").count();
        for _ in 0..n {
            let before = done();
            let answer = self.request("POST", "/v1/reconcile", &[], b"").unwrap();
            assert_eq!(answer.status, 202, "{}", answer.body);
            self.wait_for("a cycle", Duration::from_secs(60), || done() > before);
        }
    }

    /// A push announced through `POST /hooks/git`, signed with `secret`
    /// (answered 202); when it was sent.
    pub fn signed_webhook(&self, secret: &str) -> std::time::Instant {
        let body = b"{}";
        let signature = tend::testing::server::webhook::sign(secret.as_bytes(), body);
        let sent = std::time::Instant::now();
        let r = self
            .request(
                "POST",
                "/hooks/git",
                &[("X-Gitea-Signature", &signature)],
                body,
            )
            .unwrap();
        assert_eq!(r.status, 202, "{}", r.body);
        sent
    }

    /// Waits until `/readyz` answers 200.
    ///
    /// Only this process's readiness counts: its log must say it listens
    /// on the port (any server on the port answers `/readyz`, another
    /// test's agent too, after this one failed to bind).
    pub fn wait_ready(&self) {
        let listening = format!("listening on http://127.0.0.1:{}", self.port);
        self.wait_for("/readyz", Duration::from_secs(30), || {
            self.log().contains(&listening) && self.get("/readyz").is_some_and(|r| r.status == 200)
        });
    }

    /// A request over loopback; `None` when the server does not answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<Response> {
        request(self.port, method, path, headers, body)
    }

    pub fn get(&self, path: &str) -> Option<Response> {
        self.request("GET", path, &[], b"")
    }

    /// `/v1/status` as JSON.
    pub fn status(&self) -> serde_json::Value {
        let r = self.get("/v1/status").expect("the server answers");
        assert_eq!(r.status, 200, "{}", r.body);
        serde_json::from_str(&r.body).unwrap()
    }

    /// The notifications received since the last call, one message each.
    pub fn notifications(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.notify.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let status = Command::new("kill")
            .args(["-s", signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits for the process to exit; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let child = self.child.as_mut().unwrap();
        let status = super::eventually(
            "tend run exiting",
            limit,
            || child.try_wait().unwrap(),
            || {
                format!(
                    "--- log\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                )
            },
        );
        self.child = None;
        status.code()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// A request to 127.0.0.1:`port`; `None` when nothing answers.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some(Response { status, body })
}
