-- One purge batch: dead deliveries last updated longer ago than $1 seconds, oldest first, at
-- most $2.
-- params: float8, int8
DELETE FROM "{{schema}}"."{{prefix}}deliveries" WHERE id IN (
  SELECT id FROM "{{schema}}"."{{prefix}}deliveries"
   WHERE status = 'dead' AND updated_at < now() - $1 * interval '1 second'
   ORDER BY updated_at LIMIT $2)
