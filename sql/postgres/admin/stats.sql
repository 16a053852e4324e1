-- Per handler: due (not running), scheduled for later, processing (in flight under a live
-- lease), dead, completed (history and 0.1 rows), and the age of the oldest due delivery.
-- params:
WITH live AS (
  SELECT f.id FROM "{{schema}}"."{{prefix}}lanes" l CROSS JOIN LATERAL unnest(l.in_flight) AS f(id)
   WHERE l.lease_expires_at > now()
), pending AS (
  SELECT d.handler,
         count(*) FILTER (WHERE d.available_at <= now() AND d.id NOT IN (SELECT id FROM live)) AS due,
         count(*) FILTER (WHERE d.available_at > now() AND d.id NOT IN (SELECT id FROM live)) AS scheduled,
         count(*) FILTER (WHERE d.id IN (SELECT id FROM live)) AS processing,
         min(d.available_at) FILTER (WHERE d.available_at <= now() AND d.id NOT IN (SELECT id FROM live)) AS oldest
    FROM "{{schema}}"."{{prefix}}deliveries" d WHERE d.status = 'pending' GROUP BY d.handler
), dead AS (
  SELECT handler, count(*) AS dead FROM "{{schema}}"."{{prefix}}deliveries"
   WHERE status = 'dead' GROUP BY handler
), completed AS (
  SELECT handler, count(*) AS completed FROM (
    SELECT handler FROM "{{schema}}"."{{prefix}}completions"
    UNION ALL SELECT handler FROM "{{schema}}"."{{prefix}}deliveries" WHERE status = 'completed') x
   GROUP BY handler
)
SELECT coalesce(p.handler, x.handler, c.handler), coalesce(p.due, 0), coalesce(p.scheduled, 0),
       coalesce(p.processing, 0), coalesce(x.dead, 0), coalesce(c.completed, 0),
       extract(epoch FROM now() - p.oldest)::float8
  FROM pending p FULL JOIN dead x ON x.handler = p.handler
  FULL JOIN completed c ON c.handler = coalesce(p.handler, x.handler)
 ORDER BY 1
