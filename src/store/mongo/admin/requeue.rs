//! Dead letters: counted and requeued by a selector.

use mongodb::bson::{doc, DateTime, Document, Regex};

use super::super::model::{ids, literal};
use super::super::{MongoStore, DELIVERIES, EVENTS, READY};
use super::with_type;
use crate::store::{DeadLetters, RequeueSelector, Result};

impl MongoStore {
    /// The delivery filter of a requeue selector, without the event type.
    fn dead_filter(&self, s: &RequeueSelector) -> Document {
        let mut f = doc! { "status": "dead" };
        if !s.ids.is_empty() {
            f.insert("_id", doc! { "$in": &s.ids });
        }
        if let Some(h) = &s.handler {
            f.insert("handler", h);
        }
        if let Some(e) = &s.error_contains {
            f.insert(
                "lastError",
                Regex {
                    pattern: literal(e),
                    options: String::new(),
                },
            );
        }
        f
    }

    /// The dead deliveries a selector names, with the event type checked through a join.
    async fn selected_dead(&self, s: &RequeueSelector) -> Result<Vec<String>> {
        let failed = self.conn.error("could not select dead deliveries");
        let mut pipeline = vec![doc! { "$match": self.dead_filter(s) }];
        if let Some(t) = &s.event_type {
            pipeline.push(with_type(&self.name(EVENTS)));
            pipeline.push(doc! { "$match": { "event.type": t } });
        }
        pipeline.push(doc! { "$project": { "_id": 1 } });
        let cursor = self
            .conn
            .collection(&self.name(DELIVERIES))
            .await?
            .aggregate(pipeline)
            .await
            .map_err(&failed)?;
        ids(cursor).await.map_err(&failed)
    }
}

impl DeadLetters for MongoStore {
    async fn count_dead(&self, s: &RequeueSelector) -> Result<i64> {
        Ok(self.selected_dead(s).await?.len() as i64)
    }

    /// Every selected delivery still dead becomes pending, due now, with a fresh budget and a new
    /// claim; a keyed one holds back its key's followers as any head does.
    async fn requeue(&self, s: &RequeueSelector) -> Result<Vec<String>> {
        let ids = self.selected_dead(s).await?;
        if ids.is_empty() {
            return Ok(ids);
        }
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        self.conn
            .transaction("could not requeue", async move |session| {
                let cursor = deliveries
                    .find(doc! { "_id": { "$in": &ids }, "status": "dead" })
                    .projection(doc! { "_id": 1 })
                    .session(&mut *session)
                    .await?;
                let still: Vec<String> = super::super::model::all_in(cursor, session)
                    .await?
                    .iter()
                    .filter_map(|d| d.get_str("_id").ok().map(str::to_owned))
                    .collect();
                let now = DateTime::now();
                deliveries
                    .update_many(
                        doc! { "_id": { "$in": &still }, "status": "dead" },
                        doc! {
                            "$set": {
                                "status": "pending", "attempts": 0, "dueAt": now,
                                "updatedAt": now, "lane": READY, "holdsBack": 1,
                            },
                            "$inc": { "claims": 1 },
                        },
                    )
                    .session(&mut *session)
                    .await?;
                Ok(still)
            })
            .await
    }
}
