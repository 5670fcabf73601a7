//! A notification receiver on loopback: records every request (headers
//! and body) and answers as told, one behaviour per request in turn
//! (`200` once the list is used up).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How the receiver answers one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Status(u16),
    /// Reads the request and never answers (until the test ends).
    Hang,
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `POST`, …
    pub method: String,
    /// The request's path (and query).
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

pub struct Receiver {
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    answers: Arc<Mutex<Vec<Answer>>>,
}

impl Receiver {
    pub fn start(answers: &[Answer]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(answers.to_vec()));
        let (got, plan) = (received.clone(), answers.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (got, plan) = (got.clone(), plan.clone());
                thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() {
                        return;
                    }
                    let mut headers = Vec::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).is_err() {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.push((k.trim().to_string(), v.trim().to_string()));
                        }
                    }
                    let len = headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .and_then(|(_, v)| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let answer = {
                        let mut plan = plan.lock().unwrap();
                        if plan.is_empty() {
                            Answer::Status(200)
                        } else {
                            plan.remove(0)
                        }
                    };
                    let mut request = line.split_whitespace();
                    let method = request.next().unwrap_or("").to_string();
                    let path = request.next().unwrap_or("").to_string();
                    got.lock().unwrap().push(Received {
                        method,
                        path,
                        headers,
                        body: String::from_utf8_lossy(&body).into_owned(),
                    });
                    match answer {
                        Answer::Hang => thread::sleep(Duration::from_secs(3600)),
                        Answer::Status(code) => {
                            let _ = writer.write_all(
                                format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                                    .as_bytes(),
                            );
                        }
                    }
                });
            }
        });
        Receiver {
            port,
            received,
            answers,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The requests answered 2xx so far would be received() minus the
    /// failed ones; tests count events instead.
    pub fn events(&self) -> Vec<String> {
        self.received()
            .iter()
            .map(|r| r.header("X-Tend-Event").unwrap_or("?").to_string())
            .collect()
    }

    /// Queues more answers.
    pub fn answer(&self, answers: &[Answer]) {
        self.answers.lock().unwrap().extend_from_slice(answers);
    }

    /// Waits until `n` requests arrived (panics after `limit`).
    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        super::eventually(
            &format!("{n} requests"),
            limit,
            || {
                let got = self.received();
                (got.len() >= n).then_some(got)
            },
            || format!("received: {:#?}", self.received()),
        )
    }
}
