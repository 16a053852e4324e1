-- A page of events in publish order (creation time, then id), for `events list` and for the
-- walk of `events replay`: those matching the filters, at most $12; with a handler ($11), the
-- state of each one's delivery for it (the unique key of event and handler finds it).
-- $1..$10 the filters (fragments/event_filter.sql).
-- params: text[], text, text, text[], timestamptz, text, timestamptz, text, timestamptz, text, text, int8
SELECT e.id, e.type, e.key, e.created_at, e.handlers, d.status, d.available_at > now()
  FROM "{{schema}}"."{{prefix}}events" e
  LEFT JOIN "{{schema}}"."{{prefix}}deliveries" d ON d.event_id = e.id AND d.handler = $11
 WHERE {{event_filter}}
 ORDER BY e.created_at, e.id
 LIMIT $12
