-- `relaybus upgrade --contract`: what only 0.1 publishers needed goes, and the store is exactly a
-- fresh 0.2 install. Catalog changes only, in one transaction; a 0.1 publisher's insert after it
-- fails (its delivery has no lane).
DROP TRIGGER IF EXISTS "{{prefix}}legacy_delivery" ON "{{schema}}"."{{prefix}}deliveries";
DROP FUNCTION IF EXISTS "{{schema}}"."{{prefix}}legacy_delivery"();
DROP TABLE IF EXISTS "{{schema}}"."{{prefix}}legacy_writes";
