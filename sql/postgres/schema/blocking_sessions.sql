-- The sessions that held a lock a schema change waited for: locks on the schema's relations,
-- or the setup lock ($2, $3: its two halves, as pg_locks shows an advisory lock's key).
-- params: text, int8, int8
SELECT a.pid, coalesce(a.usename, '?'), coalesce(a.application_name, ''), coalesce(a.state, '?'),
       coalesce(date_trunc('second', now() - a.xact_start)::text, '?'),
       left(regexp_replace(coalesce(a.query, ''), '\s+', ' ', 'g'), 120)
  FROM pg_stat_activity a
 WHERE a.pid <> pg_backend_pid() AND a.pid IN (
       SELECT l.pid FROM pg_locks l
        WHERE l.granted AND (
          (l.locktype = 'relation' AND l.relation IN (
             SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1))
          OR (l.locktype = 'advisory' AND l.classid::bigint = $2
              AND l.objid::bigint = $3 AND l.objsubid = 1)))
 ORDER BY a.xact_start
