//! The expansion an `upgrade` leaves, for a rolling deploy: 0.1 publishers may go on writing
//! deliveries without `laneId` and events without `handlers`, and running workers adopt them (as
//! the conversion converted the rest) within seconds, until `upgrade --contract`. A document in
//! the schema collection says the store is expanded and counts what was adopted. The adoption
//! reads only through the claim's indexes: a 0.1 publisher writes pending deliveries, ready
//! (`lane_due`) or keyed (`lane_key_sequence`), whose missing `laneId` indexes as null.

use std::time::Duration;

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::convert::BATCH;
use crate::store::lane::lane_of;
use crate::store::mongo::model::{all, chrono};
use crate::store::mongo::{MongoStore, DELIVERIES, EVENTS, READY, SCHEMA};
use crate::store::{ContractPlan, Expansion, Locks, Result};

/// The schema document that marks an expanded store.
pub(in crate::store::mongo) const EXPANDED_ID: &str = "expanded";
/// How often a worker looks for 0.1 publishers' deliveries while the store is expanded.
const ADOPT_EVERY: Duration = Duration::from_secs(2);
/// How often a worker reads whether the store is expanded.
const CHECK_EVERY: Duration = Duration::from_secs(10);

/// When this store instance last looked.
#[derive(Default)]
pub(in crate::store::mongo) struct Adoption {
    /// When it last read the mark, and whether the store was expanded then.
    checked: Option<(std::time::Instant, bool)>,
    adopted_at: Option<std::time::Instant>,
}

/// The 0.1 publishers' deliveries not adopted yet, each filter within one of the claim's
/// indexes.
fn unadopted() -> [Document; 2] {
    [
        doc! { "laneId": Bson::Null, "status": "pending", "lane": READY },
        doc! { "laneId": Bson::Null, "status": "pending", "key": { "$type": "string" } },
    ]
}

impl MongoStore {
    /// What 0.1 publishers have written since the conversion, when the store is expanded.
    pub(in crate::store::mongo) async fn expansion(&self) -> Result<Option<Expansion>> {
        let found = self
            .coll(SCHEMA)
            .await?
            .find_one(doc! { "_id": EXPANDED_ID })
            .await
            .map_err(self.conn.error("could not read the schema"))?;
        Ok(found.map(|d| Expansion {
            legacy_rows: d
                .get("legacyRows")
                .map(crate::store::mongo::publish::bson_i64)
                .unwrap_or(0),
            last_legacy_write: d.get_datetime("lastLegacyWrite").ok().map(|at| chrono(*at)),
        }))
    }

    /// Marks the store expanded, keeping the counts of an expansion already marked.
    pub(in crate::store::mongo) async fn expand(&self) -> Result<()> {
        self.coll(SCHEMA)
            .await?
            .update_one(
                doc! { "_id": EXPANDED_ID },
                doc! { "$setOnInsert": { "legacyRows": 0_i64, "lastLegacyWrite": Bson::Null } },
            )
            .upsert(true)
            .await
            .map_err(self.conn.error("could not mark the store expanded"))?;
        Ok(())
    }

    /// Adopts one batch of each kind of delivery a 0.1 publisher wrote: its lane and the rest of
    /// 0.2's fields, as the conversion gave them, and its handler in its event's `handlers`.
    /// Returns how many it adopted.
    pub(in crate::store::mongo) async fn adopt(&self) -> Result<u64> {
        let failed = self
            .conn
            .error("could not adopt the deliveries of 0.1 publishers");
        let deliveries = self.coll(DELIVERIES).await?;
        let mut found: Vec<Document> = vec![];
        for filter in unadopted() {
            found.extend(
                all(deliveries
                    .find(filter)
                    .projection(doc! { "eventId": 1, "key": 1, "handler": 1, "createdAt": 1 })
                    .limit(BATCH)
                    .await
                    .map_err(&failed)?)
                .await
                .map_err(&failed)?,
            );
        }
        // A keyed delivery that is ready is found by both.
        let mut seen = std::collections::HashSet::new();
        found.retain(|d| seen.insert(d.get("_id").cloned().map(|id| id.to_string())));
        if found.is_empty() {
            return Ok(0);
        }
        let now = DateTime::now();
        let (mut lanes, mut events) = (vec![], vec![]);
        for d in &found {
            let event = d.get_str("eventId").unwrap_or_default();
            let lane = i32::from(lane_of(d.get_str("key").ok(), event));
            let created = d.get_datetime("createdAt").copied().unwrap_or(now);
            lanes.push(doc! {
                "q": { "_id": d.get("_id").cloned().unwrap_or(Bson::Null), "laneId": Bson::Null },
                "u": { "$set": { "laneId": lane, "claims": 0, "lane": READY } },
            });
            events.push(doc! {
                "q": { "_id": event },
                "u": {
                    "$addToSet": { "handlers": d.get_str("handler").unwrap_or_default() },
                    "$min": { "createdAt": created },
                },
            });
        }
        // The events first: a delivery is claimed once it has its lane, and its event must name
        // its handler by then, or a republish could add the delivery again.
        let db = self.db().await?;
        db.run_command(doc! { "update": self.name(EVENTS), "updates": events })
            .await
            .map_err(&failed)?;
        db.run_command(doc! { "update": self.name(DELIVERIES), "updates": lanes })
            .await
            .map_err(&failed)?;
        let adopted = found.len() as u64;
        self.coll(SCHEMA)
            .await?
            .update_one(
                doc! { "_id": EXPANDED_ID },
                doc! { "$inc": { "legacyRows": adopted as i64 }, "$max": { "lastLegacyWrite": now } },
            )
            .await
            .map_err(&failed)?;
        Ok(adopted)
    }

    /// Adopts what 0.1 publishers wrote, when the store is expanded and this instance has not
    /// looked for `ADOPT_EVERY`: a claim calls it, so running workers adopt within seconds. A
    /// failure is the next look's to mend; the claim goes on.
    pub(in crate::store::mongo) async fn adopt_if_due(&self) {
        let now = std::time::Instant::now();
        let (check, adopt) = {
            let a = self.adoption.lock().expect("adoption lock");
            let check = a.checked.is_none_or(|(at, _)| now - at >= CHECK_EVERY);
            let expanded = a.checked.is_some_and(|(_, e)| e);
            let due = a.adopted_at.is_none_or(|at| now - at >= ADOPT_EVERY);
            (check, due && (expanded || check))
        };
        if !adopt {
            return;
        }
        if check {
            let expanded = matches!(self.expansion().await, Ok(Some(_)));
            self.adoption.lock().expect("adoption lock").checked = Some((now, expanded));
            if !expanded {
                return;
            }
        }
        self.adoption.lock().expect("adoption lock").adopted_at = Some(now);
        match self.adopt().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deliveries = n, "adopted 0.1 publishers' deliveries"),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "could not adopt 0.1 publishers' deliveries; trying again shortly")
            }
        }
    }

    pub(in crate::store::mongo) async fn plan_contract(&self) -> Result<Option<ContractPlan>> {
        Ok(self.expansion().await?.map(|expansion| ContractPlan {
            expansion,
            drops: vec![format!(
                "the document `{EXPANDED_ID}` of {}: workers stop adopting 0.1 publishers' \
                 deliveries",
                self.name(SCHEMA)
            )],
            locks: Locks {
                what: "none".into(),
                expected_seconds: None,
            },
        }))
    }

    /// Ends the expansion: refuses while a 0.1 write was adopted within `quiet_for` (unless
    /// `force`), then removes the mark and adopts what was written until then.
    pub(in crate::store::mongo) async fn contract_expansion(
        &self,
        quiet_for: Duration,
        force: bool,
    ) -> Result<Option<Expansion>> {
        let Some(found) = self.expansion().await? else {
            return Ok(None);
        };
        found.refuse_recent(quiet_for, force)?;
        while self.adopt().await? > 0 {}
        let ended = self.expansion().await?.unwrap_or(found);
        self.coll(SCHEMA)
            .await?
            .delete_one(doc! { "_id": EXPANDED_ID })
            .await
            .map_err(self.conn.error("could not end the expansion"))?;
        Ok(Some(ended))
    }
}
