-- Dead tuples and the last (auto)vacuum of the tables the delivery path rewrites, and the lane
-- updates since the statistics were reset, HOT or not.
-- params:
SELECT relname::text, n_live_tup, n_dead_tup, greatest(last_vacuum, last_autovacuum)::text,
       n_tup_upd, n_tup_hot_upd
  FROM pg_stat_user_tables
 WHERE schemaname = '{{schema}}'
   AND relname IN ('{{prefix}}deliveries', '{{prefix}}lanes')
 ORDER BY relname
