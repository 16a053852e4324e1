-- The coalesced wake-up, in a transaction of its own after the publishes' commits. A lost
-- wake-up only costs latency, so its commit does not wait for the WAL flush (the setting lasts
-- for this statement's transaction, also behind a pooler).
-- $1 the namespace's channel.
-- params: text
SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')
