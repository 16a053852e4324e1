-- Completed deliveries, newest first: completed rows kept from 0.1, and the completion
-- history (written only by workers run with --completion-history; 0.2 deletes completed
-- deliveries). The history has no lane; its key is the event's.
-- $1 handler, $2 key, $3 the key's lane, $4 event id, $5 event type, $6 limit.
-- params: text, text, int2, text, text, int8
SELECT * FROM (
SELECT d.id, d.event_id, e.type, d.handler,
       CASE WHEN d.status = 'pending' AND EXISTS (
              SELECT 1 FROM "{{schema}}"."{{prefix}}lanes" l
               WHERE l.lane = d.lane AND l.lease_expires_at > now() AND d.id = ANY (l.in_flight))
            THEN 'processing' ELSE d.status END,
       d.attempts, d.key, d.sequence, d.lane, d.available_at, d.last_error, d.created_at,
       d.updated_at, d.completed_at
  FROM "{{schema}}"."{{prefix}}deliveries" d JOIN "{{schema}}"."{{prefix}}events" e ON e.id = d.event_id
 WHERE d.status = 'completed'
   AND ($1::text IS NULL OR d.handler = $1)
   AND ($2::text IS NULL OR (d.lane = $3 AND d.key = $2))
   AND ($4::text IS NULL OR d.event_id = $4)
   AND ($5::text IS NULL OR e.type = $5)
UNION ALL
SELECT NULL, c.event_id, coalesce(e.type, ''), c.handler, 'completed', c.attempts, e.key, NULL,
       NULL, NULL, NULL, e.created_at, NULL, c.completed_at
  FROM "{{schema}}"."{{prefix}}completions" c LEFT JOIN "{{schema}}"."{{prefix}}events" e ON e.id = c.event_id
 WHERE ($1::text IS NULL OR c.handler = $1)
   AND ($2::text IS NULL OR e.key = $2)
   AND ($4::text IS NULL OR c.event_id = $4)
   AND ($5::text IS NULL OR e.type = $5)
) x ORDER BY completed_at DESC NULLS LAST LIMIT $6
