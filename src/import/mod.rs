//! `tend import`: declarations for the databases a provider already has
//! and no declaration covers, ready to review and merge.
//!
//! # Guarantees
//! * Pure: the caller lists the provider and reads the declarations; this
//!   decides what is written, from those alone. Same inputs, byte-identical
//!   files (nothing in a file depends on the time or the order of a
//!   listing).
//! * A database is imported only when nothing claims it: no declaration
//!   names it on this provider, no agent's marker is on it, it is not a
//!   system database and the filters keep it. Every database the provider
//!   shows is either imported or listed with the reason it is not (those
//!   already declared and those the filters drop are counted).
//! * Every file is parsed and validated as `tend validate` would, and its
//!   spec compared with the observation as a plan would, before it is
//!   offered: an imported declaration adopts its database with no field
//!   change. A database whose file would not is listed, never written.
//! * Never a file that exists, never a `metadata.name` another
//!   declaration has.

pub(crate) mod name;
pub(crate) mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;

use crate::engine::desired::manages_parameters;
use crate::engine::each_difference;
use crate::model::{Declaration, parse_file};
use crate::provider::{Capabilities, Observation, OwnershipMarker, ResourceStatus};
pub(crate) use render::{Defaults, Heading, LeftOut};

/// A declaration that exists (in the tracked branch or the target
/// directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Known {
    pub name: String,
    /// Where it is written (repository-relative, or as found on disk).
    pub file: String,
    /// `spec.provider`; `None`: the only configured provider.
    pub provider: Option<String>,
    pub database_name: String,
}

impl Known {
    /// `decl`, written in `file`.
    pub(crate) fn of(decl: &Declaration, file: String) -> Self {
        Known {
            name: decl.name().to_string(),
            file,
            provider: decl.manifest.spec.provider.as_deref().map(str::to_string),
            database_name: decl.manifest.database_name(),
        }
    }
}

/// The database names `known` declares on `provider` (a declaration
/// without `spec.provider` counts for every provider: it is the only one).
pub(crate) fn covered<'a>(known: &'a [Known], provider: &str) -> BTreeSet<&'a str> {
    known
        .iter()
        .filter(|k| k.provider.as_deref().is_none_or(|p| p == provider))
        .map(|k| k.database_name.as_str())
        .collect()
}

/// Which databases an import considers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    /// Only database names this matches.
    pub only: Option<Regex>,
    /// None that any of these matches.
    pub except: Vec<Regex>,
}

impl Filter {
    /// Whether the filters keep `database`.
    pub(crate) fn keeps(&self, database: &str) -> bool {
        self.only.as_ref().is_none_or(|r| r.is_match(database))
            && !self.except.iter().any(|r| r.is_match(database))
    }
}

/// Everything an import decides from.
pub(crate) struct ImportInput<'a> {
    pub heading: Heading<'a>,
    /// This agent's id (a database with its marker is not imported: it is
    /// tend's already).
    pub agent_id: &'a str,
    pub capabilities: &'a Capabilities,
    pub defaults: &'a Defaults,
    pub all_fields: bool,
    /// Declarations that exist.
    pub known: &'a [Known],
    /// Databases that are not a tenant's, with why (`postgres`, tend's
    /// own catalog or state).
    pub system: &'a BTreeMap<String, String>,
    pub filter: &'a Filter,
    /// The directory new files go to (`/`-separated, `""`: the top).
    pub dir: &'a str,
    /// Files that exist (same form as the new files' paths).
    pub existing_files: &'a BTreeSet<String>,
}

/// One database imported: its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Imported {
    pub database: String,
    pub name: String,
    /// `dir/name.yaml`.
    pub file: String,
    pub text: String,
    pub left_out: Vec<LeftOut>,
}

/// A database not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotImported {
    pub database: String,
    pub why: String,
}

/// What an import writes and what it does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ImportPlan {
    /// Sorted by file.
    pub imported: Vec<Imported>,
    /// Sorted by database name: system databases, other agents',
    /// clashes, names no declaration can carry.
    pub not_imported: Vec<NotImported>,
    /// Databases a declaration already covers.
    pub declared: usize,
    /// Databases `--match`/`--exclude` left aside.
    pub filtered: usize,
}

/// Decides the import of `observations` (everything the provider shows).
pub(crate) fn plan_import(
    input: &ImportInput<'_>,
    mut observations: Vec<Observation>,
) -> ImportPlan {
    observations.sort_by(|a, b| a.database_name.cmp(&b.database_name));
    let provider = input.heading.provider;
    let covered = covered(input.known, provider);
    // Rule 4 of the name: databases with one derived name are told apart.
    // Counted over every database but the system ones, so a name does not
    // depend on the filters or on what is declared already.
    let mut uses: BTreeMap<String, usize> = BTreeMap::new();
    for obs in observations
        .iter()
        .filter(|o| !input.system.contains_key(&o.database_name))
    {
        *uses.entry(name::derived(&obs.database_name)).or_default() += 1;
    }
    let mut plan = ImportPlan::default();
    let mut candidates = Vec::new();
    for obs in observations {
        let database = obs.database_name.clone();
        let refuse = |why: String| NotImported {
            database: database.clone(),
            why,
        };
        if covered.contains(database.as_str()) {
            plan.declared += 1;
        } else if let Some(why) = input.system.get(&database) {
            plan.not_imported.push(refuse(why.clone()));
        } else if !input.filter.keeps(&database) {
            plan.filtered += 1;
        } else if let Some(marker) = obs.marker() {
            plan.not_imported
                .push(refuse(owned(&marker, input.agent_id)));
        } else if obs.status != ResourceStatus::Ready {
            plan.not_imported.push(refuse(format!(
                "it is {} at the provider: import it once it is ready",
                obs.status.as_str()
            )));
        } else if let Some(why) = uncarriable(&database) {
            plan.not_imported.push(refuse(why));
        } else {
            candidates.push(obs);
        }
    }
    // The first place a name is declared (the tracked branch's, then the
    // directory's).
    let mut taken: BTreeMap<&str, &Known> = BTreeMap::new();
    for k in input.known {
        taken.entry(k.name.as_str()).or_insert(k);
    }
    for obs in candidates {
        let database = obs.database_name.clone();
        let base = name::derived(&database);
        let name = if uses.get(&base).is_some_and(|n| *n > 1) {
            name::disambiguated(&base, &database)
        } else {
            base
        };
        let file = if input.dir.is_empty() {
            format!("{name}.yaml")
        } else {
            format!("{}/{name}.yaml", input.dir)
        };
        if let Some(other) = taken.get(name.as_str()) {
            plan.not_imported.push(NotImported {
                database,
                why: format!(
                    "its name would be `{name}`, which the declaration in {} already has (for database {:?}); declare this one by hand under another name",
                    other.file, other.database_name
                ),
            });
            continue;
        }
        if input.existing_files.contains(&file) {
            plan.not_imported.push(NotImported {
                database,
                why: format!("{file} exists, and tend import never overwrites a file"),
            });
            continue;
        }
        match imported(input, &obs, name, file) {
            Ok(one) => plan.imported.push(one),
            Err(why) => plan.not_imported.push(NotImported { database, why }),
        }
    }
    plan.imported.sort_by(|a, b| a.file.cmp(&b.file));
    plan.not_imported
        .sort_by(|a, b| a.database.cmp(&b.database));
    plan
}

/// Why a database with `marker` is not imported.
fn owned(marker: &OwnershipMarker, agent_id: &str) -> String {
    if marker.agent_id == agent_id {
        format!(
            "it carries this agent's marker for declaration `{}`, which the tracked branch no longer has (tend releases or deletes it by its deletion policy); `tend explain {}` says which",
            marker.declaration, marker.declaration
        )
    } else {
        format!(
            "agent `{}` owns it (declaration `{}`): import it from that agent's repository, or release it there first",
            marker.agent_id, marker.declaration
        )
    }
}

/// Why no declaration can name `database`, if none can.
fn uncarriable(database: &str) -> Option<String> {
    if database.len() > 63 {
        Some(format!(
            "its name is {} bytes long, and a declaration's databaseName holds at most 63 (PostgreSQL's limit); rename it at the provider, or manage it outside tend",
            database.len()
        ))
    } else if database.is_empty() || database.contains('\0') {
        Some("its name is empty or holds a NUL character, which no declaration can name".into())
    } else {
        None
    }
}

/// The file of one database, checked: a field whose declared value the
/// plan would not find equal to the provider's is left out (and said),
/// and the file made again without it.
fn imported(
    input: &ImportInput<'_>,
    obs: &Observation,
    name: String,
    file: String,
) -> Result<Imported, String> {
    let (mut fields, mut left_out) =
        render::spec_fields(obs, input.capabilities, input.defaults, input.all_fields);
    let database_name =
        name::needs_database_name(&name, &obs.database_name).then_some(obs.database_name.as_str());
    loop {
        let text = render::document(&input.heading, &name, database_name, &fields);
        match check(&text, &file, &name, obs, input.capabilities) {
            Ok(()) => {
                return Ok(Imported {
                    database: obs.database_name.clone(),
                    name,
                    file,
                    text,
                    left_out,
                });
            }
            Err(Unfit::Differs { field, why }) if fields.iter().any(|(f, _)| *f == field) => {
                fields.retain(|(f, _)| *f != field);
                left_out.push(LeftOut {
                    field,
                    why: format!(
                        "{why}: declared as the provider shows it, a plan would still see a difference"
                    ),
                });
            }
            Err(Unfit::Differs { why, .. }) | Err(Unfit::Broken(why)) => {
                return Err(format!(
                    "tend import made a file it would not offer ({why}); nothing is written for it. This is a bug in tend: please report it with the database's settings"
                ));
            }
        }
    }
}

/// Why a file is not offered.
enum Unfit {
    /// The top-level `field` would differ from the observation.
    Differs { field: String, why: String },
    /// The file is not one adopting declaration of the database.
    Broken(String),
}

/// The file parses and validates as one declaration named `name`, for
/// `obs`'s database, to be adopted, and every field it declares matches
/// the observation as a plan compares them.
fn check(
    text: &str,
    file: &str,
    name: &str,
    obs: &Observation,
    capabilities: &Capabilities,
) -> Result<(), Unfit> {
    let parsed = parse_file(Path::new(file), text.as_bytes());
    if let Some(d) = parsed.diagnostics.first() {
        return Err(Unfit::Broken(format!(
            "{}:{}: {}",
            d.line, d.column, d.message
        )));
    }
    let [decl] = parsed.declarations.as_slice() else {
        return Err(Unfit::Broken(format!(
            "{} documents",
            parsed.declarations.len()
        )));
    };
    if decl.name() != name || !decl.manifest.is_database_name(&obs.database_name) {
        return Err(Unfit::Broken(format!(
            "it names {} / {}",
            decl.name(),
            decl.manifest.database_name()
        )));
    }
    if !decl.annotations.adopt {
        return Err(Unfit::Broken("it does not adopt".into()));
    }
    let spec = &decl.normalized_spec;
    // As a plan compares them (the database name is the file's identity,
    // checked above).
    let mut first = None;
    each_difference(
        spec,
        obs,
        capabilities,
        manages_parameters(&decl.manifest, capabilities),
        |path, want, have| {
            if first.is_none() && path != "databaseName" {
                let why = if want.is_null() {
                    format!("{path} is set at the provider and not declared")
                } else {
                    format!("{path} declares {want}, the provider shows {have}")
                };
                let field = path.split('.').next().unwrap_or(path).to_string();
                first = Some(Unfit::Differs { field, why });
            }
        },
    );
    if let Some(unfit) = first {
        return Err(unfit);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ResourceStatus;
    use crate::provider::sandbox::SANDBOX_FIELDS;
    use serde_json::{Value, json};

    fn observation(name: &str, fields: Value) -> Observation {
        Observation {
            database_name: name.into(),
            external_id: name.into(),
            status: ResourceStatus::Ready,
            fields: serde_json::from_value(fields).unwrap(),
            labels: Default::default(),
            observed_at: std::time::SystemTime::UNIX_EPOCH,
            unobserved: Vec::new(),
        }
    }

    fn import(observations: Vec<Observation>) -> ImportPlan {
        import_with(Capabilities::for_fields(SANDBOX_FIELDS, true), observations)
    }

    fn import_with(capabilities: Capabilities, observations: Vec<Observation>) -> ImportPlan {
        let input = ImportInput {
            heading: Heading {
                schema_ref: "s.json",
                provider: "p",
                provider_kind: "sandbox",
                spell_provider: true,
            },
            agent_id: "me",
            capabilities: &capabilities,
            defaults: &Defaults::new(),
            all_fields: false,
            known: &[],
            system: &BTreeMap::new(),
            filter: &Filter::default(),
            dir: "dbs",
            existing_files: &BTreeSet::new(),
        };
        plan_import(&input, observations)
    }

    #[test]
    fn values_a_declaration_cannot_hold_are_left_out_and_said() {
        let plan = import(vec![observation(
            "odd",
            json!({
                "engine": "oracle",
                "storageGb": 0,
                "size": "db-small",
                "extensions": [{"name": "PG_Trgm"}, {"name": "citext", "version": "1.6", "schema": "public"}],
                "parameters.bad-key": "1",
                "parameters.work_mem": "4MB",
            }),
        )]);
        let [one] = plan.imported.as_slice() else {
            panic!("{plan:#?}")
        };
        assert_eq!(
            one.text,
            "# yaml-language-server: $schema=s.json\n# Imported by `tend import` from provider \"p\" (sandbox).\napiVersion: tend.dev/v1alpha1\nkind: ManagedDatabase\nmetadata:\n  name: odd\n  annotations:\n    tend.dev/adopt: \"true\"\nspec:\n  provider: p\n  extensions:\n    - citext\n  size: db-small\n"
        );
        let left: Vec<&str> = one.left_out.iter().map(|l| l.field.as_str()).collect();
        assert_eq!(
            left,
            ["extensions.PG_Trgm", "parameters", "engine", "storageGb"],
            "{:#?}",
            one.left_out
        );
        assert!(
            one.left_out[1]
                .why
                .contains("`bad-key` is not a valid parameter name")
                && one.left_out[1].why.contains("so none is written"),
            "{:#?}",
            one.left_out
        );
    }

    #[test]
    fn a_field_the_plan_would_still_find_different_is_left_out_not_the_database() {
        // A provider that shows a list setting in another form than the
        // one it compares (a bug of that provider, or a version of it):
        // declared as shown, the plan would still see a difference.
        let capabilities = Capabilities {
            list_settings: crate::provider::setting_list::POSTGRES_LIST_SETTINGS,
            ..Capabilities::for_fields(SANDBOX_FIELDS, true)
        };
        let plan = import_with(
            capabilities,
            vec![observation(
                "lists",
                json!({"owner": "o", "parameters.search_path": "a,b"}),
            )],
        );
        let [one] = plan.imported.as_slice() else {
            panic!("{plan:#?}")
        };
        assert!(
            one.text.ends_with("spec:\n  provider: p\n  owner: o\n"),
            "{}",
            one.text
        );
        assert_eq!(one.left_out.len(), 1, "{:#?}", one.left_out);
        assert_eq!(one.left_out[0].field, "parameters");
        assert!(
            one.left_out[0]
                .why
                .contains("a plan would still see a difference"),
            "{:#?}",
            one.left_out
        );
    }

    #[test]
    fn every_database_is_imported_or_said_why_not() {
        let mut marked = observation("theirs", json!({}));
        marked.labels = crate::model::FlatMap::from([
            (crate::provider::OWNER_AGENT_LABEL, "other".into()),
            (crate::provider::OWNER_DECLARATION_LABEL, "t".into()),
        ]);
        let plan = import(vec![
            observation("b", json!({})),
            marked,
            observation(&"x".repeat(64), json!({})),
            observation("a", json!({"comment": "c"})),
        ]);
        let files: Vec<&str> = plan.imported.iter().map(|i| i.file.as_str()).collect();
        assert_eq!(files, ["dbs/a.yaml", "dbs/b.yaml"]);
        assert!(plan.imported[1].text.ends_with("spec:\n  provider: p\n"));
        let why: Vec<&str> = plan
            .not_imported
            .iter()
            .map(|n| n.database.as_str())
            .collect();
        assert_eq!(why, ["theirs", &"x".repeat(64)]);
    }
}
