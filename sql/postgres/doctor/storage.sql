-- The storage parameters of every table of a namespace with the prefix.
-- $1 schema.
-- params: text
SELECT c.relname::text, coalesce(c.reloptions, '{}')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
   AND left(c.relname, length('{{prefix}}')) = '{{prefix}}'
 ORDER BY c.relname
