-- What 0.1 publishers have written to an expanded store since its conversion: deliveries, and
-- when the last came. One row per session that wrote any.
-- params:
SELECT coalesce(sum(rows), 0)::int8, max(last_at) FROM "{{schema}}"."{{prefix}}legacy_writes"
