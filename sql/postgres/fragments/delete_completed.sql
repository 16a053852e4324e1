-- The deletes of a completion (complete.sql, complete_with_history.sql): `found` and `moved`
-- return the deleted deliveries. $1..$5 the tokens as parallel arrays (delivery id, lane,
-- epoch, claims, tuple id). Lane rows are read without a lock, so a completion never waits
-- for the owner's claims; a takeover that committed first has bumped `claims`, the re-check
-- under the delete fails, and a completion and a takeover never both win.
t AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::int2[], $3::int8[], $4::int4[], $5::tid[])
    AS t(id, lane, epoch, claims, row)
), fenced AS MATERIALIZED (
  -- The tokens whose lane still has their epoch and lists them in flight: the lanes' lists
  -- are unnested once and joined by id.
  SELECT t.id, t.claims, t.row FROM t JOIN (
    SELECT f.id FROM "{{schema}}"."{{prefix}}lanes" l CROSS JOIN LATERAL unnest(l.in_flight) AS f(id)
     WHERE (l.lane, l.epoch) IN (SELECT lane, epoch FROM t)) AS listed ON listed.id = t.id
), found AS (
  -- Each row where its claim found it, by tuple id: no index lookup. The row must still be
  -- the delivery with the token's claims, compared as one row so that no plan can join on
  -- the id through the primary key (on an empty store's statistics one walked all of it).
  DELETE FROM "{{schema}}"."{{prefix}}deliveries" d
   USING fenced f WHERE d.ctid = f.row AND d.ctid = ANY ($5)
     AND (d.id, d.claims) IS NOT DISTINCT FROM (f.id, f.claims)
  RETURNING d.id, d.event_id, d.handler, d.attempts
), moved AS (
  -- The rest by id: a row updated since its claim (or a token without a tuple id); when every
  -- row was found, not even their ids are compared. The ids bound the rows read, whatever the
  -- planner thinks of the table's size.
  DELETE FROM "{{schema}}"."{{prefix}}deliveries" d
   USING fenced f WHERE d.id = f.id AND d.claims = f.claims
     AND d.id = ANY (ARRAY(SELECT id FROM fenced
                            WHERE (SELECT count(*) FROM found) < (SELECT count(*) FROM fenced)
                              AND id NOT IN (SELECT id FROM found)))
  RETURNING d.id, d.event_id, d.handler, d.attempts
)
