//! Putting dead letters back to work: counting what a selector picks, and requeueing it in one
//! statement that only ever touches rows that are still dead.

use super::super::conn::db;
use super::super::PgStore;
use crate::store::{DeadLetters, RequeueSelector, Result};

/// The ids of a selector as the statements take them: none means any.
fn ids(s: &RequeueSelector) -> Option<&[String]> {
    (!s.ids.is_empty()).then_some(s.ids.as_slice())
}

impl DeadLetters for PgStore {
    async fn count_dead(&self, s: &RequeueSelector) -> Result<i64> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(
                &self.sql.count_dead,
                &[&ids(s), &s.handler, &s.event_type, &s.error_contains],
            )
            .await
            .map_err(db("could not count dead deliveries"))?;
        Ok(rows[0].get(0))
    }

    async fn requeue(&self, s: &RequeueSelector) -> Result<Vec<String>> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(
                &self.sql.requeue,
                &[&ids(s), &s.handler, &s.event_type, &s.error_contains],
            )
            .await
            .map_err(db("could not requeue dead deliveries; nothing was changed"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
