-- One batch of the online backfill of events.handlers: the next events after $1 in id order;
-- returns the last id of the batch (null when there are none) and how many it walked.
-- params: text, int4
WITH batch AS (
  SELECT id FROM "{{schema}}"."{{prefix}}events" WHERE id > $1 ORDER BY id LIMIT $2
), filled AS (
  UPDATE "{{schema}}"."{{prefix}}events" AS e
     SET handlers = ARRAY(SELECT DISTINCT d.handler FROM "{{schema}}"."{{prefix}}deliveries" AS d
                           WHERE d.event_id = e.id ORDER BY d.handler)
    FROM batch
   WHERE e.id = batch.id AND e.handlers IS NULL
  RETURNING 1
)
-- The update runs whether or not its rows are read.
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM batch)
