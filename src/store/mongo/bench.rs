//! What `relaybus bench` reads and writes on MongoDB: the server's own counters (operations,
//! and the oplog entries and bytes of this database, with inserts, updates and deletes per
//! collection), a backlog written by bulk inserts, and the raw floors.
//!
//! The oplog is tallied from the first counter reading on: each reading adds what the oplog
//! gained since the last, newest first, so two readings differ by what happened between them.
//! A transaction's writes are one `applyOps` entry on a `mongod` replica set; each write is
//! counted inside it.

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, DateTime, Document, RawDocumentBuf, Timestamp};

use super::model::all;
use super::publish::bson_i64;
use super::{MongoStore, DELIVERIES, EVENTS, KEY_SEQUENCES, READY};
use crate::store::bench::{Backlog, BenchStore, DeliveryCounts, ServerCounters};
use crate::store::lane::lane_of;
use crate::store::{NewEvent, Result};

/// Documents per insert of a preload.
const PRELOAD_BATCH: usize = 5_000;

fn payload() -> Document {
    doc! { "pad": "x".repeat(150) }
}

fn delivery(
    id: String,
    event: &str,
    handler: &str,
    key: Option<&str>,
    sequence: Option<i64>,
) -> Document {
    let now = DateTime::now();
    doc! {
        "_id": id, "eventId": event, "handler": handler,
        "laneId": i32::from(lane_of(key, event)), "key": key, "sequence": sequence,
        "status": "pending", "attempts": 0, "claims": 0, "dueAt": now, "lastError": Bson::Null,
        "createdAt": now, "updatedAt": now, "completedAt": Bson::Null, "lane": READY,
    }
}

/// What the oplog held for this database, from the first reading to the last.
#[derive(Clone, Debug, Default)]
pub(super) struct Tally {
    started: bool,
    /// The newest entry counted (None: the oplog was empty when counting started).
    last: Option<Timestamp>,
    entries: i64,
    bytes: i64,
    /// Per collection (without the prefix): inserts, updates, deletes.
    writes: BTreeMap<String, [i64; 3]>,
}

impl MongoStore {
    /// Adds the oplog entries written since the last reading to the tally. The oplog is read
    /// newest first and only as far back as the last reading; the first reading only marks
    /// where counting starts.
    async fn read_oplog(&self, mut tally: Tally) -> Result<Tally> {
        let failed = self.conn.error("could not read the oplog");
        let oplog = self
            .conn
            .client()
            .await?
            .database("local")
            .collection::<RawDocumentBuf>("oplog.rs");
        let mut cursor = oplog
            .find(doc! {})
            .sort(doc! { "$natural": -1 })
            .await
            .map_err(&failed)?;
        let prefix = format!("{}.{}", self.ns.schema(), self.ns.prefix());
        let database = format!("{}.", self.ns.schema());
        let mut newest = None;
        while let Some(entry) = cursor.try_next().await.map_err(&failed)? {
            let ts = entry.get_timestamp("ts").ok();
            newest = newest.or(ts);
            if !tally.started || ts.is_none() || (tally.last.is_some() && ts <= tally.last) {
                break;
            }
            let entry = Document::try_from(entry.as_ref()).map_err(|e| failed(e.into()))?;
            let ops: Vec<Document> = match entry
                .get_document("o")
                .and_then(|o| o.get_array("applyOps"))
            {
                Ok(ops) => ops
                    .iter()
                    .filter_map(|op| op.as_document().cloned())
                    .collect(),
                Err(_) => vec![entry.clone()],
            };
            let mine: Vec<&Document> = ops
                .iter()
                .filter(|op| op.get_str("ns").is_ok_and(|ns| ns.starts_with(&database)))
                .collect();
            if mine.is_empty() {
                continue;
            }
            tally.entries += 1;
            tally.bytes += mongodb::bson::to_vec(&entry).map_or(0, |b| b.len() as i64);
            for op in mine {
                let Some(collection) = op
                    .get_str("ns")
                    .ok()
                    .and_then(|ns| ns.strip_prefix(&prefix))
                else {
                    continue;
                };
                let counts = tally.writes.entry(collection.to_owned()).or_default();
                match op.get_str("op").unwrap_or_default() {
                    "i" => counts[0] += 1,
                    "u" => counts[1] += 1,
                    "d" => counts[2] += 1,
                    _ => {}
                }
            }
        }
        tally.last = newest.or(tally.last);
        tally.started = true;
        Ok(tally)
    }

    async fn insert_batches(&self, collection: &str, docs: Vec<Document>) -> Result<()> {
        let coll = self.conn.collection(&self.name(collection)).await?;
        for chunk in docs.chunks(PRELOAD_BATCH) {
            coll.insert_many(chunk.to_vec())
                .ordered(false)
                .await
                .map_err(self.conn.error(format!("could not preload {collection}")))?;
        }
        Ok(())
    }
}

impl BenchStore for MongoStore {
    async fn server_counters(&self) -> Result<ServerCounters> {
        let failed = self.conn.error("could not read the server's counters");
        let before = self.tally.lock().expect("tally lock").clone();
        let tally = self.read_oplog(before).await?;
        *self.tally.lock().expect("tally lock") = tally.clone();
        let status = self
            .conn
            .client()
            .await?
            .database("admin")
            .run_command(doc! { "serverStatus": 1 })
            .await
            .map_err(&failed)?;
        let operations: i64 = status
            .get_document("opcounters")
            .map(|o| o.values().map(bson_i64).sum())
            .unwrap_or(0);
        let totals = BTreeMap::from([
            ("operations".to_owned(), operations),
            ("oplog_entries".to_owned(), tally.entries),
            ("oplog_bytes".to_owned(), tally.bytes),
        ]);
        let tables = tally
            .writes
            .into_iter()
            .map(|(c, [i, u, d])| (c, [i, u, 0, d]))
            .collect();
        Ok(ServerCounters { totals, tables })
    }

    async fn server_settings(&self) -> Result<BTreeMap<String, String>> {
        let failed = self.conn.error("could not read the server's settings");
        let admin = self.conn.client().await?.database("admin");
        let build = admin
            .run_command(doc! { "buildInfo": 1 })
            .await
            .map_err(&failed)?;
        let hello = admin
            .run_command(doc! { "hello": 1 })
            .await
            .map_err(&failed)?;
        let mut settings = BTreeMap::new();
        settings.insert(
            "server_version".into(),
            build.get_str("version").unwrap_or("?").to_owned(),
        );
        settings.insert(
            "replica_set".into(),
            hello.get_str("setName").unwrap_or("-").to_owned(),
        );
        Ok(settings)
    }

    async fn stores(&self) -> Result<Vec<String>> {
        let failed = self.conn.error("could not look for relaybus stores");
        let client = self.conn.client().await?;
        let mut stores = vec![];
        for name in client.list_database_names().await.map_err(&failed)? {
            if name.starts_with("relaybus_bench_")
                || ["admin", "config", "local"].contains(&name.as_str())
            {
                continue;
            }
            let collections = client
                .database(&name)
                .list_collection_names()
                .await
                .map_err(&failed)?;
            if collections.iter().any(|c| c.ends_with("deliveries")) {
                stores.push(name);
            }
        }
        Ok(stores)
    }

    async fn preload(&self, backlog: &Backlog, _settle: bool) -> Result<()> {
        let key = |n: u64| backlog.key_modulus.map(|m| format!("k{}", n % m));
        let now = DateTime::now();
        let events: Vec<Document> = (0..backlog.events)
            .map(|n| {
                doc! {
                    "_id": format!("e{n}"), "type": "bench.event", "key": key(n),
                    "payload": payload(), "headers": {}, "handlers": &backlog.handlers,
                    "createdAt": now,
                }
            })
            .collect();
        self.insert_batches(EVENTS, events).await?;
        let mut sequences: BTreeMap<String, i64> = BTreeMap::new();
        let mut deliveries = Vec::with_capacity(backlog.events as usize * backlog.handlers.len());
        for n in 0..backlog.events {
            let k = key(n);
            let sequence = k.as_ref().map(|k| {
                let s = sequences.entry(k.clone()).or_default();
                *s += 1;
                *s
            });
            for (i, h) in backlog.handlers.iter().enumerate() {
                // Ids ascend in publish order, as relaybus's time-ordered ids do.
                let id = format!(
                    "00000000-0000-7000-8000-{:012x}",
                    n * backlog.handlers.len() as u64 + i as u64
                );
                deliveries.push(delivery(id, &format!("e{n}"), h, k.as_deref(), sequence));
            }
        }
        self.insert_batches(DELIVERIES, deliveries).await?;
        let counters: Vec<Document> = sequences
            .into_iter()
            .map(|(k, n)| doc! { "_id": k, "lastSequence": n })
            .collect();
        if !counters.is_empty() {
            self.insert_batches(KEY_SEQUENCES, counters).await?;
        }
        Ok(())
    }

    async fn delivery_counts(&self) -> Result<DeliveryCounts> {
        let failed = self.conn.error("could not count deliveries");
        let coll = self.conn.collection(&self.name(DELIVERIES)).await?;
        let count = |filter: Document| {
            let coll = &coll;
            let failed = &failed;
            async move { coll.count_documents(filter).await.map_err(failed) }
        };
        Ok(DeliveryCounts {
            total: count(doc! {}).await? as i64,
            pending: count(doc! { "status": "pending" }).await? as i64,
            dead: count(doc! { "status": "dead" }).await? as i64,
        })
    }

    async fn pending(&self) -> Result<Vec<(String, String)>> {
        let failed = self.conn.error("could not read the pending deliveries");
        let coll = self.conn.collection(&self.name(DELIVERIES)).await?;
        let cursor = coll
            .find(doc! { "status": "pending" })
            .projection(doc! { "eventId": 1, "handler": 1 })
            .await
            .map_err(&failed)?;
        Ok(all(cursor)
            .await
            .map_err(&failed)?
            .iter()
            .filter_map(|d| {
                Some((
                    d.get_str("eventId").ok()?.to_owned(),
                    d.get_str("handler").ok()?.to_owned(),
                ))
            })
            .collect())
    }

    async fn drop_namespace(&self) -> Result<()> {
        self.conn
            .database()
            .await?
            .drop()
            .await
            .map_err(self.conn.error("could not drop the benchmark's database"))
    }

    async fn floor_publish(&self, events: &[NewEvent]) -> Result<()> {
        let now = DateTime::now();
        let docs: Vec<Document> = events
            .iter()
            .map(|e| {
                doc! {
                    "_id": &e.id, "type": "bench.event", "key": &e.key, "payload": payload(),
                    "handlers": &e.handlers, "createdAt": now,
                }
            })
            .collect();
        let deliveries: Vec<Document> = events
            .iter()
            .flat_map(|e| {
                e.handlers
                    .iter()
                    .map(|h| delivery(crate::store::new_id(), &e.id, h, e.key.as_deref(), None))
            })
            .collect();
        let failed = self.conn.error("floor: insert");
        self.conn
            .collection(&self.name(EVENTS))
            .await?
            .insert_many(docs)
            .await
            .map_err(&failed)?;
        self.conn
            .collection(&self.name(DELIVERIES))
            .await?
            .insert_many(deliveries)
            .await
            .map_err(&failed)?;
        Ok(())
    }

    async fn floor_dispatch(&self, batch: i64) -> Result<u64> {
        let failed = self.conn.error("floor: delete");
        let coll = self.conn.collection(&self.name(DELIVERIES)).await?;
        let ids: Vec<Bson> = all(coll
            .find(doc! { "status": "pending" })
            .projection(doc! { "_id": 1 })
            .limit(batch)
            .await
            .map_err(&failed)?)
        .await
        .map_err(&failed)?
        .into_iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
        let deleted = coll
            .delete_many(doc! { "_id": { "$in": ids } })
            .await
            .map_err(&failed)?;
        Ok(deleted.deleted_count)
    }
}
