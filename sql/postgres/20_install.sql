-- relaybus schema 0.2: the tables, indexes and lane rows (idempotent).
-- Creates what is missing and leaves what exists alone, so applying it to a current store, or
-- after the 0.1 -> 0.2 conversion, changes nothing.

-- `CREATE INDEX IF NOT EXISTS` looks at names, not definitions: an index of a 0.2 name with
-- another definition, and a 0.1 index under any name, are dropped first, so that what follows
-- leaves exactly the 0.2 indexes.
DO $drift$
DECLARE
  found_index record;
BEGIN
  FOR found_index IN {{index_drift}}
  LOOP
    IF found_index.action IN ('drop', 'invalid') THEN
      EXECUTE format('DROP INDEX %I.%I', '{{schema}}', found_index.name);
    END IF;
  END LOOP;
END
$drift$;

-- Events outlive their deliveries: `handlers` remembers every handler an event ever had a
-- delivery for, so a republish never runs a completed handler again. The columns stand in the
-- order a 0.1 store has them after its conversion (which adds 0.2's at the end), so that every
-- 0.2 store has one catalog.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}events" (
  id text PRIMARY KEY,
  type text NOT NULL,
  key text,
  payload jsonb NOT NULL,
  headers jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT now(),
  handlers text[] NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS "{{prefix}}events_created_idx"
  ON "{{schema}}"."{{prefix}}events" (created_at);

-- One row per (event, handler) from publish until completion; completion deletes it. The happy
-- path never updates a row here, and no index covers a column that the happy path writes.
-- Columns in the converted 0.1 order, as for events.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}deliveries" (
  id text PRIMARY KEY,
  event_id text NOT NULL REFERENCES "{{schema}}"."{{prefix}}events" (id) ON DELETE CASCADE,
  handler text NOT NULL,
  key text,
  sequence bigint,
  status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'dead', 'completed')),
  attempts int NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  lane smallint NOT NULL CHECK (lane >= 0 AND lane < 256),
  claims int NOT NULL DEFAULT 0
) WITH (autovacuum_vacuum_scale_factor = 0.02);
-- Idempotent publish and fenced single-row writes.
CREATE UNIQUE INDEX IF NOT EXISTS "{{prefix}}deliveries_event_handler_unique"
  ON "{{schema}}"."{{prefix}}deliveries" (event_id, handler);
-- Claim and statistics: due work per lane.
CREATE INDEX IF NOT EXISTS "{{prefix}}deliveries_lane_due_idx"
  ON "{{schema}}"."{{prefix}}deliveries" (lane, available_at, id) WHERE status = 'pending';
-- Per-key ordering: the earliest pending delivery of a handler and key.
CREATE INDEX IF NOT EXISTS "{{prefix}}deliveries_lane_key_idx"
  ON "{{schema}}"."{{prefix}}deliveries" (lane, handler, key, sequence)
  WHERE key IS NOT NULL AND status = 'pending';
-- Dead letters: listing, requeue and purge.
CREATE INDEX IF NOT EXISTS "{{prefix}}deliveries_dead_idx"
  ON "{{schema}}"."{{prefix}}deliveries" (updated_at, id) WHERE status = 'dead';

-- Workers lease lanes, not rows. No secondary index and half-empty pages keep every update of
-- a lane row heap-only (HOT).
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}lanes" (
  lane smallint PRIMARY KEY CHECK (lane >= 0 AND lane < 256),
  epoch bigint NOT NULL DEFAULT 0,
  lease_owner text,
  lease_expires_at timestamptz,
  in_flight text[] NOT NULL DEFAULT '{}'
) WITH (fillfactor = 50);
-- One lane row per page: each row is inserted with a 1,900-byte owner and given another at
-- once, so that its page holds two such versions and the fill factor sends the next row to a
-- new page; the owners are cleared after. A lane row stays inline up to about 2 kB (the TOAST
-- threshold), so each lane finds room for several versions on its own page however long its
-- in-flight list grows. 60 small rows to a page ran out of room and moved rows to other pages,
-- updates that are not HOT, and so did two busy lanes to a page while an analyze held back
-- pruning.
DO $lanes$
BEGIN
  FOR g IN 0..255 LOOP
    INSERT INTO "{{schema}}"."{{prefix}}lanes" (lane, lease_owner) VALUES (g, repeat('-', 1900))
      ON CONFLICT (lane) DO NOTHING;
    UPDATE "{{schema}}"."{{prefix}}lanes" SET lease_owner = repeat('+', 1900)
     WHERE lane = g AND lease_owner = repeat('-', 1900);
  END LOOP;
END
$lanes$;
UPDATE "{{schema}}"."{{prefix}}lanes" SET lease_owner = NULL WHERE lease_owner = repeat('+', 1900);

-- Per-key sequence counters. The publishing statement locks a key's row until commit, which is
-- what makes per-key order the commit order.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}key_sequences" (
  key text PRIMARY KEY,
  last_sequence bigint NOT NULL
);

-- Optional append-only completion history, written only by workers run with
-- `--completion-history`.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}completions" (
  event_id text NOT NULL,
  handler text NOT NULL,
  attempts int NOT NULL,
  completed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "{{prefix}}completions_completed_idx"
  ON "{{schema}}"."{{prefix}}completions" (completed_at);

-- What operators and workers decide about a handler, read by every worker about once a second:
-- a pause (`relaybus handlers pause`), and the circuit breaker of its webhook endpoint with the
-- settings every worker counts against (the configuration of the worker that started last;
-- NULL: relaybus's defaults). Only pauses, failed requests and a worker whose settings differ
-- write here, never the happy path.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}handlers" (
  handler text PRIMARY KEY,
  paused_at timestamptz,
  paused_by text,
  pause_reason text,
  failures int NOT NULL DEFAULT 0,
  opened int NOT NULL DEFAULT 0,
  open_until timestamptz,
  breaker_threshold int,
  breaker_max_cooldown interval
);
-- A handlers table from before the breaker's settings were kept in it.
ALTER TABLE "{{schema}}"."{{prefix}}handlers"
  ADD COLUMN IF NOT EXISTS breaker_threshold int,
  ADD COLUMN IF NOT EXISTS breaker_max_cooldown interval;

{{publish_functions}}

INSERT INTO "{{schema}}"."{{prefix}}schema" (version) VALUES ('0.2')
  ON CONFLICT (singleton) DO UPDATE SET version = excluded.version
  WHERE "{{prefix}}schema".version IS DISTINCT FROM excluded.version;
