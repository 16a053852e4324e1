-- The constraints of the first step, proved for every row now that all are filled. VALIDATE reads
-- the table under SHARE UPDATE EXCLUSIVE, which lets reads and writes go on.
ALTER TABLE "{{schema}}"."{{prefix}}events" VALIDATE CONSTRAINT "{{prefix}}events_handlers_online";
ALTER TABLE "{{schema}}"."{{prefix}}deliveries" VALIDATE CONSTRAINT "{{prefix}}deliveries_lane_online";
ALTER TABLE "{{schema}}"."{{prefix}}deliveries" VALIDATE CONSTRAINT "{{prefix}}deliveries_lane_check";
ALTER TABLE "{{schema}}"."{{prefix}}deliveries" VALIDATE CONSTRAINT "{{prefix}}deliveries_status_online";
