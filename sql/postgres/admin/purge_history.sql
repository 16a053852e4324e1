-- One purge batch: completion history older than $1 seconds, oldest first, at most $2.
-- params: float8, int8
DELETE FROM "{{schema}}"."{{prefix}}completions" WHERE ctid IN (
  SELECT ctid FROM "{{schema}}"."{{prefix}}completions"
   WHERE completed_at < now() - $1 * interval '1 second' ORDER BY completed_at LIMIT $2)
