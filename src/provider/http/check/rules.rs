//! The rules, in the order they run: each a verdict, each from what the
//! server answered.

use std::time::{Duration, SystemTime};

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::super::wire::{CapabilitiesDoc, Database, DatabasePage, IDEMPOTENCY_KEY};
use super::probe::Probe;
use super::{Checker, Reply, Verdict, skipped, verdict};

/// Runs every check against the server at `base` (the URL before `/v1`).
pub(crate) async fn run(base: &str, token: Option<String>) -> Result<Vec<Verdict>, String> {
    let client = super::super::super::tls::http_client_for(base)
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
        probe: Probe::default(),
    };
    let mut verdicts = Vec::new();

    let capabilities = async {
        let r = c.call(Method::GET, "/capabilities", &[], None).await?;
        if r.status != StatusCode::OK {
            return Err(format!("GET /v1/capabilities answered {}", r.status));
        }
        let doc: CapabilitiesDoc = serde_json::from_value(r.body.clone())
            .map_err(|e| format!("not a capabilities document ({e}): {}", r.body))?;
        if doc.version != "v1" {
            return Err(format!("version is {:?}, not \"v1\"", doc.version));
        }
        Ok(doc)
    }
    .await;
    if let Ok(doc) = &capabilities {
        c.probe = Probe::from_capabilities(doc);
    }
    verdicts.push(verdict(
        "capabilities",
        capabilities.as_ref().map_err(Clone::clone).map(|doc| {
            format!(
                "engines {:?}, fields {}",
                doc.engines,
                doc.fields.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        }),
    ));

    verdicts.push(auth(&c).await);
    verdicts.push(verdict("problem-json", problem_json(&c).await));

    // Create, then the same request again, then another body: one database.
    let first = c.key("0");
    let key = c.key("key-0");
    let fields = c.probe.create_fields();
    let created = c.create(&first, &key, fields.clone()).await;
    let created_ok = created.as_ref().is_ok_and(|r| r.status.is_success());
    verdicts.push(verdict("create", check_create(&c, &first, &created).await));
    verdicts.push(match &created {
        Ok(r) if r.status == StatusCode::ACCEPTED => verdict(
            "async-operations",
            Ok("202 Accepted, the operation polled to succeeded".into()),
        ),
        Ok(r) if r.status == StatusCode::CREATED => skipped(
            "async-operations",
            "the server created synchronously (201): no operation to poll",
        ),
        _ => skipped("async-operations", "the create failed"),
    });
    if !created_ok {
        for rule in [
            "idempotency-replay",
            "idempotency-mismatch",
            "if-match-required",
            "etag-precondition",
            "patch-replay",
            "immutability",
        ] {
            verdicts.push(skipped(rule, "the create failed"));
        }
    } else {
        verdicts.push(verdict(
            "idempotency-replay",
            async {
                let original = created.as_ref().map_err(Clone::clone)?;
                let again = c.create(&first, &key, fields.clone()).await?;
                if again.status != original.status {
                    return Err(format!(
                        "the same Idempotency-Key and body answered {} the second time, {} the first (a replay must return the original result)",
                        again.status, original.status
                    ));
                }
                if again.body.get("id") != original.body.get("id") {
                    return Err(format!(
                        "the replay answered {} for {}",
                        again.body, original.body
                    ));
                }
                Ok("the same key and body returned the original result".into())
            }
            .await,
        ));
        verdicts.push(match c.probe.other_create_fields() {
            None => skipped(
                "idempotency-mismatch",
                "the server lists no mutable field the check can vary",
            ),
            Some(other) => verdict(
                "idempotency-mismatch",
                async {
                    let r = c.create(&first, &key, other).await?;
                    if r.status != StatusCode::UNPROCESSABLE_ENTITY {
                        return Err(format!(
                            "the same Idempotency-Key with another body answered {}, not 422",
                            r.status
                        ));
                    }
                    Ok("422".into())
                }
                .await,
            ),
        });
        verdicts.extend(patches(&c, &first).await);
    }
    verdicts.push(verdict("unknown-field", unknown_field(&mut c).await));
    verdicts.push(verdict("pagination", pagination(&mut c).await));
    verdicts.extend(deletes(&mut c, &first).await);
    Ok(verdicts)
}

/// Requests without credentials are refused (when the check has some to
/// compare with).
async fn auth(c: &Checker) -> Verdict {
    if c.token.is_none() {
        return skipped(
            "auth",
            "no --token-file given: cannot tell whether requests without one are refused",
        );
    }
    verdict(
        "auth",
        async {
            for (what, token) in [
                ("no token", None),
                ("a wrong token", Some("tend-check-wrong")),
            ] {
                let r = c
                    .call_as(token, Method::GET, "/databases?pageSize=1", &[], None)
                    .await?;
                if !matches!(r.status.as_u16(), 401 | 403) {
                    return Err(format!(
                        "GET /v1/databases with {what} answered {}, not 401 or 403",
                        r.status
                    ));
                }
            }
            Ok("401/403 without the token and with a wrong one".into())
        }
        .await,
    )
}

async fn problem_json(c: &Checker) -> Result<String, String> {
    let r = c.get(&c.key("absent")).await?;
    if r.status != StatusCode::NOT_FOUND {
        return Err(format!(
            "GET of a database that does not exist answered {}, not 404",
            r.status
        ));
    }
    if !r.content_type.starts_with(super::wire::PROBLEM_JSON) {
        return Err(format!(
            "a 404 with content-type {:?}, not {}",
            r.content_type,
            super::wire::PROBLEM_JSON
        ));
    }
    serde_json::from_value::<super::wire::Problem>(r.body.clone())
        .map_err(|e| format!("the 404's body is not a problem document ({e}): {}", r.body))?;
    Ok("404 as application/problem+json".into())
}

async fn check_create(
    c: &Checker,
    name: &str,
    created: &Result<Reply, String>,
) -> Result<String, String> {
    let r = created.as_ref().map_err(Clone::clone)?;
    if !matches!(r.status.as_u16(), 201 | 202) {
        return Err(format!(
            "POST /v1/databases with fields {} (from the server's capabilities) answered {}, not 201 or 202: {}",
            c.probe.create_fields(),
            r.status,
            r.body
        ));
    }
    c.wait(r).await?;
    let got = c.get(name).await?;
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

/// `PATCH` rules: `If-Match` required (428), a stale one refused (412), a
/// fresh one applied with a new ETag, a replay answered from its key
/// (before the now stale `If-Match` is checked), an immutable field kept.
async fn patches(c: &Checker, name: &str) -> Vec<Verdict> {
    let Some((field, _, changed)) = c.probe.mutable.clone() else {
        let why = "the server lists no mutable field the check can change";
        return vec![
            skipped("if-match-required", why),
            skipped("etag-precondition", why),
            skipped("patch-replay", why),
            immutability(c, name).await,
        ];
    };
    let patch = json!({"fields": {field.as_str(): changed.clone()}});
    let path = format!("/databases/{name}");
    let mut out = Vec::new();
    out.push(verdict(
        "if-match-required",
        async {
            let r = c
                .call(
                    Method::PATCH,
                    &path,
                    &[(IDEMPOTENCY_KEY, &c.key("patch-no-if-match"))],
                    Some(&patch),
                )
                .await?;
            if r.status != StatusCode::PRECONDITION_REQUIRED {
                return Err(format!(
                    "PATCH without If-Match answered {}, not 428",
                    r.status
                ));
            }
            Ok("428".into())
        }
        .await,
    ));
    let fresh_key = c.key("patch");
    let mut fresh: Option<(Reply, String)> = None;
    out.push(verdict(
        "etag-precondition",
        async {
            let got = c.get(name).await?;
            let etag = got.etag.clone().ok_or("GET answered no ETag header")?;
            let stale = c
                .call(
                    Method::PATCH,
                    &path,
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
            let r = c
                .call(
                    Method::PATCH,
                    &path,
                    &[(IDEMPOTENCY_KEY, &fresh_key), ("if-match", &etag)],
                    Some(&patch),
                )
                .await?;
            if !r.status.is_success() {
                return Err(format!(
                    "PATCH with the current If-Match answered {}",
                    r.status
                ));
            }
            c.wait(&r).await?;
            let after = c.get(name).await?;
            if after.etag.as_deref() == Some(etag.as_str()) {
                return Err("the ETag did not change after a PATCH".into());
            }
            if after.body["fields"][field.as_str()] != changed {
                return Err(format!("the PATCH did not change {field}: {}", after.body));
            }
            fresh = Some((r, etag));
            Ok(format!(
                "412 when stale; {field} changed, a new ETag after it"
            ))
        }
        .await,
    ));
    out.push(match &fresh {
        None => skipped("patch-replay", "no PATCH was applied to replay"),
        Some((original, etag)) => verdict(
            "patch-replay",
            async {
                let again = c
                    .call(
                        Method::PATCH,
                        &path,
                        &[(IDEMPOTENCY_KEY, &fresh_key), ("if-match", etag)],
                        Some(&patch),
                    )
                    .await?;
                if again.status != original.status {
                    return Err(format!(
                        "the PATCH replayed with its key answered {}, {} the first time (a replay is answered from the key, before If-Match, which the first call made stale)",
                        again.status, original.status
                    ));
                }
                Ok(format!("{} again, from the key", again.status))
            }
            .await,
        ),
    });
    out.push(immutability(c, name).await);
    out
}

/// A `PATCH` of an immutable field is `422`, and changes nothing.
async fn immutability(c: &Checker, name: &str) -> Verdict {
    let Some((field, created, other)) = c.probe.immutable.clone() else {
        return skipped("immutability", "the server lists no immutable field");
    };
    verdict(
        "immutability",
        async {
            let got = c.get(name).await?;
            let etag = got.etag.clone().ok_or("GET answered no ETag header")?;
            let r = c
                .call(
                    Method::PATCH,
                    &format!("/databases/{name}"),
                    &[
                        (IDEMPOTENCY_KEY, &c.key("patch-immutable")),
                        ("if-match", &etag),
                    ],
                    Some(&json!({"fields": {field.as_str(): other}})),
                )
                .await?;
            if r.status != StatusCode::UNPROCESSABLE_ENTITY {
                return Err(format!(
                    "PATCH of {field} (immutable in its capabilities) answered {}, not 422",
                    r.status
                ));
            }
            let after = c.get(name).await?;
            if after.body["fields"][field.as_str()] != created {
                return Err(format!("{field} changed: {}", after.body));
            }
            Ok(format!("422 for {field}, unchanged"))
        }
        .await,
    )
}

/// A create with a field the server does not list is `422`, and creates
/// nothing.
async fn unknown_field(c: &mut Checker) -> Result<String, String> {
    let name = c.key("unknown-field");
    let mut fields = c.probe.create_fields();
    fields[c.probe.unknown.as_str()] = json!("x");
    let r = c.create(&name, &c.key("key-unknown"), fields).await?;
    if r.status != StatusCode::UNPROCESSABLE_ENTITY {
        return Err(format!(
            "a create with the field {} (not in its capabilities) answered {}, not 422",
            c.probe.unknown, r.status
        ));
    }
    if c.get(&name).await?.status != StatusCode::NOT_FOUND {
        return Err("the refused create made the database anyway".into());
    }
    Ok("422, nothing created".into())
}

async fn pagination(c: &mut Checker) -> Result<String, String> {
    for n in 1..5 {
        let name = c.key(&n.to_string());
        let r = c
            .create(&name, &c.key(&format!("key-{n}")), c.probe.create_fields())
            .await?;
        if !r.status.is_success() {
            return Err(format!("creating {name} answered {}", r.status));
        }
        c.wait(&r).await?;
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let mut path = format!("/databases?pageSize=2&label=tend.dev/conformance={}", c.run);
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
            Some(t) if !t.is_empty() => token = Some(t),
            _ => break,
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

/// Deletes: a stale `If-Match` refused (412), then every database the
/// check made deleted (cleaning up), the first one's delete replayed from
/// its key.
async fn deletes(c: &mut Checker, first: &str) -> Vec<Verdict> {
    let names: std::collections::BTreeSet<String> =
        std::mem::take(&mut c.created).into_iter().collect();
    let mut out = Vec::new();
    if names.contains(first) {
        out.push(verdict(
            "delete-precondition",
            async {
                let r = c
                    .call(
                        Method::DELETE,
                        &format!("/databases/{first}"),
                        &[
                            (IDEMPOTENCY_KEY, &c.key("delete-stale")),
                            ("if-match", "\"tend-check-stale\""),
                        ],
                        None,
                    )
                    .await?;
                if r.status != StatusCode::PRECONDITION_FAILED {
                    return Err(format!(
                        "DELETE with a stale If-Match answered {}, not 412",
                        r.status
                    ));
                }
                if c.get(first).await?.status != StatusCode::OK {
                    return Err("the refused DELETE deleted the database".into());
                }
                Ok("412, the database kept".into())
            }
            .await,
        ));
    } else {
        out.push(skipped("delete-precondition", "the create failed"));
    }
    let mut deleted = 0;
    let mut problem = None;
    let mut replay = skipped("delete-replay", "the create failed");
    for name in &names {
        let key = c.key(&format!("delete-{name}"));
        let result = async {
            let got = c.get(name).await?;
            let etag = got.etag.unwrap_or_else(|| "*".into());
            let path = format!("/databases/{name}");
            let headers = [(IDEMPOTENCY_KEY, key.as_str()), ("if-match", etag.as_str())];
            let r = c.call(Method::DELETE, &path, &headers, None).await?;
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
            if name == first {
                let again = c.call(Method::DELETE, &path, &headers, None).await?;
                replay = verdict(
                    "delete-replay",
                    if again.status == r.status {
                        Ok(format!("{} again, from the key", again.status))
                    } else {
                        Err(format!(
                            "the DELETE replayed with its key answered {}, {} the first time",
                            again.status, r.status
                        ))
                    },
                );
            }
            Ok::<(), String>(())
        }
        .await;
        match result {
            Ok(()) => deleted += 1,
            Err(e) => {
                problem.get_or_insert(e);
            }
        }
    }
    out.push(replay);
    out.push(verdict(
        "delete",
        match problem {
            Some(e) => Err(format!("{e} ({deleted} of {} deleted)", names.len())),
            None => Ok(format!("{deleted} databases deleted")),
        },
    ));
    out
}
