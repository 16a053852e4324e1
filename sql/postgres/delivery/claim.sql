-- Claim: one statement, so it runs atomically without BEGIN/COMMIT. Lanes, not rows, are
-- leased; the happy path writes one lane row per lane that got work and no delivery row.
-- The design note docs/design/delivery-path.md says why each part is shaped as it is.
-- $1 owner, $2 lease in ms, $3 handlers, $4 batch size, $5 free lanes to take at most,
-- $6 max attempts per handler (same order as $3), $7 deliveries the worker still has
-- outstanding, $8 where the free-lane search starts, $9 the most deliveries a lane keeps in
-- flight; the claim holds and takes only lanes whose number is $11 modulo $10 (its stream's).
-- $12 the lanes the stream's previous claim reported it holds, or NULL to find them by owner.
-- More lanes than $5 are taken when the held lanes' room leaves more of the batch to fill.
-- params: text, float8, text[], int8, int8, int4[], text[], int2, int4, int2, int2, int2[]
WITH census AS MATERIALIZED (
  -- A census ($12 NULL: a stream's first claim, one after a failure, and one every tenth of
  -- the lease) reads every lane of the stream once: the lanes this worker holds, and the
  -- expired ones another worker left with deliveries in flight (a dead worker's), which are
  -- taken over whatever the batch leaves room for, so that their deliveries wait for the
  -- lease and not for this worker's backlog. Other claims skip it (a one-time filter).
  SELECT o.lane, o.lease_owner = $1 AS mine FROM "{{schema}}"."{{prefix}}lanes" o
   WHERE $12 IS NULL AND o.lane % $10 = $11
     AND (o.lease_owner = $1 OR (o.lease_expires_at <= now() AND cardinality(o.in_flight) > 0))
), ours AS (
  -- The lanes of the stream this worker holds, as the snapshot shows them, and the room each
  -- has for more deliveries: a lane that runs $9 is neither picked from nor written, so it is
  -- not locked either (a row lock is a write). A lane whose lease expired is still this
  -- worker's until another takes it over (the epoch fences every write, not the clock), so a
  -- worker that stalled past its lease keeps its lanes and its running deliveries' tokens.
  -- They are named as the previous claim reported them, or as the census found them.
  SELECT l.lane, greatest($9 - (SELECT count(*) FROM unnest(l.in_flight) AS x
                                  WHERE x IN (SELECT unnest($7::text[]))), 0) AS room
    FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lane = ANY (coalesce($12, ARRAY(SELECT lane FROM census WHERE mine)))
     AND l.lease_owner = $1 AND l.lane % $10 = $11
), held AS (
  -- Those with room, locked (a takeover of them waits, and one that committed first leaves
  -- the lane out), and what each keeps in flight: what the worker still has outstanding.
  SELECT l.lane, l.epoch, l.in_flight,
         ARRAY(SELECT x FROM unnest(l.in_flight) AS x WHERE x IN (SELECT unnest($7::text[])))
           AS running
    FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lane = ANY (ARRAY(SELECT lane FROM ours WHERE room > 0)) AND l.lease_owner = $1
   ORDER BY l.lane FOR UPDATE
), candidates AS (
  -- Free or expired lanes of the stream, not this worker's, probed one by one from the $8th
  -- until enough are found: $5, or more when the held lanes lack room for the batch (the last
  -- batch may still be recorded in them). A lane qualifies with due work for these handlers
  -- (the probe follows the due index's order). Each test is a scalar subquery, so that the
  -- probe stops at the limit (as a join, the planner sorts and reads every lane), and CASE
  -- keeps their order: most lanes have nothing due, and only the lanes that have are read.
  -- coalesce makes a miss false, which ends the test, where NULL would read on.
  SELECT c.lane FROM (SELECT ($11 + $10 * ((g + $8) % (256 / $10)))::int2 AS lane
                        FROM generate_series(0, 256 / $10 - 1) g) c
   WHERE c.lane NOT IN (SELECT lane FROM ours)
     AND CASE WHEN coalesce((SELECT true FROM "{{schema}}"."{{prefix}}deliveries" d
                              WHERE d.lane = c.lane AND d.status = 'pending'
                                AND d.available_at <= now() AND d.handler = ANY ($3)
                              ORDER BY d.available_at LIMIT 1), false)
              THEN coalesce((SELECT true FROM "{{schema}}"."{{prefix}}lanes" l
                              WHERE l.lane = c.lane
                                AND (l.lease_owner IS NULL OR l.lease_expires_at <= now())), false)
              ELSE false
         END
   LIMIT greatest($5, (SELECT ceil(($4 - coalesce(sum(room), 0)) / $9::numeric) FROM ours))
), taken AS (
  -- The candidates and the lanes the census found abandoned, locked unless another claimer
  -- has them, and still free (a lane this worker held without knowing it, after a claim whose
  -- answer was lost, is taken like any).
  SELECT l.lane, l.epoch, l.in_flight, l.lease_owner IS NOT NULL AS takeover
    FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lane IN (SELECT lane FROM candidates UNION SELECT lane FROM census WHERE NOT mine)
     AND (l.lease_owner IS NULL OR l.lease_expires_at <= now())
   FOR UPDATE SKIP LOCKED
), seen AS (
  -- The statement snapshot's version of those lanes, which can be older than the locked one.
  SELECT l.lane, l.in_flight FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lane = ANY (ARRAY(SELECT lane FROM held UNION ALL SELECT lane FROM taken))
), busy AS MATERIALIZED (
  -- Listed in flight in either version: never picked by this claim.
  SELECT unnest(in_flight) AS id FROM held
  UNION ALL SELECT unnest(in_flight) FROM seen
), mine AS (
  -- Every lane this claim writes: held ones, and taken ones with their epoch bumped.
  SELECT h.lane, h.epoch, h.running, false AS fresh, false AS takeover FROM held h
  UNION ALL
  SELECT t.lane, t.epoch + 1, '{}'::text[], true, t.takeover FROM taken t
), charged AS (
  -- A takeover charges one attempt to each delivery its predecessor had in flight, and buries
  -- it at its handler's last attempt. The ids are named as an index condition, and "pending"
  -- is said as "neither dead nor completed" so that no partial index of pending rows competes
  -- with the primary key.
  UPDATE "{{schema}}"."{{prefix}}deliveries" d
     SET attempts = d.attempts + 1, claims = d.claims + 1, updated_at = now(),
         last_error = 'lease lost: the worker holding lane ' || d.lane || ' stopped without completing',
         status = CASE WHEN d.attempts + 1 >= coalesce(($6::int4[])[array_position($3, d.handler)], 2147483647)
                       THEN 'dead' ELSE 'pending' END
    FROM taken t
   WHERE t.takeover AND d.id = ANY (t.in_flight) AND d.lane = t.lane
     AND d.status NOT IN ('dead', 'completed')
     AND d.id = ANY (ARRAY(SELECT unnest(in_flight) FROM taken WHERE takeover))
  RETURNING d.id
), picked AS (
  -- Due deliveries, lane by lane until the batch is full: first the held lanes that run
  -- nothing, then taken ones, then held ones with room left. A lane takes up to $9 in flight.
  -- Taken-over lanes are picked from in the next claim.
  SELECT p.* FROM (SELECT *, greatest($9 - cardinality(running), 0) AS room FROM mine
                    WHERE NOT takeover ORDER BY cardinality(running) > 0, fresh, lane) m
  CROSS JOIN LATERAL (SELECT * FROM (
    -- Unkeyed: from the lane's first due rows of these handlers, past what it runs, with $9
    -- to spare. Other handlers' rows are skipped, not counted: a paused handler's backlog (or
    -- one that only other workers serve) must not hide the rows behind it.
    (SELECT u.id, u.lane, m.epoch, u.claims, u.attempts, u.handler, u.event_id, u.available_at,
            u.row
       FROM (SELECT d.id, d.lane, d.claims, d.attempts, d.handler, d.event_id, d.available_at,
                    d.key, d.ctid AS row FROM "{{schema}}"."{{prefix}}deliveries" d
              WHERE d.lane = m.lane AND d.status = 'pending' AND d.available_at <= now()
                AND d.handler = ANY ($3)
              ORDER BY d.available_at, d.id LIMIT m.room + cardinality(m.running) + $9) u
      WHERE u.key IS NULL AND u.id NOT IN (SELECT id FROM busy)
      LIMIT m.room)
    UNION ALL
    -- Keyed: `k` walks the lane's distinct (handler, key) pairs, one index probe each; only
    -- the head of a key, its lowest pending sequence, may run, when due and not in flight.
    -- The probe that finds a pair reads its head: the first of the pair in the index's order.
    (WITH RECURSIVE k AS (
       (SELECT d.handler, d.key, d.id, d.claims, d.attempts, d.event_id, d.available_at,
               d.ctid AS row
          FROM "{{schema}}"."{{prefix}}deliveries" d
         WHERE d.lane = m.lane AND d.key IS NOT NULL AND d.status = 'pending'
         ORDER BY d.handler, d.key, d.sequence LIMIT 1)
       UNION ALL
       (SELECT n.* FROM k CROSS JOIN LATERAL (
          SELECT d.handler, d.key, d.id, d.claims, d.attempts, d.event_id, d.available_at,
                 d.ctid AS row
            FROM "{{schema}}"."{{prefix}}deliveries" d
           WHERE d.lane = m.lane AND d.key IS NOT NULL AND d.status = 'pending'
             AND (d.handler, d.key) > (k.handler, k.key)
           ORDER BY d.handler, d.key, d.sequence LIMIT 1) n)
     )
     SELECT k.id, m.lane, m.epoch, k.claims, k.attempts, k.handler, k.event_id, k.available_at,
            k.row
       FROM k
      WHERE k.handler = ANY ($3) AND k.available_at <= now() AND k.id NOT IN (SELECT id FROM busy)
      ORDER BY k.available_at, k.id LIMIT m.room)
  ) x ORDER BY x.available_at, x.id LIMIT m.room) p
  LIMIT $4
), picks AS (
  SELECT lane, array_agg(id) AS ids FROM picked GROUP BY lane
), batch AS (
  -- Whether the batch had room left: then a held lane that got nothing has nothing due for
  -- these handlers. With a full batch it may have (a lane taken over from a dead worker
  -- does), and it is kept for the next claim rather than handed back to wait for a search.
  SELECT count(*) < $4 AS short FROM picked
), written AS (
  -- One write per lane: the new epoch, the lease, and in flight what runs plus what was
  -- picked. Lanes that run nothing and got nothing although the batch had room are handed
  -- back in the same write. The lanes are also named as an index condition.
  UPDATE "{{schema}}"."{{prefix}}lanes" l
     SET epoch = m.epoch,
         lease_owner = CASE WHEN m.takeover OR p.ids IS NOT NULL OR cardinality(m.running) > 0
                            THEN $1 END,
         lease_expires_at = CASE WHEN m.takeover OR p.ids IS NOT NULL OR cardinality(m.running) > 0
                                 THEN now() + $2::float8 * interval '1 millisecond' END,
         in_flight = m.running || coalesce(p.ids, '{}')
    FROM mine m LEFT JOIN picks p USING (lane)
   WHERE l.lane = m.lane AND l.lane = ANY (ARRAY(SELECT lane FROM mine))
     AND (m.takeover OR p.ids IS NOT NULL
          OR (NOT m.fresh AND cardinality(m.running) = 0 AND (SELECT short FROM batch)))
), holds AS (
  -- The stream's lanes this worker holds once the claim commits: full ones left alone, those
  -- written with a lease or still running, and with a full batch the held ones left alone.
  -- The next claim starts from these.
  SELECT ARRAY(SELECT lane FROM ours WHERE room = 0
               UNION ALL
               SELECT m.lane FROM mine m LEFT JOIN picks p USING (lane)
                WHERE m.takeover OR p.ids IS NOT NULL OR cardinality(m.running) > 0
                   OR (NOT m.fresh AND NOT (SELECT short FROM batch))) AS lanes
)
-- Always one row at least: the takeover counts and the lanes held, with NULL delivery columns
-- when nothing was picked. Each delivery's event is one probe of its key (a lateral lookup,
-- which no plan turns into a walk of the whole key). The epoch is the one written: a lane that
-- got picks is always written, locked as it is. `row` is where the delivery's row is: nothing
-- on the happy path updates it, so its completion finds it there without an index lookup.
SELECT p.id, p.lane, p.epoch, p.claims, p.attempts, p.handler,
       e.id, e.type, e.key, e.payload, e.headers, e.created_at, c.n AS charged, t.n AS taken,
       p.row, h.lanes AS holds
  FROM (SELECT count(*) AS n FROM charged) c CROSS JOIN (SELECT count(*) AS n FROM taken) t
  CROSS JOIN holds h
  LEFT JOIN (picked p CROSS JOIN LATERAL (SELECT * FROM "{{schema}}"."{{prefix}}events" e
                                           WHERE e.id = p.event_id LIMIT 1) e) ON true
