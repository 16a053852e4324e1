//! The delivery path: claim, complete, fail, renew, release. Workers lease lanes, not rows: the
//! happy path writes one lane row per claimed batch (a HOT update) and deletes each delivery
//! once it is done. Every statement is a single statement, so each runs atomically without
//! BEGIN/COMMIT; the statements are `sql/postgres/delivery/*.sql`.

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Utc};
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

use super::conn::db;
use super::schema::blocking_session;
use super::PgStore;
use crate::store::{
    BlockingSession, ClaimRequest, ClaimStats, ClaimedDelivery, Dispatch, FailOutcome, Failure,
    LeaseToken, RawJson, Result,
};

/// The most deliveries a claim leaves in flight in one lane. A lane row stays inline (no TOAST)
/// while it is under about 2 kB, and an update is HOT while the new version finds room on the
/// lane's page, which the install gives it alone: with 30 ids of 26 characters a version is
/// about 1 kB, so the lane keeps several versions that concurrent snapshots hold back and
/// still has room. A larger cap saved no time in drains (docs/design/delivery-path.md).
const LANE_IN_FLIGHT: i32 = 30;

/// A jsonb value as compact JSON text, read without building a tree: the server prints
/// `{"a": 1, "b": [2, 3]}` and handlers get `{"a":1,"b":[2,3]}`, as a parsed value printed.
struct CompactJson(RawJson);

impl<'a> FromSql<'a> for CompactJson {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        // jsonb's binary form is a version byte, then the text.
        let [1, text @ ..] = raw else {
            return Err("unsupported jsonb version".into());
        };
        let mut compact = Vec::with_capacity(text.len());
        let (mut in_string, mut escaped) = (false, false);
        for &b in text {
            if in_string {
                (in_string, escaped) = (escaped || b != b'"', !escaped && b == b'\\');
            } else if b == b' ' {
                continue;
            } else {
                in_string = b == b'"';
            }
            compact.push(b);
        }
        Ok(CompactJson(serde_json::value::RawValue::from_string(
            String::from_utf8(compact)?,
        )?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }
}

/// A tuple id (`ctid`) as a token carries it: the block number above the 16 bits of the offset.
#[derive(Debug)]
pub(super) struct Tid(u64);

impl<'a> FromSql<'a> for Tid {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let [b0, b1, b2, b3, o0, o1] = *raw else {
            return Err("a tuple id is 6 bytes".into());
        };
        let block = u32::from_be_bytes([b0, b1, b2, b3]);
        Ok(Tid(
            u64::from(block) << 16 | u64::from(u16::from_be_bytes([o0, o1]))
        ))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TID
    }
}

impl ToSql for Tid {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.put_u32(u32::try_from(self.0 >> 16)?);
        out.put_u16(self.0 as u16);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TID
    }

    to_sql_checked!();
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Parallel arrays of tokens, as the statements take them.
pub(super) fn token_arrays(tokens: &[LeaseToken]) -> (Vec<&str>, Vec<i16>, Vec<i64>, Vec<i32>) {
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

/// Where the tokens' claims found their rows, as the completions take them.
pub(super) fn tuple_ids(tokens: &[LeaseToken]) -> Vec<Option<Tid>> {
    tokens.iter().map(|t| t.row.map(Tid)).collect()
}

impl Dispatch for PgStore {
    /// The sessions that block the pool's sessions now handed out, asked on a connection of
    /// its own (the pool may have none left).
    async fn blockers(&self) -> Result<Vec<BlockingSession>> {
        let busy = self.pool.busy_pids();
        if busy.is_empty() {
            return Ok(vec![]);
        }
        let client = self.pool.options().connect().await?;
        let sql = &self.sql.blockers;
        let rows = client
            .query_typed(&sql.text, &sql.typed(&[&busy]))
            .await
            .map_err(db("could not list the blocking sessions"))?;
        Ok(rows.iter().map(blocking_session).collect())
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.claim,
                &[
                    &self.lease_owner(&req.owner),
                    &ms(req.lease),
                    &req.handlers,
                    &req.batch,
                    &req.new_lanes,
                    &req.max_attempts,
                    &req.outstanding,
                    // Where the free-lane search starts, so no lane waits behind lower ones.
                    &(rand::random::<u8>() as i16),
                    &LANE_IN_FLIGHT,
                    &req.lanes.count,
                    &req.lanes.index,
                    &req.held,
                ],
            )
            .await
            .map_err(db("could not claim deliveries"))?;
        let stats = rows
            .first()
            .map_or_else(ClaimStats::default, |r| ClaimStats {
                charged: r.get(12),
                lanes_taken: r.get(13),
                held: Some(r.get(15)),
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
                    row: Some(r.get::<_, Tid>(14).0),
                },
                attempts: r.get(4),
                handler: r.get(5),
                event_id: r.get(6),
                event_type: r.get(7),
                key: r.get(8),
                payload: r.get::<_, CompactJson>(9).0,
                headers: r.get::<_, CompactJson>(10).0,
                created_at: r.get::<_, DateTime<Utc>>(11),
            })
            .collect();
        Ok((claimed, stats))
    }

    async fn complete(&self, tokens: &[LeaseToken], history: bool) -> Result<Vec<String>> {
        let (ids, lanes, epochs, claims) = token_arrays(tokens);
        let located = tuple_ids(tokens);
        let sql = if history {
            &self.sql.complete_with_history
        } else {
            &self.sql.complete
        };
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(sql, &[&ids, &lanes, &epochs, &claims, &located])
            .await
            .map_err(db("could not complete deliveries"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> Result<FailOutcome> {
        let (charged, max_attempts, reject, delay) = failure.terms();
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.fail,
                &[
                    &token.delivery_id,
                    &token.lane,
                    &token.epoch,
                    &token.claims,
                    &reject,
                    &ms(delay),
                    &error,
                    &max_attempts,
                    &charged,
                ],
            )
            .await
            .map_err(db("could not record the failed attempt"))?;
        Ok(match rows.first().map(|r| r.get::<_, &str>(0)) {
            None => FailOutcome::LeaseLost,
            Some("dead") => FailOutcome::Buried,
            Some(_) => FailOutcome::Rescheduled,
        })
    }

    async fn renew(
        &self,
        owner: &str,
        lease: std::time::Duration,
        running: &[String],
    ) -> Result<u64> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.renew,
                &[&self.lease_owner(owner), &ms(lease), &running],
            )
            .await
            .map_err(db("could not renew lane leases"))?;
        Ok(rows.len() as u64)
    }

    async fn confirm(
        &self,
        owner: &str,
        lease: std::time::Duration,
        token: &LeaseToken,
    ) -> Result<bool> {
        let mut conn = self.pool.get().await?;
        let rows = conn
            .query(
                &self.sql.confirm,
                &[
                    &self.lease_owner(owner),
                    &ms(lease),
                    &token.lane,
                    &token.epoch,
                    &token.delivery_id,
                ],
            )
            .await
            .map_err(db("could not confirm a lane lease"))?;
        Ok(!rows.is_empty())
    }

    async fn release(&self, owner: &str, aborted: &[LeaseToken]) -> Result<u64> {
        let (ids, lanes, epochs, claims) = token_arrays(aborted);
        let owner = self.lease_owner(owner);
        let mut conn = self.pool.get().await?;
        conn.execute(&self.sql.release, &[&owner, &ids, &lanes, &epochs, &claims])
            .await
            .map_err(db("could not hand back the lanes"))
    }

    /// Sent unnamed: a drain's last word must not rest on a statement name that a pooler may
    /// have handed to another client's statement.
    async fn due_exists(&self, handlers: &[String]) -> Result<bool> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.due_exists, &[&handlers])
            .await
            .map_err(db("could not look for due deliveries"))?;
        Ok(rows[0].get(0))
    }
}

#[cfg(test)]
mod tests {
    //! The delivery path's statements under the plans the workers use (generic, without
    //! sequential scans): every read of deliveries and events goes through an index condition,
    //! whatever the table looked like when the plan was made.

    use tokio_postgres::types::{FromSql, Type};

    use super::CompactJson;
    use crate::store::postgres::testing::{large_store, unbounded_scans};
    use crate::store::Store;

    /// Spaces go between tokens only; strings keep theirs, escaped quotes included.
    #[test]
    fn jsonb_text_is_read_compact() {
        let text = r#"{"a b": "x \" y ", "c": [1, 2.50], "d": {"e": null}}"#;
        let raw = [&[1u8][..], text.as_bytes()].concat();
        let read = CompactJson::from_sql(&Type::JSONB, &raw).unwrap().0;
        assert_eq!(
            read.get(),
            r#"{"a b":"x \" y ","c":[1,2.50],"d":{"e":null}}"#
        );
        assert!(CompactJson::from_sql(&Type::JSONB, &[2, b'1']).is_err());
    }

    /// A connection keeps the generic plan it made the first time, so plans are checked for
    /// a freshly installed, empty store (where workers start), and for 25,000 events with work
    /// in every lane or in 10 lanes (hot keys): a plan that suits one can be ruinous for another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivery_path_reads_go_through_index_conditions_empty_or_full() {
        let mut findings = vec![];
        for (events, lanes) in [(0, 256), (25_000, 256), (25_000, 10)] {
            findings.extend(plan_findings(events, lanes).await);
        }
        assert!(findings.is_empty(), "{}", findings.join("\n\n"));
    }

    async fn plan_findings(events: u32, lanes: u32) -> Vec<String> {
        let store = large_store(&format!("explain_dispatch_{events}_{lanes}"), events).await;
        let fixture = include_str!("../../../sql/fixtures/plan-lanes.sql");
        let crowded = store
            .namespace()
            .render(fixture)
            .replace("{{lanes}}", &lanes.to_string());
        store.exec(&crowded).await;
        let tokens =
            "ARRAY['d0000002h1']::text[], ARRAY[7]::int2[], ARRAY[1]::int8[], ARRAY[0]::int4[]";
        let completions = format!("{tokens}, ARRAY['(3,4)']::tid[]");
        let publish = |id: &str, key: &str| {
            format!(
                "ARRAY['{id}'], ARRAY['t'], ARRAY[{key}]::text[], ARRAY['{{}}'::jsonb], ARRAY['{{}}'::jsonb], \
                 ARRAY['{id}'], ARRAY['h1'], ARRAY['d{id}'], ARRAY[5]::int2[], ARRAY[{key}]::text[], \
                 ARRAY[1], ARRAY[1]"
            )
        };
        let sql = &store.sql;
        let statements = [
            (
                "claim",
                &sql.claim,
                "'w1', 30000, ARRAY['h1','h2'], 200, 8, ARRAY[25,25], ARRAY['d0000002h1'], 3, 40, 2, 1, ARRAY[1, 3]::int2[]"
                    .to_owned(),
            ),
            ("complete", &sql.complete, completions.clone()),
            (
                "complete with history",
                &sql.complete_with_history,
                completions,
            ),
            (
                "fail",
                &sql.fail,
                "'d0000002h1', 7, 1, 0, false, 1000, 'boom', 25, 1".to_owned(),
            ),
            (
                "renew",
                &sql.renew,
                "'w1', 30000, ARRAY['d0000002h1']".to_owned(),
            ),
            (
                "confirm",
                &sql.confirm,
                "'w1', 30000, 7, 1, 'd0000002h1'".to_owned(),
            ),
            ("release", &sql.release, format!("'w1', {tokens}")),
            ("due", &sql.due_exists, "ARRAY['h1']".to_owned()),
            ("publish unkeyed", &sql.publish, publish("n1", "NULL")),
            ("publish keyed", &sql.publish, publish("n2", "'key7'")),
        ];
        let mut findings = vec![];
        for (name, sql, args) in statements {
            let scans = unbounded_scans(&store, sql, &args).await;
            if !scans.is_empty() {
                findings.push(format!(
                    "{name}, {events} events in {lanes} lanes: {}",
                    scans.join("; ")
                ));
            }
        }
        store.drop().await;
        findings
    }
}
