-- The rows a 0.1 -> 0.2 conversion rewrites: events, and deliveries by status.
-- params:
SELECT (SELECT count(*) FROM "{{schema}}"."{{prefix}}events"),
       count(*), count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'processing'),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status = 'dead')
  FROM "{{schema}}"."{{prefix}}deliveries"
