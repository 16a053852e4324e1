//! Per-key order, and parking. Only the head of a key (its lowest pending sequence, per handler)
//! may run. A claim that finds followers of a key in the claim index parks them (`lane:
//! "parked"` takes them out of the partial claim index), so a deep queue behind one slow
//! delivery costs nothing per claim. Parking bumps the head's `holdsBack`; whatever ends the
//! head (completion, burial) makes the key's next delivery ready in the same transaction, and
//! it holds back the rest in turn.
//!
//! Why nothing is stranded: a parking transaction writes the head it parks behind, and the
//! transaction that ends that head writes it too, so the two conflict and one runs again on a
//! fresh snapshot. The parking one then finds the head gone and parks nothing; the ending one
//! finds the follower parked and makes it ready.

use std::collections::HashMap;

use mongodb::bson::{doc, Document};
use mongodb::{ClientSession, Collection};

use super::model::{all, all_in, Candidate};
use super::{MongoStore, DELIVERIES, PARKED, READY};
use crate::store::Result;

/// A key of one handler in one lane.
pub(super) type KeyOf = (i32, String, String);

fn key_of(c: &Candidate) -> Option<KeyOf> {
    Some((c.lane_id, c.handler.clone(), c.key.clone()?))
}

/// Groups pending deliveries by key and keeps each key's lowest sequence.
fn heads_pipeline(matching: Document) -> Vec<Document> {
    vec![
        doc! { "$match": matching },
        doc! { "$sort": { "laneId": 1, "handler": 1, "key": 1, "sequence": 1 } },
        doc! { "$group": {
            "_id": { "lane": "$laneId", "handler": "$handler", "key": "$key" },
            "head": { "$first": "$_id" },
        } },
    ]
}

fn keys_filter(keys: &[KeyOf]) -> Document {
    let any: Vec<Document> = keys
        .iter()
        .map(|(lane, handler, key)| doc! { "laneId": lane, "handler": handler, "key": key })
        .collect();
    doc! { "status": "pending", "$or": any }
}

fn head_of(row: &Document) -> Option<(KeyOf, String)> {
    let id = row.get_document("_id").ok()?;
    Some((
        (
            id.get_i32("lane").ok()?,
            id.get_str("handler").ok()?.to_owned(),
            id.get_str("key").ok()?.to_owned(),
        ),
        row.get_str("head").ok()?.to_owned(),
    ))
}

impl MongoStore {
    /// Splits keyed candidates into the heads of their keys and the followers blocked behind a
    /// head (with that head's id). Unkeyed candidates are heads of nothing and always pass.
    pub(super) async fn split_heads(
        &self,
        candidates: &[Candidate],
    ) -> Result<(Vec<Candidate>, Vec<(String, String)>)> {
        let mut keys: Vec<KeyOf> = candidates.iter().filter_map(key_of).collect();
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return Ok((candidates.to_vec(), vec![]));
        }
        let deliveries = self.conn.collection(&self.name(DELIVERIES)).await?;
        let failed = self
            .conn
            .error("could not read the heads of the claimed keys");
        let cursor = deliveries
            .aggregate(heads_pipeline(keys_filter(&keys)))
            .await
            .map_err(&failed)?;
        let heads: HashMap<KeyOf, String> = all(cursor)
            .await
            .map_err(&failed)?
            .iter()
            .filter_map(head_of)
            .collect();
        let mut eligible = vec![];
        let mut blocked = vec![];
        for c in candidates {
            match key_of(c).and_then(|k| heads.get(&k)) {
                Some(head) if *head != c.id => blocked.push((c.id.clone(), head.clone())),
                _ => eligible.push(c.clone()),
            }
        }
        Ok((eligible, blocked))
    }

    /// Parks followers behind heads that are still pending. Best effort: a follower left ready
    /// is only looked at again by the next claim.
    pub(super) async fn park(&self, blocked: &[(String, String)]) {
        if blocked.is_empty() {
            return;
        }
        let Ok(coll) = self.conn.collection(&self.name(DELIVERIES)).await else {
            return;
        };
        let blocked = blocked.to_vec();
        let _ = self
            .conn
            .transaction_once("could not park followers", async move |s| {
                let mut heads: Vec<&str> = blocked.iter().map(|(_, h)| h.as_str()).collect();
                heads.sort_unstable();
                heads.dedup();
                let cursor = coll
                    .find(doc! { "_id": { "$in": &heads }, "status": "pending" })
                    .projection(doc! { "_id": 1 })
                    .session(&mut *s)
                    .await?;
                let live: Vec<String> = all_in(cursor, s)
                    .await?
                    .iter()
                    .filter_map(|d| d.get_str("_id").ok().map(str::to_owned))
                    .collect();
                if live.is_empty() {
                    return Ok(());
                }
                coll.update_many(
                    doc! { "_id": { "$in": &live } },
                    doc! { "$inc": { "holdsBack": 1 } },
                )
                .session(&mut *s)
                .await?;
                let followers: Vec<&str> = blocked
                    .iter()
                    .filter(|(_, h)| live.contains(h))
                    .map(|(f, _)| f.as_str())
                    .collect();
                coll.update_many(
                    doc! { "_id": { "$in": followers }, "status": "pending", "lane": READY },
                    doc! { "$set": { "lane": PARKED } },
                )
                .session(&mut *s)
                .await?;
                Ok(())
            })
            .await;
    }
}

/// The keys of deliveries that ended while holding followers back.
pub(super) fn held_back(ended: &[Candidate]) -> Vec<KeyOf> {
    ended
        .iter()
        .filter(|c| c.holds_back > 0)
        .filter_map(key_of)
        .collect()
}

/// In `s`'s transaction, after heads of these keys ended while holding followers back: the
/// next delivery of each key becomes ready and holds back the rest.
pub(super) async fn release_keys(
    coll: &Collection<Document>,
    s: &mut ClientSession,
    keys: &[KeyOf],
) -> mongodb::error::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let cursor = coll
        .aggregate(heads_pipeline(keys_filter(keys)))
        .session(&mut *s)
        .await?;
    let heads: Vec<String> = all_in(cursor, s)
        .await?
        .iter()
        .filter_map(head_of)
        .map(|(_, head)| head)
        .collect();
    if heads.is_empty() {
        return Ok(());
    }
    coll.update_many(
        doc! { "_id": { "$in": heads } },
        doc! { "$set": { "lane": READY, "holdsBack": 1 } },
    )
    .session(&mut *s)
    .await?;
    Ok(())
}
