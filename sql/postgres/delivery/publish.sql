-- Publish of a batch that holds events published before (publish_new.sql takes the others):
-- one statement reserves key sequences (fragments/reserve_keys.sql), inserts events and
-- inserts deliveries, so a batch is atomic without BEGIN/COMMIT. An event published before
-- with other content (type, key, payload or headers) writes nothing of the batch and is
-- returned in the last column instead.
-- $1..$5 the events as parallel arrays (id, type, key, payload, headers); $6..$10 one row per
-- (event, handler), grouped by event in event order: event id, handler, delivery id, lane,
-- key; $11, $12 where each event's handlers lie in $7 (first and last index).
-- Events new to the store are inserted plainly, without ON CONFLICT: a concurrent publish of
-- the same id makes the statement fail on a unique key, and the caller runs it again.
-- params: text[], text[], text[], jsonb[], jsonb[], text[], text[], text[], int2[], text[], int4[], int4[]
WITH prior AS MATERIALIZED (
  -- The events published before, with what they were published with.
  SELECT e.id, e.type, e.key, e.payload, e.headers, e.handlers
    FROM "{{schema}}"."{{prefix}}events" e WHERE e.id = ANY ($1)
), conflicts AS MATERIALIZED (
  -- A republish must say the same as the first publish; one that does not stops the batch.
  SELECT ev.id
    FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[])
         AS ev(id, type, key, payload, headers)
    JOIN prior p ON p.id = ev.id
   WHERE (ev.type, ev.key, ev.payload, ev.headers) IS DISTINCT FROM (p.type, p.key, p.payload, p.headers)
), fresh AS MATERIALIZED (
  -- Only deliveries of handlers the event never had: a republish is idempotent even after
  -- completed deliveries were deleted. Nothing, if the batch has a conflict.
  SELECT d.*, p.id IS NOT NULL AS republished
    FROM unnest($6::text[], $7::text[], $8::text[], $9::int2[], $10::text[])
         WITH ORDINALITY AS d(event_id, handler, id, lane, key, ord)
    LEFT JOIN prior p ON p.id = d.event_id
   WHERE (p.id IS NULL OR NOT (d.handler = ANY (p.handlers)))
     AND NOT EXISTS (SELECT 1 FROM conflicts)
), keyed AS (
  SELECT event_id, key, min(ord) AS ord FROM fresh WHERE key IS NOT NULL GROUP BY event_id, key
), {{reserve_keys}}, events_inserted AS (
  INSERT INTO "{{schema}}"."{{prefix}}events" (id, type, key, payload, headers, handlers)
  SELECT ev.id, ev.type, ev.key, ev.payload, ev.headers, $7[ev.first:ev.last]
    FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[], $11::int4[], $12::int4[])
         AS ev(id, type, key, payload, headers, first, last)
   WHERE NOT EXISTS (SELECT 1 FROM conflicts) AND ev.id NOT IN (SELECT id FROM prior)
), events_extended AS (
  -- A republish adds the handlers the event never had; the row lock orders concurrent ones.
  UPDATE "{{schema}}"."{{prefix}}events" e
     SET handlers = e.handlers || ARRAY(SELECT h FROM unnest(f.handlers) h
                                         WHERE NOT (h = ANY (e.handlers)))
    FROM (SELECT event_id, array_agg(handler ORDER BY ord) AS handlers
            FROM fresh WHERE republished GROUP BY event_id) f
   WHERE e.id = f.event_id AND e.id = ANY ($1) AND NOT (f.handlers <@ e.handlers)
), inserted AS (
  INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key, sequence)
  SELECT f.id, f.event_id, f.handler, f.lane, f.key, n.sequence
    FROM fresh f LEFT JOIN numbered n ON n.event_id = f.event_id
   WHERE NOT f.republished
), added AS (
  -- Deliveries of republished events: a concurrent republish may have added them first.
  INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key, sequence)
  SELECT f.id, f.event_id, f.handler, f.lane, f.key, n.sequence
    FROM fresh f LEFT JOIN numbered n ON n.event_id = f.event_id
   WHERE f.republished
  ON CONFLICT (event_id, handler) DO NOTHING
  RETURNING id
)
-- One row: the events published before, the deliveries added to them, the conflicts.
SELECT (SELECT array_agg(id) FROM prior), (SELECT array_agg(id) FROM added),
       (SELECT array_agg(id) FROM conflicts)
