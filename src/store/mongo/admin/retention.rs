//! Retention: completed history, dead letters and events past their age, purged in batches.

use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime};

use super::super::model::all;
use super::super::publish::bson_i64;
use super::super::{MongoStore, COMPLETIONS, DELIVERIES, EVENTS};
use super::before;
use crate::store::{PurgeBatch, PurgeCounts, PurgeKind, PurgeOptions, Result, Retention};

impl MongoStore {
    /// Events older than the cutoff without deliveries, deleted in a transaction that reads
    /// their deliveries: a publish that adds one to such an event writes the event too, so the
    /// two conflict and the event is kept.
    async fn purge_events(&self, cutoff: DateTime, batch: i64) -> Result<PurgeBatch> {
        let events = self.conn.collection(&self.name(EVENTS)).await?;
        let delivery_name = self.name(DELIVERIES);
        self.conn
            .transaction("could not purge events", async move |s| {
                let cursor = events
                    .aggregate([
                        doc! { "$match": { "createdAt": { "$lt": cutoff } } },
                        doc! { "$sort": { "createdAt": 1 } },
                        doc! { "$lookup": {
                            "from": &delivery_name, "localField": "_id", "foreignField": "eventId",
                            "as": "left", "pipeline": [{ "$limit": 1 }, { "$project": { "_id": 1 } }],
                        } },
                        doc! { "$match": { "left": { "$size": 0 } } },
                        doc! { "$limit": batch },
                        doc! { "$project": { "_id": 1 } },
                    ])
                    .session(&mut *s)
                    .await?;
                let ids: Vec<Bson> = super::super::model::all_in(cursor, s)
                    .await?
                    .into_iter()
                    .filter_map(|d| d.get("_id").cloned())
                    .collect();
                let deleted = events
                    .delete_many(doc! { "_id": { "$in": &ids } })
                    .session(&mut *s)
                    .await?
                    .deleted_count as i64;
                Ok(PurgeBatch {
                    deleted,
                    more: ids.len() as i64 == batch,
                })
            })
            .await
    }
}

impl Retention for MongoStore {
    async fn purge_count(&self, o: &PurgeOptions) -> Result<PurgeCounts> {
        let failed = self.conn.error("could not count what a purge would delete");
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let mut counts = PurgeCounts::default();
        if let Some(age) = o.dead_older_than {
            counts.dead = deliveries
                .count_documents(doc! { "status": "dead", "updatedAt": { "$lt": before(age) } })
                .await
                .map_err(&failed)? as i64;
        }
        let Some(age) = o.completed_older_than else {
            return Ok(counts);
        };
        let cutoff = before(age);
        counts.completed = deliveries
            .count_documents(doc! { "status": "completed", "completedAt": { "$lt": cutoff } })
            .await
            .map_err(&failed)? as i64;
        counts.history = self
            .conn
            .collection(&self.name(COMPLETIONS))
            .await?
            .count_documents(doc! { "completedAt": { "$lt": cutoff } })
            .await
            .map_err(&failed)? as i64;
        // Events old enough whose every delivery goes in this purge.
        let mut gone = vec![doc! { "status": "completed", "completedAt": { "$lt": cutoff } }];
        if let Some(dead_age) = o.dead_older_than {
            gone.push(doc! { "status": "dead", "updatedAt": { "$lt": before(dead_age) } });
        }
        let cursor = self
            .conn
            .collection(&self.name(EVENTS))
            .await?
            .aggregate([
                doc! { "$match": { "createdAt": { "$lt": cutoff } } },
                doc! { "$lookup": {
                    "from": self.name(DELIVERIES), "localField": "_id", "foreignField": "eventId",
                    "as": "left",
                    "pipeline": [{ "$match": { "$nor": gone } }, { "$limit": 1 }, { "$project": { "_id": 1 } }],
                } },
                doc! { "$match": { "left": { "$size": 0 } } },
                doc! { "$count": "n" },
            ])
            .await
            .map_err(&failed)?;
        counts.events = all(cursor)
            .await
            .map_err(&failed)?
            .first()
            .and_then(|d| d.get("n").map(bson_i64))
            .unwrap_or(0);
        Ok(counts)
    }

    async fn purge_batch(&self, kind: PurgeKind, age: Duration, batch: i64) -> Result<PurgeBatch> {
        let cutoff = before(age);
        let (collection, filter, order) = match kind {
            PurgeKind::Dead => (
                DELIVERIES,
                doc! { "status": "dead", "updatedAt": { "$lt": cutoff } },
                doc! { "updatedAt": 1 },
            ),
            PurgeKind::Completed => (
                DELIVERIES,
                doc! { "status": "completed", "completedAt": { "$lt": cutoff } },
                doc! { "completedAt": 1 },
            ),
            PurgeKind::History => (
                COMPLETIONS,
                doc! { "completedAt": { "$lt": cutoff } },
                doc! { "completedAt": 1 },
            ),
            PurgeKind::Events => return self.purge_events(cutoff, batch).await,
        };
        let failed = self.conn.error("could not purge");
        let coll = self.conn.collection(&self.name(collection)).await?;
        let ids: Vec<Bson> = all(coll
            .find(filter)
            .sort(order)
            .limit(batch)
            .projection(doc! { "_id": 1 })
            .await
            .map_err(&failed)?)
        .await
        .map_err(&failed)?
        .into_iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
        let deleted = coll
            .delete_many(doc! { "_id": { "$in": &ids } })
            .await
            .map_err(&failed)?
            .deleted_count as i64;
        Ok(PurgeBatch {
            deleted,
            more: ids.len() as i64 == batch,
        })
    }
}
