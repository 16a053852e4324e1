-- The raw-SQL floor of publishing: the same rows as a publish, by the plainest statement.
-- $1..$3 events (id, key, payload), $4 delivery ids, $5 the handlers of every event, $6..$9 one
-- row per delivery (event id, handler, lane, key).
-- params: text[], text[], jsonb[], text[], text[], text[], text[], int2[], text[]
WITH e AS (
  INSERT INTO "{{schema}}"."{{prefix}}events" (id, type, key, payload, handlers)
  SELECT id, 'bench.event', key, payload, $5
    FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS t(id, key, payload)
)
INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key)
SELECT d.id, d.event_id, d.handler, d.lane, d.key
  FROM unnest($4::text[], $6::text[], $7::text[], $8::int2[], $9::text[])
       AS d(id, event_id, handler, lane, key)
