-- Publish of a batch whose events are all new to the store: reserve key sequences
-- (fragments/reserve_keys.sql), insert events, insert deliveries, in one statement (atomic
-- without BEGIN/COMMIT). It does not look for earlier publishes: an event published before
-- makes it fail on the events' primary key, having written nothing, and the caller runs
-- `publish.sql`, which handles republishes.
-- $1..$5 the events as parallel arrays (id, type, key, payload, headers); $6..$10 one row per
-- (event, handler), grouped by event in event order: event id, handler, delivery id, lane,
-- key; $11, $12 where each event's handlers lie in $7 (first and last index).
-- params: text[], text[], text[], jsonb[], jsonb[], text[], text[], text[], int2[], text[], int4[], int4[]
WITH events_inserted AS (
  INSERT INTO "{{schema}}"."{{prefix}}events" (id, type, key, payload, headers, handlers)
  SELECT ev.id, ev.type, ev.key, ev.payload, ev.headers, $7[ev.first:ev.last]
    FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[], $11::int4[], $12::int4[])
         AS ev(id, type, key, payload, headers, first, last)
), keyed AS (
  SELECT event_id, key, min(ord) AS ord
    FROM unnest($6::text[], $10::text[]) WITH ORDINALITY AS d(event_id, key, ord)
   WHERE key IS NOT NULL
   GROUP BY event_id, key
), {{reserve_keys}}
INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key, sequence)
SELECT d.id, d.event_id, d.handler, d.lane, d.key, n.sequence
  FROM unnest($6::text[], $7::text[], $8::text[], $9::int2[], $10::text[])
       AS d(event_id, handler, id, lane, key)
  LEFT JOIN numbered n ON n.event_id = d.event_id
