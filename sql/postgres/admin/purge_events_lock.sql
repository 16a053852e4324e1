-- Events older than $1 seconds without deliveries, at most $2, locked (skipping events another
-- purge holds). The delete that follows checks them again with a younger snapshot.
-- params: float8, int8
SELECT e.id FROM "{{schema}}"."{{prefix}}events" e
 WHERE e.created_at < now() - $1 * interval '1 second'
   AND NOT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}deliveries" d WHERE d.event_id = e.id)
 ORDER BY e.created_at LIMIT $2 FOR UPDATE SKIP LOCKED
