//! Publishing: one statement per batch (`sql/postgres/delivery/publish.sql`) reserves key
//! sequences, inserts events and inserts deliveries, so a batch is atomic without an explicit
//! transaction (one round trip, no BEGIN or COMMIT). The text never changes, so each connection
//! parses it once.

use super::conn::db;
use super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{NewEvent, PublishedDelivery, Result, StoreError, CONFLICT_WITH_STORED};

impl PgStore {
    pub(super) async fn publish_impl(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        if events.is_empty() {
            return Ok(vec![]);
        }
        let events = NewEvent::unite(events)?;
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
        if let Some(id) = rows.iter().find_map(|r| r.get::<_, Option<String>>(3)) {
            return Err(StoreError::ConflictingEvent {
                id,
                why: CONFLICT_WITH_STORED,
            });
        }
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
