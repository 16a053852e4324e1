//! The documents as relaybus reads them: lanes, the fields of a delivery the delivery path needs,
//! and a delivery as operators see it. Field names are the seed's (`laneId`, `inFlight`,
//! `dueAt`), shared with relaybus 0.2 workers in other languages.

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, DateTime, Document};
use mongodb::{ClientSession, Cursor, SessionCursor};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::store::DeliveryRow;

/// Every document of a cursor.
pub(super) async fn all<T>(cursor: Cursor<T>) -> mongodb::error::Result<Vec<T>>
where
    T: DeserializeOwned + Unpin + Send + Sync,
{
    cursor.try_collect().await
}

/// The string `_id` of every document of a cursor.
pub(super) async fn ids(cursor: Cursor<Document>) -> mongodb::error::Result<Vec<String>> {
    Ok(all(cursor)
        .await?
        .iter()
        .filter_map(|d: &Document| d.get_str("_id").ok().map(str::to_owned))
        .collect())
}

/// Every document of a cursor of a transaction.
pub(super) async fn all_in<T>(
    mut cursor: SessionCursor<T>,
    session: &mut ClientSession,
) -> mongodb::error::Result<Vec<T>>
where
    T: DeserializeOwned + Unpin + Send + Sync,
{
    cursor.stream(session).try_collect().await
}

/// A regular expression that matches `text` literally.
pub(super) fn literal(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escape = "\\^$.|?*+()[]{}".contains(c);
            escape.then_some('\\').into_iter().chain(std::iter::once(c))
        })
        .collect()
}

pub(super) fn chrono(at: DateTime) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or_default()
}

pub(super) fn after(at: DateTime, lease: std::time::Duration) -> DateTime {
    DateTime::from_millis(
        at.timestamp_millis()
            .saturating_add(lease.as_millis() as i64),
    )
}

/// A lane document. One that breaks the rules (`LANE_RULES`) still reads, as unsound: claims
/// leave it alone and `doctor` names it, so one bad document cannot stop every worker.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "RawLane")]
pub(super) struct Lane {
    pub(super) lane: i32,
    pub(super) epoch: i64,
    pub(super) owner: Option<String>,
    pub(super) holder: Option<String>,
    pub(super) lease_expires_at: Option<DateTime>,
    pub(super) in_flight: Vec<String>,
    /// What a takeover moved out of `inFlight` and has not charged yet.
    pub(super) lost: Vec<String>,
    /// Every field as the rules say.
    pub(super) sound: bool,
}

/// A lane document's fields as stored, whatever their type.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLane {
    #[serde(rename = "_id")]
    lane: i32,
    epoch: Option<Bson>,
    owner: Option<Bson>,
    holder: Option<Bson>,
    lease_expires_at: Option<Bson>,
    in_flight: Option<Bson>,
    lost: Option<Bson>,
}

impl From<RawLane> for Lane {
    fn from(raw: RawLane) -> Self {
        let mut sound = true;
        let mut check = |ok: bool| sound &= ok;
        let epoch = match raw.epoch {
            Some(Bson::Int64(e)) => e,
            Some(Bson::Int32(e)) => i64::from(e),
            _ => {
                check(false);
                -1
            }
        };
        let mut text = |v: Option<Bson>| match v {
            Some(Bson::String(s)) => Some(s),
            None | Some(Bson::Null) => None,
            Some(_) => {
                check(false);
                None
            }
        };
        let (owner, holder) = (text(raw.owner), text(raw.holder));
        let lease_expires_at = match raw.lease_expires_at {
            Some(Bson::DateTime(at)) => Some(at),
            None | Some(Bson::Null) => None,
            Some(_) => {
                check(false);
                None
            }
        };
        let mut ids = |v: Option<Bson>| match v {
            Some(Bson::Array(items)) => items
                .into_iter()
                .filter_map(|i| match i {
                    Bson::String(id) => Some(id),
                    _ => {
                        check(false);
                        None
                    }
                })
                .collect(),
            _ => {
                check(false);
                vec![]
            }
        };
        let (in_flight, lost) = (ids(raw.in_flight), ids(raw.lost));
        Lane {
            lane: raw.lane,
            epoch,
            owner,
            holder,
            lease_expires_at,
            in_flight,
            lost,
            sound,
        }
    }
}

impl Lane {
    pub(super) fn live(&self, now: DateTime) -> bool {
        self.owner.is_some() && self.lease_expires_at.is_some_and(|at| at > now)
    }
}

/// The lane documents, by number: a query on `_id` outside it never reads a document that is
/// not a lane.
pub(super) fn lane_ids() -> Document {
    mongodb::bson::doc! { "_id": { "$gte": 0, "$lt": 256 } }
}

/// What a lane document must hold, each rule with the filter that finds the documents breaking
/// it and the repair: an epoch that is not an integer becomes one above any epoch a token can
/// carry (epochs count changes of hands from 0; the repair's time in milliseconds is far
/// above), so every token out is stale and the lane changes hands as usual; in-flight and lost
/// lists that are not lists of ids become empty, and their deliveries, still pending, are
/// claimed again.
pub(super) struct LaneRule {
    pub(super) field: &'static str,
    pub(super) rule: &'static str,
}

pub(super) const LANE_RULES: [LaneRule; 3] = [
    LaneRule {
        field: "epoch",
        rule: "an integer epoch",
    },
    LaneRule {
        field: "inFlight",
        rule: "an inFlight array",
    },
    LaneRule {
        field: "lost",
        rule: "a lost array",
    },
];

impl LaneRule {
    pub(super) fn broken(&self) -> Document {
        let wrong = if self.field == "epoch" {
            mongodb::bson::doc! { "$not": { "$type": ["int", "long"] } }
        } else {
            mongodb::bson::doc! { "$not": { "$type": "array" } }
        };
        let mut filter = lane_ids();
        filter.insert(self.field, wrong);
        filter
    }

    pub(super) fn repair(&self, now: DateTime) -> Document {
        if self.field == "epoch" {
            mongodb::bson::doc! { "$set": { "epoch": now.timestamp_millis() } }
        } else {
            mongodb::bson::doc! { "$set": { self.field: [] } }
        }
    }

    /// The repair as mongosh runs it on `coll`.
    pub(super) fn repair_js(&self, coll: &str) -> String {
        let (filter, value) = if self.field == "epoch" {
            (
                r#"{ $not: { $type: ["int", "long"] } }"#,
                "NumberLong(String(Date.now()))",
            )
        } else {
            (r#"{ $not: { $type: "array" } }"#, "[]")
        };
        format!(
            "{coll}.updateMany({{ _id: {{ $gte: 0, $lt: 256 }}, {0}: {filter} }}, {{ $set: {{ {0}: {value} }} }});\n",
            self.field
        )
    }
}

/// What the delivery path reads of a delivery.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Candidate {
    #[serde(rename = "_id")]
    pub(super) id: String,
    pub(super) event_id: String,
    pub(super) handler: String,
    pub(super) lane_id: i32,
    pub(super) key: Option<String>,
    pub(super) attempts: i32,
    #[serde(default)]
    pub(super) claims: i32,
    /// Followers of this key were parked behind this delivery.
    #[serde(default)]
    pub(super) holds_back: i32,
}

/// The projection that reads a `Candidate`.
pub(super) fn candidate_fields() -> Document {
    mongodb::bson::doc! {
        "eventId": 1, "handler": 1, "laneId": 1, "key": 1, "attempts": 1, "claims": 1,
        "holdsBack": 1,
    }
}

/// A delivery document as operators see it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Delivery {
    #[serde(rename = "_id")]
    pub(super) id: String,
    pub(super) event_id: String,
    pub(super) handler: String,
    pub(super) lane_id: Option<i32>,
    pub(super) key: Option<String>,
    pub(super) sequence: Option<i64>,
    pub(super) status: String,
    #[serde(default)]
    pub(super) attempts: i32,
    #[serde(default)]
    pub(super) claims: i32,
    pub(super) due_at: Option<DateTime>,
    pub(super) last_error: Option<String>,
    pub(super) created_at: Option<DateTime>,
    pub(super) updated_at: Option<DateTime>,
    pub(super) completed_at: Option<DateTime>,
}

impl Delivery {
    /// As listed: `processing` when its lane runs it under a live lease.
    pub(super) fn row(self, event_type: String, processing: bool) -> DeliveryRow {
        let status = if processing && self.status == "pending" {
            "processing".to_owned()
        } else {
            self.status
        };
        DeliveryRow {
            id: Some(self.id),
            event_id: self.event_id,
            event_type,
            handler: self.handler,
            status,
            attempts: self.attempts,
            key: self.key,
            sequence: self.sequence,
            lane: self.lane_id.map(|l| l as i16),
            available_at: self.due_at.map(chrono),
            last_error: self.last_error,
            created_at: self.created_at.map(chrono),
            updated_at: self.updated_at.map(chrono),
            completed_at: self.completed_at.map(chrono),
        }
    }
}
