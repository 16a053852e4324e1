-- The last step of the online conversion, in one transaction under ACCESS EXCLUSIVE on events
-- and deliveries: catalog changes only, since the validated constraints prove NOT NULL without
-- a scan (PostgreSQL 12 and later). The install that follows completes the store.
LOCK TABLE "{{schema}}"."{{prefix}}events", "{{schema}}"."{{prefix}}deliveries" IN ACCESS EXCLUSIVE MODE;
ALTER TABLE "{{schema}}"."{{prefix}}events"
  ALTER COLUMN handlers SET DEFAULT '{}',
  ALTER COLUMN handlers SET NOT NULL;
ALTER TABLE "{{schema}}"."{{prefix}}deliveries" ALTER COLUMN lane SET NOT NULL;
ALTER TABLE "{{schema}}"."{{prefix}}deliveries" DROP CONSTRAINT "{{prefix}}deliveries_status_check";
ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
  RENAME CONSTRAINT "{{prefix}}deliveries_status_online" TO "{{prefix}}deliveries_status_check";
{{online_cleanup}}
ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
  SET (autovacuum_vacuum_scale_factor = 0.02),
  DROP COLUMN IF EXISTS lease_owner,
  DROP COLUMN IF EXISTS lease_token,
  DROP COLUMN IF EXISTS lease_expires_at;
