//! `upgrade --contract`: the end of an online conversion's expansion. The trigger that gave a
//! 0.1 publisher's deliveries their lane and handlers, its function and the table that counted
//! those writes go, in one transaction, and the store is exactly a fresh install. The check
//! that no 0.1 write came within the quiet period is made again under the lock that keeps 0.1
//! inserts out, so no write slips in between the check and the drop.

use std::time::Duration;

use super::super::conn::db;
use super::super::sql::sql_file;
use super::super::PgStore;
use super::online::{is_lock_timeout, LOCK_TRIES, LOCK_WAIT};
use super::render::render;
use crate::store::{ContractPlan, Expansion, Locks, Result, SchemaStatus};

const CONTRACT: &str = sql_file!("online/contract");

impl PgStore {
    pub(super) async fn plan_contract(&self) -> Result<Option<ContractPlan>> {
        let conn = self.pool.get().await?;
        let SchemaStatus::Expanded(expansion) = self.detect(&conn.client).await? else {
            return Ok(None);
        };
        let ns = &self.ns;
        Ok(Some(ContractPlan {
            expansion,
            drops: vec![
                format!(
                    "trigger {} on {}",
                    ns.table_name("legacy_delivery"),
                    ns.table("deliveries")
                ),
                format!("function {}()", ns.table("legacy_delivery")),
                format!("table {}", ns.table("legacy_writes")),
            ],
            locks: Locks {
                what: format!(
                    "{} for catalog changes only (milliseconds), waiting at most {} ms for it and \
                     then trying again; readers and 0.2 writers wait that long at most",
                    ns.table("deliveries"),
                    LOCK_WAIT.as_millis()
                ),
                expected_seconds: Some(0.05),
            },
        }))
    }

    pub(super) async fn contract_expansion(
        &self,
        quiet_for: Duration,
        force: bool,
    ) -> Result<Option<Expansion>> {
        let mut client = self.setup_session().await?;
        let SchemaStatus::Expanded(found) = self.detect(&client).await? else {
            return Ok(None);
        };
        found.refuse_recent(quiet_for, force)?;
        let lock = format!(
            "SET LOCAL lock_timeout = {}; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            LOCK_WAIT.as_millis(),
            self.ns.table("deliveries")
        );
        let failed = || db("`upgrade --contract` failed; nothing was changed, run it again");
        let mut tries = 0;
        loop {
            tries += 1;
            let tx = client
                .transaction()
                .await
                .map_err(db("could not begin a transaction"))?;
            match tx.batch_execute(&lock).await {
                Ok(()) => {}
                Err(e) if is_lock_timeout(&e) && tries < LOCK_TRIES => {
                    drop(tx);
                    tokio::time::sleep(LOCK_WAIT).await;
                    continue;
                }
                Err(e) => return Err(failed()(e)),
            }
            // No 0.1 insert can come in now: what was written until here is all there is.
            let last = self.expansion(&tx).await?;
            last.refuse_recent(quiet_for, force)?;
            tx.batch_execute(&render(&self.ns, CONTRACT))
                .await
                .map_err(failed())?;
            tx.commit().await.map_err(failed())?;
            return Ok(Some(last));
        }
    }
}
