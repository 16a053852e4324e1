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

use super::conn::{db, PooledConn};
use super::sql::Params;
use super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{
    NewEvent, Publish, PublishedDelivery, Result, StoreError, CONFLICT_WITH_STORED,
};

/// How often a batch runs again after losing a race with a concurrent publish of one of its ids.
const RACE_RETRIES: usize = 3;

/// What a failed publish says: either statement writes its whole batch or nothing of it.
const NOTHING_WRITTEN: &str = "could not publish the batch; nothing of it was written";

/// What a concurrent publish of the same ids makes the statement fail with: a unique key (both
/// inserted the event), a foreign key (the event was purged as it was extended) or a deadlock
/// (two batches inserting shared ids in different orders). Nothing of the batch was written,
/// and the next run sees the other publish's rows.
pub(super) fn lost_race(e: &tokio_postgres::Error) -> bool {
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
    /// `publish.sql`, for a batch with events published before: it adds only the deliveries of
    /// handlers an event never had. Returns the republished events and the deliveries added.
    async fn republish(
        &self,
        conn: &mut PooledConn<'_>,
        params: Params<'_>,
    ) -> Result<(HashSet<String>, HashSet<String>)> {
        let mut attempt = 0;
        let row = loop {
            attempt += 1;
            match conn.query(&self.sql.publish, params).await {
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
        Ok((republished, ids_in(1)))
    }
}

/// A batch as the publish statements take it: the events as parallel arrays, and one row per
/// (event, handler), grouped by event in event order; `first` and `last` say where each event's
/// handlers lie in `d_handlers` (from 1).
struct Batch<'a> {
    ids: Vec<&'a str>,
    types: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    payloads: Vec<&'a serde_json::Value>,
    headers: Vec<serde_json::Value>,
    first: Vec<i32>,
    last: Vec<i32>,
    d_events: Vec<&'a str>,
    d_handlers: Vec<&'a str>,
    d_ids: Vec<String>,
    d_lanes: Vec<i16>,
    d_keys: Vec<Option<&'a str>>,
}

impl<'a> Batch<'a> {
    fn of(events: &'a [NewEvent]) -> Self {
        let n = events.len();
        let mut b = Batch {
            ids: Vec::with_capacity(n),
            types: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            first: Vec::with_capacity(n),
            last: Vec::with_capacity(n),
            d_events: vec![],
            d_handlers: vec![],
            d_ids: vec![],
            d_lanes: vec![],
            d_keys: vec![],
        };
        for e in events {
            let lane = lane_of(e.key.as_deref(), &e.id);
            b.first.push(b.d_handlers.len() as i32 + 1);
            for h in &e.handlers {
                b.d_events.push(e.id.as_str());
                b.d_handlers.push(h.as_str());
                b.d_ids.push(crate::store::new_id());
                b.d_lanes.push(lane);
                b.d_keys.push(e.key.as_deref());
            }
            b.last.push(b.d_handlers.len() as i32);
            b.ids.push(e.id.as_str());
            b.types.push(e.event_type.as_str());
            b.keys.push(e.key.as_deref());
            b.payloads.push(&e.payload);
            b.headers.push(serde_json::Value::Object(e.headers.clone()));
        }
        b
    }
}

impl Publish for PgStore {
    async fn publish(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        if events.is_empty() {
            return Ok(vec![]);
        }
        let events = NewEvent::unite(events)?;
        let batch = Batch::of(&events);
        let Batch {
            ids,
            types,
            keys,
            payloads,
            headers,
            first,
            last,
            d_events,
            d_handlers,
            d_ids,
            d_lanes,
            d_keys,
        } = &batch;
        let params: [&(dyn ToSql + Sync); 12] = [
            ids, types, keys, payloads, headers, d_events, d_handlers, d_ids, d_lanes, d_keys,
            first, last,
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
            self.republish(&mut conn, &params).await?
        };
        drop(conn);
        let published: Vec<PublishedDelivery> = batch
            .d_ids
            .into_iter()
            .enumerate()
            .filter(|(i, id)| !republished.contains(batch.d_events[*i]) || added.contains(id))
            .map(|(i, delivery_id)| PublishedDelivery {
                event_id: batch.d_events[i].to_owned(),
                handler: batch.d_handlers[i].to_owned(),
                delivery_id,
            })
            .collect();
        if !published.is_empty() {
            self.notifier.published();
        }
        Ok(published)
    }
}
