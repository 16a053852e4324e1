-- The events of a dispatch backlog: e0 .. e($1 - 1), keyed 'k' || (n % $2) unless $2 is NULL,
-- with the benchmark's 160-byte payload and handlers $3.
-- params: int8, int8, text[]
INSERT INTO "{{schema}}"."{{prefix}}events" (id, type, key, payload, handlers)
SELECT 'e' || g, 'bench.event', CASE WHEN $2 IS NOT NULL THEN 'k' || (g % $2) END,
       jsonb_build_object('pad', repeat('x', 150)), $3
  FROM generate_series(0, $1 - 1) AS g
