//! A mutating call to a provider: its kind, its identity (the
//! idempotency key), its request and how it failed. Plain data, below the
//! decision core and the executor.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::SpecHash;
use super::hash::sha256_hex;

/// Kind of a mutating call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OperationKind {
    Create,
    Update,
    Delete,
    Adopt,
    Release,
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::Create => "create",
            OperationKind::Update => "update",
            OperationKind::Delete => "delete",
            OperationKind::Adopt => "adopt",
            OperationKind::Release => "release",
        }
    }

    /// The kind [`OperationKind::as_str`] names.
    pub fn parse(text: &str) -> Option<Self> {
        [
            OperationKind::Create,
            OperationKind::Update,
            OperationKind::Delete,
            OperationKind::Adopt,
            OperationKind::Release,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// Identity of one mutating operation: sha256 of (agent id, declaration name,
/// kind, spec hash), hex. The same work always gets the same id, so a retry
/// after a lost response or a crash is recognised by the provider.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(pub String);

impl OperationId {
    pub fn derive(agent_id: &str, name: &str, kind: OperationKind, spec_hash: &SpecHash) -> Self {
        Self::derive_nth(agent_id, name, kind, spec_hash, 0)
    }

    /// The id of the `generation`-th operation of this kind on this spec
    /// (0 for the first). The design derives the id from the four parts
    /// alone; but correcting the same out-of-band drift twice under one spec
    /// is two different operations, and a provider would answer the second
    /// with the first's result. The journal counts finished operations, so
    /// a retry (pending intent) keeps its id and new work gets a new one.
    pub fn derive_nth(
        agent_id: &str,
        name: &str,
        kind: OperationKind,
        spec_hash: &SpecHash,
        generation: u32,
    ) -> Self {
        // Length-prefixed parts: no two different tuples share an input.
        let mut input = String::new();
        let generation = generation.to_string();
        let spec_hash = spec_hash.to_text();
        let parts: &[&str] = if generation == "0" {
            &[agent_id, name, kind.as_str(), &spec_hash]
        } else {
            &[agent_id, name, kind.as_str(), &spec_hash, &generation]
        };
        for part in parts {
            input.push_str(&part.len().to_string());
            input.push(':');
            input.push_str(part);
        }
        OperationId(sha256_hex(input.as_bytes()))
    }
}

impl std::fmt::Display for OperationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A provider error, classified for the executor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    #[error("{resource}: temporary provider failure: {message}")]
    Retryable { resource: String, message: String },
    #[error("{resource}: rate limited by the provider, retry after {}", crate::time::duration_ms(*retry_after))]
    RateLimited {
        resource: String,
        retry_after: std::time::Duration,
    },
    #[error("{resource}: write conflict (the resource changed since it was observed): {message}")]
    Conflict { resource: String, message: String },
    #[error("{resource}: not found at the provider")]
    NotFound { resource: String },
    #[error("{resource}: {message}")]
    Permanent { resource: String, message: String },
}

impl ProviderError {
    /// Whether the same call may succeed if retried later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::Retryable { .. } | ProviderError::RateLimited { .. }
        )
    }
}

/// The request of a create or update: database name, field values to set,
/// labels to set (ownership marker included on create).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRequest {
    pub database_name: String,
    pub fields: BTreeMap<String, Value>,
    pub labels: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_differ_per_part_and_repeat_per_input() {
        let h = SpecHash::from("abc");
        let a = OperationId::derive("agent", "orders", OperationKind::Create, &h);
        assert_eq!(
            a,
            OperationId::derive("agent", "orders", OperationKind::Create, &h)
        );
        assert_ne!(
            a,
            OperationId::derive("agent", "orders", OperationKind::Update, &h)
        );
        assert_ne!(
            a,
            OperationId::derive("agent2", "orders", OperationKind::Create, &h)
        );
        assert_ne!(
            OperationId::derive("ab", "c", OperationKind::Create, &h),
            OperationId::derive("a", "bc", OperationKind::Create, &h)
        );
        assert_eq!(a.0.len(), 64);
        assert_eq!(
            a,
            OperationId::derive_nth("agent", "orders", OperationKind::Create, &h, 0)
        );
        assert_ne!(
            a,
            OperationId::derive_nth("agent", "orders", OperationKind::Create, &h, 1)
        );
    }
}
