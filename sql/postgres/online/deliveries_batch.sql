-- One batch of the online backfill of deliveries.lane: the next deliveries after $1 in id order
-- get their lane, and processing ones become pending with their attempts kept; returns the last
-- id of the batch (null when there are none) and how many it walked.
-- params: text, int4
WITH batch AS (
  SELECT id FROM "{{schema}}"."{{prefix}}deliveries" WHERE id > $1 ORDER BY id LIMIT $2
), filled AS (
  UPDATE "{{schema}}"."{{prefix}}deliveries" AS d
     SET lane = "{{schema}}"."{{prefix}}lane_of"(coalesce(d.key, d.event_id)),
         status = CASE d.status WHEN 'processing' THEN 'pending' ELSE d.status END
    FROM batch
   WHERE d.id = batch.id AND d.lane IS NULL
  RETURNING 1
)
-- The update runs whether or not its rows are read.
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM batch)
