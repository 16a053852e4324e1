-- (event id, handler) of every pending delivery, for the exactness check.
-- params:
SELECT event_id, handler FROM "{{schema}}"."{{prefix}}deliveries" WHERE status = 'pending'
