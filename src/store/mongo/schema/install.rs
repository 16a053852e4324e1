//! The install: collections, indexes, the 256 lanes and the version document.

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::detect::*;
use super::indexes::*;
use crate::store::mongo::conn::command_code;
use crate::store::mongo::model::LANE_RULES;
use crate::store::mongo::{MongoStore, COMPLETIONS, DELIVERIES, EVENTS, LANES, SCHEMA};
use crate::store::{Result, SCHEMA_VERSION};

impl MongoStore {
    /// Creates what is missing and repairs indexes that differ, leaving data alone.
    pub(in crate::store::mongo) async fn install(&self) -> Result<()> {
        let db = self.db().await?;
        let existing = self.existing().await?;
        for c in COLLECTIONS {
            if !existing.iter().any(|e| e == c) {
                match db.create_collection(self.name(c)).await {
                    Err(e) if command_code(&e) == Some(48) => {}
                    other => other.map_err(self.conn.error(format!("could not create {c}")))?,
                }
            }
        }
        for c in [DELIVERIES, EVENTS, COMPLETIONS] {
            let (dropped, created) = drift(c, &self.indexes_of(c).await?);
            let coll = self.coll(c).await?;
            for name in dropped {
                coll.drop_index(&name)
                    .await
                    .map_err(self.conn.error(format!("could not drop the index {name}")))?;
            }
            let specs: Vec<Document> = indexes()
                .into_iter()
                .filter(|s| s.collection == c && created.contains(&s.name))
                .map(|s| index_document(&s))
                .collect();
            if !specs.is_empty() {
                db.run_command(doc! { "createIndexes": self.name(c), "indexes": specs })
                    .await
                    .map_err(
                        self.conn
                            .error(format!("could not create the indexes of {c}")),
                    )?;
            }
        }
        let lanes: Vec<Document> = (0..256)
            .map(|lane: i32| {
                doc! {
                    "q": { "_id": lane },
                    "u": { "$setOnInsert": {
                        "epoch": 0_i64, "owner": Bson::Null, "holder": Bson::Null,
                        "leaseExpiresAt": Bson::Null, "inFlight": [], "lost": [],
                    } },
                    "upsert": true,
                }
            })
            .collect();
        db.run_command(doc! { "update": self.name(LANES), "updates": lanes })
            .await
            .map_err(self.conn.error("could not seed the lanes"))?;
        let lanes = self.coll(LANES).await?;
        for rule in &LANE_RULES {
            lanes
                .update_many(rule.broken(), rule.repair(DateTime::now()))
                .await
                .map_err(self.conn.error("could not repair the lanes"))?;
        }
        self.coll(SCHEMA)
            .await?
            .update_one(
                doc! { "_id": VERSION_ID },
                doc! { "$set": { "version": SCHEMA_VERSION } },
            )
            .upsert(true)
            .await
            .map_err(self.conn.error("could not record the schema version"))?;
        Ok(())
    }
}
