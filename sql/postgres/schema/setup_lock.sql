-- The advisory lock that serialises `setup`, `upgrade` and a rendered script in one schema,
-- held until the transaction ends.
-- params: int8
SELECT pg_advisory_xact_lock($1)
