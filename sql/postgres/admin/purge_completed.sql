-- One purge batch: completed rows kept from 0.1 that completed longer ago than $1 seconds, at
-- most $2.
-- params: float8, int8
DELETE FROM "{{schema}}"."{{prefix}}deliveries" WHERE id IN (
  SELECT id FROM "{{schema}}"."{{prefix}}deliveries"
   WHERE status = 'completed' AND completed_at < now() - $1 * interval '1 second' LIMIT $2)
