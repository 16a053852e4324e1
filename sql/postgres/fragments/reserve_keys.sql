reserved AS (
  -- Key sequences for `keyed` (event_id, key, ord), shared by both publish statements: one
  -- upsert per key, in key order (two batches cannot deadlock); its row lock is held until
  -- commit, so sequence order is commit order per key.
  INSERT INTO "{{schema}}"."{{prefix}}key_sequences" AS s (key, last_sequence)
  SELECT key, count(*) FROM keyed GROUP BY key ORDER BY key
  ON CONFLICT (key) DO UPDATE SET last_sequence = s.last_sequence + excluded.last_sequence
  RETURNING s.key, s.last_sequence
), numbered AS (
  SELECT k.event_id,
         r.last_sequence - count(*) OVER w + row_number() OVER (w ORDER BY k.ord) AS sequence
    FROM keyed k JOIN reserved r ON r.key = k.key
  WINDOW w AS (PARTITION BY k.key)
)
