//! Pauses and circuit breakers: one row per handler, changed under its row lock.

use tokio_postgres::{Client, Row};

use super::conn::db;
use super::PgStore;
use crate::store::controls::HandlerControl;
use crate::store::{Controls, Result};

fn control(r: &Row) -> HandlerControl {
    HandlerControl {
        handler: r.get(0),
        paused_at: r.get(1),
        paused_by: r.get(2),
        pause_reason: r.get(3),
        failures: r.get(4),
        opened: r.get(5),
        open_until: r.get(6),
    }
}

impl PgStore {
    /// Locks the handler's row (inserting it when missing), applies `change` and writes what it
    /// left, in one transaction.
    async fn change_locked(
        &self,
        client: &mut Client,
        handler: &str,
        change: &(dyn Fn(&mut HandlerControl) -> bool + Sync),
    ) -> Result<Option<HandlerControl>, tokio_postgres::Error> {
        let tx = client.transaction().await?;
        let lock = &self.sql.lock_controls;
        let mut c = control(
            &tx.query_typed_one(&lock.text, &lock.typed(&[&handler]))
                .await?,
        );
        if !change(&mut c) {
            return Ok(None);
        }
        let write = &self.sql.write_controls;
        let values: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
            &c.handler,
            &c.paused_at,
            &c.paused_by,
            &c.pause_reason,
            &c.failures,
            &c.opened,
            &c.open_until,
        ];
        tx.execute_typed(&write.text, &write.typed(&values)).await?;
        tx.commit().await?;
        Ok(Some(c))
    }
}

impl Controls for PgStore {
    async fn controls(&self) -> Result<Vec<HandlerControl>> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(&self.sql.controls, &[])
            .await
            .map_err(db("could not read the handlers' controls"))?;
        Ok(rows.iter().map(control).collect())
    }

    async fn forget_controls(&self, handler: &str) -> Result<bool> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(&self.sql.forget_controls, &[&handler])
            .await
            .map_err(db("could not remove the handler's controls"))?;
        Ok(!rows.is_empty())
    }

    async fn change_controls(
        &self,
        handler: &str,
        change: &(dyn Fn(&mut HandlerControl) -> bool + Sync),
    ) -> Result<Option<HandlerControl>> {
        let mut conn = self.pool.get().await?;
        let changed = self.change_locked(&mut conn.client, handler, change).await;
        if let Err(e) = &changed {
            conn.note(e);
        }
        changed.map_err(db(format!(
            "could not change the controls of handler `{handler}`"
        )))
    }
}
