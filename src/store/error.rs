//! Store errors. Each message says what was wrong and what to do next; the CLI adds context and
//! prints them, the engine never prints.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("invalid {what} `{value}`: {why}; pass a name like `{example}`")]
    InvalidIdentifier {
        what: String,
        value: String,
        why: String,
        example: &'static str,
    },

    #[error("no database given: pass --database-url or set RELAYBUS_DATABASE_URL (or the libpq variables PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE)")]
    DatabaseUrlMissing,

    #[error("unsupported database URL `{0}`: use postgres:// or postgresql://")]
    UnsupportedUrl(String),

    #[error("MongoDB stores are not available in this build of relaybus; use a PostgreSQL URL (postgres://...)")]
    MongoUnavailable,

    // The driver error is part of the message, not a `#[source]`, so `{:#}` prints it once.
    #[error("could not connect to {target}: {}; check --database-url (or RELAYBUS_DATABASE_URL) and that the server is running", describe(.cause))]
    Connect {
        target: String,
        cause: tokio_postgres::Error,
    },

    #[error("{context}: {}", describe(.cause))]
    Database {
        context: String,
        cause: tokio_postgres::Error,
    },

    #[error("relaybus is not installed in schema \"{schema}\" with prefix \"{prefix}\"; run `relaybus setup` first")]
    NotInstalled { schema: String, prefix: String },

    #[error("the database is at schema 0.1; run `relaybus upgrade --dry-run` to see the conversion, then `relaybus upgrade`")]
    Outdated,

    #[error("the database is at schema {found}, newer than this relaybus ({supported}); use a newer relaybus binary")]
    TooNew { found: String, supported: String },

    #[error("{count} deliveries are still leased by 0.1 workers (until {until}); stop every 0.1 worker first, or rerun with `--force` once they are stopped")]
    LiveLeases { count: i64, until: String },

    #[error("timed out after {timeout} waiting for a lock held by {blockers}; nothing was changed. Retry when that session is done, or raise --lock-timeout")]
    LockTimeout { timeout: String, blockers: String },

    #[error("invalid event {position}: {reason}; nothing of its batch was written")]
    InvalidEvent { position: String, reason: String },
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                s.push_str(&format!(": {detail}"));
            }
            s
        }
        // The driver's text repeats "error connecting to server: "; the cause is what matters.
        None => match std::error::Error::source(e) {
            Some(cause) => cause.to_string(),
            None => e.to_string(),
        },
    }
}

impl StoreError {
    pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |cause| StoreError::Database { context, cause }
    }
}
