-- Deletes the locked candidates that still have no delivery: a publish that added one before
-- the lock is seen here, and its event is kept.
-- $1 the locked event ids.
-- params: text[]
DELETE FROM "{{schema}}"."{{prefix}}events" e
 WHERE e.id = ANY ($1)
   AND NOT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}deliveries" d WHERE d.event_id = e.id)
