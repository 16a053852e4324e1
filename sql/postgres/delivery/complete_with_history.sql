-- Completion with history: complete.sql, and the deleted deliveries appended to the
-- completion history in the same statement. A statement of its own, since a history insert in
-- every completion would open the history table on every call. The deletes are
-- fragments/delete_completed.sql.
-- $1..$5 the tokens as parallel arrays (delivery id, lane, epoch, claims, tuple id).
-- params: text[], int2[], int8[], int4[], tid[]
WITH {{delete_completed}}, done AS (
  SELECT * FROM found UNION ALL SELECT * FROM moved
), history AS (
  INSERT INTO "{{schema}}"."{{prefix}}completions" (event_id, handler, attempts)
  SELECT event_id, handler, attempts + 1 FROM done
)
SELECT id FROM done
