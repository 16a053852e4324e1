-- Every handler's row, by name.
-- params:
SELECT handler, paused_at, paused_by, pause_reason, failures, opened, open_until,
       breaker_threshold, (extract(epoch FROM breaker_max_cooldown) * 1000)::int8
  FROM "{{schema}}"."{{prefix}}handlers" ORDER BY handler
