-- Removes one handler's row (its pause, its breaker).
-- params: text
DELETE FROM "{{schema}}"."{{prefix}}handlers" WHERE handler = $1 RETURNING handler
