//! What a provider shows about a database: plain data, below the
//! decision core (which decides from it) and the providers (which make
//! it), so neither depends on the other for it.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::setting_list;
use super::{FIELDS, FlatMap, Mutability};

/// Label keys of the ownership marker at the provider.
pub const OWNER_AGENT_LABEL: &str = "tend.dev/owner-agent";
pub const OWNER_DECLARATION_LABEL: &str = "tend.dev/owner-declaration";

/// Which agent and declaration own a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipMarker {
    pub agent_id: String,
    pub declaration: String,
}

impl OwnershipMarker {
    /// Reads the marker from provider labels.
    pub fn from_labels(labels: &FlatMap<String>) -> Option<Self> {
        marker_labels(labels).map(|(agent_id, declaration)| OwnershipMarker {
            agent_id: agent_id.to_string(),
            declaration: declaration.to_string(),
        })
    }
}

/// The marker's agent id and declaration name in `labels`, borrowed.
fn marker_labels(labels: &FlatMap<String>) -> Option<(&str, &str)> {
    Some((
        labels.get(OWNER_AGENT_LABEL)?,
        labels.get(OWNER_DECLARATION_LABEL)?,
    ))
}

/// Lifecycle of a database at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceStatus {
    /// Created but not ready yet.
    Provisioning,
    Ready,
    /// A delete was accepted and is in progress.
    Deleting,
}

impl ResourceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceStatus::Provisioning => "provisioning",
            ResourceStatus::Ready => "ready",
            ResourceStatus::Deleting => "deleting",
        }
    }
}

/// What a provider showed about one database, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The database name at the provider.
    pub database_name: String,
    /// The provider's id for it.
    pub external_id: String,
    pub status: ResourceStatus,
    /// Observed values by field path (`connectionLimit`, `parameters.work_mem`).
    pub fields: FlatMap<Value>,
    /// Provider-side labels (ownership marker and provider-side overrides).
    pub labels: FlatMap<String>,
    /// When the provider's answer was produced (a stale cache answers with an
    /// old time).
    pub observed_at: SystemTime,
    /// Fields the provider could not observe this time (extensions of a
    /// database that refuses connections): never compared, never "drift".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unobserved: Vec<String>,
}

impl Observation {
    pub fn marker(&self) -> Option<OwnershipMarker> {
        OwnershipMarker::from_labels(&self.labels)
    }

    /// The marker's agent id and declaration name, borrowed (the decision
    /// core reads them for every resource in every cycle).
    pub fn marker_labels(&self) -> Option<(&str, &str)> {
        marker_labels(&self.labels)
    }

    /// Files each observed `parameters.<key>` under the declared spelling
    /// of the same name in another case (`declared`: field paths), for a
    /// provider whose setting names are case-insensitive
    /// ([`Capabilities::parameter_names_ignore_case`]): PostgreSQL stores
    /// `Work_Mem` as `work_mem` (and `datestyle` as `DateStyle`), and
    /// compared as written the setting would be drift at every cycle.
    pub fn align_parameter_names<'a>(&mut self, declared: impl IntoIterator<Item = &'a str>) {
        for path in declared {
            let Some(key) = path.strip_prefix("parameters.") else {
                continue;
            };
            if self.fields.contains_key(path) {
                continue;
            }
            let spelled = self
                .fields
                .keys()
                .find(|k| {
                    k.strip_prefix("parameters.")
                        .is_some_and(|o| o.eq_ignore_ascii_case(key))
                })
                .map(str::to_owned);
            if let Some(spelled) = spelled
                && let Some(value) = self.fields.remove(&spelled)
            {
                self.fields.insert(path.to_string(), value);
                for unobserved in &mut self.unobserved {
                    if *unobserved == spelled {
                        *unobserved = path.to_string();
                    }
                }
            }
        }
    }
}

/// The result of observing one declared database.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    Found(Observation),
    NotFound,
    /// The provider could not be asked; never act on this.
    Failed(String),
}

/// What a provider can observe and change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Top-level spec fields the provider observes, with their mutability
    /// there (from the field table unless the provider knows better).
    pub fields: crate::model::FieldSet,
    /// Whether the provider stores labels (and so provider-side overrides).
    pub labels: bool,
    /// Settings (`parameters.<name>`) the provider parses as lists: their
    /// values are compared in [`setting_list::canonical`] form.
    pub list_settings: &'static [setting_list::ListSetting],
    /// How long the provider's reads may lag its writes (a cache in front
    /// of it): within this long of tend's own write to a database, its
    /// absence from a listing is not evidence that it is gone.
    pub read_lag: std::time::Duration,
    /// Setting names are case-insensitive and the provider reports them in
    /// its own spelling (PostgreSQL): observations are read under the
    /// declaration's (see [`Observation::align_parameter_names`]).
    pub parameter_names_ignore_case: bool,
}

impl Capabilities {
    /// Capabilities for a set of top-level field names, mutability from the
    /// field table.
    pub fn for_fields(names: &[&str], labels: bool) -> Self {
        let fields = FIELDS
            .iter()
            .filter(|f| names.contains(&f.name))
            .map(|f| (f.name, f.mutability))
            .collect();
        Capabilities {
            fields,
            labels,
            list_settings: &[],
            read_lag: std::time::Duration::ZERO,
            parameter_names_ignore_case: false,
        }
    }

    /// `value` of the field `path` in the form the provider compares it:
    /// a list setting's text in canonical form, anything else as it is.
    pub fn comparable(&self, path: &str, value: Value) -> Value {
        path.strip_prefix("parameters.")
            .and_then(|key| self.canonical_setting(key, &value))
            .unwrap_or(value)
    }

    /// The mutability of a field path (`parameters.x` → `parameters`), if
    /// the provider observes it.
    pub fn mutability(&self, path: &str) -> Option<Mutability> {
        let top = path.split('.').next().unwrap_or(path);
        self.fields.get(top)
    }

    /// The canonical form of the setting `key`'s `value` when the provider
    /// parses it as a list (`None` otherwise: compare it as it is).
    pub fn canonical_setting(&self, key: &str, value: &Value) -> Option<Value> {
        let setting = setting_list::find(self.list_settings, key)?;
        setting_list::canonical(setting, value.as_str()?).map(Value::String)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observed_settings_are_filed_under_the_declared_spelling() {
        let mut obs = Observation {
            database_name: "db".into(),
            external_id: "db".into(),
            status: ResourceStatus::Ready,
            fields: FlatMap::from([
                ("parameters.work_mem".to_string(), serde_json::json!("64MB")),
                (
                    "parameters.DateStyle".to_string(),
                    serde_json::json!("iso, dmy"),
                ),
                (
                    "parameters.search_path".to_string(),
                    serde_json::json!("public"),
                ),
                ("connectionLimit".to_string(), serde_json::json!(5)),
            ]),
            labels: FlatMap::new(),
            observed_at: std::time::SystemTime::UNIX_EPOCH,
            unobserved: vec!["parameters.work_mem".to_string()],
        };
        obs.align_parameter_names([
            "parameters.Work_Mem",
            "parameters.datestyle",
            "connectionLimit",
        ]);
        let keys: Vec<&str> = obs.fields.keys().collect();
        assert_eq!(
            keys,
            [
                "connectionLimit",
                "parameters.Work_Mem",
                "parameters.datestyle",
                "parameters.search_path"
            ],
            "declared spellings; an undeclared setting keeps the server's"
        );
        assert_eq!(obs.fields["parameters.Work_Mem"], "64MB");
        assert_eq!(obs.unobserved, ["parameters.Work_Mem"]);
    }
}
