-- One handler's row as a change left them.
-- params: text, timestamptz, text, text, int4, int4, timestamptz
UPDATE "{{schema}}"."{{prefix}}handlers"
   SET paused_at = $2, paused_by = $3, pause_reason = $4, failures = $5, opened = $6,
       open_until = $7
 WHERE handler = $1
