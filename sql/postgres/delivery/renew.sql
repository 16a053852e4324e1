-- Extends the lease of every lane this worker holds that runs something.
-- $1 owner, $2 lease in ms.
-- params: text, float8
UPDATE "{{schema}}"."{{prefix}}lanes"
   SET lease_expires_at = now() + $2::float8 * interval '1 millisecond'
 WHERE lease_owner = $1 AND cardinality(in_flight) > 0
RETURNING lane
