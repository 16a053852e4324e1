-- Deliveries of a 0.1 store still leased by a 0.1 worker, and until when.
-- params:
SELECT count(*), max(lease_expires_at)::text FROM "{{schema}}"."{{prefix}}deliveries"
 WHERE status = 'processing' AND lease_expires_at > now()
