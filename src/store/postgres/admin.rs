//! The operator's queries: listings, requeue, purge, lanes and statistics. They run against a
//! live system, so each is a short statement backed by an index of the 0.2 schema wherever its
//! filters allow: the status is part of the statement text (a partial index only serves a
//! literal status), listings follow the primary key (relaybus ids are time-ordered, so that is
//! creation order) and a key filter adds its lane. Statements are sent unnamed with typed
//! parameters, one round trip each, which poolers accept too.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::conn::Conn;
use super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{
    DeliveryDetail, DeliveryFilter, DeliveryRow, DeliveryStatus, EventDetail, HandlerStats,
    LaneRow, PurgeBatch, PurgeCounts, PurgeKind, PurgeOptions, RequeueSelector, Result, StoreError,
};

/// A statement built from optional filters: text plus typed parameters.
struct Query {
    sql: String,
    args: Vec<Arg>,
}

enum Arg {
    Text(String),
    Int2(i16),
    Int8(i64),
    Float8(f64),
    Texts(Vec<String>),
}

impl Query {
    fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            args: vec![],
        }
    }

    /// Adds a parameter and returns its placeholder.
    fn arg(&mut self, a: Arg) -> String {
        self.args.push(a);
        format!("${}", self.args.len())
    }

    fn push(&mut self, text: &str) {
        self.sql.push_str(text);
    }

    async fn run(&self, conn: &Conn, context: &str) -> Result<Vec<Row>> {
        conn.client
            .query_typed(&self.sql, &self.typed())
            .await
            .map_err(StoreError::db(context))
    }

    fn typed(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        self.args
            .iter()
            .map(|a| -> (&(dyn ToSql + Sync), Type) {
                match a {
                    Arg::Text(v) => (v, Type::TEXT),
                    Arg::Int2(v) => (v, Type::INT2),
                    Arg::Int8(v) => (v, Type::INT8),
                    Arg::Float8(v) => (v, Type::FLOAT8),
                    Arg::Texts(v) => (v, Type::TEXT_ARRAY),
                }
            })
            .collect()
    }
}

/// Where the filters of a listing find their columns.
struct Columns {
    handler: &'static str,
    key: &'static str,
    lane: Option<&'static str>,
    event_id: &'static str,
}

const DELIVERIES: Columns = Columns {
    handler: "d.handler",
    key: "d.key",
    lane: Some("d.lane"),
    event_id: "d.event_id",
};

/// The completion history has no lane; its key is the event's.
const HISTORY: Columns = Columns {
    handler: "c.handler",
    key: "e.key",
    lane: None,
    event_id: "c.event_id",
};

fn seconds(d: Duration) -> Arg {
    Arg::Float8(d.as_secs_f64())
}

/// A pending delivery is processing while its lane lists it under a live lease.
const PROCESSING: &str = "EXISTS (SELECT 1 FROM \"{{schema}}\".\"{{prefix}}lanes\" l \
     WHERE l.lane = d.lane AND l.lease_expires_at > now() AND d.id = ANY (l.in_flight))";

const DELIVERY_COLUMNS: &str = "d.id, d.event_id, e.type, d.handler, \
     CASE WHEN d.status = 'pending' AND {processing} THEN 'processing' ELSE d.status END, \
     d.attempts, d.key, d.sequence, d.lane, d.available_at, d.last_error, d.created_at, \
     d.updated_at, d.completed_at";

fn delivery_row(r: &Row) -> DeliveryRow {
    DeliveryRow {
        id: r.get(0),
        event_id: r.get(1),
        event_type: r.get(2),
        handler: r.get(3),
        status: r.get(4),
        attempts: r.get(5),
        key: r.get(6),
        sequence: r.get(7),
        lane: r.get(8),
        available_at: r.get(9),
        last_error: r.get(10),
        created_at: r.get(11),
        updated_at: r.get(12),
        completed_at: r.get(13),
    }
}

impl PgStore {
    fn columns(&self) -> String {
        self.ns
            .render(&DELIVERY_COLUMNS.replace("{processing}", PROCESSING))
    }

    /// `AND ...` for the filters other than status.
    fn delivery_filters(&self, q: &mut Query, f: &DeliveryFilter, on: &Columns) {
        if let Some(h) = &f.handler {
            let p = q.arg(Arg::Text(h.clone()));
            q.push(&format!(" AND {} = {p}", on.handler));
        }
        if let Some(k) = &f.key {
            if let Some(lane_column) = on.lane {
                // The lane of a key is fixed, which lets the keyed-order index serve the filter.
                let lane = q.arg(Arg::Int2(lane_of(Some(k), "")));
                q.push(&format!(" AND {lane_column} = {lane}"));
            }
            let key = q.arg(Arg::Text(k.clone()));
            q.push(&format!(" AND {} = {key}", on.key));
        }
        if let Some(id) = &f.event_id {
            let p = q.arg(Arg::Text(id.clone()));
            q.push(&format!(" AND {} = {p}", on.event_id));
        }
        if let Some(t) = &f.event_type {
            let p = q.arg(Arg::Text(t.clone()));
            q.push(&format!(" AND e.type = {p}"));
        }
    }

    pub(crate) async fn list_deliveries_impl(
        &self,
        f: &DeliveryFilter,
    ) -> Result<Vec<DeliveryRow>> {
        let conn = self.pool.get().await?;
        let rows = self
            .list_query(f)
            .run(&conn, "could not list deliveries")
            .await?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    fn list_query(&self, f: &DeliveryFilter) -> Query {
        let deliveries = self.ns.table("deliveries");
        let events = self.ns.table("events");
        let columns = self.columns();
        if f.status == Some(DeliveryStatus::Completed) {
            return self.completed_query(f);
        }
        let mut q = match f.status {
            // The ids in flight under live leases, looked up through the primary key (a join
            // with the unnested lists is planned as a scan of deliveries).
            Some(DeliveryStatus::Processing) => Query::new(format!(
                "SELECT {columns} FROM {deliveries} d JOIN {events} e ON e.id = d.event_id \
                  WHERE d.status = 'pending' AND d.id = ANY (ARRAY( \
                        SELECT f.id FROM {} ll CROSS JOIN LATERAL unnest(ll.in_flight) AS f(id) \
                         WHERE ll.lease_expires_at > now()))",
                self.ns.table("lanes")
            )),
            Some(DeliveryStatus::Pending) => Query::new(format!(
                "SELECT {columns} FROM {deliveries} d JOIN {events} e ON e.id = d.event_id \
                  WHERE d.status = 'pending' AND NOT {}",
                self.ns.render(PROCESSING)
            )),
            Some(DeliveryStatus::Dead) => Query::new(format!(
                "SELECT {columns} FROM {deliveries} d JOIN {events} e ON e.id = d.event_id \
                  WHERE d.status = 'dead'"
            )),
            _ => Query::new(format!(
                "SELECT {columns} FROM {deliveries} d JOIN {events} e ON e.id = d.event_id WHERE true"
            )),
        };
        self.delivery_filters(&mut q, f, &DELIVERIES);
        let limit = q.arg(Arg::Int8(f.limit));
        q.push(&format!(" ORDER BY d.id LIMIT {limit}"));
        q
    }

    /// Completed rows kept from 0.1 and the completion history, newest first.
    fn completed_query(&self, f: &DeliveryFilter) -> Query {
        let mut q = Query::new(format!(
            "SELECT * FROM (SELECT {} FROM {} d JOIN {} e ON e.id = d.event_id \
              WHERE d.status = 'completed'",
            self.columns(),
            self.ns.table("deliveries"),
            self.ns.table("events")
        ));
        self.delivery_filters(&mut q, f, &DELIVERIES);
        q.push(&format!(
            " UNION ALL SELECT NULL, c.event_id, coalesce(e.type, ''), c.handler, 'completed', \
                    c.attempts, e.key, NULL, NULL, NULL, NULL, e.created_at, NULL, c.completed_at \
               FROM {} c LEFT JOIN {} e ON e.id = c.event_id WHERE true",
            self.ns.table("completions"),
            self.ns.table("events")
        ));
        self.delivery_filters(&mut q, f, &HISTORY);
        let limit = q.arg(Arg::Int8(f.limit));
        q.push(&format!(
            ") x ORDER BY completed_at DESC NULLS LAST LIMIT {limit}"
        ));
        q
    }

    pub(crate) async fn show_delivery_impl(&self, id: &str) -> Result<Option<DeliveryDetail>> {
        let conn = self.pool.get().await?;
        let mut q = Query::new(format!(
            "SELECT {}, d.claims, l.lease_owner, l.epoch, l.lease_expires_at \
               FROM {} d JOIN {} e ON e.id = d.event_id JOIN {} l ON l.lane = d.lane WHERE d.id = ",
            self.columns(),
            self.ns.table("deliveries"),
            self.ns.table("events"),
            self.ns.table("lanes")
        ));
        let p = q.arg(Arg::Text(id.to_owned()));
        q.push(&p);
        let rows = q.run(&conn, "could not read the delivery").await?;
        Ok(rows.first().map(|r| {
            let delivery = delivery_row(r);
            let claims: i32 = r.get(14);
            let lane_epoch: i64 = r.get(16);
            let processing = delivery.status == "processing";
            DeliveryDetail {
                lease_token: processing
                    .then(|| format!("{}:{lane_epoch}:{claims}", delivery.lane.unwrap_or(0))),
                lane_owner: r.get(15),
                lease_expires_at: r.get::<_, Option<DateTime<Utc>>>(17),
                claims,
                lane_epoch,
                delivery,
            }
        }))
    }

    pub(crate) async fn show_event_impl(&self, id: &str) -> Result<Option<EventDetail>> {
        let conn = self.pool.get().await?;
        let mut q = Query::new(format!(
            "SELECT id, type, key, payload, headers, handlers, created_at FROM {} WHERE id = ",
            self.ns.table("events")
        ));
        let p = q.arg(Arg::Text(id.to_owned()));
        q.push(&p);
        let rows = q.run(&conn, "could not read the event").await?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        drop(conn);
        let deliveries = self
            .list_deliveries_impl(&DeliveryFilter {
                event_id: Some(id.to_owned()),
                limit: 10_000,
                ..Default::default()
            })
            .await?;
        Ok(Some(EventDetail {
            id: r.get(0),
            event_type: r.get(1),
            key: r.get(2),
            payload: r.get(3),
            headers: r.get(4),
            handlers: r.get(5),
            created_at: r.get(6),
            deliveries,
        }))
    }

    /// `WHERE` of the dead deliveries a selector picks.
    fn requeue_where(&self, q: &mut Query, s: &RequeueSelector) {
        q.push(" WHERE d.status = 'dead'");
        if !s.ids.is_empty() {
            let p = q.arg(Arg::Texts(s.ids.clone()));
            q.push(&format!(" AND d.id = ANY ({p})"));
        }
        if let Some(h) = &s.handler {
            let p = q.arg(Arg::Text(h.clone()));
            q.push(&format!(" AND d.handler = {p}"));
        }
        if let Some(t) = &s.event_type {
            let p = q.arg(Arg::Text(t.clone()));
            q.push(&format!(
                " AND EXISTS (SELECT 1 FROM {} e WHERE e.id = d.event_id AND e.type = {p})",
                self.ns.table("events")
            ));
        }
        if let Some(text) = &s.error_contains {
            let p = q.arg(Arg::Text(text.clone()));
            q.push(&format!(" AND strpos(d.last_error, {p}) > 0"));
        }
    }

    pub(crate) async fn count_dead_impl(&self, s: &RequeueSelector) -> Result<i64> {
        let conn = self.pool.get().await?;
        let mut q = Query::new(format!(
            "SELECT count(*) FROM {} d",
            self.ns.table("deliveries")
        ));
        self.requeue_where(&mut q, s);
        Ok(q.run(&conn, "could not count dead deliveries").await?[0].get(0))
    }

    /// One statement: every selected dead delivery becomes pending, due now, with a fresh
    /// attempt budget. The status condition is in the statement, so a delivery that is not dead
    /// when it runs is never touched.
    pub(crate) async fn requeue_impl(&self, s: &RequeueSelector) -> Result<Vec<String>> {
        let conn = self.pool.get().await?;
        let mut q = Query::new(format!(
            "UPDATE {} d SET status = 'pending', attempts = 0, claims = d.claims + 1, \
                    available_at = now(), updated_at = now()",
            self.ns.table("deliveries")
        ));
        self.requeue_where(&mut q, s);
        q.push(" RETURNING d.id");
        let rows = q
            .run(
                &conn,
                "could not requeue dead deliveries; nothing was changed",
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// What a purge would delete, counted.
    pub(crate) async fn purge_count_impl(&self, o: &PurgeOptions) -> Result<PurgeCounts> {
        let conn = self.pool.get().await?;
        let mut counts = PurgeCounts::default();
        if let Some(age) = o.dead_older_than {
            let mut q = Query::new(format!(
                "SELECT count(*) FROM {} WHERE status = 'dead' AND updated_at < now() - ",
                self.ns.table("deliveries")
            ));
            let p = q.arg(seconds(age));
            q.push(&format!("{p} * interval '1 second'"));
            counts.dead = q.run(&conn, "could not count dead deliveries").await?[0].get(0);
        }
        if let Some(age) = o.completed_older_than {
            let mut q = Query::new(format!(
                "SELECT (SELECT count(*) FROM {d} WHERE status = 'completed' AND completed_at < now() - $1 * interval '1 second'), \
                        (SELECT count(*) FROM {c} WHERE completed_at < now() - $1 * interval '1 second'), \
                        (SELECT count(*) FROM {e} e WHERE e.created_at < now() - $1 * interval '1 second' \
                            AND NOT EXISTS (SELECT 1 FROM {d} d WHERE d.event_id = e.id \
                                             AND NOT (d.status = 'completed' AND d.completed_at < now() - $1 * interval '1 second') \
                                             AND NOT (d.status = 'dead' AND {dead_purged})))",
                d = self.ns.table("deliveries"),
                c = self.ns.table("completions"),
                e = self.ns.table("events"),
                dead_purged = if o.dead_older_than.is_some() { "d.updated_at < now() - $2 * interval '1 second'" } else { "false" },
            ));
            q.arg(seconds(age));
            if let Some(dead) = o.dead_older_than {
                q.arg(seconds(dead));
            }
            let r = &q
                .run(&conn, "could not count what the purge would delete")
                .await?[0];
            counts.completed = r.get(0);
            counts.history = r.get(1);
            counts.events = r.get(2);
        }
        Ok(counts)
    }

    /// Deletes one batch of one kind.
    pub(crate) async fn purge_batch_impl(
        &self,
        kind: PurgeKind,
        age: Duration,
        batch: i64,
    ) -> Result<PurgeBatch> {
        let mut conn = self.pool.get().await?;
        let d = self.ns.table("deliveries");
        let sql = match kind {
            PurgeKind::Dead => format!(
                "DELETE FROM {d} WHERE id IN (SELECT id FROM {d} WHERE status = 'dead' \
                   AND updated_at < now() - $1 * interval '1 second' ORDER BY updated_at LIMIT $2)"
            ),
            PurgeKind::Completed => format!(
                "DELETE FROM {d} WHERE id IN (SELECT id FROM {d} WHERE status = 'completed' \
                   AND completed_at < now() - $1 * interval '1 second' LIMIT $2)"
            ),
            PurgeKind::History => format!(
                "DELETE FROM {c} WHERE ctid IN (SELECT ctid FROM {c} \
                   WHERE completed_at < now() - $1 * interval '1 second' ORDER BY completed_at LIMIT $2)",
                c = self.ns.table("completions")
            ),
            PurgeKind::Events => return self.purge_events_batch(&mut conn, age, batch).await,
        };
        let deleted = conn
            .client
            .execute_typed(
                &sql,
                &[(&age.as_secs_f64(), Type::FLOAT8), (&batch, Type::INT8)],
            )
            .await
            .map_err(StoreError::db("could not purge"))? as i64;
        Ok(PurgeBatch {
            deleted,
            more: deleted > 0,
        })
    }

    /// Events without deliveries: the candidates are locked first, then checked again by a new
    /// statement, whose snapshot is younger than the locks. A publish that added a delivery
    /// before the lock is seen and the event kept; one after it waits for the lock, then finds
    /// the event gone and fails (its retry is a new event). A pending delivery is never cascaded
    /// away.
    async fn purge_events_batch(
        &self,
        conn: &mut Conn,
        age: Duration,
        batch: i64,
    ) -> Result<PurgeBatch> {
        let e = self.ns.table("events");
        let d = self.ns.table("deliveries");
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(StoreError::db("could not begin the purge"))?;
        let candidates: Vec<String> = tx
            .query_typed(
                &format!(
                    "SELECT e.id FROM {e} e WHERE e.created_at < now() - $1 * interval '1 second' \
                       AND NOT EXISTS (SELECT 1 FROM {d} d WHERE d.event_id = e.id) \
                     ORDER BY e.created_at LIMIT $2 FOR UPDATE SKIP LOCKED"
                ),
                &[(&age.as_secs_f64(), Type::FLOAT8), (&batch, Type::INT8)],
            )
            .await
            .map_err(StoreError::db("could not select events to purge"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if candidates.is_empty() {
            return Ok(PurgeBatch {
                deleted: 0,
                more: false,
            });
        }
        let deleted = tx
            .execute_typed(
                &format!(
                    "DELETE FROM {e} e WHERE e.id = ANY ($1) \
                       AND NOT EXISTS (SELECT 1 FROM {d} d WHERE d.event_id = e.id)"
                ),
                &[(&candidates, Type::TEXT_ARRAY)],
            )
            .await
            .map_err(StoreError::db("could not purge events"))? as i64;
        tx.commit()
            .await
            .map_err(StoreError::db("could not commit the purge"))?;
        // Candidates that gained a delivery in between are kept and no longer selected.
        Ok(PurgeBatch {
            deleted,
            more: true,
        })
    }

    pub(crate) async fn lanes_impl(&self) -> Result<Vec<LaneRow>> {
        let conn = self.pool.get().await?;
        let q = Query::new(format!(
            "SELECT l.lane, l.lease_owner, l.epoch, l.lease_expires_at, \
                    coalesce(l.lease_expires_at <= now(), false), \
                    (SELECT count(*) FROM {d} d WHERE d.id = ANY (l.in_flight) AND d.status = 'pending'), \
                    coalesce(p.pending, 0), p.oldest_due \
               FROM {l} l LEFT JOIN ( \
                    SELECT lane, count(*) AS pending, \
                           min(available_at) FILTER (WHERE available_at <= now()) AS oldest_due \
                      FROM {d} WHERE status = 'pending' GROUP BY lane) p USING (lane) \
              ORDER BY l.lane",
            d = self.ns.table("deliveries"),
            l = self.ns.table("lanes")
        ));
        let rows = q.run(&conn, "could not read the lanes").await?;
        Ok(rows
            .iter()
            .map(|r| LaneRow {
                lane: r.get(0),
                owner: r.get(1),
                epoch: r.get(2),
                lease_expires_at: r.get(3),
                expired: r.get(4),
                in_flight: r.get(5),
                pending: r.get(6),
                oldest_due: r.get(7),
            })
            .collect())
    }

    pub(crate) async fn stats_impl(&self) -> Result<Vec<HandlerStats>> {
        let conn = self.pool.get().await?;
        let q = Query::new(format!(
            "WITH live AS ( \
               SELECT f.id FROM {l} l CROSS JOIN LATERAL unnest(l.in_flight) AS f(id) \
                WHERE l.lease_expires_at > now()), \
             pending AS ( \
               SELECT d.handler, \
                      count(*) FILTER (WHERE d.available_at <= now() AND d.id NOT IN (SELECT id FROM live)) AS due, \
                      count(*) FILTER (WHERE d.available_at > now() AND d.id NOT IN (SELECT id FROM live)) AS scheduled, \
                      count(*) FILTER (WHERE d.id IN (SELECT id FROM live)) AS processing, \
                      min(d.available_at) FILTER (WHERE d.available_at <= now() AND d.id NOT IN (SELECT id FROM live)) AS oldest \
                 FROM {d} d WHERE d.status = 'pending' GROUP BY d.handler), \
             dead AS (SELECT handler, count(*) AS dead FROM {d} WHERE status = 'dead' GROUP BY handler), \
             completed AS ( \
               SELECT handler, count(*) AS completed FROM ( \
                 SELECT handler FROM {c} UNION ALL SELECT handler FROM {d} WHERE status = 'completed') x \
                GROUP BY handler) \
             SELECT coalesce(p.handler, x.handler, c.handler), coalesce(p.due, 0), coalesce(p.scheduled, 0), \
                    coalesce(p.processing, 0), coalesce(x.dead, 0), coalesce(c.completed, 0), \
                    extract(epoch FROM now() - p.oldest)::float8 \
               FROM pending p FULL JOIN dead x ON x.handler = p.handler \
               FULL JOIN completed c ON c.handler = coalesce(p.handler, x.handler) \
              ORDER BY 1",
            d = self.ns.table("deliveries"),
            l = self.ns.table("lanes"),
            c = self.ns.table("completions")
        ));
        let rows = q.run(&conn, "could not compute statistics").await?;
        Ok(rows
            .iter()
            .map(|r| HandlerStats {
                handler: r.get(0),
                due: r.get(1),
                scheduled: r.get(2),
                processing: r.get(3),
                dead: r.get(4),
                completed: r.get(5),
                lag_seconds: r.get(6),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    //! The listings' plans on a large table, generic as the workers' connections plan them.

    use super::*;
    use crate::store::postgres::testing::{drop_store, generic_plan, large_store};

    fn literal(a: &Arg) -> (String, &'static str) {
        let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
        match a {
            Arg::Text(v) => (quote(v), "text"),
            Arg::Int2(v) => (v.to_string(), "int2"),
            Arg::Int8(v) => (v.to_string(), "int8"),
            Arg::Float8(v) => (v.to_string(), "float8"),
            Arg::Texts(v) => (
                format!(
                    "ARRAY[{}]::text[]",
                    v.iter().map(|s| quote(s)).collect::<Vec<_>>().join(",")
                ),
                "text[]",
            ),
        }
    }

    /// Every status and filter combination over 100,000 deliveries: no plan scans deliveries
    /// sequentially. Status-less listings walk the primary key, which is creation order, and
    /// stop at the limit. Two kinds have no index: a key filter without a status (only pending
    /// keyed rows are indexed) and the completed rows kept from 0.1 (0.2 deletes completed
    /// deliveries) unless an event narrows them; since the connections rule sequential scans
    /// out, they walk the primary key whole, which reads every delivery as a scan would.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listings_use_indexes_on_a_large_table() {
        let store = large_store("explain_admin", 50_000).await;
        let mut scans = vec![];
        let statuses = [
            None,
            Some(DeliveryStatus::Pending),
            Some(DeliveryStatus::Processing),
            Some(DeliveryStatus::Dead),
            Some(DeliveryStatus::Completed),
        ];
        for status in statuses {
            for filter in ["none", "handler", "key", "event", "type"] {
                let f = DeliveryFilter {
                    status,
                    handler: (filter == "handler").then(|| "h1".into()),
                    key: (filter == "key").then(|| "key42".into()),
                    event_id: (filter == "event").then(|| "e4242".into()),
                    event_type: (filter == "type").then(|| "type3".into()),
                    limit: 100,
                };
                let q = store.list_query(&f);
                let (args, types): (Vec<String>, Vec<&str>) = q.args.iter().map(literal).unzip();
                let plan = generic_plan(&store, &q.sql, &types, &args).await;
                if plan.contains("Seq Scan on relaybus_deliveries") {
                    scans.push(format!("{status:?}/{filter}"));
                }
            }
        }
        drop_store(store).await;
        assert_eq!(scans, Vec::<String>::new());
    }
}
