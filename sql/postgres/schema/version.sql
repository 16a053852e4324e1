-- The installed schema version (one row), once detect.sql found the version table.
-- params:
SELECT version FROM "{{schema}}"."{{prefix}}schema"
