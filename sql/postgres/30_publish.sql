-- Publishing from an application's own transaction: `{{prefix}}publish` for one event and
-- `{{prefix}}publish_many` for many, with the semantics of `relaybus publish`. Both run the
-- command's own statement (delivery/publish.sql, its parameters the variables that hold them),
-- so the rows they write are the command's; they add what the command does in the binary:
-- validation, generated ids, lanes, and the wake-up, sent here at the commit of the caller's
-- transaction. Their statements are planned once per session, as the command's are, and
-- without sequential scans, so a plan made on an empty store stays right for a full one.

-- A time-ordered id, as the binary generates them: a UUIDv7 (48 bits of milliseconds since the
-- epoch, the version 7, 74 random bits and the variant) written as a ULID, 26 characters of
-- Crockford's base32: 10 for the milliseconds, 8 for the version, 12 random bits, the variant
-- and 22 random bits, 8 for 40 random bits. The random bits are a random UUID's.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}new_id"() RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $fn$
DECLARE
  digits constant text := '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
  t bigint := floor(extract(epoch FROM clock_timestamp()) * 1000);
  r text := translate(gen_random_uuid()::text, '-', '');
  x bigint := (7::bigint << 36) | (('x' || substr(r, 14, 3))::bit(12)::bigint << 24)
              | (2::bigint << 22) | (('x' || substr(r, 1, 6))::bit(24)::bigint >> 2);
  y bigint := ('x' || substr(r, 18, 10))::bit(40)::bigint;
BEGIN
  RETURN substr(digits, (t >> 45 & 31)::int + 1, 1) || substr(digits, (t >> 40 & 31)::int + 1, 1)
      || substr(digits, (t >> 35 & 31)::int + 1, 1) || substr(digits, (t >> 30 & 31)::int + 1, 1)
      || substr(digits, (t >> 25 & 31)::int + 1, 1) || substr(digits, (t >> 20 & 31)::int + 1, 1)
      || substr(digits, (t >> 15 & 31)::int + 1, 1) || substr(digits, (t >> 10 & 31)::int + 1, 1)
      || substr(digits, (t >> 5 & 31)::int + 1, 1) || substr(digits, (t & 31)::int + 1, 1)
      || substr(digits, (x >> 35 & 31)::int + 1, 1) || substr(digits, (x >> 30 & 31)::int + 1, 1)
      || substr(digits, (x >> 25 & 31)::int + 1, 1) || substr(digits, (x >> 20 & 31)::int + 1, 1)
      || substr(digits, (x >> 15 & 31)::int + 1, 1) || substr(digits, (x >> 10 & 31)::int + 1, 1)
      || substr(digits, (x >> 5 & 31)::int + 1, 1) || substr(digits, (x & 31)::int + 1, 1)
      || substr(digits, (y >> 35 & 31)::int + 1, 1) || substr(digits, (y >> 30 & 31)::int + 1, 1)
      || substr(digits, (y >> 25 & 31)::int + 1, 1) || substr(digits, (y >> 20 & 31)::int + 1, 1)
      || substr(digits, (y >> 15 & 31)::int + 1, 1) || substr(digits, (y >> 10 & 31)::int + 1, 1)
      || substr(digits, (y >> 5 & 31)::int + 1, 1) || substr(digits, (y & 31)::int + 1, 1);
END
$fn$;

-- The length of a JSON value's compact text, as the binary measures a payload: PostgreSQL
-- writes a space after the `:` of each member and the `,` between members and elements.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}compact_length"(value jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
SELECT octet_length(value::text) - coalesce(sum(CASE jsonb_typeof(item)
         WHEN 'object' THEN 2 * (SELECT count(*) FROM jsonb_object_keys(item)) - 1
         WHEN 'array' THEN jsonb_array_length(item) - 1 END)
           FILTER (WHERE item NOT IN ('{}', '[]')), 0)
  FROM jsonb_path_query(value, 'strict $.**') AS item
$fn$;

-- Publishes the events of a JSON array, each an object as `relaybus publish` reads them from
-- standard input: {"id", "type", "key", "payload", "headers", "handlers"}, with `handlers`
-- required. One row per event, in the order given: its id (generated when absent) and the
-- deliveries the call created for it (none for handlers it already had). An invalid event
-- raises 22023, a republish with other content 23RB1 ("published before with another ...");
-- either writes nothing. Runs as the schema's owner, so an application needs only EXECUTE.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}publish_many"(events jsonb)
RETURNS TABLE (event_id text, deliveries int)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off SET jit = off AS $fn$
#variable_conflict use_column
DECLARE
  fault record;
  ids text[]; types text[]; keys text[]; payloads jsonb[]; headers jsonb[];
  firsts int4[]; lasts int4[];
  d_events text[]; d_handlers text[]; d_ids text[]; d_lanes int2[]; d_keys text[];
  republished text[]; added text[]; conflicting text[];
BEGIN
  IF jsonb_typeof(events) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'relaybus: `events` must be a JSON array of events' USING ERRCODE = '22023';
  END IF;
  -- The first event that `relaybus publish` would refuse, and why, in its words.
  SELECT x.ord, x.why INTO fault FROM (
    SELECT e.ord, CASE
      WHEN jsonb_typeof(e.v) <> 'object' THEN 'expected a JSON object'
      WHEN f.unknown IS NOT NULL THEN
        format('unknown field `%s` (expected id, type, key, payload, headers, handlers)', f.unknown)
      WHEN t.field <> 'key' THEN t.why
      WHEN NOT e.v ? 'type' OR e.v->'type' = 'null' THEN 'missing `type`'
      WHEN t.field = 'key' THEN t.why
      WHEN jsonb_typeof(e.v->'headers') NOT IN ('object', 'null') THEN '`headers` must be an object'
      WHEN jsonb_typeof(e.v->'handlers') NOT IN ('array', 'null') THEN '`handlers` must be an array of strings'
      WHEN EXISTS (SELECT 1 FROM jsonb_array_elements(
                      CASE WHEN jsonb_typeof(e.v->'handlers') = 'array' THEN e.v->'handlers' END) h
                    WHERE jsonb_typeof(h) <> 'string' OR h = '""') THEN '`handlers` must hold non-empty strings'
      WHEN coalesce(jsonb_array_length(e.v->'handlers'), 0) = 0 THEN 'no handlers: give `handlers`'
      WHEN n.field IS NOT NULL THEN
        format('`%s` is %s bytes, over the limit of {{max_name_bytes}}', n.field, n.bytes)
      WHEN octet_length((e.v->'payload')::text) > {{max_payload_bytes}}
       AND "{{schema}}"."{{prefix}}compact_length"(e.v->'payload') > {{max_payload_bytes}} THEN
        format('payload is %s bytes, over the limit of {{max_payload_bytes}}',
               "{{schema}}"."{{prefix}}compact_length"(e.v->'payload'))
    END AS why
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(v, ord)
      LEFT JOIN LATERAL (
        SELECT min(k COLLATE "C") AS unknown FROM jsonb_object_keys(CASE WHEN jsonb_typeof(e.v) = 'object' THEN e.v END) k
         WHERE k NOT IN ('id', 'type', 'key', 'payload', 'headers', 'handlers')) f ON true
      LEFT JOIN LATERAL (
        SELECT field, CASE WHEN jsonb_typeof(e.v->field) <> 'string' THEN format('`%s` must be a string', field)
                           ELSE format('`%s` is empty', field) END AS why
          FROM unnest(ARRAY['id', 'type', 'key']) WITH ORDINALITY AS u(field, pos)
         WHERE jsonb_typeof(e.v) = 'object' AND e.v->field <> 'null'
           AND (jsonb_typeof(e.v->field) <> 'string' OR e.v->field = '""')
         ORDER BY pos LIMIT 1) t ON true
      LEFT JOIN LATERAL (
        SELECT field, octet_length(value) AS bytes
          FROM (SELECT 'id', e.v->>'id' UNION ALL SELECT 'type', e.v->>'type'
                UNION ALL SELECT 'key', e.v->>'key'
                UNION ALL SELECT 'handler', h FROM jsonb_array_elements_text(
                  CASE WHEN jsonb_typeof(e.v->'handlers') = 'array' THEN e.v->'handlers' END) h
               ) AS named(field, value)
         WHERE octet_length(value) > {{max_name_bytes}} LIMIT 1) n ON true
  ) x WHERE x.why IS NOT NULL ORDER BY x.ord LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'relaybus: invalid event %: %; nothing was published', fault.ord, fault.why
      USING ERRCODE = '22023';
  END IF;
  -- Each id once: one named twice with the same content stands once with the handlers of both,
  -- in the order they were first named; with other content the call is refused.
  SELECT g.id INTO fault FROM (
    SELECT coalesce(e.v->>'id', '') AS id, e.v FROM jsonb_array_elements(events) e(v)) g
   WHERE g.id <> ''
   GROUP BY g.id
  HAVING count(DISTINCT jsonb_build_array(g.v->'type', g.v->'key', coalesce(g.v->'payload', 'null'),
                                          coalesce(nullif(g.v->'headers', 'null'), '{}'))) > 1
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'relaybus: event `%` appears twice in the call with different content; nothing was published', fault.id
      USING ERRCODE = '23RB1';
  END IF;
  WITH given AS MATERIALIZED (
    SELECT e.ord, coalesce(e.v->>'id', "{{schema}}"."{{prefix}}new_id"()) AS id, e.v
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(v, ord)
  ), united AS MATERIALIZED (
    SELECT DISTINCT ON (g.id) g.id, g.ord, g.v->>'type' AS type, g.v->>'key' AS key,
           coalesce(g.v->'payload', 'null') AS payload, coalesce(nullif(g.v->'headers', 'null'), '{}') AS headers,
           "{{schema}}"."{{prefix}}lane_of"(coalesce(g.v->>'key', g.id)) AS lane
      FROM given g ORDER BY g.id, g.ord
  ), named AS (
    SELECT DISTINCT ON (g.id, h.handler) g.id, h.handler, g.ord, h.n
      FROM given g, jsonb_array_elements_text(g.v->'handlers') WITH ORDINALITY AS h(handler, n)
     ORDER BY g.id, h.handler, g.ord, h.n
  ), rows AS MATERIALIZED (
    SELECT u.id, u.ord, u.key, u.lane, n.handler, "{{schema}}"."{{prefix}}new_id"() AS delivery_id,
           row_number() OVER (ORDER BY u.ord, n.ord, n.n)::int4 AS pos
      FROM united u JOIN named n ON n.id = u.id
  )
  SELECT (SELECT array_agg(u.id ORDER BY u.ord) FROM united u),
         (SELECT array_agg(u.type ORDER BY u.ord) FROM united u),
         (SELECT array_agg(u.key ORDER BY u.ord) FROM united u),
         (SELECT array_agg(u.payload ORDER BY u.ord) FROM united u),
         (SELECT array_agg(u.headers ORDER BY u.ord) FROM united u),
         (SELECT array_agg(s.first ORDER BY s.ord) FROM (
            SELECT r.ord, min(r.pos) AS first, max(r.pos) AS last FROM rows r GROUP BY r.ord) s),
         (SELECT array_agg(s.last ORDER BY s.ord) FROM (
            SELECT r.ord, min(r.pos) AS first, max(r.pos) AS last FROM rows r GROUP BY r.ord) s),
         array_agg(r.id ORDER BY r.pos), array_agg(r.handler ORDER BY r.pos),
         array_agg(r.delivery_id ORDER BY r.pos), array_agg(r.lane ORDER BY r.pos),
         array_agg(r.key ORDER BY r.pos)
    INTO ids, types, keys, payloads, headers, firsts, lasts,
         d_events, d_handlers, d_ids, d_lanes, d_keys
    FROM rows r;
  {{publish}}
    INTO republished, added, conflicting;
  IF conflicting IS NOT NULL THEN
    RAISE EXCEPTION 'relaybus: event `%` was published before with another type, key, payload or headers (publish it again only with the same content, to add handlers; or use a new id); nothing was published',
      conflicting[1] USING ERRCODE = '23RB1';
  END IF;
  RETURN QUERY
    SELECT d.event_id, count(*) FILTER (
             WHERE NOT d.event_id = ANY (coalesce(republished, '{}'))
                OR d.delivery_id = ANY (coalesce(added, '{}')))::int
      FROM unnest(d_events, d_ids) WITH ORDINALITY AS d(event_id, delivery_id, pos)
     GROUP BY d.event_id ORDER BY min(d.pos);
  -- A new event (one or more deliveries) or a handler added: workers are woken at commit, once
  -- per transaction however many calls it makes.
  IF added IS NOT NULL OR NOT ids <@ coalesce(republished, '{}') THEN
    PERFORM pg_notify('{{channel}}', '');
  END IF;
END
$fn$;

-- Publishes one event; see `{{prefix}}publish_many`.
CREATE OR REPLACE FUNCTION "{{schema}}"."{{prefix}}publish"(
  type text, payload jsonb, handlers text[], key text DEFAULT NULL, id text DEFAULT NULL,
  headers jsonb DEFAULT '{}', OUT event_id text, OUT deliveries int)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
SELECT * FROM "{{schema}}"."{{prefix}}publish_many"(jsonb_build_array(jsonb_build_object(
  'type', type, 'payload', payload, 'handlers', handlers, 'key', key, 'id', id, 'headers', headers)))
$fn$;
