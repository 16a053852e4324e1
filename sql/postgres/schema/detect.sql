-- What is installed in the namespace: whether deliveries exist, whether they still carry
-- `lease_token` (the marker of a 0.1 store), and whether the version table exists.
-- params:
SELECT to_regclass('"{{schema}}"."{{prefix}}deliveries"') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}deliveries"')
                  AND attname = 'lease_token' AND NOT attisdropped),
       to_regclass('"{{schema}}"."{{prefix}}schema"') IS NOT NULL
