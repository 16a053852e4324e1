//! The 0.1 conversion, in bounded batches that a rerun picks up where a crash left them.

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::indexes::*;
use crate::store::lane::lane_of;
use crate::store::mongo::model::all;
use crate::store::mongo::{MongoStore, DELIVERIES, EVENTS, READY};
use crate::store::{Result, UpgradeCounts, UpgradeProgress, UpgradeStep};

/// Documents per batch of the conversion.
pub(in crate::store::mongo) const BATCH: i64 = 1000;

/// A conversion step as planned and reported.
pub(in crate::store::mongo) fn step(
    name: &str,
    description: &str,
    rows: Option<i64>,
) -> UpgradeStep {
    UpgradeStep {
        name: name.into(),
        description: description.into(),
        rows,
    }
}

pub(in crate::store::mongo) const STEP_DELIVERIES: &str = "deliveries-lanes";

pub(in crate::store::mongo) const STEP_DELIVERIES_WHAT: &str =
    "set each delivery's laneId with the publish-time hash and \
    claims to 0, turn processing deliveries into pending with their attempts kept, make every \
    delivery ready, remove leaseOwner, leaseToken and leaseExpiresAt; in batches";

pub(in crate::store::mongo) const STEP_EVENTS: &str = "events-handlers";

pub(in crate::store::mongo) const STEP_EVENTS_WHAT: &str =
    "set each event's handlers from every delivery, completed ones \
    included (so nothing completed under 0.1 runs again), and createdAt from its first \
    delivery; in batches";

pub(in crate::store::mongo) const STEP_INSTALL: &str = "install";

pub(in crate::store::mongo) const STEP_INSTALL_WHAT: &str =
    "drop the 0.1 indexes, found by definition whatever their \
    names; create the 0.2 collections and indexes, seed the 256 lanes, record the version";

impl MongoStore {
    pub(in crate::store::mongo) async fn counts(&self) -> Result<UpgradeCounts> {
        let failed = self.conn.error("could not count the documents to convert");
        let deliveries = self.coll(DELIVERIES).await?;
        let mut counts = UpgradeCounts {
            events: self
                .coll(EVENTS)
                .await?
                .count_documents(doc! {})
                .await
                .map_err(&failed)? as i64,
            ..Default::default()
        };
        let cursor = deliveries
            .aggregate([doc! { "$group": { "_id": "$status", "n": { "$sum": 1 } } }])
            .await
            .map_err(&failed)?;
        for row in all(cursor).await.map_err(&failed)? {
            let n = row
                .get("n")
                .map(crate::store::mongo::publish::bson_i64)
                .unwrap_or(0);
            counts.deliveries += n;
            match row.get_str("_id").unwrap_or_default() {
                "pending" => counts.pending += n,
                "processing" => counts.processing += n,
                "completed" => counts.completed += n,
                "dead" => counts.dead += n,
                _ => {}
            }
        }
        Ok(counts)
    }

    pub(in crate::store::mongo) async fn steps(&self) -> Result<Vec<UpgradeStep>> {
        let failed = self.conn.error("could not count the documents to convert");
        let existing = self.existing().await?;
        let deliveries = self
            .coll(DELIVERIES)
            .await?
            .count_documents(doc! { "laneId": { "$exists": false } })
            .await
            .map_err(&failed)?;
        let events = self
            .coll(EVENTS)
            .await?
            .count_documents(doc! { "handlers": { "$exists": false } })
            .await
            .map_err(&failed)?;
        let (dropped, indexes) = self.all_drift(&existing).await?;
        let missing: Vec<String> = COLLECTIONS
            .iter()
            .filter(|c| !existing.iter().any(|e| e == *c))
            .map(|c| self.name(c))
            .collect();
        let mut install = STEP_INSTALL_WHAT.to_owned();
        if !dropped.is_empty() {
            install.push_str(&format!("; drops {}", dropped.join(", ")));
        }
        let created = [indexes, missing].concat();
        if !created.is_empty() {
            install.push_str(&format!("; creates {}", created.join(", ")));
        }
        Ok(vec![
            step(
                STEP_DELIVERIES,
                STEP_DELIVERIES_WHAT,
                Some(deliveries as i64),
            ),
            step(STEP_EVENTS, STEP_EVENTS_WHAT, Some(events as i64)),
            step(STEP_INSTALL, &install, None),
        ])
    }

    /// The conversion, step by step; each step converts what is left of it.
    pub(in crate::store::mongo) async fn convert(
        &self,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<()> {
        let steps = self.steps().await?;
        let step = |name: &str| {
            let number = 1 + steps
                .iter()
                .position(|s| s.name == name)
                .expect("a planned step");
            move |rows| progress(UpgradeProgress { step: number, rows })
        };
        self.convert_deliveries(&step(STEP_DELIVERIES)).await?;
        self.convert_events(&step(STEP_EVENTS)).await?;
        step(STEP_INSTALL)(0);
        self.install().await
    }

    /// Converts the deliveries a batch at a time, reporting the rows done after each.
    pub(in crate::store::mongo) async fn convert_deliveries(
        &self,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let deliveries = self.coll(DELIVERIES).await?;
        let failed = self
            .conn
            .error(format!("the upgrade step `{STEP_DELIVERIES}` failed"));
        let mut done = 0;
        progress(done);
        loop {
            let batch = all(deliveries
                .find(doc! { "laneId": { "$exists": false } })
                .projection(doc! { "eventId": 1, "key": 1, "status": 1 })
                .limit(BATCH)
                .await
                .map_err(&failed)?)
            .await
            .map_err(&failed)?;
            if batch.is_empty() {
                return Ok(());
            }
            let updates: Vec<Document> = batch
                .iter()
                .map(|d| {
                    let key = d.get_str("key").ok();
                    let event = d.get_str("eventId").unwrap_or_default();
                    let status = match d.get_str("status").unwrap_or("pending") {
                        "processing" => "pending",
                        other => other,
                    };
                    doc! {
                        "q": { "_id": d.get("_id").cloned().unwrap_or(Bson::Null) },
                        "u": {
                            "$set": {
                                "laneId": i32::from(lane_of(key, event)), "claims": 0,
                                "status": status, "lane": READY,
                            },
                            "$unset": { "leaseOwner": "", "leaseToken": "", "leaseExpiresAt": "" },
                        },
                    }
                })
                .collect();
            self.db()
                .await?
                .run_command(doc! { "update": self.name(DELIVERIES), "updates": updates })
                .await
                .map_err(&failed)?;
            done += batch.len() as u64;
            progress(done);
        }
    }

    pub(in crate::store::mongo) async fn convert_events(
        &self,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let events = self.coll(EVENTS).await?;
        let deliveries = self.coll(DELIVERIES).await?;
        let failed = self
            .conn
            .error(format!("the upgrade step `{STEP_EVENTS}` failed"));
        let mut done = 0;
        progress(done);
        loop {
            let batch = all(events
                .find(doc! { "handlers": { "$exists": false } })
                .projection(doc! { "createdAt": 1 })
                .limit(BATCH)
                .await
                .map_err(&failed)?)
            .await
            .map_err(&failed)?;
            if batch.is_empty() {
                return Ok(());
            }
            let ids: Vec<Bson> = batch.iter().filter_map(|e| e.get("_id").cloned()).collect();
            let found = all(deliveries
                .aggregate([
                    doc! { "$match": { "eventId": { "$in": &ids } } },
                    doc! { "$sort": { "handler": 1 } },
                    doc! { "$group": {
                        "_id": "$eventId",
                        "handlers": { "$addToSet": "$handler" },
                        "first": { "$min": "$createdAt" },
                    } },
                ])
                .await
                .map_err(&failed)?)
            .await
            .map_err(&failed)?;
            let now = DateTime::now();
            let updates: Vec<Document> = batch
                .iter()
                .map(|e| {
                    let id = e.get("_id").cloned().unwrap_or(Bson::Null);
                    let of = found.iter().find(|f| f.get("_id") == Some(&id));
                    let mut handlers: Vec<String> = of
                        .and_then(|f| f.get_array("handlers").ok())
                        .map(|a| {
                            a.iter()
                                .filter_map(|h| h.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    handlers.sort();
                    let created = e
                        .get_datetime("createdAt")
                        .ok()
                        .or_else(|| of.and_then(|f| f.get_datetime("first").ok()))
                        .copied()
                        .unwrap_or(now);
                    doc! {
                        "q": { "_id": id },
                        "u": { "$set": { "handlers": handlers, "createdAt": created } },
                    }
                })
                .collect();
            self.db()
                .await?
                .run_command(doc! { "update": self.name(EVENTS), "updates": updates })
                .await
                .map_err(&failed)?;
            done += batch.len() as u64;
            progress(done);
        }
    }
}
