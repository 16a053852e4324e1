-- Publish: one statement per batch reserves key sequences, inserts events and inserts
-- deliveries, so a batch is atomic without BEGIN/COMMIT. An event published before with other
-- content (type, key, payload or headers) writes nothing of the batch and is returned in the
-- last column instead.
-- $1..$5 the events as parallel arrays (id, type, key, payload, headers); $6..$9 one row per
-- (event, handler): event id, handler, delivery id, lane.
-- params: text[], text[], text[], jsonb[], jsonb[], text[], text[], text[], int2[]
WITH ev AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[])
    WITH ORDINALITY AS e(id, type, key, payload, headers, ord)
), dv AS (
  SELECT * FROM unnest($6::text[], $7::text[], $8::text[], $9::int2[])
    WITH ORDINALITY AS d(event_id, handler, id, lane, ord)
), prior AS (
  -- The events published before, with what they were published with.
  SELECT e.id, e.type, e.key, e.payload, e.headers, e.handlers
    FROM "{{schema}}"."{{prefix}}events" e WHERE e.id = ANY ($1)
), conflicts AS MATERIALIZED (
  -- A republish must say the same as the first publish; one that does not stops the batch.
  SELECT ev.id FROM ev JOIN prior p ON p.id = ev.id
   WHERE (ev.type, ev.key, ev.payload, ev.headers) IS DISTINCT FROM (p.type, p.key, p.payload, p.headers)
), fresh AS (
  -- Only deliveries of handlers the event never had: a republish is idempotent even after
  -- completed deliveries were deleted. Nothing, if the batch has a conflict.
  SELECT dv.*, ev.key, ev.ord AS event_ord
    FROM dv JOIN ev ON ev.id = dv.event_id LEFT JOIN prior p ON p.id = dv.event_id
   WHERE (p.id IS NULL OR NOT (dv.handler = ANY (p.handlers)))
     AND NOT EXISTS (SELECT 1 FROM conflicts)
), keyed AS (
  SELECT DISTINCT event_ord, event_id, key FROM fresh WHERE key IS NOT NULL
), reserved AS (
  -- One upsert per key, in key order (two batches cannot deadlock); its row lock is held
  -- until commit, so sequence order is commit order per key.
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
), inserted AS (
  INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key, sequence)
  SELECT f.id, f.event_id, f.handler, f.lane, f.key, n.sequence
    FROM fresh f LEFT JOIN numbered n ON n.event_id = f.event_id
   ORDER BY f.ord
  ON CONFLICT (event_id, handler) DO NOTHING
  RETURNING event_id, handler, id
)
SELECT event_id, handler, id, NULL AS conflict FROM inserted
UNION ALL
SELECT NULL, NULL, NULL, id FROM conflicts
