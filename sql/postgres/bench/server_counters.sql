-- The server's counters: transactions of this database, and WAL written by the whole server.
-- params:
SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database
         WHERE datname = current_database()),
       wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal
