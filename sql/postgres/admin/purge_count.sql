-- What a purge would delete: dead deliveries older than $1, and with $2 the completed rows kept
-- from 0.1, the completion history, and the events older than $2 that would be left without a
-- delivery (counting the dead ones this purge deletes). A NULL age counts nothing of its kind.
-- $1 dead age in seconds, $2 completed age in seconds.
-- params: float8, float8
SELECT
  (SELECT count(*) FROM "{{schema}}"."{{prefix}}deliveries"
    WHERE $1 IS NOT NULL AND status = 'dead' AND updated_at < now() - $1 * interval '1 second'),
  (SELECT count(*) FROM "{{schema}}"."{{prefix}}deliveries"
    WHERE $2 IS NOT NULL AND status = 'completed' AND completed_at < now() - $2 * interval '1 second'),
  (SELECT count(*) FROM "{{schema}}"."{{prefix}}completions"
    WHERE $2 IS NOT NULL AND completed_at < now() - $2 * interval '1 second'),
  (SELECT count(*) FROM "{{schema}}"."{{prefix}}events" e
    WHERE $2 IS NOT NULL AND e.created_at < now() - $2 * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}deliveries" d
                       WHERE d.event_id = e.id
                         AND NOT (d.status = 'completed' AND d.completed_at < now() - $2 * interval '1 second')
                         AND NOT (d.status = 'dead' AND $1 IS NOT NULL
                                  AND d.updated_at < now() - $1 * interval '1 second')))
