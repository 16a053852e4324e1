-- Every lane: owner, epoch, lease, whether it expired, deliveries in flight (still pending),
-- pending deliveries and the oldest due one.
-- params:
SELECT l.lane, l.lease_owner, l.epoch, l.lease_expires_at,
       coalesce(l.lease_expires_at <= now(), false),
       (SELECT count(*) FROM "{{schema}}"."{{prefix}}deliveries" d
         WHERE d.id = ANY (l.in_flight) AND d.status = 'pending'),
       coalesce(p.pending, 0), p.oldest_due
  FROM "{{schema}}"."{{prefix}}lanes" l LEFT JOIN (
       SELECT lane, count(*) AS pending,
              min(available_at) FILTER (WHERE available_at <= now()) AS oldest_due
         FROM "{{schema}}"."{{prefix}}deliveries" WHERE status = 'pending' GROUP BY lane) p USING (lane)
 ORDER BY l.lane
