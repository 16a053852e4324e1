//! The setup lock, and what a schema change that timed out waiting for a lock tells the
//! operator: the sessions that held it.

use super::super::conn::{db, driver_error};
use super::super::PgStore;
use crate::store::lane::fnv1a_32;
use crate::store::{BlockingSession, Namespace, Result, StoreError};

/// The advisory lock that serialises `setup`, `upgrade` and a rendered script in one schema.
/// Per schema, not per prefix, because `CREATE SCHEMA IF NOT EXISTS` races across prefixes.
pub(super) fn setup_lock_key(ns: &Namespace) -> i64 {
    let hi = fnv1a_32(b"relaybus:setup");
    let lo = fnv1a_32(ns.schema().as_bytes());
    ((u64::from(hi) << 32) | u64::from(lo)) as i64
}

fn is_lock_timeout(e: &StoreError) -> bool {
    driver_error(e).and_then(|e| e.code())
        == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

impl PgStore {
    /// A session of its own that holds the setup lock until it ends: a session lock, since the
    /// work it guards (the online conversion, the contract) takes many transactions. It queues
    /// behind setups and upgrades of the schema as their transaction locks do.
    pub(super) async fn setup_session(&self) -> Result<tokio_postgres::Client> {
        let client = self.pool.options().connect().await?;
        client
            .query_typed(
                "SELECT pg_advisory_lock($1)",
                &[(&setup_lock_key(&self.ns), tokio_postgres::types::Type::INT8)],
            )
            .await
            .map_err(db("could not take the setup lock"))?;
        Ok(client)
    }

    /// Turns a lock timeout into an error naming the sessions that held the locks.
    pub(super) async fn explain_lock_timeout(&self, e: StoreError) -> StoreError {
        if !is_lock_timeout(&e) {
            return e;
        }
        let timeout = humantime::format_duration(self.lock_timeout).to_string();
        let blockers = match self.blocking_sessions().await {
            Ok(b) if !b.is_empty() => b
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            _ => "another session".into(),
        };
        StoreError::LockTimeout { timeout, blockers }
    }

    async fn blocking_sessions(&self) -> Result<Vec<BlockingSession>> {
        let conn = self.pool.get().await?;
        let key = setup_lock_key(&self.ns) as u64;
        let rows = conn
            .query_once(
                &self.sql.blocking_sessions,
                &[
                    &self.ns.schema(),
                    &((key >> 32) as i64),
                    &((key & 0xffff_ffff) as i64),
                ],
            )
            .await
            .map_err(db("could not list the blocking sessions"))?;
        Ok(rows.iter().map(blocking_session).collect())
    }
}

/// A row of `schema/blocking_sessions.sql` or `delivery/blockers.sql`.
pub(in crate::store::postgres) fn blocking_session(r: &tokio_postgres::Row) -> BlockingSession {
    BlockingSession {
        pid: r.get(0),
        user: r.get(1),
        application: r.get(2),
        state: r.get(3),
        age: r.get(4),
        query: r.get(5),
    }
}
