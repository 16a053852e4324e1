-- Deliveries in creation order (relaybus ids are time-ordered, so that is the primary key's
-- order), for every status but completed. "processing" is derived: a pending delivery that its
-- lane lists in flight under a live lease. Admin statements are sent unnamed and planned per
-- call with their values, so a filter that is NULL drops out of the plan, and a status turns
-- into the literal a partial index serves.
-- $1 status (pending, processing, dead or NULL for all), $2 handler, $3 key, $4 the key's
-- lane (the keyed index leads with it), $5 event id, $6 event type, $7 limit, $8 the id the
-- previous page ended with.
-- params: text, text, text, int2, text, text, int8, text
SELECT d.id, d.event_id, e.type, d.handler,
       CASE WHEN d.status = 'pending' AND EXISTS (
              SELECT 1 FROM "{{schema}}"."{{prefix}}lanes" l
               WHERE l.lane = d.lane AND l.lease_expires_at > now() AND d.id = ANY (l.in_flight))
            THEN 'processing' ELSE d.status END,
       d.attempts, d.key, d.sequence, d.lane, d.available_at, d.last_error, d.created_at,
       d.updated_at, d.completed_at
  FROM "{{schema}}"."{{prefix}}deliveries" d JOIN "{{schema}}"."{{prefix}}events" e ON e.id = d.event_id
 WHERE ($1::text IS NULL OR d.status = CASE WHEN $1 = 'dead' THEN 'dead' ELSE 'pending' END)
   -- Processing: the ids in flight under live leases, looked up through the primary key.
   AND ($1 IS DISTINCT FROM 'processing' OR d.id = ANY (ARRAY(
          SELECT f.id FROM "{{schema}}"."{{prefix}}lanes" ll CROSS JOIN LATERAL unnest(ll.in_flight) AS f(id)
           WHERE ll.lease_expires_at > now())))
   AND ($1 IS DISTINCT FROM 'pending' OR NOT EXISTS (
          SELECT 1 FROM "{{schema}}"."{{prefix}}lanes" l
           WHERE l.lane = d.lane AND l.lease_expires_at > now() AND d.id = ANY (l.in_flight)))
   AND ($2::text IS NULL OR d.handler = $2)
   AND ($3::text IS NULL OR (d.lane = $4 AND d.key = $3))
   AND ($5::text IS NULL OR d.event_id = $5)
   AND ($6::text IS NULL OR e.type = $6)
   AND ($8::text IS NULL OR d.id > $8)
 ORDER BY d.id LIMIT $7
