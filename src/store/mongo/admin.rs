//! The operator's queries on MongoDB: listings, one delivery or event, dead letters and requeue,
//! retention, lanes and per-handler statistics. "processing" is derived as on every store: a
//! pending delivery its lane lists in flight under a live lease.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document, Regex};

use super::json;
use super::model::{all, chrono, ids, lane_ids, literal, Delivery, Lane};
use super::publish::bson_i64;
use super::{MongoStore, COMPLETIONS, DELIVERIES, EVENTS, READY};
use crate::store::lane::lane_of;
use crate::store::{
    DeadLetters, DeliveryDetail, DeliveryFilter, DeliveryRow, DeliveryStatus, EventDetail,
    EventName, HandlerBacklog, HandlerStats, Inspect, KeyBacklog, LaneRow, LeaseToken, PurgeBatch,
    PurgeCounts, PurgeKind, PurgeOptions, Record, RequeueSelector, Result, Retention,
};

/// Deliveries shown with one event.
const EVENT_DELIVERIES: i64 = 10_000;

fn before(age: Duration) -> DateTime {
    DateTime::from_millis(
        DateTime::now()
            .timestamp_millis()
            .saturating_sub(age.as_millis() as i64),
    )
}

/// Joins each delivery's event type, as `type`.
fn with_type(events: &str) -> Document {
    doc! { "$lookup": {
        "from": events, "localField": "eventId", "foreignField": "_id", "as": "event",
        "pipeline": [{ "$project": { "type": 1, "key": 1, "createdAt": 1 } }],
    } }
}

fn type_of(d: &Document) -> Option<&Document> {
    d.get_array("event").ok()?.first()?.as_document()
}

/// Deliveries read with their event's type (`with_type`), as listings show them.
fn rows(found: Vec<Document>, in_flight: &HashSet<String>) -> Vec<DeliveryRow> {
    found
        .into_iter()
        .filter_map(|d| {
            let event_type = type_of(&d)
                .and_then(|e| e.get_str("type").ok())
                .unwrap_or_default()
                .to_owned();
            let delivery: Delivery = mongodb::bson::from_document(d).ok()?;
            let processing = in_flight.contains(&delivery.id);
            Some(delivery.row(event_type, processing))
        })
        .collect()
}

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

    /// Completed rows kept from 0.1 and the completion history, newest first.
    async fn list_completed(&self, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
        let failed = self.conn.error("could not list completed deliveries");
        let events = self.name(EVENTS);
        let mut rows = vec![];
        let mut kept = doc! { "status": "completed" };
        let mut history = Document::new();
        if let Some(h) = &f.handler {
            kept.insert("handler", h);
            history.insert("handler", h);
        }
        if let Some(e) = &f.event_id {
            kept.insert("eventId", e);
            history.insert("eventId", e);
        }
        let mut after_join = Document::new();
        if let Some(k) = &f.key {
            after_join.insert("event.key", k);
        }
        if let Some(t) = &f.event_type {
            after_join.insert("event.type", t);
        }
        for (collection, filter) in [(DELIVERIES, kept), (COMPLETIONS, history)] {
            let cursor = self
                .conn
                .collection(&self.name(collection))
                .await?
                .aggregate([
                    doc! { "$match": filter },
                    with_type(&events),
                    doc! { "$match": after_join.clone() },
                    doc! { "$sort": { "completedAt": -1 } },
                    doc! { "$limit": f.limit },
                ])
                .await
                .map_err(&failed)?;
            for d in all(cursor).await.map_err(&failed)? {
                let event = type_of(&d).cloned().unwrap_or_default();
                let event_type = event.get_str("type").unwrap_or_default().to_owned();
                if collection == DELIVERIES {
                    if let Ok(delivery) = mongodb::bson::from_document::<Delivery>(d) {
                        rows.push(delivery.row(event_type, false));
                    }
                    continue;
                }
                rows.push(DeliveryRow {
                    id: None,
                    event_id: d.get_str("eventId").unwrap_or_default().to_owned(),
                    event_type,
                    handler: d.get_str("handler").unwrap_or_default().to_owned(),
                    status: "completed".into(),
                    attempts: d.get("attempts").map(bson_i64).unwrap_or(0) as i32,
                    key: event.get_str("key").ok().map(str::to_owned),
                    sequence: None,
                    lane: None,
                    available_at: None,
                    last_error: None,
                    created_at: event.get_datetime("createdAt").ok().map(|at| chrono(*at)),
                    updated_at: None,
                    completed_at: d.get_datetime("completedAt").ok().map(|at| chrono(*at)),
                });
            }
        }
        rows.sort_by_key(|r| std::cmp::Reverse(r.completed_at));
        rows.truncate(f.limit.max(0) as usize);
        Ok(rows)
    }

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
                let ids: Vec<Bson> = super::model::all_in(cursor, s)
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

impl Inspect for MongoStore {
    async fn list_deliveries(&self, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
        if f.status == Some(DeliveryStatus::Completed) {
            return self.list_completed(f).await;
        }
        let failed = self.conn.error("could not list deliveries");
        let in_flight = self.in_flight().await?;
        let live: Vec<&str> = in_flight.iter().map(String::as_str).collect();
        let mut m = Document::new();
        match f.status {
            Some(DeliveryStatus::Dead) => {
                m.insert("status", "dead");
            }
            Some(DeliveryStatus::Pending) => {
                m.insert("status", "pending");
                m.insert("_id", doc! { "$nin": &live });
            }
            Some(DeliveryStatus::Processing) => {
                m.insert("status", "pending");
                m.insert("_id", doc! { "$in": &live });
            }
            _ => {}
        }
        if let Some(h) = &f.handler {
            m.insert("handler", h);
        }
        if let Some(k) = &f.key {
            m.insert("key", k);
            m.insert("laneId", i32::from(lane_of(Some(k), "")));
        }
        if let Some(e) = &f.event_id {
            m.insert("eventId", e);
        }
        if let Some(after) = &f.after {
            m = doc! { "$and": [m, { "_id": { "$gt": after } }] };
        }
        let mut pipeline = vec![
            doc! { "$match": m },
            doc! { "$sort": { "_id": 1 } },
            with_type(&self.name(EVENTS)),
        ];
        if let Some(t) = &f.event_type {
            pipeline.push(doc! { "$match": { "event.type": t } });
        }
        pipeline.push(doc! { "$limit": f.limit });
        let cursor = self
            .conn
            .collection(&self.name(DELIVERIES))
            .await?
            .aggregate(pipeline)
            .await
            .map_err(&failed)?;
        Ok(rows(all(cursor).await.map_err(&failed)?, &in_flight))
    }

    async fn show_delivery(&self, id: &str) -> Result<Option<DeliveryDetail>> {
        let failed = self.conn.error("could not read the delivery");
        let found = self
            .conn
            .collection(&self.name(DELIVERIES))
            .await?
            .find_one(doc! { "_id": id })
            .await
            .map_err(&failed)?;
        let Some(found) = found else {
            return Ok(None);
        };
        let delivery: Delivery = mongodb::bson::from_document(found)
            .map_err(|e| failed(mongodb::error::Error::from(e)))?;
        let event_type = self
            .conn
            .collection(&self.name(EVENTS))
            .await?
            .find_one(doc! { "_id": &delivery.event_id })
            .projection(doc! { "type": 1 })
            .await
            .map_err(&failed)?
            .and_then(|e| e.get_str("type").ok().map(str::to_owned))
            .unwrap_or_default();
        let lane: Option<Lane> = match delivery.lane_id {
            Some(l) => self
                .lane_collection()
                .await?
                .find_one(doc! { "_id": l })
                .await
                .map_err(&failed)?,
            None => None,
        };
        let now = DateTime::now();
        let processing = lane
            .as_ref()
            .is_some_and(|l| l.live(now) && l.in_flight.contains(&delivery.id));
        let claims = delivery.claims;
        let row = delivery.row(event_type, processing);
        let lane_epoch = lane.as_ref().map_or(0, |l| l.epoch);
        Ok(Some(DeliveryDetail {
            lease_token: processing.then(|| {
                LeaseToken {
                    delivery_id: id.to_owned(),
                    lane: row.lane.unwrap_or(0),
                    epoch: lane_epoch,
                    claims,
                    row: None,
                }
                .to_string()
            }),
            lane_owner: lane.as_ref().and_then(|l| l.owner.clone()),
            lease_expires_at: lane.as_ref().and_then(|l| l.lease_expires_at).map(chrono),
            claims,
            lane_epoch,
            delivery: row,
        }))
    }

    async fn show_event(&self, id: &str) -> Result<Option<EventDetail>> {
        let found = self
            .conn
            .collection(&self.name(EVENTS))
            .await?
            .find_one(doc! { "_id": id })
            .await
            .map_err(self.conn.error("could not read the event"))?;
        let Some(e) = found else {
            return Ok(None);
        };
        let deliveries = self
            .list_deliveries(&DeliveryFilter {
                event_id: Some(id.to_owned()),
                limit: EVENT_DELIVERIES,
                ..Default::default()
            })
            .await?;
        Ok(Some(EventDetail {
            id: id.to_owned(),
            event_type: e.get_str("type").unwrap_or_default().to_owned(),
            key: e.get_str("key").ok().map(str::to_owned),
            payload: e.get("payload").map(json::to_json).unwrap_or_default(),
            headers: e
                .get("headers")
                .map(json::to_json)
                .unwrap_or_else(|| serde_json::json!({})),
            handlers: e
                .get_array("handlers")
                .map(|a| {
                    a.iter()
                        .filter_map(|h| h.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            created_at: e
                .get_datetime("createdAt")
                .map(|at| chrono(*at))
                .unwrap_or_default(),
            deliveries,
        }))
    }

    async fn lanes(&self) -> Result<Vec<LaneRow>> {
        let failed = self.conn.error("could not read the lanes");
        let now = DateTime::now();
        let lanes: Vec<Lane> = all(self
            .lane_collection()
            .await?
            .find(lane_ids())
            .sort(doc! { "_id": 1 })
            .await
            .map_err(&failed)?)
        .await
        .map_err(&failed)?;
        let in_flight: Vec<&str> = lanes
            .iter()
            .flat_map(|l| l.in_flight.iter().map(String::as_str))
            .collect();
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let still: HashSet<String> = all(deliveries
            .find(doc! { "_id": { "$in": &in_flight }, "status": "pending" })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(&failed)?)
        .await
        .map_err(&failed)?
        .into_iter()
        .filter_map(|d| d.get_str("_id").ok().map(str::to_owned))
        .collect();
        let cursor = deliveries
            .aggregate([
                doc! { "$match": { "status": "pending" } },
                doc! { "$group": {
                    "_id": "$laneId", "pending": { "$sum": 1 },
                    "oldest": { "$min": { "$cond": [{ "$lte": ["$dueAt", now] }, "$dueAt", Bson::Null] } },
                } },
            ])
            .await
            .map_err(&failed)?;
        let backlog: HashMap<i32, (i64, Option<DateTime>)> = all(cursor)
            .await
            .map_err(&failed)?
            .into_iter()
            .filter_map(|d| {
                Some((
                    d.get_i32("_id").ok()?,
                    (
                        d.get("pending").map(bson_i64).unwrap_or(0),
                        d.get_datetime("oldest").ok().copied(),
                    ),
                ))
            })
            .collect();
        Ok(lanes
            .into_iter()
            .map(|l| {
                let (pending, oldest) = backlog.get(&l.lane).copied().unwrap_or((0, None));
                LaneRow {
                    lane: l.lane as i16,
                    expired: l.lease_expires_at.is_some_and(|at| at <= now),
                    in_flight: l.in_flight.iter().filter(|id| still.contains(*id)).count() as i64,
                    uncharged: l.lost.len() as i64,
                    owner: l.owner,
                    epoch: l.epoch,
                    lease_expires_at: l.lease_expires_at.map(chrono),
                    pending,
                    oldest_due: oldest.map(chrono),
                }
            })
            .collect())
    }

    async fn event_named(&self, name: EventName<'_>) -> Result<bool> {
        let filter = match name {
            EventName::Handler(h) => doc! { "handlers": h },
            EventName::Type(t) => doc! { "type": t },
        };
        let found = self
            .conn
            .collection(&self.name(EVENTS))
            .await?
            .find_one(filter)
            .projection(doc! { "_id": 1 })
            .await
            .map_err(
                self.conn
                    .error("could not look for the name among the events"),
            )?;
        Ok(found.is_some())
    }

    async fn ids_like(&self, record: Record, part: &str, limit: i64) -> Result<Vec<String>> {
        let collection = match record {
            Record::Delivery => DELIVERIES,
            Record::Event => EVENTS,
        };
        let text = literal(part);
        let failed = self.conn.error("could not look for the ids");
        let cursor = self
            .conn
            .collection(&self.name(collection))
            .await?
            .find(doc! { "$or": [
                { "_id": { "$regex": format!("^{text}") } },
                { "_id": { "$regex": format!("{text}$") } },
            ] })
            .projection(doc! { "_id": 1 })
            .sort(doc! { "_id": 1 })
            .limit(limit)
            .await
            .map_err(&failed)?;
        ids(cursor).await.map_err(&failed)
    }

    async fn stats(&self) -> Result<Vec<HandlerStats>> {
        let failed = self.conn.error("could not compute statistics");
        let live = self.in_flight().await?;
        let live: Vec<&str> = live.iter().map(String::as_str).collect();
        let now = DateTime::now();
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let cursor = deliveries
            .aggregate([doc! { "$group": {
                "_id": "$handler",
                "running": { "$sum": { "$cond": [{ "$and": [
                    { "$eq": ["$status", "pending"] }, { "$in": ["$_id", &live] },
                ] }, 1, 0] } },
                "due": { "$sum": { "$cond": [{ "$and": [
                    { "$eq": ["$status", "pending"] }, { "$lte": ["$dueAt", now] },
                    { "$not": [{ "$in": ["$_id", &live] }] },
                ] }, 1, 0] } },
                "scheduled": { "$sum": { "$cond": [{ "$and": [
                    { "$eq": ["$status", "pending"] }, { "$gt": ["$dueAt", now] },
                    { "$not": [{ "$in": ["$_id", &live] }] },
                ] }, 1, 0] } },
                "dead": { "$sum": { "$cond": [{ "$eq": ["$status", "dead"] }, 1, 0] } },
                "completed": { "$sum": { "$cond": [{ "$eq": ["$status", "completed"] }, 1, 0] } },
                "oldest": { "$min": { "$cond": [{ "$and": [
                    { "$eq": ["$status", "pending"] }, { "$lte": ["$dueAt", now] },
                    { "$not": [{ "$in": ["$_id", &live] }] },
                ] }, "$dueAt", Bson::Null] } },
            } }])
            .await
            .map_err(&failed)?;
        let mut stats: BTreeMap<String, HandlerStats> = BTreeMap::new();
        for d in all(cursor).await.map_err(&failed)? {
            let handler = d.get_str("_id").unwrap_or_default().to_owned();
            let n = |f: &str| d.get(f).map(bson_i64).unwrap_or(0);
            let lag = d
                .get_datetime("oldest")
                .ok()
                .map(|at| (now.timestamp_millis() - at.timestamp_millis()).max(0) as f64 / 1000.0);
            stats.insert(
                handler.clone(),
                HandlerStats {
                    handler,
                    due: n("due"),
                    scheduled: n("scheduled"),
                    processing: n("running"),
                    dead: n("dead"),
                    completed: n("completed"),
                    lag_seconds: lag,
                },
            );
        }
        let cursor = self
            .conn
            .collection(&self.name(COMPLETIONS))
            .await?
            .aggregate([doc! { "$group": { "_id": "$handler", "n": { "$sum": 1 } } }])
            .await
            .map_err(&failed)?;
        for d in all(cursor).await.map_err(&failed)? {
            let handler = d.get_str("_id").unwrap_or_default().to_owned();
            let entry = stats
                .entry(handler.clone())
                .or_insert_with(|| HandlerStats::empty(&handler));
            entry.completed += d.get("n").map(bson_i64).unwrap_or(0);
        }
        Ok(stats.into_values().collect())
    }

    async fn backlog(&self, handler: &str, limit: i64) -> Result<HandlerBacklog> {
        let failed = self.conn.error("could not read the handler's backlog");
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let dead = deliveries
            .aggregate([
                doc! { "$match": { "status": "dead", "handler": handler } },
                doc! { "$sort": { "updatedAt": -1, "_id": -1 } },
                doc! { "$limit": limit },
                with_type(&self.name(EVENTS)),
            ])
            .await
            .map_err(&failed)?;
        let dead = rows(all(dead).await.map_err(&failed)?, &HashSet::new());
        let keys = deliveries
            .aggregate([
                doc! { "$match": { "status": "pending", "handler": handler, "key": { "$ne": null } } },
                doc! { "$group": { "_id": "$key", "n": { "$sum": 1 }, "oldest": { "$min": "$dueAt" } } },
                doc! { "$sort": { "n": -1, "_id": 1 } },
                doc! { "$limit": limit },
            ])
            .await
            .map_err(&failed)?;
        let keys = all(keys)
            .await
            .map_err(&failed)?
            .iter()
            .map(|d| KeyBacklog {
                key: d.get_str("_id").unwrap_or_default().to_owned(),
                pending: d.get("n").map(bson_i64).unwrap_or(0),
                oldest_due: d.get_datetime("oldest").ok().map(|t| chrono(*t)),
            })
            .collect();
        Ok(HandlerBacklog { dead, keys })
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
                let still: Vec<String> = super::model::all_in(cursor, session)
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
