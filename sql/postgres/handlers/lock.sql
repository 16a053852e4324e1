-- One handler's row, locked until the change commits; a handler without a row gets one.
-- The no-op update is what takes the lock on a row that another transaction just inserted.
-- $1 handler.
-- params: text
INSERT INTO "{{schema}}"."{{prefix}}handlers" AS h (handler) VALUES ($1)
ON CONFLICT (handler) DO UPDATE SET handler = h.handler
RETURNING handler, paused_at, paused_by, pause_reason, failures, opened, open_until,
       breaker_threshold, (extract(epoch FROM breaker_max_cooldown) * 1000)::int8
