//! The state formats, one step each: the step that produces format N is
//! `STEPS[N - 1]`. A migration runs every step above the file's format in
//! one transaction: a crash leaves the file at its old format.

use rusqlite::Transaction;

/// What one format adds.
pub(super) enum Step {
    /// SQL run as a batch.
    Sql(&'static str),
    /// Columns `(table, column, type)` added where missing (SQLite has no
    /// `ADD COLUMN IF NOT EXISTS`).
    Columns(&'static [(&'static str, &'static str, &'static str)]),
}

impl Step {
    pub(super) fn apply(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        match self {
            Step::Sql(sql) => tx.execute_batch(sql),
            Step::Columns(columns) => {
                for (table, column, kind) in *columns {
                    let exists = tx
                        .prepare(&format!("SELECT {column} FROM {table} LIMIT 0"))
                        .is_ok();
                    if !exists {
                        tx.execute_batch(&format!(
                            "ALTER TABLE {table} ADD COLUMN {column} {kind}"
                        ))?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Every format's step, in order.
pub(super) const STEPS: &[Step] = &[
    // 1: the first layout.
    Step::Sql(
        r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE resources (
    name TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    database_name TEXT NOT NULL,
    file TEXT NOT NULL,
    applied_spec_hash TEXT,
    applied_fields TEXT NOT NULL DEFAULT '{}',
    applied_commit TEXT,
    external_id TEXT,
    existed INTEGER NOT NULL DEFAULT 0,
    manifest TEXT NOT NULL DEFAULT '{}',
    last_write_ms INTEGER,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE drift_seen (
    name TEXT NOT NULL, field TEXT NOT NULL, first_seen_ms INTEGER NOT NULL,
    PRIMARY KEY (name, field)
);
CREATE TABLE attempts (
    name TEXT NOT NULL, field TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (name, field)
);
CREATE TABLE intents (
    op_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    generation INTEGER NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX intents_by_name ON intents (name, state);
CREATE TABLE tombstones (
    name TEXT PRIMARY KEY,
    manifest TEXT NOT NULL,
    removed_ms INTEGER NOT NULL,
    removal_commit TEXT NOT NULL,
    delete_requested_ms INTEGER,
    last_error TEXT
);
CREATE TABLE local_overrides (
    name TEXT PRIMARY KEY,
    annotations TEXT NOT NULL,
    set_ms INTEGER NOT NULL
);
CREATE TABLE override_seen (
    name TEXT NOT NULL, source TEXT NOT NULL, fingerprint TEXT NOT NULL, first_seen_ms INTEGER NOT NULL,
    PRIMARY KEY (name, source)
);
"#,
    ),
    // 2: finding the pending intents (every cycle) must not scan the whole
    // journal; format-1 readers ignore the index.
    Step::Sql(
        r#"
CREATE INDEX IF NOT EXISTS intents_pending ON intents (state) WHERE state = 'pending';
"#,
    ),
    // 3: the mass-deletion guard remembers its holds and the operator's
    // approvals; every open intent (pending, or a state this binary does
    // not know) is found through an index; finished intents pruned from
    // the journal leave their count behind (operation-id generations). A
    // reader that ignored these tables would delete what this format holds
    // and reuse operation ids: min_reader_format 3.
    Step::Sql(
        r#"
CREATE INDEX IF NOT EXISTS intents_by_state ON intents (state);
CREATE TABLE IF NOT EXISTS deletion_holds (
    name TEXT PRIMARY KEY, since_ms INTEGER NOT NULL, due_together INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS deletion_approvals (
    name TEXT PRIMARY KEY, reason TEXT NOT NULL, approved_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pruned_generations (
    name TEXT NOT NULL, kind TEXT NOT NULL, spec_hash TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (name, kind, spec_hash)
);
"#,
    ),
    // 4: failed update attempts remember the declared and observed values
    // they were counted against, and count only while both stay the same.
    // A format-3 reader ignores the columns (its counts never reset: the
    // old behaviour, not a hazard): min_reader_format stays 3.
    Step::Columns(&[
        ("attempts", "desired", "TEXT"),
        ("attempts", "observed", "TEXT"),
    ]),
    // 5: notifications: the conditions last notified (a restart neither
    // repeats nor loses a transition) and the messages not yet delivered.
    // A format-4 reader ignores them (it sends no notifications):
    // min_reader_format stays 3.
    Step::Sql(
        r#"
CREATE TABLE IF NOT EXISTS notify_conditions (
    subject TEXT NOT NULL, condition TEXT NOT NULL, since_ms INTEGER NOT NULL,
    PRIMARY KEY (subject, condition)
);
CREATE TABLE IF NOT EXISTS notify_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    event TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS notify_outbox_due ON notify_outbox (next_ms);
"#,
    ),
    // 6: the source commit each status file was decided from, kept with a
    // digest of what the file says, so a commit that changes nothing for
    // a resource leaves its file alone; and an index by state and time
    // that answers the status step's "has an operation finished?" alone,
    // without reading every intent. Older readers ignore both.
    Step::Sql(
        r#"
CREATE TABLE IF NOT EXISTS status_decided (
    name TEXT PRIMARY KEY, digest TEXT NOT NULL, commit_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS intents_finished ON intents (state, updated_ms);
"#,
    ),
    // 7: the last operation the provider refused for good, per resource,
    // with what it was decided from: not sent again until that changes or
    // an operator retries (`Failed`). An older reader ignores the table and
    // sends it again every cycle, as it did: min_reader_format stays 3.
    Step::Sql(
        r#"
CREATE TABLE IF NOT EXISTS failures (
    name TEXT PRIMARY KEY, op_id TEXT NOT NULL, kind TEXT NOT NULL, spec_hash TEXT NOT NULL,
    observed TEXT NOT NULL, message TEXT NOT NULL, failed_ms INTEGER NOT NULL
);
"#,
    ),
    // 8: what tend released (a `Retain` declaration removed from Git),
    // kept after the resource is forgotten: shown once in the reports and
    // on the status branch (`shown`), and named when the declaration comes
    // back; and the last state each commit-status receiver was sent. An
    // older reader ignores both (a release vanishes from its reports, as it
    // did): min_reader_format stays 3.
    Step::Sql(
        r#"
CREATE TABLE IF NOT EXISTS releases (
    name TEXT PRIMARY KEY, provider TEXT NOT NULL, database_name TEXT NOT NULL,
    file TEXT NOT NULL, op_id TEXT NOT NULL, removal_commit TEXT NOT NULL,
    released_ms INTEGER NOT NULL, shown INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS notify_marks (receiver TEXT PRIMARY KEY, mark TEXT NOT NULL);
"#,
    ),
];

/// The PostgreSQL state at this binary's format, created whole (a shared
/// state starts at format 6; a later format adds its tables here with
/// `IF NOT EXISTS`, which the migration runs again on an older schema). The
/// same tables and columns as the SQLite steps above, with `BIGINT` for
/// every integer (times are milliseconds, flags 0/1); and `leases`, the
/// leader lease of each agent group sharing the schema.
pub(super) const POSTGRES: &str = r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS resources (
    name TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    database_name TEXT NOT NULL,
    file TEXT NOT NULL,
    applied_spec_hash TEXT,
    applied_fields TEXT NOT NULL DEFAULT '{}',
    applied_commit TEXT,
    external_id TEXT,
    existed BIGINT NOT NULL DEFAULT 0,
    manifest TEXT NOT NULL DEFAULT '{}',
    last_write_ms BIGINT,
    updated_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS drift_seen (
    name TEXT NOT NULL, field TEXT NOT NULL, first_seen_ms BIGINT NOT NULL,
    PRIMARY KEY (name, field)
);
CREATE TABLE IF NOT EXISTS attempts (
    name TEXT NOT NULL, field TEXT NOT NULL, count BIGINT NOT NULL,
    desired TEXT, observed TEXT,
    PRIMARY KEY (name, field)
);
CREATE TABLE IF NOT EXISTS intents (
    op_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    generation BIGINT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    last_error TEXT,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS intents_by_name ON intents (name, state);
CREATE INDEX IF NOT EXISTS intents_pending ON intents (state) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS intents_by_state ON intents (state);
CREATE INDEX IF NOT EXISTS intents_finished ON intents (state, updated_ms);
CREATE TABLE IF NOT EXISTS tombstones (
    name TEXT PRIMARY KEY,
    manifest TEXT NOT NULL,
    removed_ms BIGINT NOT NULL,
    removal_commit TEXT NOT NULL,
    delete_requested_ms BIGINT,
    last_error TEXT
);
CREATE TABLE IF NOT EXISTS local_overrides (
    name TEXT PRIMARY KEY,
    annotations TEXT NOT NULL,
    set_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS override_seen (
    name TEXT NOT NULL, source TEXT NOT NULL, fingerprint TEXT NOT NULL, first_seen_ms BIGINT NOT NULL,
    PRIMARY KEY (name, source)
);
CREATE TABLE IF NOT EXISTS deletion_holds (
    name TEXT PRIMARY KEY, since_ms BIGINT NOT NULL, due_together BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS deletion_approvals (
    name TEXT PRIMARY KEY, reason TEXT NOT NULL, approved_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS pruned_generations (
    name TEXT NOT NULL, kind TEXT NOT NULL, spec_hash TEXT NOT NULL, count BIGINT NOT NULL,
    PRIMARY KEY (name, kind, spec_hash)
);
CREATE TABLE IF NOT EXISTS notify_conditions (
    subject TEXT NOT NULL, condition TEXT NOT NULL, since_ms BIGINT NOT NULL,
    PRIMARY KEY (subject, condition)
);
CREATE TABLE IF NOT EXISTS notify_outbox (
    id BIGSERIAL PRIMARY KEY,
    receiver TEXT NOT NULL,
    event TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_ms BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS notify_outbox_due ON notify_outbox (next_ms);
CREATE TABLE IF NOT EXISTS status_decided (
    name TEXT PRIMARY KEY, digest TEXT NOT NULL, commit_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (
    name TEXT PRIMARY KEY, op_id TEXT NOT NULL, kind TEXT NOT NULL, spec_hash TEXT NOT NULL,
    observed TEXT NOT NULL, message TEXT NOT NULL, failed_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    name TEXT PRIMARY KEY, provider TEXT NOT NULL, database_name TEXT NOT NULL,
    file TEXT NOT NULL, op_id TEXT NOT NULL, removal_commit TEXT NOT NULL,
    released_ms BIGINT NOT NULL, shown BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS notify_marks (receiver TEXT PRIMARY KEY, mark TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    agent_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    token BIGINT NOT NULL,
    acquired_ms BIGINT NOT NULL,
    renewed_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);
"#;
