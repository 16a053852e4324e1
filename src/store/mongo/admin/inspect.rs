//! Listings, one delivery or event, lanes, per-handler statistics and a handler's backlog.

use std::collections::{BTreeMap, HashMap, HashSet};

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::super::json;
use super::super::model::{all, chrono, ids, lane_ids, literal, Delivery, Lane};
use super::super::publish::bson_i64;
use super::super::{MongoStore, COMPLETIONS, DELIVERIES, EVENTS};
use super::{rows, type_of, with_type, EVENT_DELIVERIES};
use crate::store::lane::lane_of;
use crate::store::{
    DeliveryDetail, DeliveryFilter, DeliveryRow, DeliveryStatus, EventDetail, EventName,
    HandlerBacklog, HandlerStats, Inspect, KeyBacklog, LaneRow, LeaseToken, Record, Result,
};

impl MongoStore {
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
