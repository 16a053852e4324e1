-- The columns of every table of a namespace with the prefix, as the catalog defines them: the
-- doctor compares an installed store with a fresh install of this version.
-- $1 schema.
-- params: text
SELECT c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
   AND left(c.relname, length('{{prefix}}')) = '{{prefix}}'
 ORDER BY c.relname, a.attnum
