-- relaybus 0.1 -> 0.2 online, the first step: the 0.2 columns, their rules as constraints that
-- hold for rows written from now on (validated for the rest once they are filled), and triggers
-- that give every row written meanwhile its lane and its event's handlers. Catalog changes
-- only: the locks it takes last milliseconds. Repeatable.

ALTER TABLE "{{schema}}"."{{prefix}}events" ADD COLUMN IF NOT EXISTS handlers text[];
ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
  ADD COLUMN IF NOT EXISTS lane smallint,
  ADD COLUMN IF NOT EXISTS claims int NOT NULL DEFAULT 0;

DO $constraints$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '"{{schema}}"."{{prefix}}events"'::regclass
                  AND conname = '{{prefix}}events_handlers_online') THEN
    ALTER TABLE "{{schema}}"."{{prefix}}events"
      ADD CONSTRAINT "{{prefix}}events_handlers_online" CHECK (handlers IS NOT NULL) NOT VALID;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '"{{schema}}"."{{prefix}}deliveries"'::regclass
                  AND conname = '{{prefix}}deliveries_lane_online') THEN
    ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
      ADD CONSTRAINT "{{prefix}}deliveries_lane_online" CHECK (lane IS NOT NULL) NOT VALID,
      ADD CONSTRAINT "{{prefix}}deliveries_lane_check" CHECK (lane >= 0 AND lane < 256) NOT VALID,
      ADD CONSTRAINT "{{prefix}}deliveries_status_online"
        CHECK (status IN ('pending', 'dead', 'completed')) NOT VALID;
  END IF;
END
$constraints$;

-- A new event has no deliveries yet: its handlers start empty, and each delivery adds its own.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}online_event"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  NEW.handlers := coalesce(NEW.handlers, '{}');
  RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}online_delivery_lane"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  NEW.lane := coalesce(NEW.lane, "{{schema}}"."{{prefix}}lane_of"(coalesce(NEW.key, NEW.event_id)));
  RETURN NEW;
END
$fn$;

-- An event the backfill has not reached yet gets every handler of its deliveries at once, so that
-- whichever of this and the backfill writes the event second finds the handlers the first wrote.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}online_delivery_handler"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  UPDATE "{{schema}}"."{{prefix}}events" AS e
     SET handlers = ARRAY(SELECT DISTINCT h FROM unnest(coalesce(e.handlers, ARRAY(
                            SELECT d.handler FROM "{{schema}}"."{{prefix}}deliveries" AS d
                             WHERE d.event_id = NEW.event_id)) || NEW.handler) AS h ORDER BY h)
   WHERE e.id = NEW.event_id AND NOT coalesce(e.handlers @> ARRAY[NEW.handler], false);
  RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS "{{prefix}}online_event" ON "{{schema}}"."{{prefix}}events";
CREATE TRIGGER "{{prefix}}online_event" BEFORE INSERT ON "{{schema}}"."{{prefix}}events"
  FOR EACH ROW EXECUTE FUNCTION "{{schema}}"."{{prefix}}online_event"();
DROP TRIGGER IF EXISTS "{{prefix}}online_delivery_lane" ON "{{schema}}"."{{prefix}}deliveries";
CREATE TRIGGER "{{prefix}}online_delivery_lane" BEFORE INSERT OR UPDATE ON "{{schema}}"."{{prefix}}deliveries"
  FOR EACH ROW EXECUTE FUNCTION "{{schema}}"."{{prefix}}online_delivery_lane"();
DROP TRIGGER IF EXISTS "{{prefix}}online_delivery_handler" ON "{{schema}}"."{{prefix}}deliveries";
CREATE TRIGGER "{{prefix}}online_delivery_handler" AFTER INSERT ON "{{schema}}"."{{prefix}}deliveries"
  FOR EACH ROW EXECUTE FUNCTION "{{schema}}"."{{prefix}}online_delivery_handler"();
