//! Real Git repositories and real transports for tests: the `git` CLI with
//! a fixed identity and no user or system config, `git daemon` on loopback,
//! and `git http-backend` behind a small HTTP server with optional token.

use base64ct::Encoding;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// Isolates `command` (git, or a program that runs git) from the
/// developer's Git configuration, with a fixed identity. Git's automatic
/// `gc` runs in the foreground: detached, it packed a repository of
/// 10,000 files while the next command cloned it, and the clone failed
/// on a loose object gone ("failed to copy file").
pub fn isolated(command: &mut Command) -> &mut Command {
    command
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "gc.autoDetach")
        .env("GIT_CONFIG_VALUE_0", "false")
        .env("GIT_AUTHOR_NAME", "Test Author")
        .env("GIT_AUTHOR_EMAIL", "author@example.test")
        .env("GIT_COMMITTER_NAME", "Test Author")
        .env("GIT_COMMITTER_EMAIL", "author@example.test")
}

/// Runs `git` isolated from the developer's configuration.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = isolated(Command::new("git").args(args).current_dir(dir))
        .output()
        .unwrap_or_else(|e| panic!("cannot run git {args:?}: {e} (install git)"));
    assert!(
        out.status.success(),
        "git {args:?} in {} failed: {}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// [`git`], or `None` where it fails (a ref that does not exist yet).
pub fn git_if_any(dir: &Path, args: &[&str]) -> Option<String> {
    let out = isolated(Command::new("git").args(args).current_dir(dir))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Where a resource's file is on the branch, by the documented rule:
/// `status/HH/NAME.yaml`, `HH` the first two hexadecimal digits of the
/// SHA-256 of the name.
pub fn status_file(name: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(name.as_bytes());
    format!("status/{:02x}/{name}.yaml", digest[0])
}

/// A work-tree repository on branch `main` in a temporary directory.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
}

impl TestRepo {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q", "-b", "main"]);
        TestRepo { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.path().display())
    }

    pub fn write(&self, file: &str, text: &str) -> &Self {
        let path = self.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    pub fn remove(&self, file: &str) -> &Self {
        std::fs::remove_file(self.path().join(file)).unwrap();
        self
    }

    /// Stages everything and commits; returns the commit id.
    pub fn commit(&self, message: &str) -> String {
        git(self.path(), &["add", "-A"]);
        git(
            self.path(),
            &["commit", "-q", "--allow-empty", "-m", message],
        );
        self.head()
    }

    pub fn head(&self) -> String {
        git(self.path(), &["rev-parse", "HEAD"])
    }

    pub fn git(&self, args: &[&str]) -> String {
        git(self.path(), args)
    }

    /// A bare clone of this repository (what servers serve).
    pub fn bare_clone(&self, into: &Path) -> PathBuf {
        let bare = into.join("repo.git");
        git(
            into,
            &[
                "clone",
                "-q",
                "--bare",
                &self.path().display().to_string(),
                "repo.git",
            ],
        );
        bare
    }
}

/// The benchmarks' repository: `count` declarations (`db-00000`, …) in 100
/// directories under `databases/`, one commit.
pub fn repo_with_declarations(count: usize) -> TestRepo {
    let repo = TestRepo::new();
    for i in 0..count {
        repo.write(
            &format!("databases/team-{:02}/db-{i:05}.yaml", i % 100),
            &manifest(&format!("db-{i:05}"), (i % 500) as u32),
        );
    }
    repo.commit(&format!("{count} declarations"));
    repo
}

/// A manifest with a connection limit, for source tests.
pub fn manifest(name: &str, limit: u32) -> String {
    format!(
        "apiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: {name}\nspec:\n  connectionLimit: {limit}\n"
    )
}

/// A loopback port nothing listens on, for a server a test starts next.
///
/// Chosen at random below the kernel's ephemeral range (32768-60999 by
/// default), never by binding port 0: a port handed out that way is free
/// only until the next outgoing connection of any test on the machine,
/// which takes its local port from that same range. One was: a test's
/// agent failed to bind, and another test's server on the port answered
/// its readiness check. Ports here are taken only by another test's
/// server, at random, and one found taken is passed over.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    for _ in 0..1_000 {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = FIRST + (random % u64::from(COUNT)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}-{}", FIRST + COUNT - 1);
}

fn wait_for_port(port: u16) {
    super::eventually(
        &format!("a listener on 127.0.0.1:{port}"),
        Duration::from_secs(5),
        || super::holds(TcpStream::connect(("127.0.0.1", port)).is_ok()),
        String::new,
    );
}

/// `git daemon` serving `base` on loopback; stopped on drop.
pub struct GitDaemon {
    child: Child,
    pub port: u16,
}

impl GitDaemon {
    pub fn start(base: &Path) -> Self {
        Self::start_with(base, &[])
    }

    /// A daemon that accepts pushes too (`git daemon --enable=receive-pack`).
    pub fn start_writable(base: &Path) -> Self {
        Self::start_with(base, &["--enable=receive-pack"])
    }

    fn start_with(base: &Path, extra: &[&str]) -> Self {
        let port = free_port();
        // `git daemon` forks `git-daemon` and killing the wrapper would leave
        // it listening: start the real binary so drop stops it.
        let exec_path = git(base, &["--exec-path"]);
        let child = Command::new(Path::new(&exec_path).join("git-daemon"))
            .args([
                "--reuseaddr",
                "--export-all",
                "--listen=127.0.0.1",
                &format!("--port={port}"),
                &format!("--base-path={}", base.display()),
            ])
            .args(extra)
            .arg(base)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start git daemon (install git)");
        wait_for_port(port);
        GitDaemon { child, port }
    }

    pub fn url(&self, repo: &str) -> String {
        format!("git://127.0.0.1:{}/{repo}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `git http-backend` behind a minimal HTTP/1.1 server on loopback. With a
/// token, requests need `Authorization: Bearer TOKEN` or Basic with the
/// token as password; others get 401.
pub struct HttpGitServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl HttpGitServer {
    pub fn start(project_root: &Path, token: Option<&str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let root = project_root.to_path_buf();
        let token = token.map(str::to_string);
        let stopped = stop.clone();
        thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let root = root.clone();
                        let token = token.clone();
                        thread::spawn(move || {
                            let _ = serve(stream, &root, token.as_deref());
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        HttpGitServer { port, stop }
    }

    pub fn url(&self, repo: &str) -> String {
        format!("http://127.0.0.1:{}/{repo}", self.port)
    }
}

impl Drop for HttpGitServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn authorized(headers: &[(String, String)], token: &str) -> bool {
    headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("authorization")
            && (v == &format!("Bearer {token}")
                || v.strip_prefix("Basic ")
                    .and_then(|b| base64ct::Base64::decode_vec(b).ok())
                    .and_then(|b| String::from_utf8(b).ok())
                    .is_some_and(|pair| pair.split_once(':').is_some_and(|(_, p)| p == token)))
    })
}

fn serve(stream: TcpStream, root: &Path, token: Option<&str>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("GET").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body)?;
    }
    if let Some(token) = token
        && !authorized(&headers, token)
    {
        writer.write_all(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        return Ok(());
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut child = Command::new("git")
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", header("content-type").unwrap_or_default())
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    child.stdin.take().unwrap().write_all(&body)?;
    let out = child.wait_with_output()?;
    let split = out
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| {
            out.stdout
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, 2))
        })
        .unwrap_or((out.stdout.len(), 0));
    let cgi_headers = String::from_utf8_lossy(&out.stdout[..split.0]).to_string();
    let content = &out.stdout[split.0 + split.1..];
    let mut status = "200 OK".to_string();
    let mut response = String::new();
    for h in cgi_headers.lines() {
        if let Some(s) = h.strip_prefix("Status:") {
            status = s.trim().to_string();
        } else if !h.trim().is_empty() {
            response.push_str(h.trim_end());
            response.push_str("\r\n");
        }
    }
    write!(
        writer,
        "HTTP/1.1 {status}\r\n{response}Content-Length: {}\r\nConnection: close\r\n\r\n",
        content.len()
    )?;
    writer.write_all(content)?;
    writer.flush()
}
