-- The server settings a benchmark report records.
-- params: text[]
SELECT name, current_setting(name) FROM unnest($1::text[]) AS name
