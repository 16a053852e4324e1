//! The operator's queries on MongoDB, a file per topic as on PostgreSQL (`postgres/admin/`):
//! `inspect.rs` listings, one delivery or event, lanes, per-handler statistics and a handler's
//! backlog; `requeue.rs` dead letters and requeue; `retention.rs` purges. Here, what they share.
//! "processing" is derived as on every store: a pending delivery its lane lists in flight under
//! a live lease.

mod inspect;
mod requeue;
mod retention;

use std::collections::HashSet;
use std::time::Duration;

use mongodb::bson::{doc, DateTime, Document};

use super::model::Delivery;
use crate::store::DeliveryRow;

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
