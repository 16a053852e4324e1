-- Confirms, before a handler starts, that the worker still holds its delivery's lane: the lane
-- is still the worker's at the claim's epoch (any change of hands bumps it) and lists the
-- delivery in flight. The lease is extended then, so the handler starts under a whole lease.
-- Asked only when the worker's own clock cannot vouch for the lease: it is in its last fifth,
-- or the worker was frozen.
-- $1 owner, $2 lease in ms, $3 lane, $4 epoch, $5 delivery id.
-- params: text, float8, int2, int8, text
UPDATE "{{schema}}"."{{prefix}}lanes"
   SET lease_expires_at = now() + $2::float8 * interval '1 millisecond'
 WHERE lane = $3 AND epoch = $4 AND lease_owner = $1 AND $5 = ANY (in_flight)
RETURNING lane
