-- The oldest snapshot any other session holds: the horizon past which no dead tuple can be
-- cleaned up, in the whole cluster.
-- params:
SELECT pid, application_name::text, extract(epoch FROM now() - coalesce(xact_start, query_start))::float8,
       state::text, left(query, 120)
  FROM pg_stat_activity
 WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
 ORDER BY age(backend_xmin) DESC
 LIMIT 1
