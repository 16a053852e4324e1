//! Looking at a live store: deliveries, one delivery, one event, the lanes, per-handler
//! statistics.

use chrono::{DateTime, Utc};

use super::super::conn::db;
use super::super::{owner_name, PgStore};
use super::delivery_row;
use crate::store::lane::lane_of;
use crate::store::{
    DeliveryDetail, DeliveryFilter, DeliveryRow, DeliveryStatus, EventDetail, EventName,
    HandlerBacklog, HandlerStats, Inspect, KeyBacklog, LaneRow, LeaseToken, Record, Result,
};

/// The most deliveries `events show` lists.
const EVENT_DELIVERIES: i64 = 10_000;

impl Inspect for PgStore {
    async fn list_deliveries(&self, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
        let conn = self.pool.get().await?;
        // The lane of a key is fixed, which lets the keyed-order index serve a key filter.
        let lane = f.key.as_deref().map(|k| lane_of(Some(k), ""));
        let rows = match f.status {
            Some(DeliveryStatus::Completed) => {
                conn.query_once(
                    &self.sql.list_completed,
                    &[
                        &f.handler,
                        &f.key,
                        &lane,
                        &f.event_id,
                        &f.event_type,
                        &f.limit,
                    ],
                )
                .await
            }
            status => {
                conn.query_once(
                    &self.sql.list,
                    &[
                        &status.map(DeliveryStatus::as_str),
                        &f.handler,
                        &f.key,
                        &lane,
                        &f.event_id,
                        &f.event_type,
                        &f.limit,
                        &f.after,
                    ],
                )
                .await
            }
        }
        .map_err(db("could not list deliveries"))?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    async fn show_delivery(&self, id: &str) -> Result<Option<DeliveryDetail>> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.show_delivery, &[&id])
            .await
            .map_err(db("could not read the delivery"))?;
        Ok(rows.first().map(|r| {
            let delivery = delivery_row(r);
            let claims: i32 = r.get(14);
            let lane_epoch: i64 = r.get(16);
            let token = LeaseToken {
                delivery_id: id.to_owned(),
                lane: delivery.lane.unwrap_or(0),
                epoch: lane_epoch,
                claims,
                row: None,
            };
            DeliveryDetail {
                lease_token: (delivery.status == "processing").then(|| token.to_string()),
                lane_owner: owner_name(r.get(15)),
                lease_expires_at: r.get::<_, Option<DateTime<Utc>>>(17),
                claims,
                lane_epoch,
                delivery,
            }
        }))
    }

    async fn show_event(&self, id: &str) -> Result<Option<EventDetail>> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.show_event, &[&id])
            .await
            .map_err(db("could not read the event"))?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        drop(conn);
        let deliveries = self
            .list_deliveries(&DeliveryFilter {
                event_id: Some(id.to_owned()),
                limit: EVENT_DELIVERIES,
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

    async fn lanes(&self) -> Result<Vec<LaneRow>> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.lanes, &[])
            .await
            .map_err(db("could not read the lanes"))?;
        Ok(rows
            .iter()
            .map(|r| LaneRow {
                lane: r.get(0),
                owner: owner_name(r.get(1)),
                epoch: r.get(2),
                lease_expires_at: r.get(3),
                expired: r.get(4),
                in_flight: r.get(5),
                uncharged: 0,
                pending: r.get(6),
                oldest_due: r.get(7),
            })
            .collect())
    }

    async fn event_named(&self, name: EventName<'_>) -> Result<bool> {
        let (handler, event_type) = match name {
            EventName::Handler(h) => (Some(h), None),
            EventName::Type(t) => (None, Some(t)),
        };
        let conn = self.pool.get().await?;
        let row = conn
            .query_once(&self.sql.event_named, &[&handler, &event_type])
            .await
            .map_err(db("could not look for the name among the events"))?;
        Ok(row[0].get(0))
    }

    async fn ids_like(&self, record: Record, part: &str, limit: i64) -> Result<Vec<String>> {
        let sql = match record {
            Record::Delivery => &self.sql.delivery_ids_like,
            Record::Event => &self.sql.event_ids_like,
        };
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(sql, &[&part, &limit])
            .await
            .map_err(db("could not look for the ids"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn stats(&self) -> Result<Vec<HandlerStats>> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query_once(&self.sql.stats, &[])
            .await
            .map_err(db("could not compute statistics"))?;
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

    async fn backlog(&self, handler: &str, limit: i64) -> Result<HandlerBacklog> {
        let conn = self.pool.get().await?;
        let dead = conn
            .query_once(&self.sql.dead_newest, &[&handler, &limit])
            .await
            .map_err(db("could not list the handler's dead deliveries"))?;
        let keys = conn
            .query_once(&self.sql.backlog_keys, &[&handler, &limit])
            .await
            .map_err(db(
                "could not count the handler's pending deliveries by key",
            ))?;
        Ok(HandlerBacklog {
            dead: dead.iter().map(delivery_row).collect(),
            keys: keys
                .iter()
                .map(|r| KeyBacklog {
                    key: r.get(0),
                    pending: r.get(1),
                    oldest_due: r.get(2),
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    //! The listings' plans on a large table, as an operator's command plans them: for its
    //! values, with the server's settings.

    use crate::store::postgres::testing::{large_store, pages_read};

    /// Every status and filter over 100,000 deliveries (1,000 dead, 100 per key), listing 100:
    /// the pages each touches (index and heap visits, counted by the server). Within the
    /// budget, a listing reads about what it returns. Over it, and known: a key without a status
    /// and completed rows kept from 0.1 have no index (only pending keyed rows are indexed; 0.2
    /// deletes completed deliveries); an event type has no index (by design, events are not
    /// indexed by type); dead letters are listed in creation order while their index is in the
    /// order they died, so a listing walks the primary key to find them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listings_read_deliveries_through_indexes_on_a_large_table() {
        let store = large_store("explain_admin", 50_000).await;
        let mut scans = vec![];
        for status in ["NULL", "'pending'", "'processing'", "'dead'", "completed"] {
            for filter in ["none", "handler", "key", "event", "type"] {
                let arg = |f: &str, value: &str| {
                    if filter == f {
                        value.to_owned()
                    } else {
                        "NULL".into()
                    }
                };
                let (handler, key, lane, event, kind) = (
                    arg("handler", "'h1'"),
                    arg("key", "'key42'"),
                    arg(
                        "key",
                        &crate::store::lane::lane_of(Some("key42"), "").to_string(),
                    ),
                    arg("event", "'e4242'"),
                    arg("type", "'type3'"),
                );
                let filters = format!("{handler}, {key}, {lane}, {event}, {kind}, 100");
                let (sql, args) = if status == "completed" {
                    (&store.sql.list_completed, filters)
                } else {
                    (&store.sql.list, format!("{status}, {filters}, NULL"))
                };
                if pages_read(&store, sql, &args).await > 1_000 {
                    scans.push(format!("{status}/{filter}"));
                }
            }
        }
        store.drop().await;
        assert_eq!(
            scans,
            [
                "NULL/key",
                "NULL/type",
                "'pending'/type",
                "'dead'/none",
                "'dead'/handler",
                "'dead'/key",
                "'dead'/type",
                "completed/none",
                "completed/handler",
                "completed/key",
                "completed/type"
            ]
        );
    }
}
