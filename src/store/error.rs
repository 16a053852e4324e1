//! Store errors. Each message says what was wrong and what to do next; the CLI adds context and
//! prints them, the engine never prints. A driver's error is kept boxed, so callers can inspect
//! it without the type naming any engine.

use thiserror::Error;

/// A driver's error, whatever the engine.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("invalid {what} `{value}`: {why}; pass a name like `{example}`")]
    InvalidIdentifier {
        what: String,
        value: String,
        why: String,
        example: &'static str,
    },

    #[error("unsupported database URL `{0}`: use postgres://, postgresql://, key=value pairs (host=... dbname=...), mongodb:// or mongodb+srv://")]
    UnsupportedUrl(String),

    #[error("invalid connection string `{shown}`: {why}")]
    InvalidConnectionString { shown: String, why: String },

    #[error("SQL handlers run only on a PostgreSQL store, in the transaction that completes the delivery; on MongoDB use an --exec or --webhook handler")]
    StatementsUnsupported,

    // The driver's error is described in the message (`detail`), not chained as a source, so
    // `{:#}` prints it once.
    // What to check depends on where the URL came from, which the command line knows: it adds
    // that (`cli::Unavailable`).
    #[error("could not connect to {target}: {detail}")]
    Connect {
        target: String,
        detail: String,
        cause: BoxError,
    },

    #[error("{target} is a standalone server; relaybus needs a replica set (a single node is enough) or a sharded cluster, since deliveries are completed in transactions and workers are woken by a change stream, neither of which a standalone server has: start mongod with --replSet rs0 and run rs.initiate() once")]
    NotReplicaSet { target: String },

    #[error("{context}: {detail}")]
    Database {
        context: String,
        detail: String,
        cause: BoxError,
    },

    #[error(
        "relaybus is not installed in {container} \"{schema}\" with prefix \"{prefix}\"; {}",
        advice::SETUP
    )]
    NotInstalled {
        container: &'static str,
        schema: String,
        prefix: String,
    },

    #[error("the relaybus schema in {container} \"{schema}\" with prefix \"{prefix}\" is incomplete (no version row, a table, column or collection missing, indexes that differ from 0.2's, or publish functions missing or from another relaybus); {}", advice::SETUP)]
    Incomplete {
        container: &'static str,
        schema: String,
        prefix: String,
    },

    #[error("the database is at schema 0.1; {}", advice::UPGRADE)]
    Outdated,

    #[error(
        "the database is at schema {found}, newer than this relaybus ({supported}); {}",
        advice::NEWER
    )]
    TooNew { found: String, supported: String },

    #[error("objects of relaybus's names that are not relaybus's are in the way: {found}; choose another --schema or --prefix, or move them; nothing was changed")]
    ForeignObjects { found: String },

    #[error("the statement does not run on this database: {detail}; its parameters are $1 event id (text), $2 payload (jsonb), $3 key (text), $4 type (text), $5 headers (jsonb), $6 delivery id (text), $7 attempt (int4)")]
    InvalidStatement { detail: String },

    #[error("{count} deliveries are still leased by 0.1 workers (until {until}); stop every 0.1 worker first, then run `relaybus upgrade --force` (or wait until the leases expire)")]
    LiveLeases { count: i64, until: String },

    #[error("0.1 publishers are still writing: {rows} rows since the conversion, the last at {last}, within --quiet-for {quiet_for}; nothing was changed. Roll the rest of the application to 0.2 and run `relaybus upgrade --contract` again once none has written for that long, or with --force to contract now (a 0.1 publisher's next insert then fails)")]
    LegacyWrites {
        rows: i64,
        last: String,
        quiet_for: String,
    },

    #[error("indexes that are not relaybus's name what 0.2 removes (a 0.1 lease column or the status `processing`): the conversion would drop them or leave them meaningless; nothing was changed. Drop them first, then rerun: {statements}")]
    BlockingIndexes { statements: String },

    #[error("timed out after {timeout} waiting for a lock held by {blockers}; nothing was changed. Retry when that session is done, or raise --lock-timeout")]
    LockTimeout { timeout: String, blockers: String },

    #[error("invalid event {position}: {reason}; nothing of its batch was written")]
    InvalidEvent { position: String, reason: String },

    #[error("event `{id}` {why}; nothing of its batch was written")]
    ConflictingEvent { id: String, why: &'static str },
}

/// What to run about the schema: these errors say it, and so does `SchemaStatus::advice`.
pub(super) mod advice {
    pub(in crate::store) const UPGRADE: &str =
        "run `relaybus upgrade --dry-run` to see the conversion, then `relaybus upgrade`";
    pub(in crate::store) const NEWER: &str = "use a newer relaybus binary";
    pub(in crate::store) const SETUP: &str = "run `relaybus setup`";
}
