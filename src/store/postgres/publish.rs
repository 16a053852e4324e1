//! Publishing: one statement per batch reserves key sequences, inserts events and inserts
//! deliveries, so a batch is atomic without an explicit transaction (one round trip, no BEGIN or
//! COMMIT). The text never changes, so each connection parses it once.

use tokio_postgres::types::Type;

use super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{NewEvent, PublishedDelivery, Result, StoreError};

/// Events arrive as parallel arrays and deliveries as a second set, one row per (event, handler).
///
/// `prior` reads the handlers each event already has; `fresh` keeps only the deliveries of
/// handlers it never had, which makes a republish idempotent even after completed deliveries
/// were deleted. Keyed events that get a delivery reserve their sequence numbers in one upsert per
/// key; the upsert's row lock is held until commit, so sequence order is commit order per key.
/// Keys are locked in sorted order so two batches cannot deadlock on them.
pub(crate) const PUBLISH: &str = r#"
WITH ev AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[])
    WITH ORDINALITY AS e(id, type, key, payload, headers, ord)
), dv AS (
  SELECT * FROM unnest($6::text[], $7::text[], $8::text[], $9::int2[])
    WITH ORDINALITY AS d(event_id, handler, id, lane, ord)
), prior AS (
  SELECT e.id, e.handlers FROM "{{schema}}"."{{prefix}}events" e WHERE e.id IN (SELECT id FROM ev)
), fresh AS (
  SELECT dv.*, ev.key, ev.ord AS event_ord
    FROM dv JOIN ev ON ev.id = dv.event_id LEFT JOIN prior p ON p.id = dv.event_id
   WHERE p.id IS NULL OR NOT (dv.handler = ANY (p.handlers))
), keyed AS (
  SELECT DISTINCT event_ord, event_id, key FROM fresh WHERE key IS NOT NULL
), reserved AS (
  INSERT INTO "{{schema}}"."{{prefix}}key_sequences" AS s (key, last_sequence)
  SELECT key, count(*) FROM keyed GROUP BY key ORDER BY key
  ON CONFLICT (key) DO UPDATE SET last_sequence = s.last_sequence + excluded.last_sequence
  RETURNING s.key, s.last_sequence
), numbered AS (
  SELECT k.event_id,
         r.last_sequence - count(*) OVER w + row_number() OVER (w ORDER BY k.event_ord) AS sequence
    FROM keyed k JOIN reserved r ON r.key = k.key
  WINDOW w AS (PARTITION BY k.key)
), events_written AS (
  INSERT INTO "{{schema}}"."{{prefix}}events" AS e (id, type, key, payload, headers, handlers)
  SELECT ev.id, ev.type, ev.key, ev.payload, ev.headers, f.handlers
    FROM ev JOIN (SELECT event_id, array_agg(handler ORDER BY ord) AS handlers
                    FROM fresh GROUP BY event_id) f ON f.event_id = ev.id
   ORDER BY ev.ord
  ON CONFLICT (id) DO UPDATE
    SET handlers = e.handlers || ARRAY(SELECT h FROM unnest(excluded.handlers) h
                                        WHERE NOT (h = ANY (e.handlers)))
    WHERE NOT (excluded.handlers <@ e.handlers)
  RETURNING 1
)
INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key, sequence)
SELECT f.id, f.event_id, f.handler, f.lane, f.key, n.sequence
  FROM fresh f LEFT JOIN numbered n ON n.event_id = f.event_id
 ORDER BY f.ord
ON CONFLICT (event_id, handler) DO NOTHING
RETURNING event_id, handler, id
"#;

pub(crate) const PUBLISH_TYPES: &[Type] = &[
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::JSONB_ARRAY,
    Type::JSONB_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT2_ARRAY,
];

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
    pub(crate) async fn publish_impl(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
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
            .map_err(StoreError::db(
                "could not publish the batch; nothing of it was written",
            ))?;
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
