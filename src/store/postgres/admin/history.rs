//! The events as history: listed by a filter, counted, and replayed to a handler.

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;

use super::super::conn::db;
use super::super::publish::lost_race;
use super::super::PgStore;
use crate::store::lane::lane_of;
use crate::store::{EventFilter, EventPosition, EventRow, History, Result, TargetState};

/// How often a batch runs again after a deadlock with a concurrent publish (both lock events
/// and key counters, each in an order of its own); every run checks everything again.
const RACE_RETRIES: usize = 3;

/// A type pattern as LIKE takes it: `*` for any text, everything else literal.
fn like(pattern: &str) -> String {
    pattern
        .chars()
        .flat_map(|c| match c {
            '*' => vec!['%'],
            '%' | '_' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

/// The filters as `fragments/event_filter.sql` takes them ($1..$10).
struct Filters<'a> {
    types: Vec<String>,
    key: &'a Option<String>,
    handler: &'a Option<String>,
    ids: &'a Vec<String>,
    bounds: [(Option<DateTime<Utc>>, Option<&'a str>); 3],
}

impl<'a> Filters<'a> {
    fn of(f: &'a EventFilter) -> Self {
        let bound = |p: &'a Option<EventPosition>| {
            p.as_ref()
                .map_or((None, None), |p| (Some(p.at), p.id.as_deref()))
        };
        Filters {
            types: f.types.iter().map(|t| like(t)).collect(),
            key: &f.key,
            handler: &f.handler,
            ids: &f.ids,
            bounds: [bound(&f.since), bound(&f.after), bound(&f.until)],
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut p: Vec<&(dyn ToSql + Sync)> = vec![&self.types, self.key, self.handler, self.ids];
        for (at, id) in &self.bounds {
            p.push(at);
            p.push(id);
        }
        p
    }
}

fn target(status: Option<String>, later: Option<bool>) -> TargetState {
    match (status.as_deref(), later) {
        (None, _) => TargetState::Absent,
        (Some("dead"), _) => TargetState::Dead,
        (Some("completed"), _) => TargetState::Completed,
        (_, Some(true)) => TargetState::Scheduled,
        _ => TargetState::Pending,
    }
}

impl History for PgStore {
    async fn count_events(&self, filter: &EventFilter) -> Result<i64> {
        let filters = Filters::of(filter);
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.count_events, &filters.params())
            .await
            .map_err(db("could not count the events"))?;
        Ok(rows[0].get(0))
    }

    async fn events(
        &self,
        filter: &EventFilter,
        limit: i64,
        handler: Option<&str>,
    ) -> Result<Vec<EventRow>> {
        let filters = Filters::of(filter);
        let mut params = filters.params();
        params.extend([&handler as &(dyn ToSql + Sync), &limit]);
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.events, &params)
            .await
            .map_err(db("could not list the events"))?;
        Ok(rows
            .iter()
            .map(|r| EventRow {
                id: r.get(0),
                event_type: r.get(1),
                key: r.get(2),
                created_at: r.get(3),
                handlers: r.get(4),
                target: target(r.get(5), r.get(6)),
            })
            .collect())
    }

    async fn replay_events(
        &self,
        handler: &str,
        events: &[EventRow],
        again: bool,
    ) -> Result<Vec<String>> {
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let delivery_ids: Vec<String> = events.iter().map(|_| crate::store::new_id()).collect();
        let lanes: Vec<i16> = events
            .iter()
            .map(|e| lane_of(e.key.as_deref(), &e.id))
            .collect();
        let keys: Vec<Option<&str>> = events.iter().map(|e| e.key.as_deref()).collect();
        let params: [&(dyn ToSql + Sync); 6] =
            [&handler, &ids, &delivery_ids, &lanes, &keys, &again];
        let conn = self.pool.get().await?;
        let mut attempt = 0;
        let rows = loop {
            attempt += 1;
            match conn.query_once(&self.sql.replay, &params).await {
                Err(e) if attempt <= RACE_RETRIES && lost_race(&e) => continue,
                result => {
                    break result
                        .map_err(db("could not replay the batch; nothing of it was written"))?
                }
            }
        };
        Ok(rows[0].get(0))
    }
}
