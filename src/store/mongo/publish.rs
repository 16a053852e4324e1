//! Publishing on MongoDB: one transaction per batch reads the events published before, reserves
//! the key sequences, and inserts events and deliveries, so a batch is all or nothing. A
//! republish adds deliveries only for handlers the event never had, and must say what the first
//! publish said. The sequence counters are written in the transaction, so two batches of one key
//! conflict and one runs again after the other committed: sequence order is commit order.

use std::collections::HashMap;

use mongodb::bson::{doc, Bson, DateTime, Document};
use serde_json::Value;

use super::json;
use super::model::all_in;
use super::{MongoStore, DELIVERIES, EVENTS, KEY_SEQUENCES, READY};
use crate::store::lane::lane_of;
use crate::store::{
    NewEvent, Publish, PublishedDelivery, Result, StoreError, CONFLICT_WITH_STORED,
};

/// An event as it is stored, with its deliveries' ids chosen once for every run of the
/// transaction.
struct Prepared {
    event: NewEvent,
    payload: Bson,
    headers: Document,
    lane: i32,
    delivery_ids: Vec<String>,
}

enum Published {
    Deliveries(Vec<PublishedDelivery>),
    Conflict(String),
}

/// The batch's events as they are stored, one per id, with their deliveries' ids.
fn prepare(events: &[NewEvent]) -> Result<Vec<Prepared>> {
    NewEvent::unite(events)?
        .into_iter()
        .map(|e| {
            let invalid = |reason: String| StoreError::InvalidEvent {
                position: format!("`{}`", e.id),
                reason,
            };
            Ok(Prepared {
                payload: json::to_bson(&e.payload).map_err(invalid)?,
                headers: json::to_document(&e.headers).map_err(invalid)?,
                lane: i32::from(lane_of(e.key.as_deref(), &e.id)),
                delivery_ids: e.handlers.iter().map(|_| crate::store::new_id()).collect(),
                event: e,
            })
        })
        .collect()
}

/// Per event: the indexes of the handlers it never had.
fn fresh_handlers(prepared: &[Prepared], prior: &HashMap<String, Document>) -> Vec<Vec<usize>> {
    prepared
        .iter()
        .map(|p| {
            let had: Vec<&str> = prior
                .get(&p.event.id)
                .and_then(|d| d.get_array("handlers").ok())
                .map(|a| a.iter().filter_map(Bson::as_str).collect())
                .unwrap_or_default();
            (0..p.event.handlers.len())
                .filter(|&i| !had.contains(&p.event.handlers[i].as_str()))
                .collect()
        })
        .collect()
}

/// How many new sequences each key needs (one per key given), in key order (two batches
/// cannot deadlock).
pub(super) fn per_key<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<(&'a str, i64)> {
    let mut per_key: Vec<(&str, i64)> = vec![];
    for key in keys {
        match per_key.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => per_key.push((key, 1)),
        }
    }
    per_key.sort_unstable();
    per_key
}

/// The next sequence of a key's block that `reserve` returned (none for an unkeyed event).
pub(super) fn next_sequence(next: &mut HashMap<String, i64>, key: Option<&str>) -> Option<i64> {
    key.map(|k| {
        let n = next.get_mut(k).expect("every fresh key has a block");
        *n += 1;
        *n - 1
    })
}

/// The key of each event that gets deliveries.
fn fresh_keys<'a>(
    prepared: &'a [Prepared],
    fresh: &'a [Vec<usize>],
) -> impl Iterator<Item = &'a str> {
    prepared
        .iter()
        .zip(fresh)
        .filter(|(_, f)| !f.is_empty())
        .filter_map(|(p, _)| p.event.key.as_deref())
}

/// Reserves each key's block of sequences and returns the first of each: a key's block ends
/// at its counter.
pub(super) async fn reserve(
    db: &mongodb::Database,
    sequences: &mongodb::Collection<Document>,
    per_key: &[(&str, i64)],
    s: &mut mongodb::ClientSession,
) -> mongodb::error::Result<HashMap<String, i64>> {
    if per_key.is_empty() {
        return Ok(HashMap::new());
    }
    let updates: Vec<Document> = per_key
        .iter()
        .map(|(key, n)| {
            doc! { "q": { "_id": key }, "u": { "$inc": { "lastSequence": n } }, "upsert": true }
        })
        .collect();
    db.run_command(doc! { "update": sequences.name(), "updates": updates, "ordered": true })
        .session(&mut *s)
        .await?;
    let keys: Vec<&str> = per_key.iter().map(|(k, _)| *k).collect();
    let cursor = sequences
        .find(doc! { "_id": { "$in": keys } })
        .session(&mut *s)
        .await?;
    let mut last: HashMap<String, i64> = HashMap::new();
    for d in all_in(cursor, s).await? {
        if let (Ok(k), Some(n)) = (d.get_str("_id"), d.get("lastSequence")) {
            last.insert(k.to_owned(), bson_i64(n));
        }
    }
    Ok(per_key
        .iter()
        .map(|(k, n)| (k.to_string(), last.get(*k).copied().unwrap_or(*n) - n + 1))
        .collect())
}

/// What a publish writes: new events, handlers added to stored ones, and deliveries.
struct Writes {
    events: Vec<Document>,
    grown: Vec<Document>,
    deliveries: Vec<Document>,
    published: Vec<PublishedDelivery>,
}

/// The batch's writes, sequences given in batch order from each key's block (`next`).
fn writes(
    prepared: &[Prepared],
    fresh: &[Vec<usize>],
    prior: &HashMap<String, Document>,
    mut next: HashMap<String, i64>,
) -> Writes {
    let now = DateTime::now();
    let mut w = Writes {
        events: vec![],
        grown: vec![],
        deliveries: vec![],
        published: vec![],
    };
    for (p, f) in prepared.iter().zip(fresh) {
        if f.is_empty() {
            continue;
        }
        let handlers: Vec<&str> = f.iter().map(|&i| p.event.handlers[i].as_str()).collect();
        if prior.contains_key(&p.event.id) {
            w.grown.push(doc! {
                "q": { "_id": &p.event.id },
                "u": { "$push": { "handlers": { "$each": &handlers } } },
            });
        } else {
            w.events.push(doc! {
                "_id": &p.event.id, "type": &p.event.event_type, "key": &p.event.key,
                "payload": p.payload.clone(), "headers": p.headers.clone(),
                "handlers": &handlers, "createdAt": now,
            });
        }
        let sequence = next_sequence(&mut next, p.event.key.as_deref());
        for &i in f {
            let id = &p.delivery_ids[i];
            w.deliveries.push(delivery(
                id,
                &p.event.id,
                &p.event.handlers[i],
                p.lane,
                p.event.key.as_deref(),
                sequence,
                now,
            ));
            w.published.push(PublishedDelivery {
                event_id: p.event.id.clone(),
                handler: p.event.handlers[i].clone(),
                delivery_id: id.clone(),
            });
        }
    }
    w
}

/// A new delivery as a publish writes it: pending, due now, ready to be claimed.
pub(super) fn delivery(
    id: &str,
    event_id: &str,
    handler: &str,
    lane: i32,
    key: Option<&str>,
    sequence: Option<i64>,
    now: DateTime,
) -> Document {
    doc! {
        "_id": id, "eventId": event_id, "handler": handler, "laneId": lane, "key": key,
        "sequence": sequence, "status": "pending", "attempts": 0, "claims": 0, "dueAt": now,
        "lastError": Bson::Null, "createdAt": now, "updatedAt": now, "completedAt": Bson::Null,
        "lane": READY,
    }
}

pub(super) fn bson_i64(value: &Bson) -> i64 {
    match value {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(f) => *f as i64,
        _ => 0,
    }
}

/// Whether a stored event says what this publish says: type, key, payload and headers, the
/// numbers compared as the handler would read them.
fn same_content(stored: &Document, p: &Prepared) -> bool {
    let e = &p.event;
    stored.get_str("type").ok() == Some(e.event_type.as_str())
        && stored.get_str("key").ok() == e.key.as_deref()
        && stored
            .get("payload")
            .is_some_and(|v| json::same_value(&json::to_json(v), &json::to_json(&p.payload)))
        && stored.get_document("headers").is_ok_and(|h| {
            json::same_value(
                &Value::Object(json::object(h)),
                &Value::Object(json::object(&p.headers)),
            )
        })
}

impl Publish for MongoStore {
    async fn publish(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        if events.is_empty() {
            return Ok(vec![]);
        }
        let prepared = prepare(events)?;
        let db = self.conn.database().await?;
        let events_coll = db.collection::<Document>(&self.name(EVENTS));
        let deliveries = db.collection::<Document>(&self.name(DELIVERIES));
        let sequences = db.collection::<Document>(&self.name(KEY_SEQUENCES));
        let outcome = self
            .conn
            .transaction(
                "could not publish the batch; nothing of it was written",
                async move |s| {
                    let ids: Vec<&str> = prepared.iter().map(|p| p.event.id.as_str()).collect();
                    let cursor = events_coll
                        .find(doc! { "_id": { "$in": &ids } })
                        .session(&mut *s)
                        .await?;
                    let prior: HashMap<String, Document> = all_in(cursor, s)
                        .await?
                        .into_iter()
                        .filter_map(|d| Some((d.get_str("_id").ok()?.to_owned(), d)))
                        .collect();
                    if let Some(p) = prepared.iter().find(|p| {
                        prior
                            .get(&p.event.id)
                            .is_some_and(|stored| !same_content(stored, p))
                    }) {
                        return Ok(Published::Conflict(p.event.id.clone()));
                    }
                    let fresh = fresh_handlers(&prepared, &prior);
                    let next = reserve(&db, &sequences, &per_key(fresh_keys(&prepared, &fresh)), s)
                        .await?;
                    let writes = writes(&prepared, &fresh, &prior, next);
                    if !writes.events.is_empty() {
                        events_coll
                            .insert_many(writes.events)
                            .session(&mut *s)
                            .await?;
                    }
                    if !writes.grown.is_empty() {
                        db.run_command(
                            doc! { "update": events_coll.name(), "updates": writes.grown },
                        )
                        .session(&mut *s)
                        .await?;
                    }
                    if !writes.deliveries.is_empty() {
                        deliveries
                            .insert_many(writes.deliveries)
                            .session(&mut *s)
                            .await?;
                    }
                    Ok(Published::Deliveries(writes.published))
                },
            )
            .await?;
        match outcome {
            Published::Deliveries(published) => Ok(published),
            Published::Conflict(id) => Err(StoreError::ConflictingEvent {
                id,
                why: CONFLICT_WITH_STORED,
            }),
        }
    }
}
