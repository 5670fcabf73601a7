//! A hostile HTTP server on loopback: answers each request as a test's
//! function says — a JSON body, an error status, or a chunked body that
//! never ends —
//! and counts the requests.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

/// `GET /v1/capabilities`: every field of the contract, as the reference
/// server lists them.
const CAPABILITIES: &str = r#"{"version": "v1", "engines": ["postgres", "mysql"], "labels": true, "fields": {"databaseName": "immutable", "owner": "mutable", "comment": "mutable", "connectionLimit": "mutable", "allowConnections": "mutable", "parameters": "mutable", "extensions": "mutable", "encoding": "immutable", "locale": "immutable", "engine": "immutable", "version": "mutable", "size": "mutable", "storageGb": "mutable", "highAvailability": "mutable", "backupRetentionDays": "mutable", "region": "immutable"}}"#;

/// How to answer one request.
pub enum Reply {
    Json(String),
    /// This status with an `application/problem+json` body saying so.
    Status(u16),
    /// `Transfer-Encoding: chunked`, chunk after chunk until the client
    /// goes away.
    Endless,
}

pub struct HostileHttp {
    pub port: u16,
    requests: Arc<AtomicUsize>,
}

impl HostileHttp {
    /// Serves `answer(path, n)` for the `n`-th request (from 0).
    pub fn start(answer: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let answer = Arc::new(answer);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (counter, answer) = (counter.clone(), answer.clone());
                thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                        loop {
                            let mut h = String::new();
                            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                                return;
                            }
                            if h.trim_end().is_empty() {
                                break;
                            }
                        }
                        // The capabilities are benign (every field the
                        // contract carries), and not counted: the hostility
                        // is in what the test's function answers.
                        let reply = if path == "/v1/capabilities" {
                            Reply::Json(CAPABILITIES.to_string())
                        } else {
                            answer(&path, counter.fetch_add(1, Ordering::SeqCst))
                        };
                        match reply {
                            Reply::Json(body) => {
                                let head = format!(
                                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                    body.len()
                                );
                                if writer.write_all(head.as_bytes()).is_err()
                                    || writer.write_all(body.as_bytes()).is_err()
                                {
                                    return;
                                }
                            }
                            Reply::Status(code) => {
                                let body = format!(
                                    r#"{{"type":"about:blank","title":"status {code}","status":{code},"detail":"answered {code} on purpose"}}"#
                                );
                                let head = format!(
                                    "HTTP/1.1 {code} Status {code}\r\nContent-Type: application/problem+json\r\nContent-Length: {}\r\n\r\n",
                                    body.len()
                                );
                                if writer.write_all(head.as_bytes()).is_err()
                                    || writer.write_all(body.as_bytes()).is_err()
                                {
                                    return;
                                }
                            }
                            Reply::Endless => {
                                let _ = writer.write_all(
                                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                                );
                                let chunk = vec![b' '; 64 * 1024];
                                let framed = [
                                    format!("{:x}\r\n", chunk.len()).into_bytes(),
                                    chunk,
                                    b"\r\n".to_vec(),
                                ]
                                .concat();
                                while writer.write_all(&framed).is_ok() {}
                                return;
                            }
                        }
                    }
                });
            }
        });
        HostileHttp { port, requests }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}
