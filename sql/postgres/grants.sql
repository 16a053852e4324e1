-- The least privileges a runtime role needs for `publish`, `run` and the admin commands
-- (`setup` on a current store, `setup --check` and `upgrade --dry-run` included); `setup` of a
-- new store and `upgrade` need the owner.
GRANT USAGE ON SCHEMA "{{schema}}" TO {{role}};
GRANT SELECT ON "{{schema}}"."{{prefix}}schema" TO {{role}};
-- Publish inserts and upserts, workers delete and update, purge deletes.
GRANT SELECT, INSERT, UPDATE, DELETE ON
  "{{schema}}"."{{prefix}}events",
  "{{schema}}"."{{prefix}}deliveries",
  "{{schema}}"."{{prefix}}key_sequences",
  "{{schema}}"."{{prefix}}completions",
  "{{schema}}"."{{prefix}}handlers"
  TO {{role}};
-- Claims lock and write lane rows; nothing inserts or deletes one.
GRANT SELECT, UPDATE ON "{{schema}}"."{{prefix}}lanes" TO {{role}};
