-- Every handler's row, by name.
-- params:
SELECT handler, paused_at, paused_by, pause_reason, failures, opened, open_until
  FROM "{{schema}}"."{{prefix}}handlers" ORDER BY handler
