//! Reading the state: every read a cycle needs, in a handful of queries.
//!
//! A row that fails to parse is returned as a [`CorruptRow`], never turned
//! into a default: an empty memory, "no override" or "pending" would turn
//! corruption into action (or inaction) on a production database.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;

use super::row_changes::Covered;
use super::sql::{Row, SqlError, SqlValue, args};
use super::{BackendKind, Freshness, StateStore, time};
use crate::engine::{FailedAttempts, HeldDeletion, Memory};
use crate::journal::StateError;
use crate::model::{ManagedDatabase, SpecHash};

/// A row of the state that cannot be read. Its resource gets no action
/// until the row is repaired or removed (`tend state check` lists them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRow {
    /// The table the row is in.
    pub table: &'static str,
    /// The resource (declaration name) the row belongs to.
    pub name: String,
    pub problem: String,
}

impl std::fmt::Display for CorruptRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} row of `{}`: {}", self.table, self.name, self.problem)
    }
}

/// State of a journalled intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentState {
    /// Journalled; the call may or may not have reached the provider.
    Pending,
    /// Confirmed by an observation.
    Done,
    /// The provider refused it permanently, or it was superseded.
    Failed,
}

impl IntentState {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentState::Pending => "pending",
            IntentState::Done => "done",
            IntentState::Failed => "failed",
        }
    }

    /// A state this binary knows; anything else is a corrupt row (or a
    /// newer format's state, which `min_reader_format` already refuses).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(IntentState::Pending),
            "done" => Some(IntentState::Done),
            "failed" => Some(IntentState::Failed),
            _ => None,
        }
    }
}

/// One journalled operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Intent {
    pub op_id: String,
    pub name: String,
    pub kind: String,
    pub spec_hash: String,
    pub generation: u32,
    /// The request as JSON, replayed with the same id after a crash.
    pub request: Value,
    pub state: IntentState,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub created: SystemTime,
    /// When it last changed (its last attempt or error).
    pub updated: SystemTime,
}

/// An override set on this host (`tend override set`), in annotation form.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalOverride {
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    pub set_at: SystemTime,
}

impl LocalOverride {
    /// Whether it pauses the resource (`tend override set --pause`).
    pub fn is_pause(&self) -> bool {
        self.annotations
            .get(crate::model::overrides::PAUSED)
            .is_some_and(|v| v == "true")
    }
}

/// A removed declaration awaiting its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct TombstoneRow {
    pub name: String,
    pub last: ManagedDatabase,
    pub removed_at: SystemTime,
    pub removal_commit: String,
    pub delete_requested_at: Option<SystemTime>,
    pub last_error: Option<String>,
}

/// An operator's approval of one held deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub reason: String,
    pub approved_at: SystemTime,
}

/// When an override from one source was first seen, and with what content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideSeen {
    pub fingerprint: String,
    pub first_seen: SystemTime,
}

/// Every resource's memory as read from the store, without the applied
/// field values: reading them all would cost more than the rest of the
/// memory, and only a changed spec needs them (see
/// [`StateStore::applied_fields`]).
#[derive(Debug, Default)]
pub struct StoredMemories {
    /// Shared from the start: the agent's cache holds them so, and making
    /// a second map of them (moving every memory into its `Arc`) cost the
    /// CPU-bound start of a one-shot command milliseconds at 10,000.
    pub memories: HashMap<String, Arc<Memory>>,
    /// When they were read (`None`: unknown, never reused).
    pub freshness: Option<super::Freshness>,
    /// Which read of the store's they are (see
    /// [`StateStore::read_memories_since`]).
    pub number: u64,
}

/// A read of the memories made from the one before it.
#[derive(Debug)]
pub enum MemoriesSince {
    /// Every resource's.
    Whole(StoredMemories),
    /// Those of the resources whose rows changed since: `names`; a name
    /// without an entry in `memories` has no memory left.
    Changed {
        names: Vec<String>,
        memories: HashMap<String, Arc<Memory>>,
        freshness: Freshness,
        number: u64,
    },
}

const INTENT_COLUMNS: &str = "op_id, name, kind, spec_hash, generation, request, state, attempts, last_error, created_ms, updated_ms";

fn intent_row(r: &Row) -> Result<Result<Intent, CorruptRow>, SqlError> {
    let name: String = r.get(1)?;
    let op_id: String = r.get(0)?;
    let corrupt = |problem: String| CorruptRow {
        table: "intents",
        name: name.clone(),
        problem: format!("intent {op_id}: {problem}"),
    };
    let state_text: String = r.get(6)?;
    let Some(state) = IntentState::parse(&state_text) else {
        return Ok(Err(corrupt(format!("unknown state `{state_text}`"))));
    };
    let request = match serde_json::from_str(&r.get::<String>(5)?) {
        Ok(v) => v,
        Err(e) => return Ok(Err(corrupt(format!("the request is not JSON ({e})")))),
    };
    Ok(Ok(Intent {
        op_id,
        name: name.clone(),
        kind: r.get(2)?,
        spec_hash: r.get(3)?,
        generation: r.get(4)?,
        request,
        state,
        attempts: r.get(7)?,
        last_error: r.get(8)?,
        created: time(r.get(9)?),
        updated: time(r.get(10)?),
    }))
}

/// One `Arc<str>` for each distinct value read: a column most rows give
/// the same few values of (a commit id, a provider's name) is held once,
/// not as a string a row.
#[derive(Default)]
pub(super) struct SharedStrings(HashSet<Arc<str>>);

impl SharedStrings {
    /// `value`, shared with every equal value shared before.
    /// (Borrowed: an `Arc<str>` copies its bytes even from a `String`, so
    /// a value is copied only the first time.)
    pub(super) fn share(&mut self, value: &str) -> Arc<str> {
        if let Some(known) = self.0.get(value) {
            return known.clone();
        }
        let new: Arc<str> = Arc::from(value);
        self.0.insert(new.clone());
        new
    }
}

impl StateStore {
    /// Maps every row of `sql` through `f`.
    pub(super) fn map_rows<T>(
        &self,
        sql: &str,
        args: &[SqlValue],
        f: impl Fn(&Row) -> Result<T, SqlError>,
    ) -> Result<Vec<T>, StateError> {
        let mut out = Vec::new();
        self.conn()
            .each(sql, args, &mut |row| {
                out.push(f(row)?);
                Ok(())
            })
            .map_err(|e| self.err(e))?;
        Ok(out)
    }

    /// Every resource's memory (without applied field values), in four
    /// queries: a cycle over thousands of resources must not pay queries
    /// for each.
    pub fn read_memories(&self) -> Result<StoredMemories, StateError> {
        let (freshness, number, _) = self.begin_memory_read(None)?;
        self.read_memories_covered((freshness, number), Covered::All, None)
    }

    /// The memories as they are now, read from the last read (`since`: its
    /// freshness and number) when the state can say which resources
    /// changed since (this process's own writes, on SQLite; see
    /// [`super::row_changes`]), else whole.
    pub fn read_memories_since(
        &self,
        since: (Freshness, u64),
    ) -> Result<MemoriesSince, StateError> {
        let (freshness, number, noted) = self.begin_memory_read(Some(since))?;
        match noted {
            Some(count) if count <= super::row_changes::MAX_CHANGED => {
                let names =
                    self.map_rows("SELECT name FROM temp.memory_rows_to_read", &[], |r| {
                        r.get::<String>(0)
                    })?;
                let covered = Covered::Noted;
                let read = self.read_memories_covered((freshness, number), covered, Some(count))?;
                Ok(MemoriesSince::Changed {
                    names,
                    memories: read.memories,
                    freshness,
                    number,
                })
            }
            _ => Ok(MemoriesSince::Whole(self.read_memories_covered(
                (freshness, number),
                Covered::All,
                None,
            )?)),
        }
    }

    /// The memories of the resources `covered`, labelled with the read's
    /// freshness (taken before any row is read: a write meanwhile makes
    /// the next read look again) and number. `count`: how many resources,
    /// when known.
    fn read_memories_covered(
        &self,
        (freshness, number): (Freshness, u64),
        covered: Covered,
        count: Option<usize>,
    ) -> Result<StoredMemories, StateError> {
        // Sized once, and filled row by row: at 10,000 resources, growing
        // it left the old tables behind at every doubling, and a list of
        // the rows beside it doubled the read's peak.
        let count = match count {
            Some(count) => count,
            None => match self.row("SELECT count(*) FROM resources", &[])? {
                Some(row) => {
                    usize::try_from(row.get::<i64>(0).map_err(|e| self.err(e))?).unwrap_or(0)
                }
                None => 0,
            },
        };
        let mut out: HashMap<String, Arc<Memory>> = HashMap::with_capacity(count);
        // The commits and providers, one of each value: most of a fleet
        // was applied at a handful of commits, on a handful of providers.
        let mut shared = SharedStrings::default();
        let in_covered = |prefix: &str, column: &str| covered.filter(prefix, column);
        self.conn()
            .each(
                &format!(
                    "SELECT name, applied_spec_hash, applied_commit, existed, last_write_ms, database_name, provider FROM resources{}",
                    in_covered("WHERE", "name")
                ),
                &[],
                &mut |r| {
                    out.insert(
                        r.get::<String>(0)?,
                        Arc::new(Memory {
                            applied_spec_hash: r.get::<Option<String>>(1)?.map(SpecHash::from),
                            applied_commit: r
                                .get::<Option<String>>(2)?
                                .map(|commit| shared.share(&commit)),
                            existed: r.get::<bool>(3)?,
                            last_write_at: r.get::<Option<i64>>(4)?.map(time),
                            database_name: Some(r.get(5)?),
                            provider: Some(shared.share(r.text(6)?)),
                            ..Memory::default()
                        }),
                    );
                    Ok(())
                },
            )
            .map_err(|e| self.err(e))?;
        for (name, field, seen) in self.map_rows(
            &format!(
                "SELECT name, field, first_seen_ms FROM drift_seen{}",
                in_covered("WHERE", "name")
            ),
            &[],
            |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?, r.get::<i64>(2)?)),
        )? {
            Arc::make_mut(out.entry(name).or_default())
                .drift_first_seen
                .insert(field, time(seen));
        }
        // Writes journalled after the last confirmed apply and never
        // confirmed: pending, or superseded (the call may have been
        // sent before a crash), or a create that failed (it may have made
        // the database and been refused halfway: a setting, an
        // extension). A refused update changed nothing tend must own:
        // what it left is what was there (drift of its own origin).
        for name in self.map_rows(
            &format!(
                "SELECT DISTINCT i.name FROM intents i LEFT JOIN resources r ON r.name = i.name \
                 WHERE (i.state = 'pending' OR (i.state = 'failed' AND (i.kind = 'create' OR i.last_error LIKE 'superseded:%'))) \
                 AND i.kind IN ('create', 'update') \
                 AND (r.name IS NULL OR r.applied_spec_hash IS NULL OR i.created_ms >= r.updated_ms){}",
                in_covered("AND", "i.name")
            ),
            &[],
            |r| r.get::<String>(0),
        )? {
            Arc::make_mut(out.entry(name).or_default()).unconfirmed_write = true;
        }
        // A state written before format 4 has no values: its counts read
        // as counted against nothing, so they never hold a field.
        let values = if self.has_column("attempts", "desired") {
            "desired, observed"
        } else {
            "NULL, NULL"
        };
        for (name, field, attempts) in self.map_rows(
            &format!(
                "SELECT name, field, count, {values} FROM attempts{}",
                in_covered("WHERE", "name")
            ),
            &[],
            |r| {
                // An unreadable value counts against nothing (the field is
                // tried again), never against everything.
                let value = |i: usize| -> Option<Value> {
                    r.get::<Option<String>>(i)
                        .ok()
                        .flatten()
                        .and_then(|t| serde_json::from_str(&t).ok())
                };
                Ok((
                    r.get::<String>(0)?,
                    r.get::<String>(1)?,
                    FailedAttempts {
                        count: r.get::<u32>(2)?,
                        desired: value(3),
                        observed: value(4),
                    },
                ))
            },
        )? {
            Arc::make_mut(out.entry(name).or_default())
                .failed_attempts
                .insert(field, attempts);
        }
        // Format 7: operations the provider refused for good.
        if self.has_table("failures")? {
            for (name, failure) in self.map_rows(
                &format!(
                    "SELECT name, op_id, kind, spec_hash, observed, message, failed_ms FROM failures{}",
                    in_covered("WHERE", "name")
                ),
                &[],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        crate::engine::OperationFailure {
                            operation_id: r.get(1)?,
                            kind: r.get(2)?,
                            spec_hash: SpecHash::from(r.get::<String>(3)?),
                            observed: r.get(4)?,
                            message: r.get(5)?,
                            at: time(r.get::<i64>(6)?),
                        },
                    ))
                },
            )? {
                Arc::make_mut(out.entry(name).or_default()).failure = Some(Box::new(failure));
            }
        }
        Ok(StoredMemories {
            memories: out,
            freshness: Some(freshness),
            number,
        })
    }

    /// The applied spec hash and field values of `names`, read together
    /// (a writer beside a reader may have applied a new spec since the
    /// memories were read, and the two must describe one apply). A value
    /// that does not parse is a [`CorruptRow`].
    #[allow(clippy::type_complexity)]
    pub fn applied_fields(
        &self,
        names: &[String],
    ) -> Result<
        Vec<(
            String,
            Option<SpecHash>,
            Result<BTreeMap<String, Value>, CorruptRow>,
        )>,
        StateError,
    > {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let row = self.row(
                "SELECT applied_spec_hash, applied_fields FROM resources WHERE name = ?1",
                args![name],
            )?;
            let Some(row) = row else { continue };
            let (hash, text): (Option<String>, String) =
                (|| Ok((row.get(0)?, row.get(1)?)))().map_err(|e: SqlError| self.err(e))?;
            let fields = serde_json::from_str(&text).map_err(|e| CorruptRow {
                table: "resources",
                name: name.clone(),
                problem: format!("the applied field values are not a JSON object ({e})"),
            });
            out.push((name.clone(), hash.map(SpecHash::from), fields));
        }
        Ok(out)
    }

    /// The last declaration seen of a managed resource, and its file.
    #[allow(clippy::type_complexity)]
    pub fn manifest_and_file(
        &self,
        name: &str,
    ) -> Result<Option<Result<(ManagedDatabase, String), CorruptRow>>, StateError> {
        let row = self
            .map_rows(
                "SELECT manifest, file FROM resources WHERE name = ?1",
                args![name],
                |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
            )?
            .into_iter()
            .next();
        Ok(row.map(|(manifest, file)| {
            serde_json::from_str(&manifest)
                .map(|m| (m, file))
                .map_err(|e| CorruptRow {
                    table: "resources",
                    name: name.to_string(),
                    problem: format!("the last declaration seen cannot be read ({e})"),
                })
        }))
    }

    /// Whether the state holds a resource or a tombstone named `name`.
    pub fn knows_resource(&self, name: &str) -> Result<bool, StateError> {
        Ok(self
            .map_rows(
                "SELECT (SELECT count(*) FROM resources WHERE name = ?1) \
                 + (SELECT count(*) FROM tombstones WHERE name = ?1)",
                args![name],
                |r| r.get::<i64>(0),
            )?
            .first()
            .is_some_and(|n| *n > 0))
    }

    /// Every tombstone.
    pub fn tombstones(&self) -> Result<Vec<Result<TombstoneRow, CorruptRow>>, StateError> {
        self.map_rows(
            "SELECT name, manifest, removed_ms, removal_commit, delete_requested_ms, last_error FROM tombstones ORDER BY name",
            &[],
            |r| {
                let name: String = r.get(0)?;
                let manifest: String = r.get(1)?;
                Ok(match serde_json::from_str::<ManagedDatabase>(&manifest) {
                    Ok(last) => Ok(TombstoneRow {
                        name,
                        last,
                        removed_at: time(r.get(2)?),
                        removal_commit: r.get(3)?,
                        delete_requested_at: r.get::<Option<i64>>(4)?.map(time),
                        last_error: r.get(5)?,
                    }),
                    Err(e) => Err(CorruptRow {
                        table: "tombstones",
                        name,
                        problem: format!("the removed declaration cannot be read ({e})"),
                    }),
                })
            },
        )
    }

    /// Every local override.
    pub fn local_overrides(&self) -> Result<Vec<Result<LocalOverride, CorruptRow>>, StateError> {
        self.map_rows(
            "SELECT name, annotations, set_ms FROM local_overrides ORDER BY name",
            &[],
            |r| {
                let name: String = r.get(0)?;
                let text: String = r.get(1)?;
                Ok(match serde_json::from_str(&text) {
                    Ok(annotations) => Ok(LocalOverride {
                        name,
                        annotations,
                        set_at: time(r.get(2)?),
                    }),
                    Err(e) => Err(CorruptRow {
                        table: "local_overrides",
                        name,
                        problem: format!("the override cannot be read ({e})"),
                    }),
                })
            },
        )
    }

    /// When each override (by resource and source) was first seen.
    pub fn overrides_seen(&self) -> Result<HashMap<(String, String), OverrideSeen>, StateError> {
        Ok(self
            .map_rows(
                "SELECT name, source, fingerprint, first_seen_ms FROM override_seen",
                &[],
                |r| {
                    Ok((
                        (r.get(0)?, r.get(1)?),
                        OverrideSeen {
                            fingerprint: r.get(2)?,
                            first_seen: time(r.get(3)?),
                        },
                    ))
                },
            )?
            .into_iter()
            .collect())
    }

    fn intents_where(
        &self,
        clause: &str,
        args: &[SqlValue],
    ) -> Result<Vec<Result<Intent, CorruptRow>>, StateError> {
        let sql = format!(
            "SELECT {INTENT_COLUMNS} FROM intents WHERE {clause} ORDER BY created_ms, op_id"
        );
        self.map_rows(&sql, args, intent_row)
    }

    /// Intents not finished: pending ones, and rows whose state this binary
    /// does not know (corrupt). Index range scans only: the journal holds
    /// every finished intent too.
    pub fn open_intents(&self) -> Result<Vec<Result<Intent, CorruptRow>>, StateError> {
        self.intents_where(
            "state < 'done' OR (state > 'done' AND state < 'failed') OR state > 'failed'",
            &[],
        )
    }

    /// Intents journalled but not confirmed (readable ones only).
    pub fn pending_intents(&self) -> Result<Vec<Intent>, StateError> {
        Ok(self
            .open_intents()?
            .into_iter()
            .filter_map(Result::ok)
            .filter(|i| i.state == IntentState::Pending)
            .collect())
    }

    /// Every intent of one resource (`explain`), unreadable rows included.
    pub fn intents_of(&self, name: &str) -> Result<Vec<Result<Intent, CorruptRow>>, StateError> {
        self.intents_where("name = ?1", args![name])
    }

    /// Every readable intent (tests, `state show`).
    pub fn all_intents(&self) -> Result<Vec<Intent>, StateError> {
        Ok(self
            .intents_where("1 = 1", &[])?
            .into_iter()
            .filter_map(Result::ok)
            .collect())
    }

    /// Whether the database has `table`: a reader never migrates, so a
    /// state written by an older format lacks the newer tables (read as
    /// empty: nothing was held or approved before they existed). A
    /// PostgreSQL state is created whole at one format: every table is
    /// there.
    pub(super) fn has_table(&self, table: &str) -> Result<bool, StateError> {
        if self.kind == BackendKind::Postgres {
            return Ok(true);
        }
        Ok(self
            .map_rows(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                args![table],
                |r| r.get::<i64>(0),
            )?
            .first()
            .is_some_and(|n| *n > 0))
    }

    /// Whether `table` has `column` (a reader of an older format's state,
    /// which it never migrates).
    fn has_column(&self, table: &str, column: &str) -> bool {
        self.kind == BackendKind::Postgres
            || self
                .rows(&format!("SELECT {column} FROM {table} LIMIT 0"), &[])
                .is_ok()
    }

    /// Approvals of held deletions, by resource.
    pub fn approvals(&self) -> Result<HashMap<String, Approval>, StateError> {
        if !self.has_table("deletion_approvals")? {
            return Ok(HashMap::new());
        }
        Ok(self
            .map_rows(
                "SELECT name, reason, approved_ms FROM deletion_approvals",
                &[],
                |r| {
                    Ok((
                        r.get(0)?,
                        Approval {
                            reason: r.get(1)?,
                            approved_at: time(r.get(2)?),
                        },
                    ))
                },
            )?
            .into_iter()
            .collect())
    }

    /// Deletions the mass-deletion guard holds, by resource.
    pub fn held_deletions(&self) -> Result<HashMap<String, HeldDeletion>, StateError> {
        if !self.has_table("deletion_holds")? {
            return Ok(HashMap::new());
        }
        Ok(self
            .map_rows(
                "SELECT name, since_ms, due_together FROM deletion_holds",
                &[],
                |r| {
                    Ok((
                        r.get(0)?,
                        HeldDeletion {
                            since: time(r.get(1)?),
                            due_together: usize::try_from(r.get::<i64>(2)?).unwrap_or(usize::MAX),
                        },
                    ))
                },
            )?
            .into_iter()
            .collect())
    }

    /// How many operations of this kind on this spec were completed: the
    /// generation of the next one (a new correction of recurring drift must
    /// not reuse the id of the last one). Finished intents pruned from the
    /// journal are still counted (`pruned_generations`): a reused id would
    /// be answered by the provider with the old operation's result.
    pub fn next_generation(
        &self,
        name: &str,
        kind: &str,
        spec_hash: &SpecHash,
    ) -> Result<u32, StateError> {
        // A state older than format 3 (read by a reader, which never
        // migrates) has pruned nothing yet.
        let sql = if self.has_table("pruned_generations")? {
            "SELECT (SELECT count(*) FROM intents WHERE name = ?1 AND kind = ?2 AND spec_hash = ?3 AND state != 'pending')
                  + coalesce((SELECT count FROM pruned_generations WHERE name = ?1 AND kind = ?2 AND spec_hash = ?3), 0)"
        } else {
            "SELECT count(*) FROM intents WHERE name = ?1 AND kind = ?2 AND spec_hash = ?3 AND state != 'pending'"
        };
        Ok(self
            .map_rows(sql, args![name, kind, spec_hash.to_string()], |r| {
                r.get::<u32>(0)
            })?
            .first()
            .copied()
            .unwrap_or(0))
    }
}
