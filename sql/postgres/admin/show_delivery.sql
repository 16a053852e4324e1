-- One delivery with its lane, for `deliveries show`.
-- $1 delivery id.
-- params: text
SELECT d.id, d.event_id, e.type, d.handler,
       CASE WHEN d.status = 'pending' AND EXISTS (
              SELECT 1 FROM "{{schema}}"."{{prefix}}lanes" l
               WHERE l.lane = d.lane AND l.lease_expires_at > now() AND d.id = ANY (l.in_flight))
            THEN 'processing' ELSE d.status END,
       d.attempts, d.key, d.sequence, d.lane, d.available_at, d.last_error, d.created_at,
       d.updated_at, d.completed_at,
       d.claims, l.lease_owner, l.epoch, l.lease_expires_at
  FROM "{{schema}}"."{{prefix}}deliveries" d
  JOIN "{{schema}}"."{{prefix}}events" e ON e.id = d.event_id
  JOIN "{{schema}}"."{{prefix}}lanes" l ON l.lane = d.lane
 WHERE d.id = $1
