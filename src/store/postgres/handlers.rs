//! Pauses and circuit breakers: one row per handler, changed under its row lock.

use tokio_postgres::{Client, Row};

use super::conn::db;
use super::PgStore;
use crate::store::handlers::{BreakerPolicy, HandlerRow};
use crate::store::{Handlers, Result};

fn row(r: &Row) -> HandlerRow {
    HandlerRow {
        handler: r.get(0),
        paused_at: r.get(1),
        paused_by: r.get(2),
        pause_reason: r.get(3),
        failures: r.get(4),
        opened: r.get(5),
        open_until: r.get(6),
        breaker_policy: BreakerPolicy::stored(r.get(7), r.get(8)),
    }
}

impl PgStore {
    /// Locks the handler's row (inserting it when missing), applies `change` and writes what it
    /// left, in one transaction.
    async fn change_locked(
        &self,
        client: &mut Client,
        handler: &str,
        change: &(dyn Fn(&mut HandlerRow) -> bool + Sync),
    ) -> Result<Option<HandlerRow>, tokio_postgres::Error> {
        let tx = client.transaction().await?;
        let lock = &self.sql.lock_handler;
        let mut c = row(&tx
            .query_typed_one(&lock.text, &lock.typed(&[&handler]))
            .await?);
        if !change(&mut c) {
            return Ok(None);
        }
        let write = &self.sql.write_handler;
        let max_cooldown_ms = c.breaker_policy.max_cooldown_ms();
        let values: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
            &c.handler,
            &c.paused_at,
            &c.paused_by,
            &c.pause_reason,
            &c.failures,
            &c.opened,
            &c.open_until,
            &c.breaker_policy.threshold,
            &max_cooldown_ms,
        ];
        tx.execute_typed(&write.text, &write.typed(&values)).await?;
        tx.commit().await?;
        Ok(Some(c))
    }
}

impl Handlers for PgStore {
    async fn handler_rows(&self) -> Result<Vec<HandlerRow>> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(&self.sql.handler_rows, &[])
            .await
            .map_err(db("could not read the handlers table"))?;
        Ok(rows.iter().map(row).collect())
    }

    async fn forget_handler(&self, handler: &str) -> Result<bool> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(&self.sql.forget_handler, &[&handler])
            .await
            .map_err(db("could not remove the handler's row"))?;
        Ok(!rows.is_empty())
    }

    async fn change_handler(
        &self,
        handler: &str,
        change: &(dyn Fn(&mut HandlerRow) -> bool + Sync),
    ) -> Result<Option<HandlerRow>> {
        let mut conn = self.pool.get().await?;
        let changed = self.change_locked(&mut conn.client, handler, change).await;
        if let Err(e) = &changed {
            conn.note(e);
        }
        changed.map_err(db(format!(
            "could not change the row of handler `{handler}`"
        )))
    }
}
