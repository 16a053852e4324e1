//! What is installed, and what follows from it: the one place that says which command brings a
//! store to the current schema, and when a conversion must wait for 0.1 workers.

use serde::Serialize;

use super::error::advice;
use super::{Namespace, StoreError};

/// The schema version this binary installs and works with.
pub const SCHEMA_VERSION: &str = "0.2";

/// What is installed in a namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SchemaStatus {
    NotInstalled,
    /// A 0.1 store (deliveries still carry `lease_token`).
    V01,
    /// Tables exist but the version row is missing (an interrupted or hand-applied install), the
    /// indexes differ from 0.2's (renamed, redefined or dropped by hand), or the publish
    /// functions are missing or another binary's.
    Incomplete,
    Current,
    /// Current, and still taking a 0.1 publisher's writes: an online conversion left it so, for a
    /// rolling deploy, until `upgrade --contract`.
    Expanded(Expansion),
    Newer {
        version: String,
    },
}

/// What 0.1 publishers have written to an expanded store since its conversion.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Expansion {
    /// Deliveries 0.1 publishers wrote (on MongoDB: the deliveries adopted).
    pub legacy_rows: i64,
    pub last_legacy_write: Option<chrono::DateTime<chrono::Utc>>,
}

impl Expansion {
    /// How long `upgrade --contract` waits, unless told otherwise, without a 0.1 write.
    pub const QUIET_FOR: std::time::Duration = std::time::Duration::from_secs(600);

    /// What `setup --check`, `doctor` and `upgrade --dry-run` say of it.
    pub fn describe(&self) -> String {
        let last = match self.last_legacy_write {
            Some(at) => format!(
                "{} rows from 0.1 publishers so far, the last at {}",
                self.legacy_rows,
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None => "no 0.1 write since the conversion".into(),
        };
        format!("0.2, expanded: 0.1 publishers accepted ({last})")
    }

    /// Whether a 0.1 write came within `quiet_for` of `now`.
    pub fn recent(
        &self,
        quiet_for: std::time::Duration,
        now: chrono::DateTime<chrono::Utc>,
    ) -> bool {
        let quiet = chrono::Duration::from_std(quiet_for).unwrap_or(chrono::Duration::MAX);
        self.last_legacy_write.is_some_and(|at| now - at < quiet)
    }

    /// `upgrade --contract`'s refusal while 0.1 publishers still write: a 0.1 write within
    /// `quiet_for`, unless `force`.
    pub fn refuse_recent(&self, quiet_for: std::time::Duration, force: bool) -> super::Result<()> {
        if force || !self.recent(quiet_for, chrono::Utc::now()) {
            return Ok(());
        }
        Err(StoreError::LegacyWrites {
            rows: self.legacy_rows,
            last: self
                .last_legacy_write
                .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default(),
            quiet_for: humantime::format_duration(quiet_for).to_string(),
        })
    }
}

impl SchemaStatus {
    pub fn describe(&self) -> String {
        match self {
            SchemaStatus::NotInstalled => "not installed".into(),
            SchemaStatus::V01 => "0.1".into(),
            SchemaStatus::Incomplete => "0.2 (incomplete)".into(),
            SchemaStatus::Current => SCHEMA_VERSION.into(),
            SchemaStatus::Expanded(e) => e.describe(),
            SchemaStatus::Newer { version } => version.clone(),
        }
    }

    /// Whether 0.2 workers and commands run on it as it is.
    pub fn is_current(&self) -> bool {
        matches!(self, SchemaStatus::Current | SchemaStatus::Expanded(_))
    }

    /// What to run to make the store current.
    pub fn advice(&self) -> &'static str {
        match self {
            SchemaStatus::V01 => advice::UPGRADE,
            SchemaStatus::Newer { .. } => advice::NEWER,
            SchemaStatus::Current => "nothing to do",
            SchemaStatus::Expanded(_) => {
                "roll every publisher to 0.2, then run `relaybus upgrade --contract` (it waits \
                 for 10 minutes without a 0.1 write; `--dry-run` shows what it drops)"
            }
            SchemaStatus::NotInstalled | SchemaStatus::Incomplete => advice::SETUP,
        }
    }

    /// The error a command that needs the current schema shows, or none when it is current.
    pub fn error(&self, ns: &Namespace) -> Option<StoreError> {
        let (container, schema, prefix) = (
            ns.container(),
            ns.schema().to_owned(),
            ns.prefix().to_owned(),
        );
        match self {
            SchemaStatus::Current | SchemaStatus::Expanded(_) => None,
            SchemaStatus::V01 => Some(StoreError::Outdated),
            SchemaStatus::Newer { version } => Some(StoreError::TooNew {
                found: version.clone(),
                supported: SCHEMA_VERSION.into(),
            }),
            SchemaStatus::NotInstalled => Some(StoreError::NotInstalled {
                container,
                schema,
                prefix,
            }),
            SchemaStatus::Incomplete => Some(StoreError::Incomplete {
                container,
                schema,
                prefix,
            }),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SetupOutcome {
    pub before: SchemaStatus,
    pub after: SchemaStatus,
}

/// Deliveries of a 0.1 store that 0.1 workers still hold under a live lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveLeases {
    pub count: i64,
    /// When the last of them expires, as the server prints it.
    pub until: Option<String>,
}

impl LiveLeases {
    /// A conversion must not run under live 0.1 workers, unless the operator says they are
    /// stopped (`force`).
    pub fn refuse_unless(&self, force: bool) -> Result<(), StoreError> {
        if self.count == 0 || force {
            return Ok(());
        }
        Err(StoreError::LiveLeases {
            count: self.count,
            until: self.until.clone().unwrap_or_default(),
        })
    }
}

/// How the 0.1 -> 0.2 conversion runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Conversion {
    /// One transaction holding the tables throughout: the shortest conversion, during which
    /// the application waits.
    Offline,
    /// Short batches while the tables stay writable; the locks it takes are held for catalog
    /// changes only. On MongoDB every conversion is this one.
    Online,
}

/// One step of the 0.1 -> 0.2 conversion, as planned.
#[derive(Clone, Debug, Serialize)]
pub struct UpgradeStep {
    pub name: String,
    /// What it does, naming the objects it changes.
    pub description: String,
    /// Rows (or documents) the step rewrites, where it rewrites any.
    pub rows: Option<i64>,
}

/// How far a running conversion has come: step `step` (counted from 1, as in the plan) has
/// rewritten `rows` of its rows so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpgradeProgress {
    pub step: usize,
    pub rows: u64,
}

/// What `upgrade` would do, read without writing anything.
#[derive(Clone, Debug, Serialize)]
pub struct UpgradePlan {
    pub found: SchemaStatus,
    /// Empty unless a conversion is due.
    pub steps: Vec<UpgradeStep>,
    pub counts: UpgradeCounts,
    pub live_leases: LiveLeases,
    /// What the conversion locks, and so what waits while it runs.
    pub locks: Locks,
    /// Indexes of relaybus's tables that relaybus did not create: kept, unless they block.
    pub foreign_indexes: Vec<ForeignIndex>,
}

impl UpgradePlan {
    /// The plan of a store that has no conversion due: `found` and nothing else.
    pub(crate) fn nothing_due(found: SchemaStatus) -> Self {
        Self {
            found,
            steps: vec![],
            counts: UpgradeCounts::default(),
            live_leases: LiveLeases::default(),
            locks: Locks::default(),
            foreign_indexes: vec![],
        }
    }

    /// A conversion must not drop, or leave meaningless, an index that is not relaybus's.
    pub fn refuse_blocking_indexes(&self) -> Result<(), StoreError> {
        let drop: Vec<String> = self
            .foreign_indexes
            .iter()
            .filter(|i| i.blocks)
            .map(|i| i.drop_statement.clone())
            .collect();
        if drop.is_empty() {
            return Ok(());
        }
        Err(StoreError::BlockingIndexes {
            statements: drop.join(" "),
        })
    }
}

/// An index of a relaybus table that relaybus did not create (the application's): relaybus
/// lists it and never drops it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForeignIndex {
    pub name: String,
    /// As the server prints it (`CREATE INDEX ...`).
    pub definition: String,
    /// It names what 0.2 removes (a 0.1 lease column or the status `processing`), so the
    /// conversion refuses until it is dropped.
    pub blocks: bool,
    pub drop_statement: String,
    /// A 0.2 index of the same table whose key columns include all of its own: it may be
    /// redundant, which only its owner can tell.
    pub covered_by: Option<String>,
}

/// What `upgrade --contract` would do to an expanded store.
#[derive(Clone, Debug, Serialize)]
pub struct ContractPlan {
    pub expansion: Expansion,
    /// What it drops, by name.
    pub drops: Vec<String>,
    pub locks: Locks,
}

/// What a conversion locks, and for how long it expects to.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Locks {
    pub what: String,
    /// The expected hold for these rows, where one lock is held throughout.
    pub expected_seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct UpgradeCounts {
    pub events: i64,
    pub deliveries: i64,
    pub pending: i64,
    pub processing: i64,
    pub completed: i64,
    pub dead: i64,
}
