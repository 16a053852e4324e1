-- What is installed in the namespace: whether deliveries exist, whether they still carry
-- `lease_token` (the marker of a 0.1 store), whether the version table exists, and whether the
-- handlers table does (a 0.2 store installed before it existed lacks it until `setup`).
-- params:
SELECT to_regclass('"{{schema}}"."{{prefix}}deliveries"') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}deliveries"')
                  AND attname = 'lease_token' AND NOT attisdropped),
       to_regclass('"{{schema}}"."{{prefix}}schema"') IS NOT NULL,
       to_regclass('"{{schema}}"."{{prefix}}handlers"') IS NOT NULL
