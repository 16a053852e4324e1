//! The setup lock: a lease on a document that queues setups and upgrades of one store.

use std::time::Duration;

use mongodb::bson::{doc, DateTime, Document};
use mongodb::Collection;

use crate::store::mongo::conn::is_duplicate_key;
use crate::store::mongo::model::after;
use crate::store::mongo::{MongoStore, SCHEMA};
use crate::store::Result;

/// The setup lock's lease; its holder renews it while it works.
pub(in crate::store::mongo) const LOCK_LEASE: Duration = Duration::from_secs(30);

pub(in crate::store::mongo) const LOCK_ID: &str = "setup-lock";

/// The setup lock, held until released (or, if the process dies, until its lease expires).
pub(in crate::store::mongo) struct SetupLock {
    schema: Collection<Document>,
    me: String,
    renew: tokio::task::JoinHandle<()>,
}

impl SetupLock {
    pub(in crate::store::mongo) async fn release(self) {
        self.renew.abort();
        let _ = self
            .schema
            .delete_one(doc! { "_id": LOCK_ID, "holder": &self.me })
            .await;
    }
}

impl MongoStore {
    /// Takes the setup lock, waiting as long as another setup or upgrade holds it, and keeps
    /// it until the guard is dropped.
    pub(in crate::store::mongo) async fn lock(&self) -> Result<SetupLock> {
        let schema = self.coll(SCHEMA).await?;
        let me = uuid::Uuid::now_v7().to_string();
        let failed = self.conn.error("could not take the setup lock");
        let (host, pid) = (crate::identity::hostname(), std::process::id() as i64);
        loop {
            let now = DateTime::now();
            let taken = schema
                .update_one(
                    doc! { "_id": LOCK_ID, "$or": [
                        { "expiresAt": { "$lte": now } }, { "holder": &me },
                    ] },
                    doc! { "$set": {
                        "holder": &me, "host": &host, "pid": pid,
                        "expiresAt": after(now, LOCK_LEASE),
                    } },
                )
                .upsert(true)
                .await;
            match taken {
                Ok(_) => break,
                Err(e) if is_duplicate_key(&e) => {
                    self.free_if_holder_died(&schema, &host).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(failed(e)),
            }
        }
        let renew = {
            let (schema, me) = (schema.clone(), me.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LOCK_LEASE / 3).await;
                    let _ = schema
                        .update_one(
                            doc! { "_id": LOCK_ID, "holder": &me },
                            doc! { "$set": { "expiresAt": after(DateTime::now(), LOCK_LEASE) } },
                        )
                        .await;
                }
            })
        };
        Ok(SetupLock { schema, me, renew })
    }

    /// Frees the setup lock when its holder was a process of this machine that is gone (a
    /// setup or upgrade killed and run again), instead of waiting out the lease of the dead.
    async fn free_if_holder_died(&self, schema: &Collection<Document>, host: &str) {
        let Ok(Some(held)) = schema.find_one(doc! { "_id": LOCK_ID }).await else {
            return;
        };
        let pid = held.get_i64("pid").ok().and_then(|p| i32::try_from(p).ok());
        let here = held.get_str("host").is_ok_and(|h| h == host);
        let gone = |pid| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH)
        };
        if let (true, Some(pid)) = (here, pid) {
            if gone(pid) {
                let holder = held.get_str("holder").unwrap_or_default();
                let _ = schema
                    .delete_one(doc! { "_id": LOCK_ID, "holder": holder })
                    .await;
            }
        }
    }

    /// Refuses collections of relaybus's names that are not relaybus's, and a 0.1 store that
    /// 0.1 workers still hold leases in (unless `force`).
    pub(in crate::store::mongo) async fn refuse(&self, force: bool) -> Result<()> {
        let existing = self.existing().await?;
        self.refuse_foreign(&existing).await?;
        if self.is_0_1(&existing).await? {
            self.live_leases().await?.refuse_unless(force)?;
        }
        Ok(())
    }
}
