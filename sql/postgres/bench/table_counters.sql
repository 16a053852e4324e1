-- Rows inserted, updated, HOT-updated and deleted in each relaybus table of the namespace.
-- params:
SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables
 WHERE schemaname = '{{schema}}' AND starts_with(relname::text, '{{prefix}}')
