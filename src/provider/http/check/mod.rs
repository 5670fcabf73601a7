//! `tend provider check URL`: the contract's conformance checks against
//! any server, one verdict per rule tend relies on. The checks create
//! databases (labelled `tend.dev/conformance=<run>`) and delete them at
//! the end. What they send comes from the server's own capabilities
//! ([`probe::Probe`]): a rule the server's field set cannot exercise is
//! skipped, with the reason, never passed.

mod probe;
mod rules;

pub(crate) use rules::run;

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::wire::{self, IDEMPOTENCY_KEY, Operation};

/// One rule's verdict.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    pub rule: &'static str,
    pub outcome: Outcome,
}

/// What became of one rule.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// It holds: what was seen.
    Pass(String),
    /// It does not: why.
    Fail(String),
    /// It could not be exercised against this server: why.
    Skip(String),
}

struct Checker {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
    run: String,
    created: Vec<String>,
    probe: probe::Probe,
}

struct Reply {
    status: StatusCode,
    content_type: String,
    etag: Option<String>,
    body: Value,
}

impl Checker {
    async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        self.call_as(self.token.as_deref(), method, path, headers, body)
            .await
    }

    /// [`Checker::call`] with `token` (`None`: no credentials).
    async fn call_as(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let mut request = self.client.request(
            method.clone(),
            format!("{}{}{path}", self.base, wire::PREFIX),
        );
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = response.status();
        let header = |name: &str| super::header(&response, name);
        let content_type = header("content-type").unwrap_or_default();
        let etag = header("etag");
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::String(
                String::from_utf8_lossy(&bytes).chars().take(200).collect(),
            ))
        };
        Ok(Reply {
            status,
            content_type,
            etag,
            body,
        })
    }

    /// An idempotency key in the contract's form (64 lowercase hex
    /// characters, as tend's operation ids are), one per `what` of this
    /// run.
    fn key(&self, what: &str) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("tend-check-{}-{what}", self.run));
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Posts a create of `name` under `key` with `fields` (the probe's,
    /// from the server's capabilities).
    async fn create(&mut self, name: &str, key: &str, fields: Value) -> Result<Reply, String> {
        let body = json!({
            "name": name,
            "fields": fields,
            "labels": {"tend.dev/conformance": self.run},
        });
        let reply = self
            .call(
                Method::POST,
                "/databases",
                &[(IDEMPOTENCY_KEY, key)],
                Some(&body),
            )
            .await?;
        if reply.status.is_success() {
            self.created.push(name.to_string());
        }
        Ok(reply)
    }

    async fn wait(&self, reply: &Reply) -> Result<(), String> {
        if reply.status != StatusCode::ACCEPTED {
            return Ok(());
        }
        let mut op: Operation = serde_json::from_value(reply.body.clone())
            .map_err(|e| format!("a 202 whose body is not an operation ({e}): {}", reply.body))?;
        let started = Instant::now();
        while op.status == "running" {
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!("operation {} still running after 2 minutes", op.id));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let polled = self
                .call(Method::GET, &format!("/operations/{}", op.id), &[], None)
                .await?;
            if polled.status != StatusCode::OK {
                return Err(format!(
                    "GET /v1/operations/{} answered {}",
                    op.id, polled.status
                ));
            }
            op = serde_json::from_value(polled.body.clone())
                .map_err(|e| format!("not an operation ({e}): {}", polled.body))?;
        }
        if op.status == "succeeded" {
            Ok(())
        } else {
            Err(format!("operation {} ended {}", op.id, op.status))
        }
    }

    async fn get(&self, name: &str) -> Result<Reply, String> {
        self.call(Method::GET, &format!("/databases/{name}"), &[], None)
            .await
    }
}

fn verdict(rule: &'static str, result: Result<String, String>) -> Verdict {
    Verdict {
        rule,
        outcome: match result {
            Ok(note) => Outcome::Pass(note),
            Err(why) => Outcome::Fail(why),
        },
    }
}

fn skipped(rule: &'static str, why: impl Into<String>) -> Verdict {
    Verdict {
        rule,
        outcome: Outcome::Skip(why.into()),
    }
}
