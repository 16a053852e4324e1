-- One handler's keys with the most pending deliveries (`relaybus top`): its pending deliveries
-- read once, as the statistics read every handler's.
-- $1 handler, $2 limit.
-- params: text, int8
SELECT key, count(*), min(available_at)
  FROM "{{schema}}"."{{prefix}}deliveries"
 WHERE status = 'pending' AND handler = $1 AND key IS NOT NULL
 GROUP BY key ORDER BY count(*) DESC, key LIMIT $2
