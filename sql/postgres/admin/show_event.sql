-- One event, for `events show` (its deliveries come from list.sql).
-- $1 event id.
-- params: text
SELECT id, type, key, payload, headers, handlers, created_at
  FROM "{{schema}}"."{{prefix}}events" WHERE id = $1
