-- Graceful shutdown: ends the claims of aborted deliveries without charging an attempt, then
-- hands back every lane of this worker, so others continue at once instead of after the lease.
-- $1 owner, $2..$5 the aborted tokens as parallel arrays.
-- params: text, text[], int2[], int8[], int4[]
WITH released AS (
  UPDATE "{{schema}}"."{{prefix}}deliveries" d SET claims = d.claims + 1
    FROM unnest($2::text[], $3::int2[], $4::int8[], $5::int4[]) AS t(id, lane, epoch, claims),
         "{{schema}}"."{{prefix}}lanes" l
   WHERE d.id = t.id AND d.claims = t.claims AND l.lane = t.lane AND l.epoch = t.epoch
     AND l.lease_owner = $1 AND d.id = ANY (l.in_flight) AND d.id = ANY ($2)
  RETURNING d.id
)
UPDATE "{{schema}}"."{{prefix}}lanes"
   SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'
 WHERE lease_owner = $1
