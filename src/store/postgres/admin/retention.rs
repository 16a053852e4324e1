//! Retention: what a purge would delete, and one bounded batch of one kind at a time.

use std::time::Duration;

use super::super::conn::db;
use super::super::PgStore;
use super::seconds;
use crate::store::{PurgeBatch, PurgeCounts, PurgeKind, PurgeOptions, Result, Retention};

impl PgStore {
    /// Events without deliveries: the candidates are locked first, then checked again by a new
    /// statement, whose snapshot is younger than the locks. A publish that added a delivery
    /// before the lock is seen and the event kept; one after it waits for the lock, then finds
    /// the event gone and fails (its retry is a new event). A pending delivery is never cascaded
    /// away.
    async fn purge_events_batch(&self, age: Duration, batch: i64) -> Result<PurgeBatch> {
        let mut conn = self.pool.get().await?;
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(db("could not begin the purge"))?;
        let lock = &self.sql.purge_events_lock;
        let candidates: Vec<String> = tx
            .query_typed(&lock.text, &lock.typed(&[&seconds(age), &batch]))
            .await
            .map_err(db("could not select events to purge"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if candidates.is_empty() {
            return Ok(PurgeBatch {
                deleted: 0,
                more: false,
            });
        }
        let delete = &self.sql.purge_events_delete;
        let deleted = tx
            .execute_typed(&delete.text, &delete.typed(&[&candidates]))
            .await
            .map_err(db("could not purge events"))? as i64;
        tx.commit()
            .await
            .map_err(db("could not commit the purge"))?;
        // Candidates that gained a delivery in between are kept and no longer selected.
        Ok(PurgeBatch {
            deleted,
            more: true,
        })
    }
}

impl Retention for PgStore {
    async fn purge_count(&self, o: &PurgeOptions) -> Result<PurgeCounts> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(
                &self.sql.purge_count,
                &[
                    &o.dead_older_than.map(seconds),
                    &o.completed_older_than.map(seconds),
                ],
            )
            .await
            .map_err(db("could not count what the purge would delete"))?;
        let r = &rows[0];
        Ok(PurgeCounts {
            dead: r.get(0),
            completed: r.get(1),
            history: r.get(2),
            events: r.get(3),
        })
    }

    async fn purge_batch(&self, kind: PurgeKind, age: Duration, batch: i64) -> Result<PurgeBatch> {
        let sql = match kind {
            PurgeKind::Dead => &self.sql.purge_dead,
            PurgeKind::Completed => &self.sql.purge_completed,
            PurgeKind::History => &self.sql.purge_history,
            PurgeKind::Events => return self.purge_events_batch(age, batch).await,
        };
        let mut conn = self.pool.get().await?;
        let deleted = conn
            .execute(sql, &[&seconds(age), &batch])
            .await
            .map_err(db("could not purge"))? as i64;
        Ok(PurgeBatch {
            deleted,
            more: deleted > 0,
        })
    }
}
