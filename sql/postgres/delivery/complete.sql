-- Completion: deletes the deliveries of a window of completions whose tokens are still valid,
-- in one statement (complete_with_history.sql also appends them to the history). The deletes
-- are fragments/delete_completed.sql.
-- $1..$5 the tokens as parallel arrays (delivery id, lane, epoch, claims, tuple id).
-- params: text[], int2[], int8[], int4[], tid[]
WITH {{delete_completed}}
SELECT id FROM found UNION ALL SELECT id FROM moved
