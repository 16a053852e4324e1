-- Completion: deletes the deliveries of a window of completions whose tokens are still valid,
-- in one statement (complete_with_history.sql also appends them to the history). Lane rows are read
-- without a lock, so a completion never waits for the owner's claims; a takeover that
-- committed first has bumped `claims`, the re-check under the delete fails, and a completion
-- and a takeover never both win.
-- $1..$4 the tokens as parallel arrays (delivery id, lane, epoch, claims).
-- params: text[], int2[], int8[], int4[]
WITH t AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::int2[], $3::int8[], $4::int4[]) AS t(id, lane, epoch, claims)
), fenced AS MATERIALIZED (
  -- The tokens whose lane still has their epoch and lists them in flight: the lanes' lists
  -- are unnested once and joined by id.
  SELECT t.id, t.claims FROM t JOIN (
    SELECT f.id FROM "{{schema}}"."{{prefix}}lanes" l CROSS JOIN LATERAL unnest(l.in_flight) AS f(id)
     WHERE (l.lane, l.epoch) IN (SELECT lane, epoch FROM t)) AS listed ON listed.id = t.id
)
-- The tokens' ids bound the rows read, whatever the planner thinks of the table's size.
DELETE FROM "{{schema}}"."{{prefix}}deliveries" d
 USING fenced f WHERE d.id = f.id AND d.claims = f.claims AND d.id = ANY ($1)
RETURNING d.id
