//! The HTTP provider (`kind = "http"`): a DBaaS that speaks tend's
//! documented contract (docs/provider-http-api.md) over HTTP(S).
//!
//! # Guarantees
//! * Every mutating request carries tend's operation id as
//!   `Idempotency-Key`, so a retry after a lost response is the same
//!   request to the server, never a second database.
//! * `PATCH` and `DELETE` send `If-Match` with the ETag tend last observed:
//!   a database someone changed since is answered `412`, which tend turns
//!   into a conflict after observing the database again. It never retries
//!   with the new ETag on its own (that would overwrite the other writer's
//!   change without deciding about it).
//! * Every status code is classified (`classify`): 429 and 503 with
//!   `Retry-After` are rate limits with that delay, other 5xx and
//!   transport failures are retryable, 4xx are permanent except 404 and
//!   409/412 (conflicts).
//! * Asynchronous work (`202 Accepted` + an operation) is polled until it
//!   ends, within `operation_timeout`; a timeout is retryable (the retry
//!   replays the same key and finds the same operation).
//! * Nothing the server sends is unbounded: a body is read in chunks up to
//!   [`MAX_BODY_BYTES`] (an endless body ends in an error, not in memory);
//!   a listing ends with an error when a page token comes back, a
//!   database is listed twice, pages stay empty, or the whole listing
//!   takes longer than [`LISTING_TIMEOUTS`] × `timeout`.

pub(crate) mod check;
mod classify;
mod listing;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::model::Mutability;

use super::{
    Capabilities, ChangeRequest, Observation, OperationId, Provider, ProviderError, SetupError,
};
pub(crate) use classify::classify;
use listing::Listed;
use wire::{CreateDatabase, Database, IDEMPOTENCY_KEY, Operation, UpdateDatabase};

/// Fields the contract can carry: every provider field of both scopes. A
/// server manages those its `GET /v1/capabilities` lists (read at the
/// first call, again after a `422`): tend sends only those, and a
/// declaration that sets another is refused at plan time.
pub const HTTP_FIELDS: &[&str] = super::sandbox::SANDBOX_FIELDS;

/// The most one answer's body may hold (a page of 1,000 databases is
/// about 1 MiB).
pub(crate) const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// A whole listing may take this many request timeouts.
pub(crate) const LISTING_TIMEOUTS: u32 = 20;
/// This many empty pages in a row, each with a next token, end a listing
/// (a server that pages forever through nothing).
const MAX_EMPTY_PAGES: usize = 100;

/// What the provider needs, secrets read.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Base URL; `/v1/…` is appended.
    pub endpoint: String,
    pub token: Option<String>,
    /// One request's limit (connect to last byte).
    pub timeout: Duration,
    /// How long an asynchronous operation may run before the call is
    /// reported as retryable.
    pub operation_timeout: Duration,
    pub max_connections: usize,
    /// How long the server's reads may lag its writes.
    pub read_lag: Duration,
}

pub struct HttpProvider {
    settings: HttpSettings,
    client: reqwest::Client,
    /// What the databases showed last (shared with the listing's page
    /// readers).
    seen: std::sync::Arc<Seen>,
    /// What the server manages (`GET /v1/capabilities`), once read;
    /// forgotten after a `422` (its cause may be a field it stopped
    /// managing) and read again at the next call.
    server_capabilities: Mutex<Option<Capabilities>>,
}

/// What the databases showed last: each one's ETag (observation or
/// answer), for the next `PATCH` or `DELETE`, and whether an unreadable
/// `observedAt` was told.
#[derive(Default)]
struct Seen {
    etags: Mutex<HashMap<String, String>>,
    warned_observed_at: std::sync::atomic::AtomicBool,
}

impl Seen {
    /// `listed`'s observation, its ETag kept (an unchanged one is not
    /// copied again) and an unreadable `observedAt` told once.
    fn remember(&self, endpoint: &str, listed: Listed) -> Observation {
        if let Some(time) = &listed.unreadable_time
            && !self
                .warned_observed_at
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                "{endpoint}: database `{}` has observedAt {:?}, not an RFC 3339 time: its observations count as stale (told once)",
                crate::escape::terminal(&listed.observation.database_name),
                crate::escape::terminal(time)
            );
        }
        let name = &listed.observation.database_name;
        let mut etags = self.etags();
        match etags.get_mut(name) {
            Some(known) if *known == listed.etag => {}
            Some(known) => *known = listed.etag,
            None => {
                etags.insert(name.clone(), listed.etag);
            }
        }
        listed.observation
    }

    /// The ETags by database name.
    fn etags(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.etags.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A response read whole.
struct Answer {
    status: StatusCode,
    retry_after: Option<Duration>,
    body: Vec<u8>,
}

impl HttpProvider {
    pub fn new(settings: HttpSettings) -> Result<Self, SetupError> {
        let base = settings.endpoint.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SetupError::Endpoint(settings.endpoint));
        }
        let client = super::tls::http_client_for(&settings.endpoint)
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            .pool_max_idle_per_host(settings.max_connections)
            // A redirect would carry the bearer token elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(SetupError::HttpClient)?;
        Ok(HttpProvider {
            settings,
            client,
            seen: Default::default(),
            server_capabilities: Mutex::new(None),
        })
    }

    fn url(&self, path: &str) -> String {
        format!(
            "{}{}{path}",
            self.settings.endpoint.trim_end_matches('/'),
            wire::PREFIX
        )
    }

    /// The server's capabilities, read once (`GET /v1/capabilities`).
    async fn server_capabilities(&self) -> Result<Capabilities, ProviderError> {
        let known = self
            .server_capabilities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(known) = known {
            return Ok(known);
        }
        let answer = self
            .send(Method::GET, "/capabilities", "*", &[], None)
            .await?;
        let doc: wire::CapabilitiesDoc = self.parse("*", &answer)?;
        let capabilities = self.capabilities_of(&doc);
        *self
            .server_capabilities
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(capabilities.clone());
        Ok(capabilities)
    }

    /// tend's capabilities for what `doc` lists: the fields tend knows
    /// that the server manages, with the server's mutability where it
    /// names one of the contract's three.
    fn capabilities_of(&self, doc: &wire::CapabilitiesDoc) -> Capabilities {
        let mut capabilities = Capabilities {
            read_lag: self.settings.read_lag,
            ..Capabilities::for_fields(HTTP_FIELDS, doc.labels)
        };
        capabilities.fields.retain(|name, mutability| {
            let Some(theirs) = doc.fields.get(name) else {
                return false;
            };
            *mutability = match theirs.as_str() {
                "mutable" => Mutability::Mutable,
                "immutable" => Mutability::Immutable,
                "create-only" => Mutability::CreateOnly,
                _ => *mutability,
            };
            true
        });
        capabilities
    }

    /// Forgets the server's capabilities after a `422`: it may no longer
    /// manage a field tend sent.
    fn recheck_capabilities_after(&self, answer: &Answer) {
        if answer.status == StatusCode::UNPROCESSABLE_ENTITY {
            *self
                .server_capabilities
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// `fields` without those the server does not manage (a
    /// `parameters.NAME` goes with `parameters`).
    fn managed_only(
        capabilities: &Capabilities,
        fields: &BTreeMap<String, Value>,
    ) -> BTreeMap<String, Value> {
        fields
            .iter()
            .filter(|(k, _)| {
                let top = k.split('.').next().unwrap_or(k);
                capabilities.fields.contains_key(top)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        resource: &str,
        headers: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<Answer, ProviderError> {
        let mut request = self.client.request(method, self.url(path));
        if let Some(token) = &self.settings.token {
            request = request.bearer_auth(token);
        }
        for (k, v) in headers {
            request = request.header(*k, v);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.map_err(|e| ProviderError::Retryable {
            resource: resource.to_string(),
            message: format!("{}: {}", self.settings.endpoint, transport_message(&e)),
        })?;
        let status = response.status();
        let header = |name: &str| header(&response, name);
        let retry_after =
            header("retry-after").and_then(|v| classify::retry_after(&v, SystemTime::now()));
        let too_large = || ProviderError::Retryable {
            resource: resource.to_string(),
            message: format!(
                "{}: the answer's body is larger than {} MiB; nothing the contract answers is that large",
                self.settings.endpoint,
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        };
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(too_large());
        }
        // Chunk by chunk: an endless body ends at the cap, not in memory.
        let mut response = response;
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_BODY_BYTES {
                        return Err(too_large());
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    return Err(ProviderError::Retryable {
                        resource: resource.to_string(),
                        message: format!(
                            "{}: the answer was cut off: {}",
                            self.settings.endpoint,
                            transport_message(&e)
                        ),
                    });
                }
            }
        }
        Ok(Answer {
            status,
            retry_after,
            body,
        })
    }

    /// `answer` as `T`, or its status classified.
    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        resource: &str,
        answer: &Answer,
    ) -> Result<T, ProviderError> {
        if !answer.status.is_success() {
            return Err(classify(
                resource,
                answer.status,
                answer.retry_after,
                &answer.body,
            ));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|e| listing::broken_body(&self.settings.endpoint, resource, answer.status, &e))
    }

    /// A database as the contract describes it, as an observation (see
    /// [`Listed::of`]), its ETag remembered.
    fn observation(&self, db: Database) -> Result<Observation, ProviderError> {
        let endpoint = &self.settings.endpoint;
        Listed::of(endpoint, db).map(|listed| self.seen.remember(endpoint, listed))
    }

    async fn get(&self, name: &str) -> Result<Option<Observation>, ProviderError> {
        let answer = self
            .send(
                Method::GET,
                &format!("/databases/{}", segment(name)),
                name,
                &[],
                None,
            )
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            self.seen.etags().remove(name);
            return Ok(None);
        }
        let db: Database = self.parse(name, &answer)?;
        self.observation(db).map(Some)
    }

    /// The ETag to send for `name`, observing it first when none is known.
    async fn etag(&self, name: &str) -> Result<String, ProviderError> {
        let known = self.seen.etags().get(name).cloned();
        if let Some(tag) = known {
            return Ok(tag);
        }
        self.get(name).await?;
        self.seen
            .etags()
            .get(name)
            .cloned()
            .ok_or_else(|| ProviderError::NotFound {
                resource: name.to_string(),
            })
    }

    /// A 412: look again (the next decision sees the other writer's
    /// change), then report the conflict.
    async fn stale(&self, name: &str, answer: &Answer) -> ProviderError {
        if let Err(e) = self.get(name).await {
            tracing::warn!("{name}: cannot observe it again after a 412: {e}");
        }
        ProviderError::Conflict {
            resource: name.to_string(),
            message: format!(
                "the database changed since tend observed it (412): {}; it was observed again and will be decided afresh",
                classify::problem_text(&answer.body)
            ),
        }
    }

    /// Polls the operation in a `202 Accepted` answer until it ends.
    async fn finish(&self, resource: &str, answer: &Answer) -> Result<(), ProviderError> {
        let mut op: Operation = self.parse(resource, answer)?;
        let started = std::time::Instant::now();
        let mut delay = Duration::from_millis(50);
        while op.status == "running" {
            if started.elapsed() >= self.settings.operation_timeout {
                return Err(ProviderError::Retryable {
                    resource: resource.to_string(),
                    message: format!(
                        "operation {} still running after {}",
                        op.id,
                        humantime::format_duration(self.settings.operation_timeout)
                    ),
                });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
            let polled = self
                .send(
                    Method::GET,
                    &format!("/operations/{}", segment(&op.id)),
                    resource,
                    &[],
                    None,
                )
                .await?;
            op = self.parse(resource, &polled)?;
        }
        match op.status.as_str() {
            "succeeded" => Ok(()),
            _ => Err(ProviderError::Permanent {
                resource: resource.to_string(),
                message: format!(
                    "operation {} {}: {}",
                    op.id,
                    op.status,
                    op.error
                        .map(|p| p.detail.unwrap_or(p.title))
                        .unwrap_or_else(|| "no reason given".into())
                ),
            }),
        }
    }

    /// A create's or update's answer: the database (200/201), or an
    /// operation to finish and then the database observed.
    async fn changed(&self, name: &str, answer: Answer) -> Result<Observation, ProviderError> {
        if answer.status == StatusCode::ACCEPTED {
            self.finish(name, &answer).await?;
            return self
                .get(name)
                .await?
                .ok_or_else(|| ProviderError::NotFound {
                    resource: name.to_string(),
                });
        }
        let db: Database = self.parse(name, &answer)?;
        self.observation(db)
    }
}

/// A response header as text (`None`: absent, or not visible ASCII).
fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A path segment, percent-encoded where the contract's names could need it.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// reqwest's error with its causes (the kind alone says little).
fn transport_message(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

impl Provider for HttpProvider {
    /// The server's, once read; before that every field the contract can
    /// carry (nothing is decided before the first observation, which
    /// reads them).
    fn capabilities(&self) -> Capabilities {
        self.server_capabilities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| Capabilities {
                read_lag: self.settings.read_lag,
                ..Capabilities::for_fields(HTTP_FIELDS, true)
            })
    }

    /// Every database the token can see, page by page (one request per
    /// page); the named ones among them.
    async fn observe_all(
        &self,
        names: &[String],
        _deep: &[String],
    ) -> Result<Vec<Observation>, ProviderError> {
        self.server_capabilities().await?;
        let wanted: std::collections::HashSet<&String> = names.iter().collect();
        self.list(|o| wanted.contains(&o.database_name)).await
    }

    async fn observe(&self, database_name: &str) -> Result<Option<Observation>, ProviderError> {
        self.server_capabilities().await?;
        self.get(database_name).await
    }

    async fn create(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let name = &request.database_name;
        let capabilities = self.server_capabilities().await?;
        let body = CreateDatabase {
            name: name.clone(),
            fields: Self::managed_only(&capabilities, &request.fields),
            labels: request.labels.clone(),
        };
        let answer = self
            .send(
                Method::POST,
                "/databases",
                name,
                &[(IDEMPOTENCY_KEY, op.0.clone())],
                Some(json(&body)),
            )
            .await?;
        self.recheck_capabilities_after(&answer);
        self.changed(name, answer).await
    }

    async fn update(
        &self,
        op: &OperationId,
        request: &ChangeRequest,
    ) -> Result<Observation, ProviderError> {
        let name = &request.database_name;
        let capabilities = self.server_capabilities().await?;
        let etag = self.etag(name).await?;
        let body = UpdateDatabase {
            fields: Self::managed_only(&capabilities, &request.fields),
            labels: request.labels.clone(),
        };
        let answer = self
            .send(
                Method::PATCH,
                &format!("/databases/{}", segment(name)),
                name,
                &[(IDEMPOTENCY_KEY, op.0.clone()), ("if-match", etag)],
                Some(json(&body)),
            )
            .await?;
        if answer.status == StatusCode::PRECONDITION_FAILED {
            return Err(self.stale(name, &answer).await);
        }
        self.recheck_capabilities_after(&answer);
        self.changed(name, answer).await
    }

    async fn delete(&self, op: &OperationId, database_name: &str) -> Result<(), ProviderError> {
        let etag = match self.etag(database_name).await {
            Ok(tag) => tag,
            // Already gone (a replay after a lost answer): nothing to do.
            Err(ProviderError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let answer = self
            .send(
                Method::DELETE,
                &format!("/databases/{}", segment(database_name)),
                database_name,
                &[(IDEMPOTENCY_KEY, op.0.clone()), ("if-match", etag)],
                None,
            )
            .await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => {
                self.seen.etags().remove(database_name);
                Ok(())
            }
            StatusCode::ACCEPTED => self.finish(database_name, &answer).await,
            StatusCode::PRECONDITION_FAILED => Err(self.stale(database_name, &answer).await),
            _ => Err(classify(
                database_name,
                answer.status,
                answer.retry_after,
                &answer.body,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> HttpProvider {
        HttpProvider::new(HttpSettings {
            endpoint: "http://127.0.0.1:9".into(),
            token: None,
            timeout: Duration::from_secs(1),
            operation_timeout: Duration::from_secs(1),
            max_connections: 1,
            read_lag: Duration::ZERO,
        })
        .unwrap()
    }

    fn db(status: &str, observed_at: &str) -> Database {
        Database {
            name: "legacy".into(),
            id: "db-1".into(),
            status: status.into(),
            fields: Default::default(),
            labels: Default::default(),
            etag: "\"1\"".into(),
            observed_at: observed_at.into(),
        }
    }

    /// `+00:00` is RFC 3339 as much as `Z` (it was read as "now", so an
    /// old cached copy looked fresh); an unreadable time is as old as can
    /// be, never now; a status the contract does not define is an error,
    /// not `ready`; the listed name is the `databaseName`.
    #[test]
    fn an_observation_keeps_the_servers_time_and_refuses_unknown_states() {
        let p = provider();
        let hour_ago = "2026-12-01T17:00:00+00:00";
        let seen = p.observation(db("ready", hour_ago)).unwrap();
        assert_eq!(
            Some(seen.observed_at),
            crate::time::parse_rfc3339("2026-12-01T17:00:00Z")
        );
        assert_eq!(
            seen.fields.get("databaseName"),
            Some(&Value::String("legacy".into()))
        );
        let garbled = p.observation(db("ready", "yesterday")).unwrap();
        assert_eq!(garbled.observed_at, SystemTime::UNIX_EPOCH);
        let err = p
            .observation(db("degraded", hour_ago))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"degraded\"") && err.contains("does not define"),
            "{err}"
        );
    }
}
