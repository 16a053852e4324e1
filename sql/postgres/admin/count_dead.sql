-- How many dead deliveries a requeue would select.
-- $1 ids (NULL: any), $2 handler, $3 event type, $4 text the last error contains; the criteria
-- combine with AND.
-- params: text[], text, text, text
SELECT count(*) FROM "{{schema}}"."{{prefix}}deliveries" d
 WHERE d.status = 'dead'
   AND ($1::text[] IS NULL OR d.id = ANY ($1))
   AND ($2::text IS NULL OR d.handler = $2)
   AND ($3::text IS NULL OR EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}events" e
                                     WHERE e.id = d.event_id AND e.type = $3))
   AND ($4::text IS NULL OR strpos(d.last_error, $4) > 0)
