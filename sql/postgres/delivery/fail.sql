-- A failed attempt: the delivery leaves its lane's in-flight list and is rescheduled, or
-- buried when the handler rejected it ($5) or this was its last attempt ($8); one claim more
-- either way, and $9 attempts more (1 for an attempt, 0 for a delivery postponed without
-- one). The rare path: these updates are not HOT, by design.
-- $1..$4 the token (delivery id, lane, epoch, claims), $5 reject, $6 retry delay in ms,
-- $7 the error, $8 the handler's max attempts, $9 attempts charged. Returns the new status;
-- no row: lease lost.
-- params: text, int2, int8, int4, bool, float8, text, int4, int4
WITH lane AS (
  UPDATE "{{schema}}"."{{prefix}}lanes" SET in_flight = array_remove(in_flight, $1)
   WHERE lane = $2 AND epoch = $3 AND $1 = ANY (in_flight)
  RETURNING lane
)
UPDATE "{{schema}}"."{{prefix}}deliveries" d
   SET attempts = d.attempts + $9, claims = d.claims + 1, updated_at = now(), last_error = $7,
       status = CASE WHEN $5 OR d.attempts + $9 >= $8 THEN 'dead' ELSE 'pending' END,
       available_at = CASE WHEN $5 OR d.attempts + $9 >= $8 THEN d.available_at
                           ELSE now() + $6::float8 * interval '1 millisecond' END
  FROM lane WHERE d.id = $1 AND d.claims = $4 AND d.lane = lane.lane
RETURNING d.status
