//! The `ManagedDatabase` declaration: types, the field table, override
//! annotations, validation, the spec hash and loading from files.

pub(crate) mod declaration;
pub(crate) mod fields;
pub(crate) mod flat_map;
pub(crate) mod hash;
pub(crate) mod load;
pub(crate) mod messages;
pub(crate) mod normalized;
pub(crate) mod observation;
pub(crate) mod operation;
pub(crate) mod overrides;
pub(crate) mod schema;
pub(crate) mod setting_list;
pub(crate) mod suggest;
pub(crate) mod tree;
pub(crate) mod validate;
pub(crate) mod yaml;
pub(crate) mod yaml_spans;

pub(crate) use declaration::ManagedDatabase;
pub use declaration::{DeletionPolicy, DriftPolicy};
pub use fields::FIELDS;
pub(crate) use fields::{FieldInfo, FieldSet, Mutability};
pub use flat_map::FlatMap;
pub use hash::SpecHash;
pub use load::{Declaration, DeclarationSet, Diagnostic, load_paths, parse_file};
pub(crate) use normalized::NormalizedSpec;
pub use overrides::{OnExpiry, OverrideExpiry, OverrideSpec};
