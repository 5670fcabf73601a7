//! Deliberate bugs, for showing that a test's invariants catch them.
//!
//! The simulation (tests/library/simulation.rs) holds tend to its promises; each
//! invariant is proven able to fail by a test that turns on one of these
//! and asserts the simulation finds it. They are named here, one per
//! promise, so a newcomer sees what each invariant guards against.
//!
//! Only a build with the `test-hooks` feature (the test build) can turn
//! one on: without it neither `Policy` nor the executor's context has a
//! field to hold one, their `sabotaged` is the constant `false`, every
//! sabotaged branch is dead code, and nothing (no configuration key, no
//! environment variable) sets a value.

/// One deliberate bug, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sabotage {
    #[default]
    None,
    /// decide: a database without this declaration's ownership marker is
    /// managed as if it were tend's.
    OwnershipNotChecked,
    /// decide: `ignore-fields` overrides are not honoured.
    IgnoreFieldsNotHonoured,
    /// decide: pauses (a local override among them) are not honoured.
    PauseNotHonoured,
    /// decide: drift that is held (grace, report-only) is reported `InSync`.
    HeldDriftReportedInSync,
    /// executor: every attempt of a call goes out under a new operation
    /// id, so a retry after a lost response is new work to the provider.
    FreshIdOnRetry,
    /// executor: a confirmed operation's intent is never marked done.
    IntentLeftPending,
    /// decide: `driftPolicy: Report` is not honoured (out-of-band drift is
    /// corrected after its grace like any other).
    ReportPolicyIgnored,
    /// routing and the guard: a tree that declares nothing removes every
    /// declaration like any other commit.
    EmptyTreeNotGuarded,
    /// routing: a file that does not parse counts as its declarations
    /// removed.
    UnparsableFileTombstoned,
}
