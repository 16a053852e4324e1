-- The raw-SQL floor of dispatch: a batch of $1 pending deliveries picked with SKIP LOCKED and
-- deleted.
-- params: int8
DELETE FROM "{{schema}}"."{{prefix}}deliveries" WHERE id IN (
  SELECT id FROM "{{schema}}"."{{prefix}}deliveries"
   WHERE status = 'pending' LIMIT $1 FOR UPDATE SKIP LOCKED)
