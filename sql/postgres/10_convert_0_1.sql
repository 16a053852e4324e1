-- relaybus 0.1 -> 0.2: the in-place conversion (idempotent).
-- Every data step runs only while deliveries still has lease_token, the marker of a 0.1 store,
-- so a second application changes nothing. Stop every 0.1 worker first: they would fail on the
-- dropped columns. There is no down migration; take a backup.

-- step check-indexes: refuse to convert while an index that is not relaybus's names a 0.1
-- lease column or the 0.1 status `processing`: the conversion would drop it with its column, or
-- leave it meaningless; its owner drops it first
DO $step$
DECLARE
  found_index record;
  blocking text := '';
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute
             WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}deliveries"')
               AND attname = 'lease_token' AND NOT attisdropped) THEN
    FOR found_index IN {{index_drift}}
    LOOP
      IF found_index.action = 'blocking' THEN
        blocking := blocking || format(' DROP INDEX %I.%I;', '{{schema}}', found_index.name);
      END IF;
    END LOOP;
    IF blocking <> '' THEN
      RAISE EXCEPTION 'relaybus: indexes that are not relaybus''s name what 0.2 removes (a 0.1 lease column or the status processing); drop them first:%', blocking;
    END IF;
  END IF;
END
$step$;

-- step events-handlers: fill events.handlers from every delivery, completed ones included, so
-- nothing completed under 0.1 runs again
DO $step$
DECLARE
  pages bigint := pg_relation_size('"{{schema}}"."{{prefix}}events"')
                  / current_setting('block_size')::int;
  -- Block ranges at a time, for progress; before PostgreSQL 14 a ctid range reads the whole
  -- table, so there it is one range.
  chunk bigint := CASE WHEN current_setting('server_version_num')::int >= 140000 THEN 256
                       ELSE pages + 1 END;
  first bigint := 0;
  n bigint;
  done bigint := 0;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute
             WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}deliveries"')
               AND attname = 'lease_token' AND NOT attisdropped) THEN
    ALTER TABLE "{{schema}}"."{{prefix}}events"
      ADD COLUMN IF NOT EXISTS handlers text[];
    WHILE first < pages LOOP
      UPDATE "{{schema}}"."{{prefix}}events" AS e
         SET handlers = ARRAY(SELECT DISTINCT d.handler FROM "{{schema}}"."{{prefix}}deliveries" AS d
                               WHERE d.event_id = e.id ORDER BY d.handler)
       WHERE e.ctid >= format('(%s,0)', first)::tid AND e.ctid < format('(%s,0)', first + chunk)::tid
         AND e.handlers IS NULL;
      GET DIAGNOSTICS n = ROW_COUNT;
      done := done + n;
      first := first + chunk;
      RAISE DEBUG 'relaybus progress: %', done;
    END LOOP;
    ALTER TABLE "{{schema}}"."{{prefix}}events"
      ALTER COLUMN handlers SET DEFAULT '{}',
      ALTER COLUMN handlers SET NOT NULL;
  END IF;
END
$step$;

-- step deliveries-lanes: fill each delivery's lane with the publish-time hash and turn
-- processing deliveries into pending with their attempts kept (one rewrite of every row)
DO $step$
DECLARE
  pages bigint := pg_relation_size('"{{schema}}"."{{prefix}}deliveries"')
                  / current_setting('block_size')::int;
  -- Block ranges at a time, for progress; before PostgreSQL 14 a ctid range reads the whole
  -- table, so there it is one range.
  chunk bigint := CASE WHEN current_setting('server_version_num')::int >= 140000 THEN 256
                       ELSE pages + 1 END;
  first bigint := 0;
  n bigint;
  done bigint := 0;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute
             WHERE attrelid = to_regclass('"{{schema}}"."{{prefix}}deliveries"')
               AND attname = 'lease_token' AND NOT attisdropped) THEN
    ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
      ADD COLUMN IF NOT EXISTS lane smallint,
      ADD COLUMN IF NOT EXISTS claims int NOT NULL DEFAULT 0;
    WHILE first < pages LOOP
      UPDATE "{{schema}}"."{{prefix}}deliveries"
         SET lane = "{{schema}}"."{{prefix}}lane_of"(coalesce(key, event_id)),
             status = CASE status WHEN 'processing' THEN 'pending' ELSE status END
       WHERE ctid >= format('(%s,0)', first)::tid AND ctid < format('(%s,0)', first + chunk)::tid
         AND lane IS NULL;
      GET DIAGNOSTICS n = ROW_COUNT;
      done := done + n;
      first := first + chunk;
      RAISE DEBUG 'relaybus progress: %', done;
    END LOOP;
    ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
      ALTER COLUMN lane SET NOT NULL,
      DROP CONSTRAINT IF EXISTS "{{prefix}}deliveries_status_check",
      ADD CONSTRAINT "{{prefix}}deliveries_status_check"
        CHECK (status IN ('pending', 'dead', 'completed')),
      DROP CONSTRAINT IF EXISTS "{{prefix}}deliveries_lane_check",
      ADD CONSTRAINT "{{prefix}}deliveries_lane_check" CHECK (lane >= 0 AND lane < 256),
      SET (autovacuum_vacuum_scale_factor = 0.02);
  END IF;
END
$step$;

-- step lease-columns: drop the 0.1 row leases (0.2 leases lanes), and what an online conversion
-- that stopped halfway left
ALTER TABLE "{{schema}}"."{{prefix}}deliveries"
  DROP COLUMN IF EXISTS lease_owner,
  DROP COLUMN IF EXISTS lease_token,
  DROP COLUMN IF EXISTS lease_expires_at;
{{online_cleanup}}

