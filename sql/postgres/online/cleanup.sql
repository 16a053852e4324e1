-- What the online conversion added for its own use: its triggers, their functions and the
-- constraints that stood for NOT NULL until it was set.
DROP TRIGGER IF EXISTS "{{prefix}}online_event" ON "{{schema}}"."{{prefix}}events";
DROP TRIGGER IF EXISTS "{{prefix}}online_delivery_lane" ON "{{schema}}"."{{prefix}}deliveries";
DROP TRIGGER IF EXISTS "{{prefix}}online_delivery_handler" ON "{{schema}}"."{{prefix}}deliveries";
DROP FUNCTION IF EXISTS "{{schema}}"."{{prefix}}online_event"();
DROP FUNCTION IF EXISTS "{{schema}}"."{{prefix}}online_delivery_lane"();
DROP FUNCTION IF EXISTS "{{schema}}"."{{prefix}}online_delivery_handler"();
ALTER TABLE "{{schema}}"."{{prefix}}events" DROP CONSTRAINT IF EXISTS "{{prefix}}events_handlers_online";
ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
  DROP CONSTRAINT IF EXISTS "{{prefix}}deliveries_lane_online",
  DROP CONSTRAINT IF EXISTS "{{prefix}}deliveries_status_online";
