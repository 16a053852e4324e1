-- One handler's dead letters, the most recently buried first (`relaybus top`), through the
-- dead letters' index.
-- $1 handler, $2 limit.
-- params: text, int8
SELECT d.id, d.event_id, e.type, d.handler, d.status, d.attempts, d.key, d.sequence, d.lane,
       d.available_at, d.last_error, d.created_at, d.updated_at, d.completed_at
  FROM "{{schema}}"."{{prefix}}deliveries" d JOIN "{{schema}}"."{{prefix}}events" e ON e.id = d.event_id
 WHERE d.status = 'dead' AND d.handler = $1
 ORDER BY d.updated_at DESC, d.id DESC LIMIT $2
