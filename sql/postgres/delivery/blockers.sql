-- The sessions that block any of $1 (the worker's sessions now handed out), as a stalled
-- claim or completion names them. Run on a connection of its own: the pool may be exhausted.
-- params: int4[]
SELECT a.pid, coalesce(a.usename, '?'), coalesce(a.application_name, ''), coalesce(a.state, '?'),
       coalesce(date_trunc('second', now() - a.xact_start)::text, '?'),
       left(regexp_replace(coalesce(a.query, ''), '\s+', ' ', 'g'), 120)
  FROM pg_stat_activity a
 WHERE a.pid IN (SELECT unnest(pg_blocking_pids(w)) FROM unnest($1::int4[]) AS w)
 ORDER BY a.xact_start
