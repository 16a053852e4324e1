-- How the namespace's indexes differ from 0.2's, by definition, whatever their names: rows
-- (name, 'drop') for a 0.1 index 0.2 does not keep, for a 0.2 index under another name (a
-- duplicate) and for an index of a 0.2 name with another definition; (name, 'create') for a
-- 0.2 index that is missing or is dropped here. The conversion and the install drop what this
-- finds; `setup --check` calls a store current only when it finds nothing.
-- params:
WITH wanted (name, tbl, is_unique, def) AS (VALUES
  ('{{prefix}}deliveries_event_handler_unique', '{{prefix}}deliveries', true,
   'btree (event_id, handler)'),
  ('{{prefix}}deliveries_lane_due_idx', '{{prefix}}deliveries', false,
   'btree (lane, available_at, id) WHERE (status = ''pending''::text)'),
  ('{{prefix}}deliveries_lane_key_idx', '{{prefix}}deliveries', false,
   'btree (lane, handler, key, sequence) WHERE ((key IS NOT NULL) AND (status = ''pending''::text))'),
  ('{{prefix}}deliveries_dead_idx', '{{prefix}}deliveries', false,
   'btree (updated_at, id) WHERE (status = ''dead''::text)'),
  ('{{prefix}}events_created_idx', '{{prefix}}events', false, 'btree (created_at)'),
  ('{{prefix}}completions_completed_idx', '{{prefix}}completions', false, 'btree (completed_at)')
), retired (def) AS (VALUES
  -- The 0.1 indexes of deliveries that 0.2 does not keep.
  ('btree (available_at, id) WHERE (status = ''pending''::text)'),
  ('btree (available_at, id) WHERE ((status = ''pending''::text) AND (key IS NULL))'),
  ('btree (completed_at) WHERE (status = ''completed''::text)'),
  ('btree (handler, created_at)'),
  ('btree (status, created_at)'),
  ('btree (handler, key, sequence) WHERE ((key IS NOT NULL) AND (status = ANY (ARRAY[''pending''::text, ''processing''::text])))'),
  ('btree (lease_expires_at) WHERE (status = ''processing''::text)'),
  ('btree (updated_at) WHERE (status = ''dead''::text)')
), present AS (
  SELECT c.relname::text AS name, t.relname::text AS tbl, i.indisunique AS is_unique,
         substring(pg_get_indexdef(i.indexrelid) from ' USING (.*)$') AS def
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = t.relnamespace
   WHERE n.nspname = '{{schema}}' AND NOT i.indisprimary
     AND t.relname IN ('{{prefix}}deliveries', '{{prefix}}events', '{{prefix}}completions')
), dropped AS (
  SELECT p.name FROM present p
   WHERE (p.name NOT IN (SELECT name FROM wanted)
          AND ((p.tbl = '{{prefix}}deliveries' AND p.def IN (SELECT def FROM retired))
               OR (p.tbl, p.is_unique, p.def) IN (SELECT tbl, is_unique, def FROM wanted)))
      OR EXISTS (SELECT 1 FROM wanted w WHERE w.name = p.name
                  AND (w.tbl, w.is_unique, w.def) IS DISTINCT FROM (p.tbl, p.is_unique, p.def))
)
SELECT name, 'drop' AS action FROM dropped
UNION ALL
SELECT w.name, 'create' FROM wanted w
 WHERE w.name IN (SELECT name FROM dropped)
    OR NOT EXISTS (SELECT 1 FROM present p WHERE p.name = w.name)
 ORDER BY action DESC, name
