-- One batch of `events replay`: a delivery for handler $1 for each event of $2 (in publish
-- order) as a publish would have made it, with the lane ($4) of its key ($5) and the next
-- sequences of that key, and the handler added to the event's handlers. What the walk read is
-- checked again under the events' row locks: an event purged since, or given a live delivery
-- for the handler since, or (unless $6, `--again`) ever published for it, gets nothing. A
-- completed row kept from 0.1 becomes the new delivery. Returns the events given a delivery.
-- $3 the new deliveries' ids.
-- params: text, text[], text[], int2[], text[], bool
WITH candidates AS MATERIALIZED (
  SELECT c.event_id, c.id, c.lane, c.key, c.ord
    FROM unnest($2::text[], $3::text[], $4::int2[], $5::text[])
         WITH ORDINALITY AS c(event_id, id, lane, key, ord)
), locked AS MATERIALIZED (
  -- In id order, as every batch locks them: two replays wait for each other, never deadlock.
  SELECT e.id, e.handlers FROM "{{schema}}"."{{prefix}}events" e
   WHERE e.id = ANY ($2) ORDER BY e.id FOR UPDATE
), fresh AS MATERIALIZED (
  SELECT c.* FROM candidates c JOIN locked l ON l.id = c.event_id
   WHERE ($6 OR NOT ($1 = ANY (l.handlers)))
     AND NOT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}deliveries" d
                      WHERE d.event_id = c.event_id AND d.handler = $1
                        AND d.status <> 'completed')
), keyed AS (
  SELECT event_id, key, ord FROM fresh WHERE key IS NOT NULL
), {{reserve_keys}}, extended AS (
  UPDATE "{{schema}}"."{{prefix}}events" e SET handlers = array_append(e.handlers, $1)
    FROM fresh f
   WHERE e.id = f.event_id AND NOT ($1 = ANY (e.handlers))
), inserted AS (
  -- A delivery made by a concurrent publish after this statement's snapshot is the conflict
  -- that leaves it alone.
  INSERT INTO "{{schema}}"."{{prefix}}deliveries" AS d (id, event_id, handler, lane, key, sequence)
  SELECT f.id, f.event_id, $1, f.lane, f.key, n.sequence
    FROM fresh f LEFT JOIN numbered n ON n.event_id = f.event_id
  ON CONFLICT (event_id, handler) DO UPDATE
     SET id = excluded.id, lane = excluded.lane, key = excluded.key,
         sequence = excluded.sequence, status = 'pending', attempts = 0, claims = 0,
         available_at = now(), last_error = NULL, created_at = now(), updated_at = now(),
         completed_at = NULL
   WHERE d.status = 'completed'
  RETURNING d.event_id
)
SELECT coalesce(array_agg(event_id), '{}') FROM inserted
