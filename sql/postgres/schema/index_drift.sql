-- How the namespace's indexes differ from 0.2's, whatever their names: one row (name, action,
-- definition) per index that is not exactly a 0.2 one, and per 0.2 index that is missing.
--   drop      a 0.1 index 0.2 does not keep, found by its 0.1 name or by its 0.1 definition
--             under another name; a 0.2 index under another name (a copy); an index of a 0.2
--             name with another definition
--   invalid   an index of a 0.2 name that an interrupted concurrent build left invalid
--   create    a 0.2 index that is missing or is dropped here
--   foreign   any other index of a relaybus table: the application's, kept and never dropped,
--             with the 0.2 index whose columns cover its own, if one does
--   blocking  a foreign index that names a 0.1 lease column or the 0.1 status `processing`:
--             the conversion would drop it with its column, or leave it meaningless, so it
--             refuses until its owner drops it
-- The conversion and the install drop what this finds; `setup --check` calls a store current
-- only when it finds nothing but foreign indexes.
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
), retired_names (name) AS (VALUES
  -- The indexes of deliveries that 0.1 created and 0.2 does not keep, by the names 0.1 gave them.
  ('{{prefix}}deliveries_due_idx'), ('{{prefix}}deliveries_due_unkeyed_idx'),
  ('{{prefix}}deliveries_completed_idx'), ('{{prefix}}deliveries_handler_created_idx'),
  ('{{prefix}}deliveries_status_created_idx'), ('{{prefix}}deliveries_key_sequence_idx'),
  ('{{prefix}}deliveries_processing_idx'), ('{{prefix}}deliveries_dead_purge_idx')
), retired (def) AS (VALUES
  -- The same indexes by their 0.1 definitions, for copies renamed since.
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
         substring(pg_get_indexdef(i.indexrelid) from ' USING (.*)$') AS def,
         pg_get_indexdef(i.indexrelid) AS statement, i.indisvalid AS valid,
         CASE WHEN NOT 0 = ANY (i.indkey::int2[]) THEN
           ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) AS k
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)
         END AS cols
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = t.relnamespace
   WHERE n.nspname = '{{schema}}' AND NOT i.indisprimary
     AND t.relname IN ('{{prefix}}deliveries', '{{prefix}}events', '{{prefix}}completions',
                       '{{prefix}}lanes', '{{prefix}}key_sequences', '{{prefix}}handlers',
                       '{{prefix}}schema')
), classified AS (
  SELECT p.*,
         CASE
           WHEN p.name IN (SELECT name FROM wanted) AND NOT p.valid THEN 'invalid'
           WHEN p.name IN (SELECT name FROM wanted) THEN
             CASE WHEN (p.tbl, p.is_unique, p.def) IN (SELECT tbl, is_unique, def FROM wanted)
                  THEN 'keep' ELSE 'drop' END
           WHEN p.tbl = '{{prefix}}deliveries'
                AND (p.name IN (SELECT name FROM retired_names)
                     OR p.def IN (SELECT def FROM retired)) THEN 'drop'
           WHEN (p.tbl, p.is_unique, p.def) IN (SELECT tbl, is_unique, def FROM wanted) THEN 'drop'
           WHEN p.def ~ '\m(lease_owner|lease_token|lease_expires_at)\M|''processing''' THEN 'blocking'
           ELSE 'foreign'
         END AS action
    FROM present p
)
-- A foreign index whose key columns are all among those of a 0.2 index of its table (as 0.2
-- defines it, so the plan of a conversion can say so too) is named with it: the application
-- may not need it any more. An index on an expression is never covered.
SELECT c.name, c.action, c.statement,
       CASE WHEN c.action = 'foreign' THEN
         (SELECT w.name FROM wanted w
           WHERE w.tbl = c.tbl
             AND c.cols <@ string_to_array(substring(w.def from '^btree \(([^)]*)\)'), ', ')
           ORDER BY w.name LIMIT 1)
       END AS covered_by
  FROM classified c WHERE c.action <> 'keep'
UNION ALL
SELECT w.name, 'create', NULL, NULL FROM wanted w
 WHERE w.name IN (SELECT name FROM classified WHERE action IN ('drop', 'invalid'))
    OR NOT EXISTS (SELECT 1 FROM present p WHERE p.name = w.name)
 ORDER BY 2 DESC, 1
