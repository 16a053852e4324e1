-- The replication this server takes part in: whether it is a standby, how commits wait for
-- standbys, and each standby streaming from it as pg_stat_replication shows it (its name, state
-- and sync state; the replay lag is hidden from a role without pg_read_all_stats).
-- params:
SELECT pg_is_in_recovery(), current_setting('synchronous_commit'),
       coalesce((SELECT array_agg(format('%s %s %s, replay lag %s',
                                         coalesce(nullif(r.application_name, ''), '(unnamed)'),
                                         coalesce(r.state, 'unknown'), coalesce(r.sync_state, 'unknown'),
                                         coalesce(round(extract(epoch FROM r.replay_lag)::numeric, 1) || ' s', 'unknown'))
                           ORDER BY r.application_name)
                   FROM pg_stat_replication r), '{}'),
       coalesce((SELECT bool_or(r.sync_state IN ('sync', 'quorum')) FROM pg_stat_replication r), false),
       coalesce((SELECT bool_and(r.state = 'streaming') FROM pg_stat_replication r), true)
