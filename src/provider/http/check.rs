//! `tend provider check URL`: the contract's conformance checks against
//! any server, one verdict per rule tend relies on. The checks create
//! databases named `tend-check-<run>-<n>` (labelled
//! `tend.dev/conformance=<run>`) and delete them at the end.

use std::time::{Duration, Instant, SystemTime};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::wire::{self, CapabilitiesDoc, Database, DatabasePage, IDEMPOTENCY_KEY, Operation};

/// One rule's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub rule: &'static str,
    /// `None`: passed; `Some(why)`: failed.
    pub failure: Option<String>,
    /// What was seen (for a pass, or a rule that could not be exercised).
    pub note: String,
}

struct Checker {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
    run: String,
    created: Vec<String>,
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
        let mut request = self.client.request(
            method.clone(),
            format!("{}{}{path}", self.base, wire::PREFIX),
        );
        if let Some(token) = &self.token {
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
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
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

    /// Creates `name` under `key` and waits until it is ready.
    async fn create(&mut self, name: &str, key: &str, size: &str) -> Result<Reply, String> {
        let body = json!({
            "name": name,
            "fields": {"engine": "postgres", "size": size},
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
    match result {
        Ok(note) => Verdict {
            rule,
            failure: None,
            note,
        },
        Err(why) => Verdict {
            rule,
            failure: Some(why),
            note: String::new(),
        },
    }
}

/// Runs every check against the server at `base` (the URL before `/v1`).
pub async fn run(base: &str, token: Option<String>) -> Result<Vec<Verdict>, String> {
    let client = super::super::tls::http_client_for(base)
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let run = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let mut c = Checker {
        client,
        base: base.trim_end_matches('/').to_string(),
        token,
        run,
        created: Vec::new(),
    };
    let mut verdicts = Vec::new();

    verdicts.push(verdict(
        "capabilities",
        async {
            let r = c.call(Method::GET, "/capabilities", &[], None).await?;
            if r.status != StatusCode::OK {
                return Err(format!("GET /v1/capabilities answered {}", r.status));
            }
            let doc: CapabilitiesDoc = serde_json::from_value(r.body.clone())
                .map_err(|e| format!("not a capabilities document ({e}): {}", r.body))?;
            if doc.version != "v1" {
                return Err(format!("version is {:?}, not \"v1\"", doc.version));
            }
            Ok(format!(
                "engines {:?}, {} fields",
                doc.engines,
                doc.fields.len()
            ))
        }
        .await,
    ));

    verdicts.push(verdict(
        "problem-json",
        async {
            let r = c.get(&c.key("absent")).await?;
            if r.status != StatusCode::NOT_FOUND {
                return Err(format!(
                    "GET of a database that does not exist answered {}, not 404",
                    r.status
                ));
            }
            if !r.content_type.starts_with(wire::PROBLEM_JSON) {
                return Err(format!(
                    "a 404 with content-type {:?}, not {}",
                    r.content_type,
                    wire::PROBLEM_JSON
                ));
            }
            serde_json::from_value::<wire::Problem>(r.body.clone()).map_err(|e| {
                format!("the 404's body is not a problem document ({e}): {}", r.body)
            })?;
            Ok("404 as application/problem+json".into())
        }
        .await,
    ));

    // Create, then the same request again, then another body: one database.
    let first = c.key("0");
    let key = c.key("key-0");
    let created = c.create(&first, &key, "db-small").await;
    let mut async_seen = false;
    verdicts.push(verdict(
        "create",
        async {
            let r = created.as_ref().map_err(Clone::clone)?;
            match r.status.as_u16() {
                201 => {}
                202 => async_seen = true,
                other => {
                    return Err(format!(
                        "POST /v1/databases answered {other}, not 201 or 202"
                    ));
                }
            }
            c.wait(r).await?;
            let got = c.get(&first).await?;
            if got.status != StatusCode::OK {
                return Err(format!("GET after the create answered {}", got.status));
            }
            let db: Database = serde_json::from_value(got.body.clone())
                .map_err(|e| format!("not a database ({e}): {}", got.body))?;
            if got.etag.as_deref() != Some(db.etag.as_str()) {
                return Err(format!(
                    "the ETag header {:?} differs from the body's etag {:?}",
                    got.etag, db.etag
                ));
            }
            Ok(format!("{} ({})", r.status, db.status))
        }
        .await,
    ));

    verdicts.push(verdict(
        "async-operations",
        async {
            if !async_seen {
                return Ok("not exercised: the server created synchronously (201)".into());
            }
            Ok("202 Accepted, the operation polled to succeeded".into())
        }
        .await,
    ));

    verdicts.push(verdict("idempotency-replay", async {
        let original = created.as_ref().map_err(Clone::clone)?;
        let again = c.create(&first, &key, "db-small").await?;
        if again.status != original.status {
            return Err(format!(
                "the same Idempotency-Key and body answered {} the second time, {} the first (a replay must return the original result)",
                again.status, original.status
            ));
        }
        if again.body.get("id") != original.body.get("id") {
            return Err(format!("the replay answered {} for {}", again.body, original.body));
        }
        Ok("the same key and body returned the original result".into())
    }.await));

    verdicts.push(verdict(
        "idempotency-mismatch",
        async {
            let other = c.create(&first, &key, "db-large").await?;
            if other.status != StatusCode::UNPROCESSABLE_ENTITY {
                return Err(format!(
                    "the same Idempotency-Key with another body answered {}, not 422",
                    other.status
                ));
            }
            Ok("422".into())
        }
        .await,
    ));

    verdicts.push(verdict(
        "etag-precondition",
        async {
            let got = c.get(&first).await?;
            let etag = got.etag.clone().ok_or("GET answered no ETag header")?;
            let patch = serde_json::to_value(super::change(&[("size", json!("db-medium"))], &[]))
                .map_err(|e| e.to_string())?;
            let stale = c
                .call(
                    Method::PATCH,
                    &format!("/databases/{first}"),
                    &[
                        (IDEMPOTENCY_KEY, &c.key("patch-stale")),
                        ("if-match", "\"tend-check-stale\""),
                    ],
                    Some(&patch),
                )
                .await?;
            if stale.status != StatusCode::PRECONDITION_FAILED {
                return Err(format!(
                    "PATCH with a stale If-Match answered {}, not 412",
                    stale.status
                ));
            }
            let fresh = c
                .call(
                    Method::PATCH,
                    &format!("/databases/{first}"),
                    &[(IDEMPOTENCY_KEY, &c.key("patch")), ("if-match", &etag)],
                    Some(&patch),
                )
                .await?;
            if !fresh.status.is_success() {
                return Err(format!(
                    "PATCH with the current If-Match answered {}",
                    fresh.status
                ));
            }
            c.wait(&fresh).await?;
            let after = c.get(&first).await?;
            if after.etag.as_deref() == Some(etag.as_str()) {
                return Err("the ETag did not change after a PATCH".into());
            }
            if after.body["fields"]["size"] != json!("db-medium") {
                return Err(format!(
                    "the PATCH did not change the field: {}",
                    after.body
                ));
            }
            Ok("412 when stale; a new ETag after the change".into())
        }
        .await,
    ));

    verdicts.push(verdict(
        "pagination",
        async {
            for n in 1..5 {
                let name = c.key(&n.to_string());
                let r = c
                    .create(&name, &c.key(&format!("key-{n}")), "db-small")
                    .await?;
                if !r.status.is_success() {
                    return Err(format!("creating {name} answered {}", r.status));
                }
                c.wait(&r).await?;
            }
            let mut seen = Vec::new();
            let mut token: Option<String> = None;
            for _ in 0..10 {
                let mut path =
                    format!("/databases?pageSize=2&label=tend.dev/conformance={}", c.run);
                if let Some(t) = &token {
                    path.push_str(&format!("&pageToken={t}"));
                }
                let r = c.call(Method::GET, &path, &[], None).await?;
                if r.status != StatusCode::OK {
                    return Err(format!("GET {path} answered {}", r.status));
                }
                let page: DatabasePage = serde_json::from_value(r.body.clone())
                    .map_err(|e| format!("not a page ({e}): {}", r.body))?;
                if page.items.len() > 2 {
                    return Err(format!("pageSize=2 answered {} items", page.items.len()));
                }
                seen.extend(page.items.into_iter().map(|d| d.name));
                match page.next_page_token {
                    Some(t) => token = Some(t),
                    None => break,
                }
            }
            seen.sort();
            let mut expected = c.created.clone();
            expected.sort();
            expected.dedup();
            if seen != expected {
                return Err(format!("the pages listed {seen:?}, not {expected:?}"));
            }
            Ok(format!(
                "{} databases over pages of 2, filtered by label",
                seen.len()
            ))
        }
        .await,
    ));

    // Clean up, and check deletes on the way.
    let names = std::mem::take(&mut c.created);
    let mut delete_problem = None;
    for name in names.iter().collect::<std::collections::BTreeSet<_>>() {
        let result = async {
            let got = c.get(name).await?;
            let etag = got.etag.unwrap_or_else(|| "*".into());
            let r = c
                .call(
                    Method::DELETE,
                    &format!("/databases/{name}"),
                    &[
                        (IDEMPOTENCY_KEY, &c.key(&format!("delete-{name}"))),
                        ("if-match", &etag),
                    ],
                    None,
                )
                .await?;
            if !r.status.is_success() {
                return Err(format!("DELETE {name} answered {}", r.status));
            }
            c.wait(&r).await?;
            let gone = c.get(name).await?;
            if gone.status != StatusCode::NOT_FOUND {
                return Err(format!(
                    "GET after DELETE of {name} answered {}",
                    gone.status
                ));
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            delete_problem.get_or_insert(e);
        }
    }
    verdicts.push(verdict(
        "delete",
        match delete_problem {
            Some(e) => Err(e),
            None => Ok(format!("{} databases deleted", names.len())),
        },
    ));
    Ok(verdicts)
}
