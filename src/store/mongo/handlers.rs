//! Pauses and circuit breakers: one document per handler, `_id` its name, each change written
//! over the version it read (compare and swap), so that concurrent changes never lose one.

use mongodb::bson::{doc, Bson, DateTime, Document};

use super::conn::is_duplicate_key;
use super::model::{all, chrono};
use super::{MongoStore, HANDLERS};
use crate::store::handlers::{BreakerPolicy, HandlerRow};
use crate::store::{Handlers, Result};

fn row(d: &Document) -> HandlerRow {
    let text = |f: &str| d.get_str(f).ok().map(str::to_owned);
    let time = |f: &str| d.get_datetime(f).ok().map(|t| chrono(*t));
    HandlerRow {
        handler: text("_id").unwrap_or_default(),
        paused_at: time("pausedAt"),
        paused_by: text("pausedBy"),
        pause_reason: text("pauseReason"),
        failures: d.get_i32("failures").unwrap_or(0),
        opened: d.get_i32("opened").unwrap_or(0),
        open_until: time("openUntil"),
        // A document from before the breaker's settings were kept has the defaults.
        breaker_policy: BreakerPolicy::stored(
            d.get_i32("breakerThreshold").ok(),
            d.get_i64("breakerMaxCooldownMs").ok(),
        ),
    }
}

fn document(c: &HandlerRow) -> Document {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or(Bson::Null, |t| {
            Bson::DateTime(DateTime::from_millis(t.timestamp_millis()))
        })
    };
    doc! {
        "_id": &c.handler, "pausedAt": time(c.paused_at), "pausedBy": &c.paused_by,
        "pauseReason": &c.pause_reason, "failures": c.failures, "opened": c.opened,
        "openUntil": time(c.open_until), "breakerThreshold": c.breaker_policy.threshold,
        "breakerMaxCooldownMs": c.breaker_policy.max_cooldown_ms(),
    }
}

impl Handlers for MongoStore {
    async fn handler_rows(&self) -> Result<Vec<HandlerRow>> {
        let failed = self.conn.error("could not read the handlers table");
        let cursor = self
            .coll(HANDLERS)
            .await?
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .map_err(&failed)?;
        Ok(all(cursor)
            .await
            .map_err(&failed)?
            .iter()
            .map(row)
            .collect())
    }

    async fn forget_handler(&self, handler: &str) -> Result<bool> {
        let deleted = self
            .coll(HANDLERS)
            .await?
            .delete_one(doc! { "_id": handler })
            .await
            .map_err(self.conn.error("could not remove the handler's row"))?;
        Ok(deleted.deleted_count == 1)
    }

    async fn change_handler(
        &self,
        handler: &str,
        change: &(dyn Fn(&mut HandlerRow) -> bool + Sync),
    ) -> Result<Option<HandlerRow>> {
        let coll = self.coll(HANDLERS).await?;
        let failed = self
            .conn
            .error(format!("could not change the row of handler `{handler}`"));
        loop {
            let found = coll
                .find_one(doc! { "_id": handler })
                .await
                .map_err(&failed)?;
            let mut c = found.as_ref().map_or_else(|| HandlerRow::new(handler), row);
            if !change(&mut c) {
                return Ok(None);
            }
            // Written only over the version read: a change that got there first (another
            // document, or a duplicate key) sends this one round again.
            let written = match found {
                Some(found) => coll
                    .replace_one(found, document(&c))
                    .await
                    .map(|r| r.matched_count == 1),
                None => match coll.insert_one(document(&c)).await {
                    Err(e) if is_duplicate_key(&e) => Ok(false),
                    other => other.map(|_| true),
                },
            };
            if written.map_err(&failed)? {
                return Ok(Some(c));
            }
        }
    }
}
