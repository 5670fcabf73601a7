//! The reference provider server: the HTTP provider contract
//! (docs/provider-http-api.md) implemented faithfully, with fault
//! injection, for tend's tests and benchmarks and for a DBaaS adapter
//! author's first experiment.
//!
//! ```text
//! cargo run --example reference_provider -- --listen 127.0.0.1:8080 --data /tmp/dbaas.json
//! ```
//!
//! Databases, idempotency keys (kept 24 h) and operations persist in the
//! data file: one JSON line appended per committed change, before the
//! answer, replayed at start. `POST /admin/faults`
//! sets faults (see [`Faults`]); `GET /admin/stats` counts what happened.
//! `--broken-replay` and `--broken-etag` make a server that breaks one
//! rule each, for `tend provider check` to catch.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Digest;
use tend::testing::provider::http::wire::{
    CapabilitiesDoc, CreateDatabase, Database, DatabasePage, IDEMPOTENCY_KEY, Operation,
    PROBLEM_JSON, Problem, UpdateDatabase,
};

#[derive(Parser, Debug)]
#[command(about = "The reference server of tend's HTTP provider contract")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where databases, idempotency keys and operations persist.
    #[arg(long)]
    data: PathBuf,
    /// Require `Authorization: Bearer TOKEN`.
    #[arg(long)]
    token: Option<String>,
    /// How long a new database stays `provisioning` (its create answers
    /// `202 Accepted` with an operation when this is not zero).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    provisioning_delay: Duration,
    /// The most databases on one page of `GET /v1/databases` (and the
    /// page size when `pageSize` asks for none).
    #[arg(long, default_value_t = 100)]
    page_size: usize,
    /// Broken on purpose: a replayed Idempotency-Key performs the request again.
    #[arg(long)]
    broken_replay: bool,
    /// Broken on purpose: If-Match is not checked.
    #[arg(long)]
    broken_etag: bool,
    /// The fields this server manages (its capabilities), comma-separated;
    /// every field of the contract when not given.
    #[arg(long, value_delimiter = ',')]
    fields: Vec<String>,
}

/// Faults, set with `POST /admin/faults` (every field optional; counts are
/// "the next N calls to the API", rates are a fraction of calls).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Faults {
    /// Commit the next N mutating requests, then drop the connection
    /// without answering.
    drop_responses: u32,
    /// Answer the next N calls with 502.
    error_calls: u32,
    /// Answer the next N mutating calls (POST, PATCH, DELETE) with 502,
    /// before they change anything: reads keep working.
    error_mutations: u32,
    /// Answer this fraction of calls with 500.
    error_rate: f64,
    /// Answer the next N calls with 429 and `Retry-After`.
    rate_limit_calls: u32,
    /// Answer this fraction of calls with 429.
    rate_limit_rate: f64,
    retry_after_secs: u64,
    /// Added to every API call.
    latency_ms: u64,
    /// Reads within this long after a write show the state before it.
    stale_reads_ms: u64,
    /// Creates and deletes take this long to finish (202 + operation).
    operation_delay_ms: u64,
    /// Applied to the named database just before the next PATCH or DELETE
    /// of it, as another writer would: `{"database": …, "fields": {…}}`.
    concurrent_write: Option<ConcurrentWrite>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConcurrentWrite {
    database: String,
    fields: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    db: Database,
    version: u64,
    written_ms: u64,
    /// Until when the database provisions (creates) or deletes.
    busy_until_ms: u64,
    previous: Option<Database>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Recorded {
    digest: String,
    status: u16,
    body: Value,
    etag: Option<String>,
    at_ms: u64,
    uses: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredOperation {
    op: Operation,
    done_ms: u64,
    /// Remove the database when done (a delete).
    removes: bool,
}

/// One line of the data file: the state of one database, its request's
/// key and its operations after a request committed.
#[derive(Debug, Serialize, Deserialize)]
struct Change {
    database: String,
    stored: Option<Stored>,
    key: String,
    recorded: Option<Recorded>,
    operations: BTreeMap<String, StoredOperation>,
    next_id: u64,
}

impl Change {
    fn apply(self, data: &mut Data) {
        match self.stored {
            Some(stored) => data.databases.insert(self.database, stored),
            None => data.databases.remove(&self.database),
        };
        if let Some(recorded) = self.recorded {
            data.keys.insert(self.key, recorded);
        }
        data.operations.extend(self.operations);
        data.next_id = data.next_id.max(self.next_id);
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Data {
    databases: BTreeMap<String, Stored>,
    keys: BTreeMap<String, Recorded>,
    operations: BTreeMap<String, StoredOperation>,
    next_id: u64,
    /// Counters for tests (`GET /admin/stats`).
    stats: BTreeMap<String, u64>,
}

struct Server {
    args: Args,
    data: Mutex<Data>,
    faults: Mutex<Faults>,
    /// A deterministic sequence for the fault rates.
    dice: Mutex<u64>,
}

const KEY_RETENTION_MS: u64 = 24 * 3600 * 1000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A JSON object body as `T` (serde would also read a struct from an
/// array, by position: `[]` is not an empty update).
fn object_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    match serde_json::from_slice::<Value>(body).ok()? {
        value @ Value::Object(_) => serde_json::from_value(value).ok(),
        _ => None,
    }
}

/// `405 Method Not Allowed` with the methods the path takes.
fn not_allowed(allow: &str) -> Response {
    let mut response = problem(
        405,
        "Method Not Allowed",
        format!("this path takes {allow}"),
    );
    if let Ok(value) = allow.parse() {
        response.headers_mut().insert("allow", value);
    }
    response
}

/// Why `value` is not of the type field `key` takes (`null` removes a
/// field in a PATCH and is always accepted).
fn wrong_type(key: &str, value: &Value) -> Option<String> {
    let wanted = match key.split('.').next().unwrap_or(key) {
        _ if value.is_null() => return None,
        "connectionLimit" | "storageGb" | "backupRetentionDays" => {
            if value.is_i64() {
                return None;
            }
            "an integer"
        }
        "allowConnections" | "highAvailability" => {
            if value.is_boolean() {
                return None;
            }
            "a boolean"
        }
        "extensions" => {
            if value.is_array() {
                return None;
            }
            "a list"
        }
        _ => {
            if value.is_string() {
                return None;
            }
            "a string"
        }
    };
    Some(format!("field `{key}` must be {wanted}, not {value}"))
}

/// A percent-encoded path segment as text; `None` when an escape is
/// broken or the bytes are not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn json_response(status: u16, body: &Value, etag: Option<&str>) -> Response {
    let mut builder = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(etag) = etag {
        builder = builder.header("etag", etag);
    }
    builder
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

fn problem(status: u16, title: &str, detail: impl Into<String>) -> Response {
    let body = serde_json::to_value(Problem::new(status, title, detail)).expect("serialisable");
    Response::builder()
        .status(status)
        .header("content-type", PROBLEM_JSON)
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

impl Server {
    /// Replays the data file: one JSON line per committed change.
    fn load(args: Args) -> Self {
        let mut data = Data::default();
        if let Ok(text) = std::fs::read_to_string(&args.data) {
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
                let change: Change = serde_json::from_str(line).unwrap_or_else(|e| {
                    eprintln!(
                        "{}:{}: not a change of this server ({e}); move the file away",
                        args.data.display(),
                        i + 1
                    );
                    std::process::exit(2)
                });
                change.apply(&mut data);
            }
        }
        Server {
            args,
            data: Mutex::new(data),
            faults: Mutex::new(Faults::default()),
            dice: Mutex::new(0x2545_f491_4f6c_dd1d),
        }
    }

    /// Appends what one request changed (the database, its key, its
    /// operations) to the data file, before the answer goes out: a write
    /// of one line, whatever the number of databases.
    fn save(&self, data: &Data, database: &str, key: &str) {
        let change = Change {
            database: database.to_string(),
            stored: data.databases.get(database).cloned(),
            key: key.to_string(),
            recorded: data.keys.get(key).cloned(),
            operations: data
                .operations
                .iter()
                .filter(|(_, o)| o.op.database == database)
                .map(|(id, o)| (id.clone(), o.clone()))
                .collect(),
            next_id: data.next_id,
        };
        let mut line = serde_json::to_vec(&change).expect("serialisable");
        line.push(b'\n');
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.args.data)
            .and_then(|mut f| f.write_all(&line));
        if let Err(e) = written {
            eprintln!("cannot append to {}: {e}", self.args.data.display());
        }
    }

    /// Whether this call falls in a fraction `rate` of calls.
    fn roll(&self, rate: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        let mut x = self.dice.lock().unwrap();
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        (*x % 10_000) as f64 / 10_000.0 < rate
    }

    /// A fault that answers instead of the API, counted down.
    fn injected(&self, mutating: bool) -> Option<Response> {
        let mut f = self.faults.lock().unwrap();
        if mutating && f.error_mutations > 0 {
            f.error_mutations -= 1;
            return Some(problem(502, "Bad Gateway", "injected outage of writes"));
        }
        let retry = f.retry_after_secs.max(1).to_string();
        if f.rate_limit_calls > 0 || self.roll(f.rate_limit_rate) {
            f.rate_limit_calls = f.rate_limit_calls.saturating_sub(1);
            let mut r = problem(429, "Too Many Requests", "injected rate limit");
            r.headers_mut()
                .insert("retry-after", retry.parse().expect("digits"));
            return Some(r);
        }
        if f.error_calls > 0 {
            f.error_calls -= 1;
            return Some(problem(502, "Bad Gateway", "injected outage"));
        }
        if self.roll(f.error_rate) {
            return Some(problem(500, "Internal Server Error", "injected failure"));
        }
        None
    }

    fn count(data: &mut Data, what: &str) {
        *data.stats.entry(what.to_string()).or_default() += 1;
    }

    /// Finishes operations whose time has come.
    fn settle(data: &mut Data, now: u64) {
        let done: Vec<String> = data
            .operations
            .iter()
            .filter(|(_, o)| o.op.status == "running" && o.done_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            let Some(o) = data.operations.get_mut(&id) else {
                continue;
            };
            o.op.status = "succeeded".into();
            if o.removes {
                let name = o.op.database.clone();
                data.databases.remove(&name);
            }
        }
        for stored in data.databases.values_mut() {
            if stored.db.status == "provisioning" && stored.busy_until_ms <= now {
                stored.db.status = "ready".into();
            }
        }
        data.keys
            .retain(|_, k| now.saturating_sub(k.at_ms) < KEY_RETENTION_MS);
    }

    /// What a read shows of `stored` at `now` (stale within the lag).
    fn read(&self, stored: &Stored, now: u64) -> Option<Database> {
        let lag = self.faults.lock().unwrap().stale_reads_ms;
        if lag > 0 && now.saturating_sub(stored.written_ms) < lag {
            let mut old = stored.previous.clone()?;
            old.observed_at = rfc3339(now.saturating_sub(lag));
            return Some(old);
        }
        let mut db = stored.db.clone();
        db.observed_at = rfc3339(now);
        Some(db)
    }

    fn handle(&self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
        let path = uri.path();
        if let Some(admin) = path.strip_prefix("/admin/") {
            return self.admin(method, admin, body);
        }
        if let Some(token) = &self.args.token {
            let sent = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if sent != Some(token.as_str()) {
                return problem(401, "Unauthorized", "a bearer token is required");
            }
        }
        if let Some(r) = self.injected(matches!(
            *method,
            Method::POST | Method::PATCH | Method::DELETE
        )) {
            return r;
        }
        let now = now_ms();
        let mut data = self.data.lock().unwrap();
        Self::count(&mut data, "calls");
        Self::settle(&mut data, now);
        let rest = path.strip_prefix("/v1/").unwrap_or("");
        // Each segment percent-decoded after the split: `a%2Fb` is the one
        // name `a/b`, `caf%C3%A9%20x` is `café x`.
        let Some(decoded) = rest
            .split('/')
            .map(percent_decode)
            .collect::<Option<Vec<String>>>()
        else {
            return problem(
                400,
                "Bad Request",
                "a path segment is not percent-encoded UTF-8",
            );
        };
        let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
        // A method a known path does not take: 405 before anything else.
        let allow = match segments.as_slice() {
            ["capabilities"] | ["operations", _] => Some("GET"),
            ["databases"] => Some("GET, POST"),
            ["databases", _] => Some("GET, PATCH, DELETE"),
            _ => None,
        };
        if let Some(allow) = allow
            && !allow.split(", ").any(|m| m == method.as_str())
        {
            return not_allowed(allow);
        }
        let mutating = matches!(*method, Method::POST | Method::PATCH | Method::DELETE);
        let key = headers
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if mutating {
            let Some(key) = key.clone() else {
                return problem(
                    400,
                    "Bad Request",
                    "mutating requests need an Idempotency-Key",
                );
            };
            if key.len() != 64 || !key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return problem(
                    400,
                    "Bad Request",
                    "an Idempotency-Key is 64 lowercase hex characters",
                );
            }
            let digest = hex(&sha2::Sha256::digest(
                [
                    method.as_str().as_bytes(),
                    b" ",
                    path.as_bytes(),
                    b"\n",
                    body,
                ]
                .concat(),
            ));
            if let Some(recorded) = data.keys.get_mut(&key)
                && !self.args.broken_replay
            {
                if recorded.digest != digest {
                    return problem(
                        422,
                        "Unprocessable Content",
                        format!("Idempotency-Key {key} was used with another request"),
                    );
                }
                recorded.uses += 1;
                let (status, body, etag) = (
                    recorded.status,
                    recorded.body.clone(),
                    recorded.etag.clone(),
                );
                Self::count(&mut data, "replays");
                return json_response(status, &body, etag.as_deref());
            }
            let response = match (method, segments.as_slice()) {
                (&Method::POST, ["databases"]) => self.create(&mut data, body, now),
                (&Method::PATCH, ["databases", name]) => {
                    self.update(&mut data, name, headers, body, now)
                }
                (&Method::DELETE, ["databases", name]) => {
                    self.delete(&mut data, name, headers, now)
                }
                _ => return problem(404, "Not Found", format!("no route {method} {path}")),
            };
            let status = response.0;
            let key_for_log = key.clone();
            if status < 300 {
                data.keys.insert(
                    key,
                    Recorded {
                        digest,
                        status,
                        body: response.1.clone(),
                        etag: response.2.clone(),
                        at_ms: now,
                        uses: 1,
                    },
                );
            }
            let touched = match segments.as_slice() {
                [_, name] => name.to_string(),
                _ => serde_json::from_slice::<Value>(body)
                    .ok()
                    .and_then(|b| b["name"].as_str().map(str::to_string))
                    .unwrap_or_default(),
            };
            self.save(&data, &touched, &key_for_log);
            let dropped = {
                let mut f = self.faults.lock().unwrap();
                let drop = status < 300 && f.drop_responses > 0;
                f.drop_responses = f.drop_responses.saturating_sub(u32::from(drop));
                drop
            };
            if dropped {
                Self::count(&mut data, "dropped");
                drop(data);
                // Committed; the answer is lost with the connection.
                std::panic::resume_unwind(Box::new("response dropped after commit"));
            }
            return if status >= 400 {
                let detail = response.1["detail"].as_str().unwrap_or("").to_string();
                let title = response.1["title"].as_str().unwrap_or("Error").to_string();
                problem(status, &title, detail)
            } else {
                json_response(status, &response.1, response.2.as_deref())
            };
        }
        match (method, segments.as_slice()) {
            (&Method::GET, ["capabilities"]) => {
                let doc = CapabilitiesDoc {
                    version: "v1".into(),
                    engines: vec!["postgres".into(), "mysql".into()],
                    fields: self.managed_fields(),
                    labels: true,
                };
                json_response(200, &serde_json::to_value(doc).expect("serialisable"), None)
            }
            (&Method::GET, ["databases"]) => {
                Self::count(&mut data, "lists");
                self.list(&data, uri.query().unwrap_or(""), now)
            }
            (&Method::GET, ["databases", name]) => match data.databases.get(*name) {
                Some(stored) => match self.read(stored, now) {
                    Some(db) => {
                        let etag = db.etag.clone();
                        json_response(200, &serde_json::to_value(db).expect("ok"), Some(&etag))
                    }
                    None => problem(404, "Not Found", format!("no database {name}")),
                },
                None => problem(404, "Not Found", format!("no database {name}")),
            },
            (&Method::GET, ["operations", id]) => match data.operations.get(*id) {
                Some(o) => json_response(200, &serde_json::to_value(&o.op).expect("ok"), None),
                None => problem(404, "Not Found", format!("no operation {id}")),
            },
            _ => problem(404, "Not Found", format!("no route {method} {path}")),
        }
    }

    fn list(&self, data: &Data, query: &str, now: u64) -> Response {
        let mut labels = Vec::new();
        let mut token = None;
        let mut size = self.args.page_size;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = query_decode(v);
            match k {
                "label" => labels.push(v),
                "pageToken" => token = Some(v),
                "pageSize" => match v.parse::<usize>() {
                    Ok(n) if (1..=1000).contains(&n) => size = n.min(self.args.page_size),
                    _ => return problem(400, "Bad Request", "pageSize is 1 to 1000"),
                },
                _ => {}
            }
        }
        let after = match token.as_deref().map(unhex) {
            Some(Some(name)) => Some(name),
            Some(None) => return problem(400, "Bad Request", "not a page token of this server"),
            None => None,
        };
        let matches = |db: &Database| {
            labels.iter().all(|l| match l.split_once('=') {
                Some((k, v)) => db.labels.get(k).is_some_and(|x| x == v),
                None => db.labels.contains_key(l.as_str()),
            })
        };
        let mut items = Vec::new();
        let mut next = None;
        for (name, stored) in &data.databases {
            if after.as_ref().is_some_and(|a| name <= a) {
                continue;
            }
            let Some(db) = self.read(stored, now) else {
                continue;
            };
            if !matches(&db) {
                continue;
            }
            if items.len() == size {
                next = items.last().map(|d: &Database| hex(d.name.as_bytes()));
                break;
            }
            items.push(db);
        }
        let page = DatabasePage {
            items,
            next_page_token: next,
        };
        json_response(200, &serde_json::to_value(page).expect("ok"), None)
    }

    /// The fields this server manages and their mutability (`--fields`,
    /// else all the contract carries).
    fn managed_fields(&self) -> BTreeMap<String, String> {
        tend::testing::model::FIELDS
            .iter()
            .filter(|f| tend::testing::provider::http::HTTP_FIELDS.contains(&f.name))
            .filter(|f| self.args.fields.is_empty() || self.args.fields.iter().any(|n| n == f.name))
            .map(|f| (f.name.to_string(), f.mutability.as_str().to_string()))
            .collect()
    }

    /// A `422` for the first field of `fields` this server does not
    /// manage (a setting `parameters.NAME` goes with `parameters`), or,
    /// for an update (`current`: the database), one it cannot change.
    fn refused_field(
        &self,
        fields: &BTreeMap<String, Value>,
        current: Option<&Database>,
    ) -> Option<(u16, Value, Option<String>)> {
        let managed = self.managed_fields();
        for (key, value) in fields {
            let top = key.split('.').next().unwrap_or(key);
            let Some(mutability) = managed.get(top) else {
                return Some(failure(
                    422,
                    "Unprocessable Content",
                    format!(
                        "field `{key}` is not managed by this server (see GET /v1/capabilities)"
                    ),
                ));
            };
            if let Some(problem) = wrong_type(key, value) {
                return Some(failure(422, "Unprocessable Content", problem));
            }
            if let Some(db) = current
                && mutability != "mutable"
                && db.fields.get(key) != Some(value)
            {
                return Some(failure(
                    422,
                    "Unprocessable Content",
                    format!("field `{key}` is {mutability}: it cannot be changed"),
                ));
            }
        }
        None
    }

    fn create(&self, data: &mut Data, body: &[u8], now: u64) -> (u16, Value, Option<String>) {
        let Some(request) = object_body::<CreateDatabase>(body) else {
            return failure(
                400,
                "Bad Request",
                "the body is not a CreateDatabase object",
            );
        };
        if request.name.is_empty() || request.name.len() > 255 {
            return failure(
                422,
                "Unprocessable Content",
                "a database name is 1 to 255 characters",
            );
        }
        if let Some(refused) = self.refused_field(&request.fields, None) {
            return refused;
        }
        if data.databases.contains_key(&request.name) {
            return failure(409, "Conflict", format!("database {} exists", request.name));
        }
        Self::count(data, "creates");
        data.next_id += 1;
        let delay = self.args.provisioning_delay.as_millis() as u64
            + self.faults.lock().unwrap().operation_delay_ms;
        let db = Database {
            name: request.name.clone(),
            id: format!("db-{}", data.next_id),
            status: if delay > 0 { "provisioning" } else { "ready" }.into(),
            fields: request
                .fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .collect(),
            labels: request
                .labels
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .collect(),
            etag: "\"1\"".into(),
            observed_at: rfc3339(now),
        };
        data.databases.insert(
            request.name.clone(),
            Stored {
                db: db.clone(),
                version: 1,
                written_ms: now,
                busy_until_ms: now + delay,
                previous: None,
            },
        );
        if delay == 0 {
            let etag = db.etag.clone();
            return (201, serde_json::to_value(db).expect("ok"), Some(etag));
        }
        let op = self.operation(data, &request.name, now + delay, false);
        (202, op, None)
    }

    fn operation(&self, data: &mut Data, database: &str, done_ms: u64, removes: bool) -> Value {
        data.next_id += 1;
        let op = Operation {
            id: format!("op-{}", data.next_id),
            status: "running".into(),
            database: database.to_string(),
            error: None,
        };
        data.operations.insert(
            op.id.clone(),
            StoredOperation {
                op: op.clone(),
                done_ms,
                removes,
            },
        );
        serde_json::to_value(op).expect("ok")
    }

    /// The `If-Match` check, after the injected concurrent write.
    fn precondition(
        &self,
        data: &mut Data,
        name: &str,
        headers: &HeaderMap,
        now: u64,
    ) -> Result<(), (u16, Value, Option<String>)> {
        let concurrent = {
            let mut f = self.faults.lock().unwrap();
            match &f.concurrent_write {
                Some(w) if w.database == name => f.concurrent_write.take(),
                _ => None,
            }
        };
        let Some(stored) = data.databases.get_mut(name) else {
            return Err(failure(404, "Not Found", format!("no database {name}")));
        };
        if let Some(write) = concurrent {
            bump(stored, now, |db| db.fields.extend(write.fields));
        }
        if self.args.broken_etag {
            return Ok(());
        }
        match headers.get("if-match").and_then(|v| v.to_str().ok()) {
            None => Err(failure(
                428,
                "Precondition Required",
                "send If-Match with the ETag",
            )),
            Some(tag) if tag == stored.db.etag || tag == "*" => Ok(()),
            Some(tag) => Err(failure(
                412,
                "Precondition Failed",
                format!("{name} is at {}, not {tag}", stored.db.etag),
            )),
        }
    }

    fn update(
        &self,
        data: &mut Data,
        name: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: u64,
    ) -> (u16, Value, Option<String>) {
        let Some(request) = object_body::<UpdateDatabase>(body) else {
            return failure(
                400,
                "Bad Request",
                "the body is not an UpdateDatabase object",
            );
        };
        if let Err(e) = self.precondition(data, name, headers, now) {
            return e;
        }
        let current = data.databases.get(name).map(|stored| stored.db.clone());
        if let Some(refused) = self.refused_field(&request.fields, current.as_ref()) {
            return refused;
        }
        Self::count(data, "updates");
        let Some(stored) = data.databases.get_mut(name) else {
            return failure(404, "Not Found", format!("no database {name}"));
        };
        bump(stored, now, |db| {
            for (k, v) in request.fields {
                if v.is_null() {
                    db.fields.remove(&k);
                } else {
                    db.fields.insert(k, v);
                }
            }
            for (k, v) in request.labels {
                if v.is_empty() {
                    db.labels.remove(&k);
                } else {
                    db.labels.insert(k, v);
                }
            }
        });
        let db = stored.db.clone();
        let etag = db.etag.clone();
        (200, serde_json::to_value(db).expect("ok"), Some(etag))
    }

    fn delete(
        &self,
        data: &mut Data,
        name: &str,
        headers: &HeaderMap,
        now: u64,
    ) -> (u16, Value, Option<String>) {
        if let Err(e) = self.precondition(data, name, headers, now) {
            return e;
        }
        Self::count(data, "deletes");
        let delay = self.faults.lock().unwrap().operation_delay_ms;
        if delay == 0 {
            data.databases.remove(name);
            return (204, Value::Null, None);
        }
        if let Some(stored) = data.databases.get_mut(name) {
            bump(stored, now, |db| db.status = "deleting".into());
        }
        (202, self.operation(data, name, now + delay, true), None)
    }

    fn admin(&self, method: &Method, what: &str, body: &[u8]) -> Response {
        match (method, what) {
            (&Method::POST, "faults") => match serde_json::from_slice::<Faults>(body) {
                Ok(f) => {
                    *self.faults.lock().unwrap() = f.clone();
                    json_response(200, &serde_json::to_value(f).expect("ok"), None)
                }
                Err(e) => problem(400, "Bad Request", format!("not a faults document: {e}")),
            },
            (&Method::GET, "faults") => json_response(
                200,
                &serde_json::to_value(self.faults.lock().unwrap().clone()).expect("ok"),
                None,
            ),
            (&Method::GET, "stats") => {
                let data = self.data.lock().unwrap();
                let uses: BTreeMap<&String, u32> =
                    data.keys.iter().map(|(k, r)| (k, r.uses)).collect();
                json_response(
                    200,
                    &json!({"databases": data.databases.len(), "counts": data.stats, "keyUses": uses}),
                    None,
                )
            }
            _ => problem(404, "Not Found", format!("no admin route {what}")),
        }
    }
}

/// A new version of `stored`: the old one kept for stale reads.
fn bump(stored: &mut Stored, now: u64, change: impl FnOnce(&mut Database)) {
    stored.previous = Some(stored.db.clone());
    change(&mut stored.db);
    stored.version += 1;
    stored.db.etag = format!("\"{}\"", stored.version);
    stored.written_ms = now;
}

fn failure(status: u16, title: &str, detail: impl Into<String>) -> (u16, Value, Option<String>) {
    let body = serde_json::to_value(Problem::new(status, title, detail)).expect("ok");
    (status, body, None)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// A query string value: `+` is a space, a broken escape is kept as it is.
fn query_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => match text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(b) => {
                    out.push(b);
                    i += 3;
                }
                None => {
                    out.push(b'%');
                    i += 1;
                }
            },
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let listen = args.listen;
    let server = Arc::new(Server::load(args));
    let app = Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let server = server.clone();
            async move {
                let latency = server.faults.lock().unwrap().latency_ms;
                if latency > 0 && !uri.path().starts_with("/admin/") {
                    tokio::time::sleep(Duration::from_millis(latency)).await;
                }
                let response = server.handle(&method, &uri, &headers, &body);
                if response.status() == StatusCode::NO_CONTENT {
                    return Response::builder()
                        .status(204)
                        .body(Body::empty())
                        .expect("a valid response");
                }
                response
            }
        },
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot listen on {listen}: {e}");
            std::process::exit(2)
        });
    eprintln!("reference provider listening on http://{listen}");
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("server error: {e}");
        std::process::exit(1);
    }
}
