//! The documents as relaybus reads them: lanes, the fields of a delivery the delivery path needs,
//! and a delivery as operators see it. Field names are the seed's (`laneId`, `inFlight`,
//! `dueAt`), shared with relaybus 0.2 workers in other languages.

use futures_util::TryStreamExt;
use mongodb::bson::{DateTime, Document};
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

/// A lane document.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Lane {
    #[serde(rename = "_id")]
    pub(super) lane: i32,
    pub(super) epoch: i64,
    pub(super) owner: Option<String>,
    pub(super) holder: Option<String>,
    pub(super) lease_expires_at: Option<DateTime>,
    #[serde(default)]
    pub(super) in_flight: Vec<String>,
    /// What a takeover moved out of `inFlight` and has not charged yet.
    #[serde(default)]
    pub(super) lost: Vec<String>,
}

impl Lane {
    pub(super) fn live(&self, now: DateTime) -> bool {
        self.owner.is_some() && self.lease_expires_at.is_some_and(|at| at > now)
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
