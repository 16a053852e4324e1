//! Publishing: one statement per batch reserves key sequences, inserts events and inserts
//! deliveries, so a batch is atomic without an explicit transaction (one round trip, no BEGIN
//! or COMMIT). A batch of new events takes `publish_new.sql`, which does not look for earlier
//! publishes; one with an event published before makes it fail on the events' key and takes
//! `publish.sql`, as do the batches after it until one holds no republished event. Each
//! connection parses each text once.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::conn::db;
use super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{NewEvent, PublishedDelivery, Result, StoreError, CONFLICT_WITH_STORED};

/// How often a batch runs again after losing a race with a concurrent publish of one of its ids.
const RACE_RETRIES: usize = 3;

/// What a failed publish says: either statement writes its whole batch or nothing of it.
const NOTHING_WRITTEN: &str = "could not publish the batch; nothing of it was written";

/// What a concurrent publish of the same ids makes the statement fail with: a unique key (both
/// inserted the event), a foreign key (the event was purged as it was extended) or a deadlock
/// (two batches inserting shared ids in different orders). Nothing of the batch was written,
/// and the next run sees the other publish's rows.
fn lost_race(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        [
            SqlState::UNIQUE_VIOLATION,
            SqlState::FOREIGN_KEY_VIOLATION,
            SqlState::T_R_DEADLOCK_DETECTED,
        ]
        .contains(c)
    })
}

impl PgStore {
    pub(super) async fn publish_impl(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        if events.is_empty() {
            return Ok(vec![]);
        }
        let events = NewEvent::unite(events)?;
        let n = events.len();
        let (mut ids, mut types, mut keys, mut payloads, mut headers, mut first, mut last) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut d_events, mut d_handlers, mut d_ids, mut d_lanes, mut d_keys) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for e in &events {
            let lane = lane_of(e.key.as_deref(), &e.id);
            first.push(d_handlers.len() as i32 + 1);
            for h in &e.handlers {
                d_events.push(e.id.as_str());
                d_handlers.push(h.as_str());
                d_ids.push(crate::store::new_id());
                d_lanes.push(lane);
                d_keys.push(e.key.as_deref());
            }
            last.push(d_handlers.len() as i32);
            ids.push(e.id.as_str());
            types.push(e.event_type.as_str());
            keys.push(e.key.as_deref());
            payloads.push(&e.payload);
            headers.push(serde_json::Value::Object(e.headers.clone()));
        }
        let params: [&(dyn ToSql + Sync); 12] = [
            &ids,
            &types,
            &keys,
            &payloads,
            &headers,
            &d_events,
            &d_handlers,
            &d_ids,
            &d_lanes,
            &d_keys,
            &first,
            &last,
        ];
        let mut conn = self.pool.get().await?;
        let all_new = !self.republishing.load(Ordering::Relaxed)
            && match conn.execute(&self.sql.publish_new, &params).await {
                Ok(_) => true,
                Err(e) if lost_race(&e) => {
                    self.republishing.store(true, Ordering::Relaxed);
                    false
                }
                Err(e) => return Err(db(NOTHING_WRITTEN)(e)),
            };
        let (republished, added) = if all_new {
            (HashSet::new(), HashSet::new())
        } else {
            let mut attempt = 0;
            let row = loop {
                attempt += 1;
                match conn.query(&self.sql.publish, &params).await {
                    Err(e) if attempt <= RACE_RETRIES && lost_race(&e) => continue,
                    result => break result.map_err(db(NOTHING_WRITTEN))?.remove(0),
                }
            };
            if let Some(id) = row
                .get::<_, Option<Vec<String>>>(2)
                .and_then(|c| c.into_iter().next())
            {
                return Err(StoreError::ConflictingEvent {
                    id,
                    why: CONFLICT_WITH_STORED,
                });
            }
            let ids_in = |column| -> HashSet<String> {
                row.get::<_, Option<Vec<_>>>(column)
                    .into_iter()
                    .flatten()
                    .collect()
            };
            let republished = ids_in(0);
            if republished.is_empty() {
                self.republishing.store(false, Ordering::Relaxed);
            }
            (republished, ids_in(1))
        };
        drop(conn);
        let published: Vec<PublishedDelivery> = d_ids
            .into_iter()
            .enumerate()
            .filter(|(i, id)| !republished.contains(d_events[*i]) || added.contains(id))
            .map(|(i, delivery_id)| PublishedDelivery {
                event_id: d_events[i].to_owned(),
                handler: d_handlers[i].to_owned(),
                delivery_id,
            })
            .collect();
        if !published.is_empty() {
            self.notifier.published();
        }
        Ok(published)
    }
}
