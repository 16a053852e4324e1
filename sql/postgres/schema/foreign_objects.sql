-- Objects of the relaybus names that are not relaybus's: a relation that is not a table, a table
-- without the columns 0.1 and 0.2 share, a lane function of another shape. `CREATE ... IF NOT
-- EXISTS` does not look at what it finds, so setup would adopt them (and purge their rows).
-- One row per object: its name and what is wrong.
-- params:
WITH expected (tbl, col) AS (VALUES
  ('events', 'id'), ('events', 'type'), ('events', 'key'), ('events', 'payload'),
  ('events', 'headers'), ('events', 'created_at'),
  ('deliveries', 'id'), ('deliveries', 'event_id'), ('deliveries', 'handler'),
  ('deliveries', 'key'), ('deliveries', 'sequence'), ('deliveries', 'status'),
  ('deliveries', 'attempts'), ('deliveries', 'available_at'), ('deliveries', 'last_error'),
  ('deliveries', 'created_at'), ('deliveries', 'updated_at'), ('deliveries', 'completed_at'),
  ('lanes', 'lane'), ('lanes', 'epoch'), ('lanes', 'lease_owner'),
  ('lanes', 'lease_expires_at'), ('lanes', 'in_flight'),
  ('key_sequences', 'key'), ('key_sequences', 'last_sequence'),
  ('completions', 'event_id'), ('completions', 'handler'), ('completions', 'attempts'),
  ('completions', 'completed_at'),
  ('handlers', 'handler'), ('handlers', 'paused_at'), ('handlers', 'paused_by'),
  ('handlers', 'pause_reason'), ('handlers', 'failures'), ('handlers', 'opened'),
  ('handlers', 'open_until'),
  ('schema', 'singleton'), ('schema', 'version'), ('schema', 'installed_at')
), present AS (
  SELECT c.oid, c.relname::text AS relname, c.relkind, e.tbl
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN (SELECT DISTINCT tbl FROM expected) e ON c.relname = '{{prefix}}' || e.tbl
   WHERE n.nspname = '{{schema}}'
)
SELECT p.relname,
       CASE WHEN p.relkind NOT IN ('r', 'p') THEN 'it is not a table'
            ELSE 'it has no column ' || string_agg(x.col, ', ' ORDER BY x.col) END
  FROM present p JOIN expected x ON x.tbl = p.tbl
 WHERE p.relkind NOT IN ('r', 'p')
    OR NOT EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = p.oid AND a.attname = x.col AND NOT a.attisdropped)
 GROUP BY p.relname, p.relkind
UNION ALL
SELECT f.proname || '(text)', 'it is a function that does not return smallint'
  FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
 WHERE n.nspname = '{{schema}}' AND f.proname = '{{prefix}}lane_of'
   AND f.proargtypes = '25'::oidvector AND f.prorettype <> 'smallint'::regtype
ORDER BY 1
