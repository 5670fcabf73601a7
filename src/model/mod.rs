//! The `ManagedDatabase` declaration: types, the field table, override
//! annotations, validation, the spec hash and loading from files.

pub mod declaration;
pub mod fields;
pub mod hash;
pub mod load;
pub mod messages;
pub mod observation;
pub mod operation;
pub mod overrides;
pub mod schema;
pub mod setting_list;
pub mod suggest;
pub mod tree;
pub mod validate;
pub mod yaml;
pub mod yaml_spans;

pub use declaration::{DeletionPolicy, DriftPolicy, ManagedDatabase, Spec};
pub use fields::{FIELDS, FieldInfo, FieldSet, Mutability};
pub use hash::SpecHash;
pub use load::{Declaration, DeclarationSet, Diagnostic, is_yaml, load_paths, parse_file};
pub use overrides::{OnExpiry, OverrideExpiry, OverrideSpec, TendAnnotations};
