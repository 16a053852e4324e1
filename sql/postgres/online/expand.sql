-- The end of the online conversion leaves the store expanded: 0.2 in full, and still taking a
-- 0.1 publisher's rows, so that an application rolls to 0.2 one instance at a time. A 0.1
-- publisher writes a delivery without a lane; this trigger (which only such a row fires) gives
-- it its lane by the publish-time hash, adds its handler to its event (whose handlers start as
-- the column's default, empty), and counts it in `legacy_writes`, one row per session, so that
-- no two publishers wait for each other there. A 0.1 publisher reserves its per-key sequence in
-- key_sequences as 0.2 does. `relaybus upgrade --contract` removes all of it once no 0.1
-- publisher is left.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}legacy_writes" (
  pid int PRIMARY KEY,
  last_at timestamptz NOT NULL,
  rows bigint NOT NULL
);

CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}legacy_delivery"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  NEW.lane := "{{schema}}"."{{prefix}}lane_of"(coalesce(NEW.key, NEW.event_id));
  UPDATE "{{schema}}"."{{prefix}}events"
     SET handlers = handlers || NEW.handler
   WHERE id = NEW.event_id AND NOT handlers @> ARRAY[NEW.handler];
  INSERT INTO "{{schema}}"."{{prefix}}legacy_writes" AS w (pid, last_at, rows)
  VALUES (pg_backend_pid(), now(), 1)
  ON CONFLICT (pid) DO UPDATE SET last_at = excluded.last_at, rows = w.rows + 1;
  RETURN NEW;
END
$fn$;

DROP TRIGGER IF EXISTS "{{prefix}}legacy_delivery" ON "{{schema}}"."{{prefix}}deliveries";
CREATE TRIGGER "{{prefix}}legacy_delivery" BEFORE INSERT ON "{{schema}}"."{{prefix}}deliveries"
  FOR EACH ROW WHEN (NEW.lane IS NULL) EXECUTE FUNCTION "{{schema}}"."{{prefix}}legacy_delivery"();
