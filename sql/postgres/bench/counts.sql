-- Deliveries in all, pending and dead.
-- params:
SELECT count(*), count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'dead')
  FROM "{{schema}}"."{{prefix}}deliveries"
