-- Requeue: every selected dead delivery becomes pending, due now, with a fresh attempt budget
-- and a new claim. The status condition is in the statement, so a delivery that is not dead
-- when it runs is never touched. Its last error is kept until the next attempt.
-- $1 ids (NULL: any), $2 handler, $3 event type, $4 text the last error contains; the criteria
-- combine with AND.
-- params: text[], text, text, text
UPDATE "{{schema}}"."{{prefix}}deliveries" d
   SET status = 'pending', attempts = 0, claims = d.claims + 1, available_at = now(),
       updated_at = now()
 WHERE d.status = 'dead'
   AND ($1::text[] IS NULL OR d.id = ANY ($1))
   AND ($2::text IS NULL OR d.handler = $2)
   AND ($3::text IS NULL OR EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}events" e
                                     WHERE e.id = d.event_id AND e.type = $3))
   AND ($4::text IS NULL OR strpos(d.last_error, $4) > 0)
RETURNING d.id
