-- One handler's row as a change left it.
-- params: text, timestamptz, text, text, int4, int4, timestamptz, int4, int8
UPDATE "{{schema}}"."{{prefix}}handlers"
   SET paused_at = $2, paused_by = $3, pause_reason = $4, failures = $5, opened = $6,
       open_until = $7, breaker_threshold = $8,
       breaker_max_cooldown = $9 * interval '1 millisecond'
 WHERE handler = $1
