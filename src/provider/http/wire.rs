//! The HTTP provider contract's messages (docs/provider-http-api.md,
//! docs/openapi.yaml), shared by tend's client, the reference server and
//! `tend provider check`, so the three cannot disagree on a field name.

use std::collections::BTreeMap;

use crate::model::FlatMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The contract's version prefix.
pub const PREFIX: &str = "/v1";
/// The header every mutating request carries: tend's operation id.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Errors are RFC 9457 problem details.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// `GET /v1/capabilities`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapabilitiesDoc {
    /// `v1`.
    pub version: String,
    /// Engines a database may be created with (`postgres`, `mysql`).
    pub engines: Vec<String>,
    /// Observable fields and their mutability there (`mutable`,
    /// `immutable`, `create-only`).
    pub fields: BTreeMap<String, String>,
    /// Whether the server stores labels (ownership marker and overrides).
    pub labels: bool,
}

/// One database: what `GET /v1/databases/{name}` answers (its `ETag`
/// header repeats `etag`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Database {
    pub name: String,
    /// The server's id for it.
    pub id: String,
    /// `provisioning`, `ready` or `deleting`.
    pub status: String,
    /// Field values by path (`size`, `storageGb`, `parameters.work_mem`).
    #[serde(default)]
    pub fields: FlatMap<Value>,
    #[serde(default)]
    pub labels: FlatMap<String>,
    /// The version of this representation (quoted, as in the header).
    pub etag: String,
    /// When this representation was true (RFC 3339): a cache serving an
    /// old copy says so.
    pub observed_at: String,
}

/// `GET /v1/databases`: one page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabasePage {
    pub items: Vec<Database>,
    /// The next page's token; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// `POST /v1/databases`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateDatabase {
    pub name: String,
    #[serde(default)]
    pub fields: BTreeMap<String, Value>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `PATCH /v1/databases/{name}`: a `null` field value removes the field;
/// an empty label value removes the label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateDatabase {
    #[serde(default)]
    pub fields: BTreeMap<String, Value>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Asynchronous work: the body of a `202 Accepted` and of
/// `GET /v1/operations/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub id: String,
    /// `running`, `succeeded` or `failed`.
    pub status: String,
    /// The database the operation works on.
    pub database: String,
    /// Why it failed (status `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// An RFC 9457 problem (`application/problem+json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    #[serde(rename = "type", default = "about_blank")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

fn about_blank() -> String {
    "about:blank".into()
}

impl Problem {
    pub fn new(status: u16, title: &str, detail: impl Into<String>) -> Self {
        Problem {
            kind: about_blank(),
            title: title.to_string(),
            status,
            detail: Some(detail.into()),
        }
    }
}
