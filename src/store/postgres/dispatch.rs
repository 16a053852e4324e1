//! The delivery path: claim, renew, complete, fail, release. Workers lease lanes, not rows: the
//! happy path writes one lane row per claimed batch (a HOT update: lanes have no secondary index
//! and half-empty pages) and deletes each delivery once it is done. No delivery row is updated
//! unless an attempt fails, a lane is taken over or a worker releases work at shutdown.
//! Every statement here is a single statement, so each runs atomically without BEGIN/COMMIT.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use super::PgStore;
use crate::store::{ClaimRequest, ClaimedDelivery, Failure, LeaseToken, Result, StoreError};

/// One claim. `held` locks the lanes this worker holds under a live lease (a takeover of them
/// waits). `candidates` are the first $5 free or expired lanes with due work for these
/// handlers, starting at a random lane ($8) so that no lane waits behind lower-numbered ones
/// (from lane 0, a busy worker left the high lanes for seconds); the lanes are put in that order
/// first and probed for work one by one until $5 have it (probing all 256 and then ordering
/// them cost 0.5-0.85 ms a claim). The probe's ORDER BY is the due index's order: without it a
/// generic plan expected the first match early in a sequential scan, and with the work in a
/// few lanes every probe of an idle lane read the whole table (21 ms a claim). `taken` locks them, skipping lanes another claimer has
/// locked, and re-checks that they are still free. Locking only then keeps the probed lanes
/// unlocked: a row lock is a write. Expired lanes are taken over: their epoch is
/// bumped, and every delivery the predecessor had in flight is charged one attempt (buried at the
/// handler's last attempt); they are picked from in the next claim. Completions delete rows
/// without touching the lane, so a held lane's in-flight list is pruned here.
/// Locking returns the newest version of a lane row while deliveries are read from the
/// statement's snapshot, which can be older: a failure or release that committed in between has
/// already taken its delivery off the lane, but the snapshot still shows the delivery due with
/// its old claims counter. `seen` is the snapshot's version of each lane, and nothing listed in
/// flight in either version (`busy`, one hashed set) is picked; the next claim, with a fresh
/// snapshot, picks it. `running`, the list a held lane keeps, is its locked version less what
/// the worker no longer has outstanding ($7: running, or waiting for its completion to commit);
/// the worker knows, so the claim reads no delivery for it (looking them up cost 3.4 ms of an
/// 11 ms claim with 400 in flight; searching the list once per row of the lane, 13 ms).
/// Picks fill the batch from held lanes first, then lane by lane, so a batch writes as few lane
/// rows as it can: lanes are visited in that order and the visit stops once the batch is full
/// (ordering all lanes' candidates instead read every lane's: 1.8 ms of a 4.1 ms claim). A keyed delivery is picked only when no earlier delivery of its handler and key
/// is pending (in-flight deliveries are pending rows, so that covers them too): per lane, `k`
/// walks the distinct (handler, key) pairs of the keyed-order index, one probe each, and only the
/// head of each, its lowest pending sequence, can be picked, when it is due and not in flight.
/// Checking every pending row for an earlier one instead cost a probe per row of the lane:
/// 108 deliveries/s with 1,000 keys, 1/s with 10 hot keys. Unkeyed picks come from the first
/// batch + 100 due rows of the lane: no index holds unkeyed rows alone, and walking a hot key's
/// backlog on every claim cost 55 ms. The price: an unkeyed delivery waits while more than that
/// many older keyed deliveries are queued ahead of it in its lane. Lanes that run nothing and got
/// nothing are handed back in the same write. The lanes written are also named as an index
/// condition: with sequential scans ruled out, the join otherwise walked all 256 lanes through
/// the index (4 and 8 processes dispatched 12-15% slower). The result always has one row,
/// carrying the takeover counts, with NULL delivery columns when nothing was picked.
pub(crate) const CLAIM: &str = r#"
WITH held AS (
  SELECT l.lane, l.epoch, l.in_flight FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lease_owner = $1 AND l.lease_expires_at > now()
   ORDER BY l.lane FOR UPDATE
), candidates AS (
  SELECT c.lane FROM (SELECT l.lane FROM "{{schema}}"."{{prefix}}lanes" l
                       WHERE l.lease_owner IS NULL OR l.lease_expires_at <= now()
                       ORDER BY (l.lane + $8) % 256) c
   WHERE (SELECT true FROM "{{schema}}"."{{prefix}}deliveries" d
           WHERE d.lane = c.lane AND d.status = 'pending' AND d.available_at <= now()
             AND d.handler = ANY ($3) ORDER BY d.available_at LIMIT 1)
   LIMIT $5
), taken AS (
  SELECT l.lane, l.epoch, l.in_flight, l.lease_owner IS NOT NULL AS takeover
    FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lane IN (SELECT lane FROM candidates)
     AND (l.lease_owner IS NULL OR l.lease_expires_at <= now())
   FOR UPDATE SKIP LOCKED
), seen AS (
  SELECT l.lane, l.in_flight FROM "{{schema}}"."{{prefix}}lanes" l
   WHERE l.lane IN (SELECT lane FROM held) OR l.lane IN (SELECT lane FROM taken)
), busy AS MATERIALIZED (
  SELECT unnest(in_flight) AS id FROM held
  UNION SELECT unnest(in_flight) FROM seen
), running AS (
  SELECT h.lane, ARRAY(SELECT x FROM unnest(h.in_flight) AS x
                        WHERE x IN (SELECT unnest($7::text[]))) AS ids
    FROM held h
), mine AS (
  SELECT h.lane, h.epoch, r.ids AS running, false AS fresh, false AS takeover
    FROM held h JOIN running r USING (lane)
  UNION ALL
  SELECT t.lane, t.epoch + 1, '{}'::text[], true, t.takeover FROM taken t
), charged AS (
  UPDATE "{{schema}}"."{{prefix}}deliveries" d
     SET attempts = d.attempts + 1, claims = d.claims + 1, updated_at = now(),
         last_error = 'lease lost: the worker holding lane ' || d.lane || ' stopped without completing',
         status = CASE WHEN d.attempts + 1 >= coalesce(($6::int4[])[array_position($3, d.handler)], 2147483647)
                       THEN 'dead' ELSE 'pending' END
    FROM taken t
   WHERE t.takeover AND d.id = ANY (t.in_flight) AND d.lane = t.lane AND d.status = 'pending'
  RETURNING d.id
), picked AS (
  SELECT p.* FROM (SELECT * FROM mine WHERE NOT takeover ORDER BY fresh, lane) m
  CROSS JOIN LATERAL (SELECT * FROM (
    (SELECT u.id, u.lane, u.claims, u.attempts, u.handler, u.event_id, u.available_at, m.fresh
       FROM (SELECT d.* FROM "{{schema}}"."{{prefix}}deliveries" d
              WHERE d.lane = m.lane AND d.status = 'pending' AND d.available_at <= now()
              ORDER BY d.available_at, d.id LIMIT $4 + 100) u
      WHERE u.key IS NULL AND u.handler = ANY ($3) AND u.id NOT IN (SELECT id FROM busy)
      LIMIT $4)
    UNION ALL
    (WITH RECURSIVE k AS (
       (SELECT d.handler, d.key FROM "{{schema}}"."{{prefix}}deliveries" d
         WHERE d.lane = m.lane AND d.key IS NOT NULL AND d.status = 'pending'
         ORDER BY d.handler, d.key LIMIT 1)
       UNION ALL
       (SELECT n.handler, n.key FROM k CROSS JOIN LATERAL (
          SELECT d.handler, d.key FROM "{{schema}}"."{{prefix}}deliveries" d
           WHERE d.lane = m.lane AND d.key IS NOT NULL AND d.status = 'pending'
             AND (d.handler, d.key) > (k.handler, k.key)
           ORDER BY d.handler, d.key LIMIT 1) n)
     )
     SELECT h.id, h.lane, h.claims, h.attempts, h.handler, h.event_id, h.available_at, m.fresh
       FROM k CROSS JOIN LATERAL (
         SELECT d.id, d.lane, d.claims, d.attempts, d.handler, d.event_id, d.available_at
           FROM "{{schema}}"."{{prefix}}deliveries" d
          WHERE d.lane = m.lane AND d.handler = k.handler AND d.key = k.key
            AND d.key IS NOT NULL AND d.status = 'pending'
          ORDER BY d.sequence LIMIT 1) h
      WHERE h.handler = ANY ($3) AND h.available_at <= now() AND h.id NOT IN (SELECT id FROM busy)
      ORDER BY h.available_at, h.id LIMIT $4)
  ) x ORDER BY x.available_at, x.id LIMIT $4) p
  LIMIT $4
), picks AS (
  SELECT lane, array_agg(id) AS ids FROM picked GROUP BY lane
), written AS (
  UPDATE "{{schema}}"."{{prefix}}lanes" l
     SET epoch = m.epoch,
         lease_owner = CASE WHEN m.takeover OR p.ids IS NOT NULL OR cardinality(m.running) > 0
                            THEN $1 END,
         lease_expires_at = CASE WHEN m.takeover OR p.ids IS NOT NULL OR cardinality(m.running) > 0
                                 THEN now() + $2::float8 * interval '1 millisecond' END,
         in_flight = m.running || coalesce(p.ids, '{}')
    FROM mine m LEFT JOIN picks p USING (lane)
   WHERE l.lane = m.lane AND l.lane = ANY (ARRAY(SELECT lane FROM mine))
     AND (m.takeover OR p.ids IS NOT NULL OR (NOT m.fresh AND cardinality(m.running) = 0))
  RETURNING l.lane, l.epoch
)
SELECT p.id, p.lane, w.epoch, p.claims, p.attempts, p.handler,
       e.id, e.type, e.key, e.payload, e.headers, e.created_at, c.n AS charged, t.n AS taken
  FROM (SELECT count(*) AS n FROM charged) c CROSS JOIN (SELECT count(*) AS n FROM taken) t
  LEFT JOIN (picked p JOIN written w USING (lane)
             JOIN "{{schema}}"."{{prefix}}events" e ON e.id = p.event_id) ON true
 ORDER BY p.fresh, p.lane, p.available_at, p.id
"#;
pub(crate) const CLAIM_TYPES: &[Type] = &[
    Type::TEXT,
    Type::FLOAT8,
    Type::TEXT_ARRAY,
    Type::INT8,
    Type::INT8,
    Type::INT4_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT2,
];

/// The tokens of a completion batch that are still valid: `fenced` (id, claims). Shared by both
/// completion statements.
macro_rules! fence {
    () => {
        r#"
WITH t AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::int2[], $3::int8[], $4::int4[]) AS t(id, lane, epoch, claims)
), fenced AS MATERIALIZED (
  SELECT t.id, t.claims FROM t JOIN (
    SELECT f.id FROM "{{schema}}"."{{prefix}}lanes" l CROSS JOIN LATERAL unnest(l.in_flight) AS f(id)
     WHERE (l.lane, l.epoch) IN (SELECT lane, epoch FROM t)) AS listed ON listed.id = t.id
)
"#
    };
}

/// Completion: deletes the deliveries whose tokens are still valid, in one statement for a whole
/// window of completions. The in-flight lists of the fenced lanes (lane and epoch as in the
/// tokens) are unnested once and joined by id, so the check costs one pass, not a search of the
/// list per delivery. Both sets are materialized: a generic plan cannot know the batch size, and
/// left to nest it re-reads (and de-TOASTs) an in-flight list once per token (measured: 34 ms
/// for 200 completions). Lane rows are read without a lock, so a completion never waits for the
/// owner's claims; a takeover that committed first has bumped `claims`, and the re-check of the
/// row under the delete then fails, so a completion and a takeover never both win.
pub(crate) const COMPLETE: &str = concat!(
    fence!(),
    r#"
DELETE FROM "{{schema}}"."{{prefix}}deliveries" d
 USING fenced f WHERE d.id = f.id AND d.claims = f.claims
RETURNING d.id
"#
);

/// Completion that also appends to the completion history.
pub(crate) const COMPLETE_WITH_HISTORY: &str = concat!(
    fence!(),
    r#", done AS (
  DELETE FROM "{{schema}}"."{{prefix}}deliveries" d
   USING fenced f WHERE d.id = f.id AND d.claims = f.claims
  RETURNING d.id, d.event_id, d.handler, d.attempts
), history AS (
  INSERT INTO "{{schema}}"."{{prefix}}completions" (event_id, handler, attempts)
  SELECT event_id, handler, attempts + 1 FROM done
)
SELECT id FROM done
"#
);
pub(crate) const COMPLETE_TYPES: &[Type] = &[
    Type::TEXT_ARRAY,
    Type::INT2_ARRAY,
    Type::INT8_ARRAY,
    Type::INT4_ARRAY,
];

/// A failed attempt: the delivery leaves the lane's in-flight list and is rescheduled or buried,
/// with one attempt and one claim more. The rare path; these updates are not HOT by design.
pub(crate) const FAIL: &str = r#"
WITH lane AS (
  UPDATE "{{schema}}"."{{prefix}}lanes" SET in_flight = array_remove(in_flight, $1)
   WHERE lane = $2 AND epoch = $3 AND $1 = ANY (in_flight)
  RETURNING lane
)
UPDATE "{{schema}}"."{{prefix}}deliveries" d
   SET attempts = d.attempts + 1, claims = d.claims + 1, updated_at = now(), last_error = $7,
       status = CASE WHEN $5 THEN 'dead' ELSE 'pending' END,
       available_at = CASE WHEN $5 THEN d.available_at
                           ELSE now() + $6::float8 * interval '1 millisecond' END
  FROM lane WHERE d.id = $1 AND d.claims = $4 AND d.lane = lane.lane
RETURNING d.id
"#;
pub(crate) const FAIL_TYPES: &[Type] = &[
    Type::TEXT,
    Type::INT2,
    Type::INT8,
    Type::INT4,
    Type::BOOL,
    Type::FLOAT8,
    Type::TEXT,
];

/// Extends the lease of every lane this worker holds that runs something.
pub(crate) const RENEW: &str = r#"
UPDATE "{{schema}}"."{{prefix}}lanes"
   SET lease_expires_at = now() + $2::float8 * interval '1 millisecond'
 WHERE lease_owner = $1 AND cardinality(in_flight) > 0
RETURNING lane
"#;
pub(crate) const RENEW_TYPES: &[Type] = &[Type::TEXT, Type::FLOAT8];

/// Graceful shutdown: ends the claims of aborted deliveries without charging an attempt, then
/// hands back every lane of this worker so others continue at once instead of after the lease.
pub(crate) const RELEASE: &str = r#"
WITH released AS (
  UPDATE "{{schema}}"."{{prefix}}deliveries" d SET claims = d.claims + 1
    FROM unnest($2::text[], $3::int2[], $4::int8[], $5::int4[]) AS t(id, lane, epoch, claims),
         "{{schema}}"."{{prefix}}lanes" l
   WHERE d.id = t.id AND d.claims = t.claims AND l.lane = t.lane AND l.epoch = t.epoch
     AND l.lease_owner = $1 AND d.id = ANY (l.in_flight)
  RETURNING d.id
)
UPDATE "{{schema}}"."{{prefix}}lanes"
   SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'
 WHERE lease_owner = $1
"#;
pub(crate) const RELEASE_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT_ARRAY,
    Type::INT2_ARRAY,
    Type::INT8_ARRAY,
    Type::INT4_ARRAY,
];

/// Whether any delivery of these handlers is due, for `run --drain`: one probe of the due index
/// per lane (the index leads with the lane; without it the check scans deliveries).
pub(crate) const DUE_EXISTS: &str = r#"
SELECT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}lanes" l
                WHERE EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}deliveries" d
                               WHERE d.lane = l.lane AND d.status = 'pending'
                                 AND d.available_at <= now() AND d.handler = ANY ($1)))
"#;
pub(crate) const DUE_EXISTS_TYPES: &[Type] = &[Type::TEXT_ARRAY];

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Parallel arrays of tokens, as the statements take them.
fn token_arrays(tokens: &[LeaseToken]) -> (Vec<&str>, Vec<i16>, Vec<i64>, Vec<i32>) {
    let mut out = (
        Vec::with_capacity(tokens.len()),
        Vec::with_capacity(tokens.len()),
        Vec::with_capacity(tokens.len()),
        Vec::with_capacity(tokens.len()),
    );
    for t in tokens {
        out.0.push(t.delivery_id.as_str());
        out.1.push(t.lane);
        out.2.push(t.epoch);
        out.3.push(t.claims);
    }
    out
}

/// What a claim found, beyond the deliveries.
#[derive(Debug, Default)]
pub struct ClaimStats {
    /// Deliveries charged one attempt because their lane was taken over.
    pub charged: i64,
    /// Free or expired lanes taken by this claim.
    pub lanes_taken: i64,
}

impl PgStore {
    pub(crate) async fn claim_impl(
        &self,
        req: &ClaimRequest,
    ) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.claim,
                &[
                    &req.owner,
                    &ms(req.lease),
                    &req.handlers,
                    &req.batch,
                    &req.new_lanes,
                    &req.max_attempts,
                    &req.outstanding,
                    &(rand::random::<u8>() as i16),
                ],
            )
            .await
            .map_err(StoreError::db("could not claim deliveries"))?;
        let stats = rows
            .first()
            .map_or_else(ClaimStats::default, |r| ClaimStats {
                charged: r.get(12),
                lanes_taken: r.get(13),
            });
        let claimed = rows
            .iter()
            .filter(|r| r.get::<_, Option<&str>>(0).is_some())
            .map(|r| ClaimedDelivery {
                token: LeaseToken {
                    delivery_id: r.get(0),
                    lane: r.get(1),
                    epoch: r.get(2),
                    claims: r.get(3),
                },
                attempts: r.get(4),
                handler: r.get(5),
                event_id: r.get(6),
                event_type: r.get(7),
                key: r.get(8),
                payload: r.get(9),
                headers: r.get(10),
                created_at: r.get::<_, DateTime<Utc>>(11),
            })
            .collect();
        Ok((claimed, stats))
    }

    pub(crate) async fn complete_impl(
        &self,
        tokens: &[LeaseToken],
        history: bool,
    ) -> Result<Vec<String>> {
        let (ids, lanes, epochs, claims) = token_arrays(tokens);
        let sql = if history {
            &self.sql.complete_with_history
        } else {
            &self.sql.complete
        };
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(sql, &[&ids, &lanes, &epochs, &claims])
            .await
            .map_err(StoreError::db("could not complete deliveries"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    pub(crate) async fn fail_impl(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> Result<bool> {
        let (bury, delay) = match failure {
            Failure::Bury => (true, 0.0),
            Failure::Reschedule { delay } => (false, ms(*delay)),
        };
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.fail,
                &[
                    &token.delivery_id,
                    &token.lane,
                    &token.epoch,
                    &token.claims,
                    &bury,
                    &delay,
                    &error,
                ],
            )
            .await
            .map_err(StoreError::db("could not record the failed attempt"))?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn renew_impl(&self, owner: &str, lease: std::time::Duration) -> Result<u64> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(&self.sql.renew, &[&owner, &ms(lease)])
            .await
            .map_err(StoreError::db("could not renew lane leases"))?;
        Ok(rows.len() as u64)
    }

    pub(crate) async fn release_impl(&self, owner: &str, aborted: &[LeaseToken]) -> Result<u64> {
        let (ids, lanes, epochs, claims) = token_arrays(aborted);
        let mut conn = self.pool.get().await?;
        conn.execute(&self.sql.release, &[&owner, &ids, &lanes, &epochs, &claims])
            .await
            .map_err(StoreError::db("could not hand back the lanes"))
    }

    pub(crate) async fn due_exists_impl(&self, handlers: &[String]) -> Result<bool> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(&self.sql.due_exists, &[&handlers])
            .await
            .map_err(StoreError::db("could not look for due deliveries"))?;
        Ok(rows[0].get(0))
    }
}

#[cfg(test)]
mod tests {
    //! The delivery path's statements under the generic plans the workers use: no sequential
    //! scan of deliveries or events, whatever the table looked like when the plan was made.

    use crate::store::postgres::publish::PUBLISH;
    use crate::store::postgres::testing::{drop_store, generic_plan, large_store};

    /// A connection keeps the generic plan it made the first time, so plans are checked for
    /// a freshly installed, empty store (where workers start), and for 25,000 events with work
    /// in every lane or in 10 lanes (hot keys): a plan that suits one can be ruinous for another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivery_path_plans_use_indexes_empty_or_full_with_work_in_every_lane_or_few() {
        let mut findings = vec![];
        for (events, lanes) in [(0, 256), (25_000, 256), (25_000, 10)] {
            findings.extend(plan_findings(events, lanes).await);
        }
        assert!(findings.is_empty(), "{}", findings.join("\n\n"));
    }

    async fn plan_findings(events: u32, lanes: u32) -> Vec<String> {
        let store = large_store(&format!("explain_dispatch_{events}_{lanes}"), events).await;
        let ns = store.namespace().clone();
        // A lane held by w1 and one whose lease expired, so both claim paths are planned.
        let conn = store.pool.get().await.unwrap();
        conn.client
            .batch_execute(&format!(
                "UPDATE {d} SET lane = lane % {lanes} WHERE lane >= {lanes}; ANALYZE {d}; \
                 UPDATE {l} SET lease_owner = 'w1', lease_expires_at = now() + interval '1 minute', \
                        in_flight = '{{d0000002h1}}' WHERE lane = 7; \
                 UPDATE {l} SET lease_owner = 'w0', lease_expires_at = now() - interval '1 minute', \
                        in_flight = '{{d0000004h1}}' WHERE lane = 9",
                d = ns.table("deliveries"),
                l = ns.table("lanes")
            ))
            .await
            .unwrap();
        drop(conn);
        let tokens = [
            "ARRAY['d0000002h1']::text[]",
            "ARRAY[7]::int2[]",
            "ARRAY[1]::int8[]",
            "ARRAY[0]::int4[]",
        ];
        let token_types = ["text[]", "int2[]", "int8[]", "int4[]"];
        let statements: Vec<(&str, String, Vec<&str>, Vec<&str>)> = vec![
            (
                "claim",
                ns.render(super::CLAIM),
                vec![
                    "text", "float8", "text[]", "int8", "int8", "int4[]", "text[]", "int2",
                ],
                vec![
                    "'w1'",
                    "30000",
                    "ARRAY['h1','h2']",
                    "200",
                    "8",
                    "ARRAY[25,25]",
                    "ARRAY['d0000002h1']",
                    "3",
                ],
            ),
            (
                "complete",
                ns.render(super::COMPLETE),
                token_types.to_vec(),
                tokens.to_vec(),
            ),
            (
                "complete with history",
                ns.render(super::COMPLETE_WITH_HISTORY),
                token_types.to_vec(),
                tokens.to_vec(),
            ),
            (
                "fail",
                ns.render(super::FAIL),
                vec!["text", "int2", "int8", "int4", "bool", "float8", "text"],
                vec!["'d0000002h1'", "7", "1", "0", "false", "1000", "'boom'"],
            ),
            (
                "renew",
                ns.render(super::RENEW),
                vec!["text", "float8"],
                vec!["'w1'", "30000"],
            ),
            (
                "release",
                ns.render(super::RELEASE),
                vec!["text", "text[]", "int2[]", "int8[]", "int4[]"],
                vec!["'w1'", tokens[0], tokens[1], tokens[2], tokens[3]],
            ),
            (
                "due",
                ns.render(super::DUE_EXISTS),
                vec!["text[]"],
                vec!["ARRAY['h1']"],
            ),
            (
                "publish unkeyed",
                ns.render(PUBLISH),
                vec![
                    "text[]", "text[]", "text[]", "jsonb[]", "jsonb[]", "text[]", "text[]",
                    "text[]", "int2[]",
                ],
                vec![
                    "ARRAY['n1']",
                    "ARRAY['t']",
                    "ARRAY[NULL]::text[]",
                    "ARRAY['{}'::jsonb]",
                    "ARRAY['{}'::jsonb]",
                    "ARRAY['n1']",
                    "ARRAY['h1']",
                    "ARRAY['nd1']",
                    "ARRAY[5]::int2[]",
                ],
            ),
            (
                "publish keyed",
                ns.render(PUBLISH),
                vec![
                    "text[]", "text[]", "text[]", "jsonb[]", "jsonb[]", "text[]", "text[]",
                    "text[]", "int2[]",
                ],
                vec![
                    "ARRAY['n2']",
                    "ARRAY['t']",
                    "ARRAY['key7']",
                    "ARRAY['{}'::jsonb]",
                    "ARRAY['{}'::jsonb]",
                    "ARRAY['n2']",
                    "ARRAY['h1']",
                    "ARRAY['nd2']",
                    "ARRAY[5]::int2[]",
                ],
            ),
        ];
        let mut findings = vec![];
        for (name, text, types, args) in statements {
            let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
            let plan = generic_plan(&store, &text, &types, &args).await;
            for table in ["deliveries", "events"] {
                if plan.contains(&format!("Seq Scan on relaybus_{table}")) {
                    findings.push(format!(
                        "{name}, {events} events in {lanes} lanes: sequential scan of {table}\n{plan}"
                    ));
                }
            }
        }
        drop_store(store).await;
        findings
    }
}
