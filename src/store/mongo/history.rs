//! The events as history on MongoDB: listed by a filter, counted, and replayed to a handler.
//! A replay batch is one transaction that reads the events and their deliveries for the
//! handler again, so what the walk read may have changed: a concurrent publish of one of the
//! events conflicts with it, and one of the two runs again on a fresh snapshot.

use std::collections::HashMap;
use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document, Regex};

use super::model::{all, all_in, chrono, literal};
use super::publish::{delivery, next_sequence, per_key, reserve};
use super::{MongoStore, DELIVERIES, EVENTS, KEY_SEQUENCES};
use crate::store::lane::lane_of;
use crate::store::{EventFilter, EventPosition, EventRow, History, Result, TargetState};

/// How long a replay batch runs again after write conflicts: longer than a server keeps the
/// transaction of a client that died in one (`transactionLifetimeLimitSeconds`, 60 s by
/// default), such as a replay killed halfway, whose rerun must wait for it.
const CONFLICTS_FOR: Duration = Duration::from_secs(90);

/// A type pattern as a regular expression: `*` for any text, everything else literal.
fn pattern(glob: &str) -> Bson {
    let body: Vec<String> = glob.split('*').map(literal).collect();
    Bson::RegularExpression(Regex {
        pattern: format!("^{}$", body.join(".*")),
        options: "s".into(),
    })
}

fn at(p: &EventPosition) -> DateTime {
    DateTime::from_millis(p.at.timestamp_millis())
}

/// A bound in publish order: `time` on the creation time (`$gte`, `$lte`), and for a bound at
/// an event, events of that very time pass on their id (`id`) and the others on `past`.
fn bound(p: &EventPosition, time: &str, past: &str, id: &str) -> Vec<Document> {
    let mut d = vec![doc! { "createdAt": { time: at(p) } }];
    if let Some(given) = &p.id {
        d.push(doc! { "$or": [
            { "createdAt": { past: at(p) } },
            { "_id": { id: given } },
        ] });
    }
    d
}

/// The filter as a query on events.
fn query(f: &EventFilter) -> Document {
    let mut all: Vec<Document> = vec![];
    if !f.types.is_empty() {
        let patterns: Vec<Bson> = f.types.iter().map(|t| pattern(t)).collect();
        all.push(doc! { "type": { "$in": patterns } });
    }
    if let Some(key) = &f.key {
        all.push(doc! { "key": key });
    }
    if let Some(handler) = &f.handler {
        all.push(doc! { "handlers": handler });
    }
    if !f.ids.is_empty() {
        all.push(doc! { "_id": { "$in": &f.ids } });
    }
    if let Some(p) = &f.since {
        all.extend(bound(p, "$gte", "$gt", "$gte"));
    }
    if let Some(p) = &f.after {
        all.extend(bound(p, "$gte", "$gt", "$gt"));
    }
    if let Some(p) = &f.until {
        all.extend(bound(p, "$lte", "$lt", "$lte"));
    }
    if all.is_empty() {
        doc! {}
    } else {
        doc! { "$and": all }
    }
}

fn target(delivery: &Document, now: DateTime) -> TargetState {
    match delivery.get_str("status").unwrap_or_default() {
        "dead" => TargetState::Dead,
        "completed" => TargetState::Completed,
        _ if delivery.get_datetime("dueAt").is_ok_and(|due| *due > now) => TargetState::Scheduled,
        _ => TargetState::Pending,
    }
}

/// An event as listed, without its delivery's state.
fn row(e: &Document) -> EventRow {
    EventRow {
        id: e.get_str("_id").unwrap_or_default().to_owned(),
        event_type: e.get_str("type").unwrap_or_default().to_owned(),
        key: e.get_str("key").ok().map(str::to_owned),
        created_at: e
            .get_datetime("createdAt")
            .map(|t| chrono(*t))
            .unwrap_or_default(),
        handlers: handlers(e),
        target: TargetState::Absent,
    }
}

fn handlers(event: &Document) -> Vec<String> {
    event
        .get_array("handlers")
        .map(|a| {
            a.iter()
                .filter_map(|h| h.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl History for MongoStore {
    async fn count_events(&self, filter: &EventFilter) -> Result<i64> {
        let events = self.conn.collection(&self.name(EVENTS)).await?;
        let n = events
            .count_documents(query(filter))
            .await
            .map_err(self.conn.error("could not count the events"))?;
        Ok(n as i64)
    }

    async fn events(
        &self,
        filter: &EventFilter,
        limit: i64,
        handler: Option<&str>,
    ) -> Result<Vec<EventRow>> {
        let failed = self.conn.error("could not list the events");
        let events = self.conn.collection(&self.name(EVENTS)).await?;
        let find = |query: Document, limit: Option<i64>| {
            let (events, failed) = (&events, &failed);
            async move {
                let cursor = events
                    .find(query)
                    .sort(doc! { "createdAt": 1 })
                    .limit(limit.unwrap_or(0))
                    .projection(doc! { "type": 1, "key": 1, "createdAt": 1, "handlers": 1 })
                    .await
                    .map_err(failed)?;
                let found: Vec<EventRow> =
                    all(cursor).await.map_err(failed)?.iter().map(row).collect();
                Ok::<_, crate::store::StoreError>(found)
            }
        };
        // The creation-time index gives the order of times, not of ids within one time: the
        // page is read in time order, then the events of its last time are read whole, and
        // the page is put in id order within each time in memory. Reading by (createdAt, _id)
        // would sort every event from the bound on.
        let mut rows = find(query(filter), Some(limit)).await?;
        if rows.len() as i64 == limit {
            let last = rows.last().map(|r| r.created_at).unwrap_or_default();
            rows.retain(|r| r.created_at < last);
            let at = DateTime::from_millis(last.timestamp_millis());
            let group = doc! { "$and": [query(filter), { "createdAt": at }] };
            rows.extend(find(group, None).await?);
        }
        rows.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        rows.truncate(limit as usize);
        let Some(handler) = handler.filter(|_| !rows.is_empty()) else {
            return Ok(rows);
        };
        let ids: Vec<&str> = rows.iter().map(|e| e.id.as_str()).collect();
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let cursor = deliveries
            .find(doc! { "eventId": { "$in": ids }, "handler": handler })
            .projection(doc! { "eventId": 1, "status": 1, "dueAt": 1 })
            .await
            .map_err(&failed)?;
        let now = DateTime::now();
        let states: HashMap<String, TargetState> = all(cursor)
            .await
            .map_err(&failed)?
            .iter()
            .filter_map(|d| Some((d.get_str("eventId").ok()?.to_owned(), target(d, now))))
            .collect();
        for row in &mut rows {
            row.target = states.get(&row.id).copied().unwrap_or_default();
        }
        Ok(rows)
    }

    async fn replay_events(
        &self,
        handler: &str,
        events: &[EventRow],
        again: bool,
    ) -> Result<Vec<String>> {
        let db = self.conn.database().await?;
        let events_coll = db.collection::<Document>(&self.name(EVENTS));
        let deliveries = db.collection::<Document>(&self.name(DELIVERIES));
        let sequences = db.collection::<Document>(&self.name(KEY_SEQUENCES));
        let (handler, events) = (handler.to_owned(), events.to_vec());
        // Chosen once, for every run of the transaction.
        let delivery_ids: Vec<String> = events.iter().map(|_| crate::store::new_id()).collect();
        self.conn
            .transaction_within(
                "could not replay the batch; nothing of it was written",
                CONFLICTS_FOR,
                async move |s| {
                    let handler = handler.as_str();
                    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
                    let fresh =
                        replayable(&events_coll, &deliveries, &events, handler, again, s).await?;
                    if fresh.is_empty() {
                        return Ok(vec![]);
                    }
                    let fresh_ids: Vec<&str> = fresh.iter().map(|&i| ids[i]).collect();
                    // Completed rows kept from 0.1 make way for the new deliveries.
                    deliveries
                        .delete_many(doc! {
                            "eventId": { "$in": &fresh_ids }, "handler": handler,
                            "status": "completed",
                        })
                        .session(&mut *s)
                        .await?;
                    let keys = fresh.iter().filter_map(|&i| events[i].key.as_deref());
                    let mut next = reserve(&db, &sequences, &per_key(keys), s).await?;
                    events_coll
                        .update_many(
                            doc! { "_id": { "$in": &fresh_ids }, "handlers": { "$ne": handler } },
                            doc! { "$push": { "handlers": handler } },
                        )
                        .session(&mut *s)
                        .await?;
                    let now = DateTime::now();
                    let new: Vec<Document> = fresh
                        .iter()
                        .map(|&i| {
                            let e = &events[i];
                            let sequence = next_sequence(&mut next, e.key.as_deref());
                            let lane = i32::from(lane_of(e.key.as_deref(), &e.id));
                            delivery(
                                &delivery_ids[i],
                                &e.id,
                                handler,
                                lane,
                                e.key.as_deref(),
                                sequence,
                                now,
                            )
                        })
                        .collect();
                    deliveries.insert_many(new).session(&mut *s).await?;
                    Ok(fresh_ids.iter().map(|id| id.to_string()).collect())
                },
            )
            .await
    }
}

/// The positions in `events` of those to replay to `handler`: events it is not named by (with
/// `again`, also those it is) and that have no live delivery to it.
async fn replayable(
    events_coll: &mongodb::Collection<Document>,
    deliveries: &mongodb::Collection<Document>,
    events: &[EventRow],
    handler: &str,
    again: bool,
    s: &mut mongodb::ClientSession,
) -> mongodb::error::Result<Vec<usize>> {
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let cursor = events_coll
        .find(doc! { "_id": { "$in": &ids } })
        .projection(doc! { "handlers": 1 })
        .session(&mut *s)
        .await?;
    let named: HashMap<String, bool> = all_in(cursor, s)
        .await?
        .iter()
        .filter_map(|e| {
            let id = e.get_str("_id").ok()?.to_owned();
            Some((id, handlers(e).iter().any(|h| h == handler)))
        })
        .collect();
    let cursor = deliveries
        .find(doc! { "eventId": { "$in": &ids }, "handler": handler })
        .projection(doc! { "eventId": 1, "status": 1 })
        .session(&mut *s)
        .await?;
    let live: HashMap<String, bool> = all_in(cursor, s)
        .await?
        .iter()
        .filter_map(|d| {
            let id = d.get_str("eventId").ok()?.to_owned();
            Some((id, d.get_str("status").ok() != Some("completed")))
        })
        .collect();
    Ok((0..events.len())
        .filter(|&i| {
            let id = &events[i].id;
            named.get(id).is_some_and(|&named| again || !named)
                && !live.get(id).copied().unwrap_or(false)
        })
        .collect())
}
