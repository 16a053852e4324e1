//! Publishing: one statement per batch (`sql/postgres/delivery/publish.sql`) reserves key
//! sequences, inserts events and inserts deliveries, so a batch is atomic without an explicit
//! transaction (one round trip, no BEGIN or COMMIT). The text never changes, so each connection
//! parses it once.

use super::conn::db;
use super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{NewEvent, PublishedDelivery, Result};

/// Merges events that appear twice in one batch (their handlers are united; the first
/// occurrence's fields win), since one statement cannot upsert a row twice.
fn merge_duplicates(events: &[NewEvent]) -> Vec<NewEvent> {
    let mut merged: Vec<NewEvent> = Vec::with_capacity(events.len());
    let mut index = std::collections::HashMap::with_capacity(events.len());
    for e in events {
        match index.get(&e.id) {
            Some(&i) => {
                let target: &mut NewEvent = &mut merged[i];
                for h in &e.handlers {
                    if !target.handlers.contains(h) {
                        target.handlers.push(h.clone());
                    }
                }
            }
            None => {
                index.insert(e.id.clone(), merged.len());
                merged.push(e.clone());
            }
        }
    }
    merged
}

impl PgStore {
    pub(super) async fn publish_impl(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        if events.is_empty() {
            return Ok(vec![]);
        }
        let events = merge_duplicates(events);
        let n = events.len();
        let (mut ids, mut types, mut keys, mut payloads, mut headers) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut d_events, mut d_handlers, mut d_ids, mut d_lanes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for e in &events {
            let lane = lane_of(e.key.as_deref(), &e.id);
            for h in &e.handlers {
                d_events.push(e.id.as_str());
                d_handlers.push(h.as_str());
                d_ids.push(uuid::Uuid::now_v7().to_string());
                d_lanes.push(lane);
            }
            ids.push(e.id.as_str());
            types.push(e.event_type.as_str());
            keys.push(e.key.as_deref());
            payloads.push(&e.payload);
            headers.push(serde_json::Value::Object(e.headers.clone()));
        }
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.publish,
                &[
                    &ids,
                    &types,
                    &keys,
                    &payloads,
                    &headers,
                    &d_events,
                    &d_handlers,
                    &d_ids,
                    &d_lanes,
                ],
            )
            .await
            .map_err(db("could not publish the batch; nothing of it was written"))?;
        let published: Vec<PublishedDelivery> = rows
            .iter()
            .map(|r| PublishedDelivery {
                event_id: r.get(0),
                handler: r.get(1),
                delivery_id: r.get(2),
            })
            .collect();
        drop(conn);
        if !published.is_empty() {
            self.notifier.published();
        }
        Ok(published)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(id: &str, handlers: &[&str]) -> NewEvent {
        NewEvent {
            id: id.into(),
            event_type: "t".into(),
            key: None,
            payload: json!({}),
            headers: Default::default(),
            handlers: handlers.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn duplicates_in_a_batch_unite_their_handlers() {
        let merged = merge_duplicates(&[
            event("a", &["x"]),
            event("b", &["y"]),
            event("a", &["z", "x"]),
        ]);
        assert_eq!(merged, vec![event("a", &["x", "z"]), event("b", &["y"])]);
    }
}
