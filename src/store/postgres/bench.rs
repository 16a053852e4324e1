//! What `relaybus bench` reads and writes on PostgreSQL (`sql/postgres/bench/*.sql`): the
//! server's counters (transactions, WAL, rows per table), a backlog written by two set-based
//! inserts, and the raw-SQL floors.

use std::collections::BTreeMap;

use tokio_postgres::error::SqlState;

use super::conn::db;
use super::PgStore;
use crate::store::bench::{Backlog, BenchStore, DeliveryCounts, ServerCounters};
use crate::store::lane::lane_of;
use crate::store::{NewEvent, Result};

/// The settings a report records.
const SETTINGS: [&str; 9] = [
    "server_version",
    "shared_buffers",
    "synchronous_commit",
    "full_page_writes",
    "fsync",
    "wal_level",
    "max_wal_size",
    "max_connections",
    "jit",
];

impl BenchStore for PgStore {
    async fn server_counters(&self) -> Result<ServerCounters> {
        let conn = self.pool.get().await?;
        // A backend publishes its statistics at most once a second, so the WAL and rows of a
        // preload that just ended could land in the sample (measured: 2,110 WAL bytes per
        // delivery instead of 410). This session's own are flushed first; the workers' are
        // flushed when they exit, before the sample ends.
        conn.client
            .batch_execute(
                "DO $$ BEGIN IF current_setting('server_version_num')::int >= 150000 THEN \
                 PERFORM pg_stat_force_next_flush(); END IF; END $$",
            )
            .await
            .map_err(db("could not flush the statistics"))?;
        let r = &conn
            .query_once(&self.sql.bench_server_counters, &[])
            .await
            .map_err(db("could not read the server's counters"))?[0];
        let totals = ["transactions", "wal_records", "wal_fpi", "wal_bytes"]
            .iter()
            .enumerate()
            .map(|(i, name)| (name.to_string(), r.get(i)))
            .collect();
        let tables = conn
            .query_once(&self.sql.bench_table_counters, &[])
            .await
            .map_err(db("could not read the table counters"))?
            .iter()
            .map(|row| {
                let name: String = row.get(0);
                let name = name[self.ns.prefix().len()..].to_owned();
                (name, [row.get(1), row.get(2), row.get(3), row.get(4)])
            })
            .collect();
        Ok(ServerCounters { totals, tables })
    }

    async fn server_settings(&self) -> Result<BTreeMap<String, String>> {
        let conn = self.pool.get().await?;
        let names: Vec<&str> = SETTINGS.to_vec();
        Ok(conn
            .query_once(&self.sql.bench_settings, &[&names])
            .await
            .map_err(db("could not read the server's settings"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    async fn stores(&self) -> Result<Vec<String>> {
        let conn = self.pool.get().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match conn.query_once(&self.sql.bench_stores, &[]).await {
                // A schema dropped between the listing and its count: look again.
                Err(e) if attempt < 3 && e.code() == Some(&SqlState::UNDEFINED_TABLE) => continue,
                rows => {
                    return Ok(rows
                        .map_err(db("could not look for relaybus stores"))?
                        .iter()
                        .map(|r| r.get(0))
                        .collect())
                }
            }
        }
    }

    async fn preload(&self, backlog: &Backlog, settle: bool) -> Result<()> {
        let mut conn = self.pool.get().await?;
        let args: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [
            &(backlog.events as i64),
            &backlog.key_modulus.map(|m| m as i64),
            &backlog.handlers,
        ];
        for sql in [
            &self.sql.bench_preload_events,
            &self.sql.bench_preload_deliveries,
        ] {
            conn.execute(sql, &args)
                .await
                .map_err(db("could not preload the backlog"))?;
        }
        // One statement each: several in one query string form a transaction, which VACUUM
        // refuses.
        let how = if settle { "VACUUM ANALYZE" } else { "ANALYZE" };
        for table in ["deliveries", "events", "lanes"] {
            conn.client
                .batch_execute(&format!("{how} {}", self.ns.table(table)))
                .await
                .map_err(db(format!("could not {how} {table}")))?;
        }
        if settle {
            conn.client
                .batch_execute("CHECKPOINT")
                .await
                .map_err(db("could not checkpoint"))?;
        }
        Ok(())
    }

    async fn delivery_counts(&self) -> Result<DeliveryCounts> {
        let conn = self.pool.get().await?;
        let r = &conn
            .query_once(&self.sql.bench_counts, &[])
            .await
            .map_err(db("could not count deliveries"))?[0];
        Ok(DeliveryCounts {
            total: r.get(0),
            pending: r.get(1),
            dead: r.get(2),
        })
    }

    async fn pending(&self) -> Result<Vec<(String, String)>> {
        let conn = self.pool.get().await?;
        Ok(conn
            .query_once(&self.sql.bench_pending, &[])
            .await
            .map_err(db("could not read the pending deliveries"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    async fn drop_namespace(&self) -> Result<()> {
        let conn = self.pool.get().await?;
        let statement = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.ns.schema());
        conn.client
            .batch_execute(&statement)
            .await
            .map_err(db(format!("`{statement}` failed")))
    }

    async fn floor_publish(&self, events: &[NewEvent]) -> Result<()> {
        let handlers: Vec<&str> = events
            .first()
            .map(|e| e.handlers.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let keys: Vec<Option<&str>> = events.iter().map(|e| e.key.as_deref()).collect();
        let payloads: Vec<&serde_json::Value> = events.iter().map(|e| &e.payload).collect();
        let (mut d_ids, mut d_events, mut d_handlers, mut d_lanes, mut d_keys) =
            (vec![], vec![], vec![], vec![], vec![]);
        for e in events {
            for h in &handlers {
                d_ids.push(crate::store::new_id());
                d_events.push(e.id.as_str());
                d_handlers.push(*h);
                d_lanes.push(lane_of(e.key.as_deref(), &e.id));
                d_keys.push(e.key.as_deref());
            }
        }
        let mut conn = self.pool.get().await?;
        conn.execute(
            &self.sql.bench_floor_publish,
            &[
                &ids,
                &keys,
                &payloads,
                &d_ids,
                &handlers,
                &d_events,
                &d_handlers,
                &d_lanes,
                &d_keys,
            ],
        )
        .await
        .map_err(db("floor: insert"))?;
        Ok(())
    }

    async fn floor_dispatch(&self, batch: i64) -> Result<u64> {
        let mut conn = self.pool.get().await?;
        conn.execute(&self.sql.bench_floor_dispatch, &[&batch])
            .await
            .map_err(db("floor: delete"))
    }
}
