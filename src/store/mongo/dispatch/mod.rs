//! The delivery path on MongoDB: claim, complete, fail, renew, release.
//!
//! A claim reads the lanes (256 small documents), the due deliveries of the lanes this worker
//! holds, and, when those do not fill the batch, a few free or expired lanes with due work; it
//! records the batch with one conditional update of the lane documents and writes no delivery.
//! Each lane's update is conditioned on the lane as it was read, so a lane another worker took,
//! or whose in-flight list a failure changed meanwhile, keeps its state and its picks are not
//! handed out. A takeover moves `inFlight` into `lost` in the update that bumps the epoch and
//! then charges each of them an attempt in a transaction. A completion deletes its deliveries in
//! a transaction that reads, but never writes, the lanes: a completion and the charge of a
//! takeover write the same delivery documents, so exactly one of them commits.

mod claim;
#[cfg(test)]
pub(super) mod tests;

use std::collections::{HashMap, HashSet};

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::Collection;

use super::keys::{held_back, release_keys};
use super::model::{after, all, all_in, candidate_fields, Candidate, Lane};
use super::{MongoStore, COMPLETIONS, DELIVERIES, LANES, READY};
use crate::store::{
    ClaimRequest, ClaimStats, ClaimedDelivery, Dispatch, FailOutcome, Failure, LeaseToken, Result,
};

/// Due deliveries of these handlers in the claim index, in `lanes` when given.
fn due(lanes: Option<Bson>, handlers: &[String], now: DateTime) -> Document {
    let mut filter = doc! {
        "status": "pending", "lane": READY, "dueAt": { "$lte": now },
        "handler": { "$in": handlers },
    };
    if let Some(lanes) = lanes {
        filter.insert("laneId", lanes);
    }
    filter
}

/// The tokens whose lane still lists their delivery in flight at their epoch, with their claims
/// counter: a completion counts only for the holder of the lane.
async fn fenced<'t>(
    lanes: &Collection<Lane>,
    tokens: &'t [LeaseToken],
    lane_ids: &[i32],
    s: &mut mongodb::ClientSession,
) -> mongodb::error::Result<HashMap<&'t str, i32>> {
    let cursor = lanes
        .find(doc! { "_id": { "$in": lane_ids } })
        .session(&mut *s)
        .await?;
    let read: HashMap<i32, Lane> = all_in(cursor, s)
        .await?
        .into_iter()
        .map(|l| (l.lane, l))
        .collect();
    Ok(tokens
        .iter()
        .filter(|t| {
            read.get(&i32::from(t.lane))
                .is_some_and(|l| l.epoch == t.epoch && l.in_flight.contains(&t.delivery_id))
        })
        .map(|t| (t.delivery_id.as_str(), t.claims))
        .collect())
}

/// The fenced deliveries that still carry the claims counter of their token.
async fn still_claimed(
    deliveries: &Collection<Document>,
    valid: &HashMap<&str, i32>,
    s: &mut mongodb::ClientSession,
) -> mongodb::error::Result<Vec<Candidate>> {
    if valid.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<&str> = valid.keys().copied().collect();
    let cursor = deliveries
        .clone_with_type::<Candidate>()
        .find(doc! { "_id": { "$in": &ids } })
        .projection(candidate_fields())
        .session(&mut *s)
        .await?;
    Ok(all_in(cursor, s)
        .await?
        .into_iter()
        .filter(|c| valid.get(c.id.as_str()) == Some(&c.claims))
        .collect())
}

/// The completion history (`--completion-history`): one entry per completed delivery.
async fn record_history(
    completions: &Collection<Document>,
    done: &[Candidate],
    s: &mut mongodb::ClientSession,
) -> mongodb::error::Result<()> {
    let now = DateTime::now();
    let entries = done.iter().map(|c| {
        doc! {
            "eventId": &c.event_id, "handler": &c.handler,
            "attempts": c.attempts + 1, "completedAt": now,
        }
    });
    completions.insert_many(entries).session(&mut *s).await?;
    Ok(())
}

impl MongoStore {
    pub(in crate::store::mongo) async fn lane_collection(&self) -> Result<Collection<Lane>> {
        Ok(self.conn.database().await?.collection(&self.name(LANES)))
    }

    /// Ids in flight under live leases, for listings and statistics.
    pub(in crate::store::mongo) async fn in_flight(&self) -> Result<HashSet<String>> {
        let failed = self.conn.error("could not read the lanes");
        let now = DateTime::now();
        let lanes = all(self
            .lane_collection()
            .await?
            .find(doc! { "leaseExpiresAt": { "$gt": now } })
            .await
            .map_err(&failed)?)
        .await
        .map_err(&failed)?;
        Ok(lanes.into_iter().flat_map(|l| l.in_flight).collect())
    }
}

impl Dispatch for MongoStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        self.claim_batch(req).await
    }

    async fn complete(&self, tokens: &[LeaseToken], history: bool) -> Result<Vec<String>> {
        if tokens.is_empty() {
            return Ok(vec![]);
        }
        let lanes = self.lane_collection().await?;
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let completions = self.conn.collection(&self.name(COMPLETIONS)).await?;
        let mut lane_ids: Vec<i32> = tokens.iter().map(|t| i32::from(t.lane)).collect();
        lane_ids.sort_unstable();
        lane_ids.dedup();
        let tokens = tokens.to_vec();
        #[cfg(test)]
        let mut pause = self.completion_pause.lock().expect("pause lock").take();
        self.conn
            .transaction("could not complete deliveries", async move |s| {
                let valid = fenced(&lanes, &tokens, &lane_ids, s).await?;
                let done = still_claimed(&deliveries, &valid, s).await?;
                if done.is_empty() {
                    return Ok(vec![]);
                }
                #[cfg(test)]
                if let Some(p) = pause.take_if(|p| !p.after_writes) {
                    p.hold().await;
                }
                let done_ids: Vec<&str> = done.iter().map(|c| c.id.as_str()).collect();
                deliveries
                    .delete_many(doc! { "_id": { "$in": &done_ids } })
                    .session(&mut *s)
                    .await?;
                if history {
                    record_history(&completions, &done, s).await?;
                }
                release_keys(&deliveries, s, &held_back(&done)).await?;
                #[cfg(test)]
                if let Some(p) = pause.take() {
                    p.hold().await;
                }
                Ok(done.into_iter().map(|c| c.id).collect())
            })
            .await
    }

    async fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> Result<FailOutcome> {
        let lanes = self.conn.collection(&self.name(LANES)).await?;
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let lane = i32::from(token.lane);
        let (token, failure, error) = (token.clone(), failure.clone(), error.to_owned());
        self.conn
            .transaction("could not record the failed attempt", async move |s| {
                let fenced = lanes
                    .find_one(doc! {
                        "_id": lane, "epoch": token.epoch, "inFlight": &token.delivery_id,
                    })
                    .session(&mut *s)
                    .await?;
                let found = match fenced {
                    None => None,
                    Some(_) => {
                        deliveries
                            .clone_with_type::<Candidate>()
                            .find_one(doc! { "_id": &token.delivery_id, "claims": token.claims })
                            .projection(candidate_fields())
                            .session(&mut *s)
                            .await?
                    }
                };
                let Some(d) = found else {
                    return Ok(FailOutcome::LeaseLost);
                };
                let now = DateTime::now();
                let (charged, max_attempts, reject, delay) = failure.terms();
                let dead = reject || d.attempts.saturating_add(charged) >= max_attempts;
                let due_at = (!dead).then(|| after(now, delay));
                let mut set = doc! {
                    "status": if dead { "dead" } else { "pending" },
                    "lastError": &error, "updatedAt": now,
                };
                if let Some(at) = due_at {
                    set.insert("dueAt", at);
                }
                deliveries
                    .update_one(
                        doc! { "_id": &d.id, "claims": d.claims },
                        doc! { "$inc": { "attempts": charged, "claims": 1 }, "$set": set },
                    )
                    .session(&mut *s)
                    .await?;
                lanes
                    .update_one(
                        doc! { "_id": lane, "epoch": token.epoch },
                        doc! { "$pull": { "inFlight": &d.id } },
                    )
                    .session(&mut *s)
                    .await?;
                if !dead {
                    return Ok(FailOutcome::Rescheduled);
                }
                release_keys(&deliveries, s, &held_back(std::slice::from_ref(&d))).await?;
                Ok(FailOutcome::Buried)
            })
            .await
    }

    /// Lanes whose takeover's losses are not charged yet are renewed too: their holder charges
    /// them at its next claims.
    async fn renew(
        &self,
        owner: &str,
        lease: std::time::Duration,
        running: &[String],
    ) -> Result<u64> {
        let lanes = self.conn.collection(&self.name(LANES)).await?;
        let updated = lanes
            .update_many(
                doc! {
                    "owner": owner, "holder": &self.holder,
                    "$or": [{ "inFlight": { "$in": running } }, { "lost.0": { "$exists": true } }],
                },
                doc! { "$set": { "leaseExpiresAt": after(DateTime::now(), lease) } },
            )
            .await
            .map_err(self.conn.error("could not renew lane leases"))?;
        Ok(updated.matched_count)
    }

    async fn confirm(
        &self,
        owner: &str,
        lease: std::time::Duration,
        token: &LeaseToken,
    ) -> Result<bool> {
        let lanes = self.conn.collection(&self.name(LANES)).await?;
        let updated = lanes
            .update_one(
                doc! {
                    "_id": i32::from(token.lane), "epoch": token.epoch, "owner": owner,
                    "holder": &self.holder, "inFlight": &token.delivery_id,
                },
                doc! { "$set": { "leaseExpiresAt": after(DateTime::now(), lease) } },
            )
            .await
            .map_err(self.conn.error("could not confirm a lane lease"))?;
        Ok(updated.matched_count == 1)
    }

    async fn release(&self, owner: &str, aborted: &[LeaseToken]) -> Result<u64> {
        let lanes = self.lane_collection().await?;
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let mine = doc! { "owner": owner, "holder": &self.holder };
        let aborted = aborted.to_vec();
        self.conn
            .transaction("could not hand back the lanes", async move |s| {
                let cursor = lanes.find(mine.clone()).session(&mut *s).await?;
                let held: HashMap<i32, Lane> = all_in(cursor, s)
                    .await?
                    .into_iter()
                    .map(|l| (l.lane, l))
                    .collect();
                let released: Vec<Document> = aborted
                    .iter()
                    .filter(|t| {
                        held.get(&i32::from(t.lane)).is_some_and(|l| {
                            l.epoch == t.epoch && l.in_flight.contains(&t.delivery_id)
                        })
                    })
                    .map(|t| doc! { "_id": &t.delivery_id, "claims": t.claims })
                    .collect();
                if !released.is_empty() {
                    deliveries
                        .update_many(doc! { "$or": released }, doc! { "$inc": { "claims": 1 } })
                        .session(&mut *s)
                        .await?;
                }
                let freed = lanes
                    .update_many(
                        mine.clone(),
                        doc! { "$set": {
                            "owner": Bson::Null, "holder": Bson::Null,
                            "leaseExpiresAt": Bson::Null, "inFlight": [],
                        } },
                    )
                    .session(&mut *s)
                    .await?;
                Ok(freed.matched_count)
            })
            .await
    }

    async fn due_exists(&self, handlers: &[String]) -> Result<bool> {
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let filter = due(None, handlers, DateTime::now());
        let found = deliveries
            .find_one(filter)
            .projection(doc! { "_id": 1 })
            .await
            .map_err(self.conn.error("could not look for due deliveries"))?;
        Ok(found.is_some())
    }
}
