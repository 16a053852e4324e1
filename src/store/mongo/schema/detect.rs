//! What is installed: the collections, their indexes, the version document, and 0.1 leases.

use futures_util::TryStreamExt;
use mongodb::bson::{doc, DateTime, Document};
use mongodb::{Collection, Database, IndexModel};

use super::indexes::*;
use crate::store::mongo::model::{chrono, LANE_RULES};
use crate::store::mongo::{
    MongoStore, COMPLETIONS, DELIVERIES, EVENTS, KEY_SEQUENCES, LANES, SCHEMA,
};
use crate::store::{LiveLeases, Result, SchemaStatus, StoreError, SCHEMA_VERSION};

pub(in crate::store::mongo) const VERSION_ID: &str = "version";

impl MongoStore {
    pub(in crate::store::mongo) async fn db(&self) -> Result<Database> {
        self.conn.database().await
    }

    pub(in crate::store::mongo) async fn coll(&self, name: &str) -> Result<Collection<Document>> {
        self.conn.collection(&self.name(name)).await
    }

    /// The relaybus collections that exist.
    pub(in crate::store::mongo) async fn existing(&self) -> Result<Vec<String>> {
        let names = self
            .db()
            .await?
            .list_collection_names()
            .await
            .map_err(self.conn.error("could not list the collections"))?;
        Ok(COLLECTIONS
            .iter()
            .filter(|c| names.contains(&self.name(c)))
            .map(|c| c.to_string())
            .collect())
    }

    pub(in crate::store::mongo) async fn indexes_of(
        &self,
        collection: &str,
    ) -> Result<Vec<IndexModel>> {
        let failed = self
            .conn
            .error(format!("could not list the indexes of {collection}"));
        let cursor = self
            .coll(collection)
            .await?
            .list_indexes()
            .await
            .map_err(&failed)?;
        cursor.try_collect().await.map_err(&failed)
    }

    /// The index drift of every indexed collection that exists.
    pub(in crate::store::mongo) async fn all_drift(
        &self,
        existing: &[String],
    ) -> Result<(Vec<String>, Vec<String>)> {
        let (mut dropped, mut created) = (vec![], vec![]);
        for c in [DELIVERIES, EVENTS, COMPLETIONS] {
            let found = if existing.iter().any(|e| e == c) {
                self.indexes_of(c).await?
            } else {
                vec![]
            };
            let (mut d, n) = drift(c, &found);
            d.sort();
            dropped.extend(d.into_iter().map(|d| format!("{}.{d}", self.name(c))));
            created.extend(n.into_iter().map(|n| format!("{}.{n}", self.name(c))));
        }
        Ok((dropped, created))
    }

    pub(in crate::store::mongo) async fn version(&self) -> Result<Option<String>> {
        let found = self
            .coll(SCHEMA)
            .await?
            .find_one(doc! { "_id": VERSION_ID })
            .await
            .map_err(self.conn.error("could not read the schema version"))?;
        Ok(found.and_then(|d| d.get_str("version").ok().map(str::to_owned)))
    }

    /// A 0.1 store, or what is left of one: deliveries without a lane, events without
    /// handlers, or, unless the store records 0.2 (a conversion writes that last, so a 0.1
    /// index on such a store was made since: `doctor` names it and `setup` drops it), a 0.1
    /// index. No index covers the first two, so on a converted store this reads both
    /// collections through.
    pub(in crate::store::mongo) async fn is_0_1(&self, existing: &[String]) -> Result<bool> {
        if !existing.iter().any(|e| e == DELIVERIES) {
            return Ok(false);
        }
        let unconverted = |c, field: &'static str| async move {
            if !existing.iter().any(|e| e == c) {
                return Ok(false);
            }
            Ok(self
                .coll(c)
                .await?
                .find_one(doc! { field: { "$exists": false } })
                .projection(doc! { "_id": 1 })
                .await
                .map_err(self.conn.error(format!("could not read the {c}")))?
                .is_some())
        };
        if unconverted(DELIVERIES, "laneId").await? || unconverted(EVENTS, "handlers").await? {
            return Ok(true);
        }
        let versioned = existing.iter().any(|e| e == SCHEMA)
            && self.version().await?.as_deref() == Some(SCHEMA_VERSION);
        Ok(!versioned
            && self
                .indexes_of(DELIVERIES)
                .await?
                .iter()
                .any(|f| retired().iter().any(|r| same_keys(r, &f.keys))))
    }

    /// `detect`, and then a store that records 0.2 over documents 0.2 never wrote (an install
    /// applied over a 0.1 store) is 0.1, so that it is converted, and one with a lane document
    /// that breaks the rules is incomplete, so that `setup` repairs it. `setup`, `upgrade` and
    /// `doctor` look; the check every other command makes does not, since it reads the
    /// deliveries and events through (and workers leave such a lane alone meanwhile).
    pub(in crate::store::mongo) async fn detect_thoroughly(&self) -> Result<SchemaStatus> {
        let found = self.detect().await?;
        // An expanded store takes 0.1 documents on purpose: its workers adopt them.
        if matches!(found, SchemaStatus::Current | SchemaStatus::Incomplete)
            && self.is_0_1(&self.existing().await?).await?
        {
            return Ok(SchemaStatus::V01);
        }
        if found.is_current() && self.unsound_lanes().await? {
            return Ok(SchemaStatus::Incomplete);
        }
        Ok(found)
    }

    /// Whether a lane document breaks the rules (`LANE_RULES`).
    async fn unsound_lanes(&self) -> Result<bool> {
        let lanes = self.coll(LANES).await?;
        for rule in &LANE_RULES {
            let broken = lanes
                .find_one(rule.broken())
                .projection(doc! { "_id": 1 })
                .await
                .map_err(self.conn.error("could not read the lanes"))?;
            if broken.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub(in crate::store::mongo) async fn detect(&self) -> Result<SchemaStatus> {
        let existing = self.existing().await?;
        let version = if existing.iter().any(|e| e == SCHEMA) {
            self.version().await?
        } else {
            None
        };
        Ok(match version.as_deref() {
            Some(SCHEMA_VERSION)
                if existing.len() != COLLECTIONS.len()
                    || self.all_drift(&existing).await? != (vec![], vec![])
                    || self.lane_count().await? != 256 =>
            {
                SchemaStatus::Incomplete
            }
            Some(SCHEMA_VERSION) => match self.expansion().await? {
                Some(expansion) => SchemaStatus::Expanded(expansion),
                None => SchemaStatus::Current,
            },
            Some(v) => SchemaStatus::Newer { version: v.into() },
            None if self.is_0_1(&existing).await? => SchemaStatus::V01,
            // The schema collection alone holds no more than the setup lock.
            None if existing.iter().any(|e| e != SCHEMA) => SchemaStatus::Incomplete,
            None => SchemaStatus::NotInstalled,
        })
    }

    pub(in crate::store::mongo) async fn lane_count(&self) -> Result<u64> {
        self.coll(LANES)
            .await?
            .count_documents(doc! { "_id": { "$gte": 0, "$lt": 256 } })
            .await
            .map_err(self.conn.error("could not count the lanes"))
    }

    /// Refuses collections of the relaybus names whose documents are not relaybus's: a document
    /// without one of the fields (of a lane: without all of them, since a lane document that
    /// lost one is relaybus's to repair).
    pub(in crate::store::mongo) async fn refuse_foreign(&self, existing: &[String]) -> Result<()> {
        let shapes: [(&str, &[&str]); 4] = [
            (EVENTS, &["type", "payload"]),
            (DELIVERIES, &["eventId", "handler", "status"]),
            (LANES, &["epoch", "inFlight", "lost"]),
            (KEY_SEQUENCES, &["lastSequence"]),
        ];
        let mut found = vec![];
        for (c, fields) in shapes {
            if !existing.iter().any(|e| e == c) {
                continue;
            }
            let missing: Vec<Document> = fields
                .iter()
                .map(|f| doc! { *f: { "$exists": false } })
                .collect();
            let odd = if c == LANES {
                doc! { "$and": missing }
            } else {
                doc! { "$or": missing }
            };
            let odd = self
                .coll(c)
                .await?
                .find_one(odd)
                .projection(doc! { "_id": 1 })
                .await
                .map_err(self.conn.error("could not look at the collections"))?;
            if odd.is_some() {
                found.push(format!(
                    "`{}.{}` (documents without {})",
                    self.ns.schema(),
                    self.name(c),
                    fields.join(", ")
                ));
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        Err(StoreError::ForeignObjects {
            found: found.join(", "),
        })
    }

    pub(in crate::store::mongo) async fn live_leases(&self) -> Result<LiveLeases> {
        let deliveries = self.coll(DELIVERIES).await?;
        let filter = doc! { "status": "processing", "leaseExpiresAt": { "$gt": DateTime::now() } };
        let failed = self.conn.error("could not count live 0.1 leases");
        let count = deliveries
            .count_documents(filter.clone())
            .await
            .map_err(&failed)?;
        let last = deliveries
            .find_one(filter)
            .sort(doc! { "leaseExpiresAt": -1 })
            .await
            .map_err(&failed)?;
        Ok(LiveLeases {
            count: count as i64,
            until: last
                .and_then(|d| d.get_datetime("leaseExpiresAt").ok().copied())
                .map(|at| chrono(at).to_rfc3339()),
        })
    }
}
