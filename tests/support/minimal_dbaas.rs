//! A second DBaaS, deliberately minimal, written from
//! docs/provider-http-api.md alone (not from the reference server, not
//! with tend's wire types): it manages `owner`, `comment`,
//! `connectionLimit` and `parameters` (mutable) and `region` (immutable),
//! and neither `databaseName` nor `engine`. `Lax` switches off what a
//! careless implementation forgets: auth, `If-Match`, key replay.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use serde_json::{Value, json};

const FIELDS: &[(&str, &str)] = &[
    ("owner", "mutable"),
    ("comment", "mutable"),
    ("connectionLimit", "mutable"),
    ("parameters", "mutable"),
    ("region", "immutable"),
];

/// What a careless implementation leaves out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lax {
    pub no_auth: bool,
    pub no_if_match: bool,
    pub no_replay: bool,
}

#[derive(Default)]
struct Store {
    /// Name → (database without etag/observedAt, version).
    databases: BTreeMap<String, (Value, u64)>,
    /// Key → (request fingerprint, status, body).
    keys: BTreeMap<String, (String, u16, Value)>,
    next_id: u64,
}

pub struct MinimalDbaas {
    pub port: u16,
    pub token: String,
}

struct Request {
    method: String,
    path: String,
    query: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl MinimalDbaas {
    pub fn start(lax: Lax) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let token = "minimal-token".to_string();
        let store = Arc::new(Mutex::new(Store::default()));
        let expected = token.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (store, token) = (store.clone(), expected.clone());
                thread::spawn(move || serve(stream, &store, &token, lax));
            }
        });
        MinimalDbaas { port, token }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn serve(stream: TcpStream, store: &Mutex<Store>, token: &str, lax: Lax) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some(request) = read_request(&mut reader) {
        let (status, body, etag) = answer(&request, store, token, lax);
        let text = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let kind = if status >= 400 {
            "application/problem+json"
        } else {
            "application/json"
        };
        let mut head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n",
            text.len()
        );
        if let Some(etag) = etag {
            head.push_str(&format!("ETag: {etag}\r\n"));
        }
        head.push_str("\r\n");
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(text.as_bytes()).is_err()
        {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    Some(Request {
        method,
        path: path.to_string(),
        query: query.to_string(),
        headers,
        body,
    })
}

fn problem(status: u16, detail: &str) -> (u16, Value, Option<String>) {
    (
        status,
        json!({"type": "about:blank", "title": "error", "status": status, "detail": detail}),
        None,
    )
}

/// `%XX` decoded (a path segment or a query value).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], text.get(i + 1..i + 3)) {
            (b'%', Some(hex)) if u8::from_str_radix(hex, 16).is_ok() => {
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn shown(db: &Value, version: u64) -> (Value, String) {
    let etag = format!("\"v{version}\"");
    let mut db = db.clone();
    db["etag"] = json!(etag);
    db["observedAt"] =
        json!(humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string());
    (db, etag)
}

/// A field of `fields` this server does not manage, or cannot change.
fn refused(fields: &serde_json::Map<String, Value>, current: Option<&Value>) -> Option<String> {
    for (key, value) in fields {
        let top = key.split('.').next().unwrap_or(key);
        match FIELDS.iter().find(|(name, _)| *name == top) {
            None => return Some(format!("field {key} is not managed here")),
            Some((_, "immutable")) if current.is_some_and(|db| db["fields"][key] != *value) => {
                return Some(format!("field {key} is immutable"));
            }
            _ => {}
        }
    }
    None
}

fn answer(
    r: &Request,
    store: &Mutex<Store>,
    token: &str,
    lax: Lax,
) -> (u16, Value, Option<String>) {
    if !lax.no_auth && r.headers.get("authorization") != Some(&format!("Bearer {token}")) {
        return problem(401, "a bearer token is required");
    }
    let segments: Vec<String> = r
        .path
        .trim_start_matches("/v1/")
        .split('/')
        .map(decode)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let mut store = store.lock().unwrap();
    let mutating = matches!(r.method.as_str(), "POST" | "PATCH" | "DELETE");
    let key = r.headers.get("idempotency-key").cloned();
    let fingerprint = format!(
        "{} {} {}",
        r.method,
        r.path,
        String::from_utf8_lossy(&r.body)
    );
    if mutating {
        let Some(key) = &key else {
            return problem(400, "an Idempotency-Key is required");
        };
        if let Some((seen, status, body)) = store.keys.get(key)
            && !lax.no_replay
        {
            if *seen != fingerprint {
                return problem(422, "the Idempotency-Key was used with another request");
            }
            let etag = body["etag"].as_str().map(str::to_string);
            return (*status, body.clone(), etag);
        }
    }
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let result = match (r.method.as_str(), segments.as_slice()) {
        ("GET", ["capabilities"]) => (
            200,
            json!({"version": "v1", "engines": [], "labels": true,
                   "fields": FIELDS.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()}),
            None,
        ),
        ("GET", ["databases"]) => list(&store, &r.query),
        ("GET", ["databases", name]) => match store.databases.get(*name) {
            Some((db, version)) => {
                let (db, etag) = shown(db, *version);
                (200, db, Some(etag))
            }
            None => problem(404, "no such database"),
        },
        ("POST", ["databases"]) => {
            let name = body["name"].as_str().unwrap_or("").to_string();
            let fields = body["fields"].as_object().cloned().unwrap_or_default();
            if name.is_empty() {
                problem(422, "a name is required")
            } else if let Some(why) = refused(&fields, None) {
                problem(422, &why)
            } else if store.databases.contains_key(&name) {
                problem(409, "the name exists")
            } else {
                store.next_id += 1;
                let db = json!({"name": name, "id": format!("m-{}", store.next_id), "status": "ready",
                                "fields": fields, "labels": body["labels"].clone()});
                store.databases.insert(name, (db.clone(), 1));
                let (db, etag) = shown(&db, 1);
                (201, db, Some(etag))
            }
        }
        ("PATCH" | "DELETE", ["databases", name]) => {
            let Some((db, version)) = store.databases.get(*name).cloned() else {
                return problem(404, "no such database");
            };
            let current = format!("\"v{version}\"");
            match r.headers.get("if-match") {
                None if !lax.no_if_match => return problem(428, "If-Match is required"),
                Some(tag) if !lax.no_if_match && *tag != current => {
                    return problem(412, "the database changed");
                }
                _ => {}
            }
            if r.method == "DELETE" {
                store.databases.remove(*name);
                (204, Value::Null, None)
            } else {
                let fields = body["fields"].as_object().cloned().unwrap_or_default();
                if let Some(why) = refused(&fields, Some(&db)) {
                    return problem(422, &why);
                }
                let mut db = db;
                for (k, v) in fields {
                    match v {
                        Value::Null => {
                            db["fields"].as_object_mut().map(|f| f.remove(&k));
                        }
                        v => db["fields"][k.as_str()] = v,
                    }
                }
                if let Some(labels) = body["labels"].as_object() {
                    for (k, v) in labels {
                        match v.as_str() {
                            Some("") | None => {
                                db["labels"].as_object_mut().map(|l| l.remove(k));
                            }
                            Some(_) => db["labels"][k.as_str()] = v.clone(),
                        }
                    }
                }
                store
                    .databases
                    .insert(name.to_string(), (db.clone(), version + 1));
                let (db, etag) = shown(&db, version + 1);
                (200, db, Some(etag))
            }
        }
        (_, ["capabilities"] | ["databases"] | ["databases", _]) => {
            problem(405, "method not allowed")
        }
        _ => problem(404, "no such route"),
    };
    if mutating && result.0 < 300 {
        let key = key.unwrap_or_default();
        store
            .keys
            .insert(key, (fingerprint, result.0, result.1.clone()));
    }
    result
}

fn list(store: &Store, query: &str) -> (u16, Value, Option<String>) {
    let mut size = 100usize;
    let mut after = String::new();
    let mut labels = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v);
        match k {
            "pageSize" => size = v.parse().unwrap_or(100).clamp(1, 100),
            "pageToken" => after = v,
            "label" => labels.push(v),
            _ => {}
        }
    }
    let keeps = |db: &Value| {
        labels.iter().all(|l| match l.split_once('=') {
            Some((k, v)) => db["labels"][k] == json!(v),
            None => db["labels"].get(l.as_str()).is_some(),
        })
    };
    let matching: Vec<(&String, &(Value, u64))> = store
        .databases
        .iter()
        .filter(|(name, (db, _))| name.as_str() > after.as_str() && keeps(db))
        .collect();
    let page: Vec<Value> = matching
        .iter()
        .take(size)
        .map(|(_, (db, version))| shown(db, *version).0)
        .collect();
    let mut out = json!({"items": page});
    if matching.len() > size {
        out["nextPageToken"] = json!(matching[size - 1].0);
    }
    (200, out, None)
}
