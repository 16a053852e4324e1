-- The tables and indexes that exist in the schema, so a plan names only what it changes.
-- params:
SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = '{{schema}}' AND c.relkind IN ('r', 'i')
