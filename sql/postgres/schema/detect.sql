-- What is installed in the namespace: whether deliveries exist, whether they still carry
-- `lease_token` (the marker of a 0.1 store), whether the version table exists, whether the
-- handlers table does with the breaker's settings (a 0.2 store installed before it, or before
-- them, lacks them until `setup`), and
-- whether an online conversion left the store expanded for 0.1 publishers, and the functions of
-- the prefix, each as its name (without the prefix), a newline and its body.
-- params:
SELECT to_regclass('"{{schema}}"."{{prefix}}deliveries"') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}deliveries"')
                  AND attname = 'lease_token' AND NOT attisdropped),
       to_regclass('"{{schema}}"."{{prefix}}schema"') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}handlers"')
                  AND attname = 'breaker_max_cooldown' AND NOT attisdropped),
       to_regclass('"{{schema}}"."{{prefix}}legacy_writes"') IS NOT NULL,
       ARRAY(SELECT substr(p.proname, length('{{prefix}}') + 1) || E'\n' || p.prosrc
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = '{{schema}}' AND starts_with(p.proname, '{{prefix}}'))
