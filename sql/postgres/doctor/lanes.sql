-- The lane rows: how many of 0..255 exist, and how many lie outside.
-- params:
SELECT count(*) FILTER (WHERE lane BETWEEN 0 AND 255), count(*) FILTER (WHERE lane NOT BETWEEN 0 AND 255)
  FROM "{{schema}}"."{{prefix}}lanes"
