-- relaybus: the schema, the version table and the lane function, needed by every script.

CREATE SCHEMA IF NOT EXISTS "{{schema}}";

-- One row: the installed schema version, read by `relaybus setup --check` and `upgrade`.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}schema" (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  version text NOT NULL,
  installed_at timestamptz NOT NULL DEFAULT now()
);

-- FNV-1a 32-bit of the UTF-8 bytes, modulo 256: the lane of a delivery. The binary computes the
-- same function when publishing; this one serves the 0.1 backfill and ad-hoc SQL.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}lane_of"(k text) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
  h bigint := 2166136261;
  b bytea := convert_to(k, 'UTF8');
BEGIN
  FOR i IN 0 .. length(b) - 1 LOOP
    h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
  END LOOP;
  RETURN (h % 256)::smallint;
END
$fn$;

