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
        loop {
            let now = DateTime::now();
            let taken = schema
                .update_one(
                    doc! { "_id": LOCK_ID, "$or": [
                        { "expiresAt": { "$lte": now } }, { "holder": &me },
                    ] },
                    doc! { "$set": { "holder": &me, "expiresAt": after(now, LOCK_LEASE) } },
                )
                .upsert(true)
                .await;
            match taken {
                Ok(_) => break,
                Err(e) if is_duplicate_key(&e) => {
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
