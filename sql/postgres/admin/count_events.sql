-- How many events match the filters of `events list` and `events replay` (the total of a
-- replay's progress).
-- $1..$10 the filters (fragments/event_filter.sql).
-- params: text[], text, text, text[], timestamptz, text, timestamptz, text, timestamptz, text
SELECT count(*) FROM "{{schema}}"."{{prefix}}events" e WHERE {{event_filter}}
