-- Extends the lease of every lane of this worker that runs one of its outstanding deliveries.
-- A lane whose in-flight list names only deliveries the worker has finished (ids stay listed
-- until the lane's next claim rewrites the list) is not extended: it expires, and its pending
-- work is taken over instead of waiting behind a worker that runs nothing there.
-- $1 owner, $2 lease in ms, $3 the deliveries the worker has outstanding.
-- params: text, float8, text[]
UPDATE "{{schema}}"."{{prefix}}lanes"
   SET lease_expires_at = now() + $2::float8 * interval '1 millisecond'
 WHERE lease_owner = $1 AND in_flight && $3
RETURNING lane
