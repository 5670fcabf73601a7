//! The crate as the integration tests (`tests/`), the benchmarks, the fuzz
//! targets (`tests/fuzz`) and the reference HTTP provider
//! (`examples/reference_provider.rs`) see it: the only way in from outside
//! the crate besides the binary's entry points.
//!
//! Each module below mirrors the crate module of the same name and
//! re-exports the items a test drives directly: the pure decision core
//! (`engine::decide` and its inputs), the loaders, the state store, the
//! providers, the one reconcile path, the report renderers and the wire
//! types a second HTTP server shares. Everything else stays `pub(crate)`,
//! so the compiler reports code nothing uses and a change inside a module
//! cannot break a caller it never knew about. Add an item here when a test
//! needs it, not a `pub` on the module.

/// The long-lived agent the commands open.
pub mod agent {
    pub use crate::agent::Agent;
}

/// The command line as clap parses it.
pub mod cli {
    pub use crate::cli::Cli;
}

/// The injected clock.
pub mod clock {
    pub use crate::clock::{Clock, ManualClock};
}

/// `tend.toml`.
pub mod config {
    pub use crate::config::Config;
}

/// The pure decision core and its inputs.
pub mod engine {
    pub use crate::engine::{
        Action, DecideInput, Decision, DeletionGate, DeletionGuard, Drift, DriftOrigin,
        FailedAttempts, HeldDeletion, Memory, OperationFailure, OverrideInput, OverrideSource,
        Policy, Rule, State, Subject, Suspension, Tombstone, decide, observed_fingerprint,
    };

    /// The spec fields a declaration asks for, as a provider sees them.
    pub mod desired {
        pub use crate::engine::desired::desired_fields;
    }
}

/// The state store: journal, memories, leases.
pub mod journal {
    pub use crate::journal::{
        Access, Applied, FORMAT, Fence, Intent, IntentState, LeaseHolder, PgStateSettings, Release,
        StateError, StateStore,
    };
}

/// Declarations: loading, parsing, the field table.
pub mod model {
    pub use crate::model::{
        Declaration, DeclarationSet, DeletionPolicy, Diagnostic, DriftPolicy, FIELDS, FlatMap,
        OnExpiry, OverrideExpiry, OverrideSpec, SpecHash, load_paths, parse_file,
    };

    /// The annotations tend reads.
    pub mod overrides {
        pub use crate::model::overrides::KNOWN_ANNOTATIONS;
    }
}

/// The named failpoints at the executor's commit points.
pub mod process {
    pub use crate::process::failpoint;
}

/// Handing a change made at the provider back to Git.
pub mod propose {
    pub use crate::propose::propose;
}

/// Where databases live: the provider contract, the PostgreSQL and sandbox
/// providers, and the HTTP provider's fields and wire types.
pub mod provider {
    pub use crate::provider::{
        Capabilities, ChangeRequest, OWNER_AGENT_LABEL, OWNER_DECLARATION_LABEL, Observation,
        Observed, OperationId, Provider, ProviderError, ResourceStatus,
    };

    /// The HTTP provider's field list and wire types (shared with the
    /// reference server).
    pub mod http {
        pub use crate::provider::http::{HTTP_FIELDS, wire};
    }

    /// The PostgreSQL provider.
    pub mod postgres {
        pub use crate::provider::postgres::{PostgresProvider, PostgresSettings};
    }

    /// The sandbox provider (a SQLite file of databases in the state dir).
    pub mod sandbox {
        pub use crate::provider::sandbox::{
            SANDBOX_FIELDS, SandboxDatabase, SandboxProvider, SandboxState,
        };
    }

    /// The HTTP client tend builds for a provider.
    pub mod tls {
        pub use crate::provider::tls::http_client_for;
    }
}

/// The one reconcile path and the plan it returns.
pub mod reconcile {
    pub use crate::reconcile::{
        Mode, OrphanedOverride, Plan, PlannedOperationId, PlannedResource, PlannedSubject,
        ReconcileError, Scope, reconcile,
    };

    /// Planning helpers.
    pub mod plan {
        pub use crate::reconcile::plan::operation_kind;
    }
}

/// Deliberate bugs, for the simulation's self-test.
pub mod sabotage {
    pub use crate::sabotage::Sabotage;
}

/// The webhook's signature.
pub mod server {
    /// Signing and verifying a webhook body.
    pub mod webhook {
        pub use crate::server::webhook::{sign, verify};
    }
}

/// The Git source.
pub mod source {
    pub use crate::source::{PollOutcome, Snapshot, Source, SourceError, Wakeups, follow};

    /// Credentials for the remote.
    pub mod auth {
        pub use crate::source::auth::{Credentials, TokenScheme};
    }

    /// The parse cache.
    pub mod parse_cache {
        pub use crate::source::parse_cache::load;
    }

    /// How the source is set up.
    pub mod tracker {
        pub use crate::source::tracker::SourceSettings;
    }

    /// Signed commits.
    pub mod trust {
        pub use crate::source::trust::{AllowedSigners, Trust, TrustPolicy};
    }
}

/// Reports.
pub mod status {
    pub use crate::status::{build_report, render};

    /// The HTML report.
    pub mod html {
        pub use crate::status::html::page;
    }
}

/// The metrics registry.
pub mod telemetry {
    pub use crate::telemetry::Metrics;
}

/// Time, overflow-safe.
pub mod time {
    pub use crate::time::rfc3339;
}
