-- One delivery per event and handler, with the lane relaybus computes and per-key sequences in
-- the order of the numbers (the exactness check relies on it). Ids ascend in publish order, as
-- relaybus's UUIDv7 ids do (random ones made the preload a fifth slower).
-- params: int8, int8, text[]
INSERT INTO "{{schema}}"."{{prefix}}deliveries" (id, event_id, handler, lane, key, sequence)
SELECT '00000000-0000-7000-8000-' || lpad(to_hex(g * cardinality($3) + i - 1), 12, '0'),
       'e' || g, h, "{{schema}}"."{{prefix}}lane_of"(coalesce(k.key, 'e' || g)), k.key,
       CASE WHEN k.key IS NOT NULL THEN row_number() OVER (PARTITION BY h, k.key ORDER BY g) END
  FROM generate_series(0, $1 - 1) AS g
 CROSS JOIN LATERAL (SELECT CASE WHEN $2 IS NOT NULL THEN 'k' || (g % $2) END AS key) k
 CROSS JOIN unnest($3::text[]) WITH ORDINALITY AS u(h, i)
