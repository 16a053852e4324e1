-- Per handler: due (not running), scheduled for later, processing (in flight under a live
-- lease), dead, completed (history and 0.1 rows), and the age of the oldest due delivery. One
-- scan of the deliveries counts every status (a scan per status took half as long again on a
-- million deliveries), and whether a delivery runs is looked up once per row.
-- params:
WITH live AS (
  SELECT f.id FROM "{{schema}}"."{{prefix}}lanes" l CROSS JOIN LATERAL unnest(l.in_flight) AS f(id)
   WHERE l.lease_expires_at > now()
), d AS (
  SELECT handler, status, available_at,
         status = 'pending' AND id IN (SELECT id FROM live) AS running
    FROM "{{schema}}"."{{prefix}}deliveries"
), counts AS (
  SELECT handler,
         count(*) FILTER (WHERE status = 'pending' AND NOT running AND available_at <= now()) AS due,
         count(*) FILTER (WHERE status = 'pending' AND NOT running AND available_at > now()) AS scheduled,
         count(*) FILTER (WHERE running) AS processing,
         count(*) FILTER (WHERE status = 'dead') AS dead,
         count(*) FILTER (WHERE status = 'completed') AS completed,
         min(available_at) FILTER (WHERE status = 'pending' AND NOT running AND available_at <= now()) AS oldest
    FROM d GROUP BY handler
), history AS (
  SELECT handler, count(*) AS completed FROM "{{schema}}"."{{prefix}}completions" GROUP BY handler
)
SELECT coalesce(c.handler, h.handler), coalesce(c.due, 0), coalesce(c.scheduled, 0),
       coalesce(c.processing, 0), coalesce(c.dead, 0),
       coalesce(c.completed, 0) + coalesce(h.completed, 0),
       extract(epoch FROM now() - c.oldest)::float8
  FROM counts c FULL JOIN history h ON h.handler = c.handler
 ORDER BY 1
