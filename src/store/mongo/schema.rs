//! Installing and converting a MongoDB store: what is installed, `setup`, the 0.1 conversion and
//! its plan, and the same as a `mongosh` script for teams whose migrations run elsewhere.
//!
//! MongoDB has no transactional DDL, so the conversion runs step by step in bounded batches and
//! every step picks up what is left: it can be run again after a crash at any point, and the
//! version document, written last, says when it is done. A lease on a lock document queues
//! setups and upgrades of one store behind each other. `docs/design/mongodb.md` records the 0.1
//! layout this converts from.

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::{Collection, Database, IndexModel};

use super::model::{after, all, chrono};
use super::{MongoStore, COMPLETIONS, DELIVERIES, EVENTS, KEY_SEQUENCES, LANES, READY, SCHEMA};
use crate::store::lane::lane_of;
use crate::store::{
    LiveLeases, Locks, Namespace, Result, Schema, SchemaStatus, Script, SetupOutcome, StoreError,
    UpgradeCounts, UpgradePlan, UpgradeProgress, UpgradeStep, SCHEMA_VERSION,
};

/// Documents per batch of the conversion.
const BATCH: i64 = 1000;
/// The setup lock's lease; its holder renews it while it works.
const LOCK_LEASE: Duration = Duration::from_secs(30);
const LOCK_ID: &str = "setup-lock";
pub(super) const VERSION_ID: &str = "version";

/// An index of 0.2, with why it exists.
pub(super) struct IndexSpec {
    pub(super) collection: &'static str,
    pub(super) name: &'static str,
    pub(super) keys: Document,
    pub(super) unique: bool,
    pub(super) partial: Option<Document>,
    pub(super) why: &'static str,
}

/// The indexes 0.2 needs: the claim, the per-key rule, idempotent publish, the dead letters and
/// the purges; nothing else.
pub(super) fn indexes() -> Vec<IndexSpec> {
    vec![
        IndexSpec {
            collection: DELIVERIES,
            name: "eventId_handler_unique",
            keys: doc! { "eventId": 1, "handler": 1 },
            unique: true,
            partial: None,
            why: "Idempotent publish: one delivery per (event, handler).",
        },
        IndexSpec {
            collection: DELIVERIES,
            name: "lane_due",
            keys: doc! { "laneId": 1, "dueAt": 1, "_id": 1 },
            unique: false,
            partial: Some(doc! { "status": "pending", "lane": READY }),
            why: "The claim: due work per lane. Parked followers of a key stay out of it.",
        },
        IndexSpec {
            collection: DELIVERIES,
            name: "lane_key_sequence",
            keys: doc! { "laneId": 1, "handler": 1, "key": 1, "sequence": 1 },
            unique: false,
            partial: Some(doc! { "status": "pending", "key": { "$type": "string" } }),
            why: "Per-key order: the earliest pending delivery of a handler and key.",
        },
        IndexSpec {
            collection: DELIVERIES,
            name: "dead_updated",
            keys: doc! { "updatedAt": 1, "_id": 1 },
            unique: false,
            partial: Some(doc! { "status": "dead" }),
            why: "Dead letters: listing, requeue and purge.",
        },
        IndexSpec {
            collection: EVENTS,
            name: "created",
            keys: doc! { "createdAt": 1 },
            unique: false,
            partial: None,
            why: "Events outlive their deliveries: the purge of events left without one.",
        },
        IndexSpec {
            collection: COMPLETIONS,
            name: "completed",
            keys: doc! { "completedAt": 1 },
            unique: false,
            partial: None,
            why: "The purge of the completion history.",
        },
    ]
}

/// The key patterns of the 0.1 indexes of deliveries that 0.2 does not keep.
fn retired() -> Vec<Document> {
    vec![
        doc! { "status": 1, "lane": 1, "dueAt": 1 },
        doc! { "key": 1, "handler": 1, "sequence": 1 },
        doc! { "status": 1, "leaseExpiresAt": 1 },
        doc! { "status": 1, "completedAt": 1 },
        doc! { "status": 1, "updatedAt": 1 },
        doc! { "handler": 1, "createdAt": 1 },
    ]
}

/// Every collection of a store, in the order they are created.
pub(super) const COLLECTIONS: [&str; 6] = [
    SCHEMA,
    EVENTS,
    DELIVERIES,
    LANES,
    KEY_SEQUENCES,
    COMPLETIONS,
];

/// Index key patterns compare field by field, in order, with numbers of any type.
fn same_keys(a: &Document, b: &Document) -> bool {
    let number = |v: &Bson| match v {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(f) => Some(*f),
        _ => None,
    };
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|((ka, va), (kb, vb))| {
            ka == kb && (va == vb || (number(va).is_some() && number(va) == number(vb)))
        })
}

fn matches(spec: &IndexSpec, found: &IndexModel) -> bool {
    let options = found.options.as_ref();
    same_keys(&spec.keys, &found.keys)
        && options.and_then(|o| o.unique).unwrap_or(false) == spec.unique
        && options.and_then(|o| o.partial_filter_expression.as_ref()) == spec.partial.as_ref()
}

fn index_name(found: &IndexModel) -> String {
    found
        .options
        .as_ref()
        .and_then(|o| o.name.clone())
        .unwrap_or_default()
}

/// How a collection's indexes differ from 0.2's, by definition: names to drop (0.1 indexes,
/// duplicates of a 0.2 index, a 0.2 name with another definition) and 0.2 indexes to create.
pub(super) fn drift(collection: &str, found: &[IndexModel]) -> (Vec<String>, Vec<&'static str>) {
    let wanted: Vec<IndexSpec> = indexes()
        .into_iter()
        .filter(|s| s.collection == collection)
        .collect();
    let mut dropped = vec![];
    for f in found {
        let name = index_name(f);
        let spec_of_name = wanted.iter().find(|s| s.name == name);
        let stale = match spec_of_name {
            Some(spec) => !matches(spec, f),
            None => {
                (collection == DELIVERIES && retired().iter().any(|r| same_keys(r, &f.keys)))
                    || wanted.iter().any(|s| matches(s, f))
            }
        };
        if stale {
            dropped.push(name);
        }
    }
    let created = wanted
        .iter()
        .filter(|s| {
            dropped.contains(&s.name.to_owned()) || !found.iter().any(|f| index_name(f) == s.name)
        })
        .map(|s| s.name)
        .collect();
    (dropped, created)
}

/// A conversion step as planned and reported.
fn step(name: &str, description: &str, rows: Option<i64>) -> UpgradeStep {
    UpgradeStep {
        name: name.into(),
        description: description.into(),
        rows,
    }
}

const STEP_DELIVERIES: &str = "deliveries-lanes";
const STEP_DELIVERIES_WHAT: &str = "set each delivery's laneId with the publish-time hash and \
    claims to 0, turn processing deliveries into pending with their attempts kept, make every \
    delivery ready, remove leaseOwner, leaseToken and leaseExpiresAt; in batches";
const STEP_EVENTS: &str = "events-handlers";
const STEP_EVENTS_WHAT: &str = "set each event's handlers from every delivery, completed ones \
    included (so nothing completed under 0.1 runs again), and createdAt from its first \
    delivery; in batches";
const STEP_INSTALL: &str = "install";
const STEP_INSTALL_WHAT: &str = "drop the 0.1 indexes, found by definition whatever their \
    names; create the 0.2 collections and indexes, seed the 256 lanes, record the version";

impl MongoStore {
    async fn db(&self) -> Result<Database> {
        self.conn.database().await
    }

    pub(super) async fn coll(&self, name: &str) -> Result<Collection<Document>> {
        self.conn.collection(&self.name(name)).await
    }

    /// The relaybus collections that exist.
    pub(super) async fn existing(&self) -> Result<Vec<String>> {
        let names = self
            .db()
            .await?
            .list_collection_names()
            .await
            .map_err(self.conn.error("could not list the collections"))?;
        Ok(COLLECTIONS
            .iter()
            .filter(|c| names.contains(&self.name(c)))
            .map(|c| c.to_string())
            .collect())
    }

    pub(super) async fn indexes_of(&self, collection: &str) -> Result<Vec<IndexModel>> {
        let failed = self
            .conn
            .error(format!("could not list the indexes of {collection}"));
        let cursor = self
            .coll(collection)
            .await?
            .list_indexes()
            .await
            .map_err(&failed)?;
        cursor.try_collect().await.map_err(&failed)
    }

    /// The index drift of every indexed collection that exists.
    async fn all_drift(&self, existing: &[String]) -> Result<(Vec<String>, Vec<String>)> {
        let (mut dropped, mut created) = (vec![], vec![]);
        for c in [DELIVERIES, EVENTS, COMPLETIONS] {
            let found = if existing.iter().any(|e| e == c) {
                self.indexes_of(c).await?
            } else {
                vec![]
            };
            let (mut d, n) = drift(c, &found);
            d.sort();
            dropped.extend(d.into_iter().map(|d| format!("{}.{d}", self.name(c))));
            created.extend(n.into_iter().map(|n| format!("{}.{n}", self.name(c))));
        }
        Ok((dropped, created))
    }

    pub(super) async fn version(&self) -> Result<Option<String>> {
        let found = self
            .coll(SCHEMA)
            .await?
            .find_one(doc! { "_id": VERSION_ID })
            .await
            .map_err(self.conn.error("could not read the schema version"))?;
        Ok(found.and_then(|d| d.get_str("version").ok().map(str::to_owned)))
    }

    /// A 0.1 store: deliveries without a lane, or a 0.1 index.
    async fn is_0_1(&self, existing: &[String]) -> Result<bool> {
        if !existing.iter().any(|e| e == DELIVERIES) {
            return Ok(false);
        }
        let unconverted = self
            .coll(DELIVERIES)
            .await?
            .find_one(doc! { "laneId": { "$exists": false } })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(self.conn.error("could not read the deliveries"))?;
        let old_index = self
            .indexes_of(DELIVERIES)
            .await?
            .iter()
            .any(|f| retired().iter().any(|r| same_keys(r, &f.keys)));
        Ok(unconverted.is_some() || old_index)
    }

    pub(super) async fn detect(&self) -> Result<SchemaStatus> {
        let existing = self.existing().await?;
        let version = if existing.iter().any(|e| e == SCHEMA) {
            self.version().await?
        } else {
            None
        };
        Ok(match version.as_deref() {
            Some(SCHEMA_VERSION)
                if self.all_drift(&existing).await? != (vec![], vec![])
                    || self.lane_count().await? != 256 =>
            {
                SchemaStatus::Incomplete
            }
            Some(SCHEMA_VERSION) => SchemaStatus::Current,
            Some(v) => SchemaStatus::Newer { version: v.into() },
            None if self.is_0_1(&existing).await? => SchemaStatus::V01,
            // The schema collection alone holds no more than the setup lock.
            None if existing.iter().any(|e| e != SCHEMA) => SchemaStatus::Incomplete,
            None => SchemaStatus::NotInstalled,
        })
    }

    async fn lane_count(&self) -> Result<u64> {
        self.coll(LANES)
            .await?
            .count_documents(doc! { "_id": { "$gte": 0, "$lt": 256 } })
            .await
            .map_err(self.conn.error("could not count the lanes"))
    }

    /// Refuses collections of the relaybus names whose documents are not relaybus's.
    async fn refuse_foreign(&self, existing: &[String]) -> Result<()> {
        let shapes: [(&str, &[&str]); 4] = [
            (EVENTS, &["type", "payload"]),
            (DELIVERIES, &["eventId", "handler", "status"]),
            (LANES, &["epoch"]),
            (KEY_SEQUENCES, &["lastSequence"]),
        ];
        let mut found = vec![];
        for (c, fields) in shapes {
            if !existing.iter().any(|e| e == c) {
                continue;
            }
            let any: Vec<Document> = fields
                .iter()
                .map(|f| doc! { *f: { "$exists": false } })
                .collect();
            let odd = self
                .coll(c)
                .await?
                .find_one(doc! { "$or": any })
                .projection(doc! { "_id": 1 })
                .await
                .map_err(self.conn.error("could not look at the collections"))?;
            if odd.is_some() {
                found.push(format!(
                    "`{}.{}` (documents without {})",
                    self.ns.schema(),
                    self.name(c),
                    fields.join(", ")
                ));
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        Err(StoreError::ForeignObjects {
            found: found.join(", "),
        })
    }

    async fn live_leases(&self) -> Result<LiveLeases> {
        let deliveries = self.coll(DELIVERIES).await?;
        let filter = doc! { "status": "processing", "leaseExpiresAt": { "$gt": DateTime::now() } };
        let failed = self.conn.error("could not count live 0.1 leases");
        let count = deliveries
            .count_documents(filter.clone())
            .await
            .map_err(&failed)?;
        let last = deliveries
            .find_one(filter)
            .sort(doc! { "leaseExpiresAt": -1 })
            .await
            .map_err(&failed)?;
        Ok(LiveLeases {
            count: count as i64,
            until: last
                .and_then(|d| d.get_datetime("leaseExpiresAt").ok().copied())
                .map(|at| chrono(at).to_rfc3339()),
        })
    }

    /// Takes the setup lock, waiting as long as another setup or upgrade holds it, and keeps
    /// it until the guard is dropped.
    async fn lock(&self) -> Result<SetupLock> {
        let schema = self.coll(SCHEMA).await?;
        let me = uuid::Uuid::now_v7().to_string();
        let failed = self.conn.error("could not take the setup lock");
        loop {
            let now = DateTime::now();
            let taken = schema
                .update_one(
                    doc! { "_id": LOCK_ID, "$or": [
                        { "expiresAt": { "$lte": now } }, { "holder": &me },
                    ] },
                    doc! { "$set": { "holder": &me, "expiresAt": after(now, LOCK_LEASE) } },
                )
                .upsert(true)
                .await;
            match taken {
                Ok(_) => break,
                Err(e) if is_duplicate_key(&e) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(failed(e)),
            }
        }
        let renew = {
            let (schema, me) = (schema.clone(), me.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LOCK_LEASE / 3).await;
                    let _ = schema
                        .update_one(
                            doc! { "_id": LOCK_ID, "holder": &me },
                            doc! { "$set": { "expiresAt": after(DateTime::now(), LOCK_LEASE) } },
                        )
                        .await;
                }
            })
        };
        Ok(SetupLock { schema, me, renew })
    }

    /// Refuses collections of relaybus's names that are not relaybus's, and a 0.1 store that
    /// 0.1 workers still hold leases in (unless `force`).
    async fn refuse(&self, force: bool) -> Result<()> {
        let existing = self.existing().await?;
        self.refuse_foreign(&existing).await?;
        if self.is_0_1(&existing).await? {
            self.live_leases().await?.refuse_unless(force)?;
        }
        Ok(())
    }

    /// Creates what is missing and repairs indexes that differ, leaving data alone.
    async fn install(&self) -> Result<()> {
        let db = self.db().await?;
        let existing = self.existing().await?;
        for c in COLLECTIONS {
            if !existing.iter().any(|e| e == c) {
                match db.create_collection(self.name(c)).await {
                    Err(e) if command_code(&e) == Some(48) => {}
                    other => other.map_err(self.conn.error(format!("could not create {c}")))?,
                }
            }
        }
        for c in [DELIVERIES, EVENTS, COMPLETIONS] {
            let (dropped, created) = drift(c, &self.indexes_of(c).await?);
            let coll = self.coll(c).await?;
            for name in dropped {
                coll.drop_index(&name)
                    .await
                    .map_err(self.conn.error(format!("could not drop the index {name}")))?;
            }
            let specs: Vec<Document> = indexes()
                .into_iter()
                .filter(|s| s.collection == c && created.contains(&s.name))
                .map(|s| index_document(&s))
                .collect();
            if !specs.is_empty() {
                db.run_command(doc! { "createIndexes": self.name(c), "indexes": specs })
                    .await
                    .map_err(
                        self.conn
                            .error(format!("could not create the indexes of {c}")),
                    )?;
            }
        }
        let lanes: Vec<Document> = (0..256)
            .map(|lane: i32| {
                doc! {
                    "q": { "_id": lane },
                    "u": { "$setOnInsert": {
                        "epoch": 0_i64, "owner": Bson::Null, "holder": Bson::Null,
                        "leaseExpiresAt": Bson::Null, "inFlight": [], "lost": [],
                    } },
                    "upsert": true,
                }
            })
            .collect();
        db.run_command(doc! { "update": self.name(LANES), "updates": lanes })
            .await
            .map_err(self.conn.error("could not seed the lanes"))?;
        self.coll(SCHEMA)
            .await?
            .update_one(
                doc! { "_id": VERSION_ID },
                doc! { "$set": { "version": SCHEMA_VERSION } },
            )
            .upsert(true)
            .await
            .map_err(self.conn.error("could not record the schema version"))?;
        Ok(())
    }

    async fn counts(&self) -> Result<UpgradeCounts> {
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
            let n = row.get("n").map(super::publish::bson_i64).unwrap_or(0);
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

    async fn steps(&self) -> Result<Vec<UpgradeStep>> {
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
    async fn convert(&self, progress: &(dyn Fn(UpgradeProgress) + Sync)) -> Result<()> {
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
    async fn convert_deliveries(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
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

    async fn convert_events(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
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

/// The setup lock, held until released (or, if the process dies, until its lease expires).
struct SetupLock {
    schema: Collection<Document>,
    me: String,
    renew: tokio::task::JoinHandle<()>,
}

impl SetupLock {
    async fn release(self) {
        self.renew.abort();
        let _ = self
            .schema
            .delete_one(doc! { "_id": LOCK_ID, "holder": &self.me })
            .await;
    }
}

fn command_code(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
            Some(w.code)
        }
        _ => None,
    }
}

pub(super) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    command_code(e) == Some(11000)
}

impl IndexSpec {
    /// The index's options, as `createIndex` takes them.
    pub(super) fn options(&self) -> Document {
        let mut d = doc! { "name": self.name };
        if self.unique {
            d.insert("unique", true);
        }
        if let Some(p) = &self.partial {
            d.insert("partialFilterExpression", p.clone());
        }
        d
    }
}

fn index_document(spec: &IndexSpec) -> Document {
    let mut d = spec.options();
    d.insert("key", spec.keys.clone());
    d
}

/// Extended JSON of a document, as mongosh reads it.
pub(super) fn js(d: &Document) -> String {
    Bson::Document(d.clone()).into_relaxed_extjson().to_string()
}

fn header(ns: &Namespace, what: &str) -> String {
    format!(
        "// relaybus {} MongoDB schema {SCHEMA_VERSION}: {what}\n\
         // database \"{}\", prefix \"{}\"; rendered by `relaybus schema-sql`.\n\
         // Apply with every relaybus worker of an older version stopped:\n\
         //   mongosh \"mongodb://HOST/?replicaSet=NAME\" --file FILE\n\
         // Applying it again changes nothing.\n\n\
         const rb = db.getSiblingDB({});\n",
        env!("CARGO_PKG_VERSION"),
        ns.schema(),
        ns.prefix(),
        serde_json::to_string(ns.schema()).expect("a string serialises")
    )
}

pub(super) fn collection_js(ns: &Namespace, c: &str) -> String {
    format!(
        "rb.getCollection({})",
        serde_json::to_string(&ns.table_name(c)).expect("a string serialises")
    )
}

fn install_js(ns: &Namespace) -> String {
    let mut out = String::from(
        "\n// The collections, created before any transaction writes to them.\n\
         const existing = rb.getCollectionNames();\n",
    );
    for c in COLLECTIONS {
        let name = serde_json::to_string(&ns.table_name(c)).expect("a string serialises");
        out.push_str(&format!(
            "if (!existing.includes({name})) rb.createCollection({name});\n"
        ));
    }
    out.push_str(
        "\n// An index of a 0.2 name with another definition, and a copy of a 0.2 index under\n\
         // another name, are dropped first, so that what follows leaves exactly the 0.2 indexes.\n\
         function ensureIndex(coll, keys, options) {\n\
         \x20 const same = (ix) => JSON.stringify(ix.key) === JSON.stringify(keys)\n\
         \x20   && JSON.stringify(ix.partialFilterExpression) === JSON.stringify(options.partialFilterExpression)\n\
         \x20   && Boolean(ix.unique) === Boolean(options.unique);\n\
         \x20 for (const ix of coll.getIndexes()) {\n\
         \x20   if ((ix.name === options.name) !== same(ix)) coll.dropIndex(ix.name);\n\
         \x20 }\n\
         \x20 coll.createIndex(keys, options);\n\
         }\n",
    );
    for spec in indexes() {
        out.push_str(&format!(
            "\n// {}\nensureIndex({}, {}, {});\n",
            spec.why,
            collection_js(ns, spec.collection),
            js(&spec.keys),
            js(&spec.options())
        ));
    }
    out.push_str(&format!(
        "\n// Workers lease lanes, not deliveries: 256 lane documents.\n\
         for (let lane = 0; lane < 256; lane++) {{\n\
         \x20 {}.updateOne({{ _id: lane }}, {{ $setOnInsert: {{ epoch: NumberLong(\"0\"), owner: null,\n\
         \x20   holder: null, leaseExpiresAt: null, inFlight: [], lost: [] }} }}, {{ upsert: true }});\n\
         }}\n\
         \n// The version, written last: `relaybus setup --check` reads it.\n\
         {}.updateOne({{ _id: \"{VERSION_ID}\" }}, {{ $set: {{ version: \"{SCHEMA_VERSION}\" }} }}, {{ upsert: true }});\n",
        collection_js(ns, LANES),
        collection_js(ns, SCHEMA),
    ));
    out
}

fn convert_js(ns: &Namespace) -> String {
    let retired: Vec<String> = retired().iter().map(js).collect();
    format!(
        "\n// The lane of a delivery: FNV-1a 32-bit over the UTF-8 bytes of its key (or event id),\n\
         // modulo 256, as relaybus computes it when publishing.\n\
         function laneOf(text) {{\n\
         \x20 let h = 0x811c9dc5;\n\
         \x20 for (const b of new TextEncoder().encode(text)) {{ h = Math.imul(h ^ b, 0x01000193) >>> 0; }}\n\
         \x20 return h % 256;\n\
         }}\n\
         const deliveries = {deliveries};\n\
         const events = {events};\n\
         \n// step {STEP_DELIVERIES}: {STEP_DELIVERIES_WHAT}\n\
         for (;;) {{\n\
         \x20 const batch = deliveries.find({{ laneId: {{ $exists: false }} }}, {{ eventId: 1, key: 1, status: 1 }}).limit({BATCH}).toArray();\n\
         \x20 if (batch.length === 0) break;\n\
         \x20 deliveries.bulkWrite(batch.map((d) => ({{ updateOne: {{ filter: {{ _id: d._id }}, update: {{\n\
         \x20   $set: {{ laneId: laneOf(d.key ?? d.eventId), claims: 0,\n\
         \x20          status: d.status === \"processing\" ? \"pending\" : d.status, lane: \"{READY}\" }},\n\
         \x20   $unset: {{ leaseOwner: \"\", leaseToken: \"\", leaseExpiresAt: \"\" }} }} }} }})));\n\
         }}\n\
         \n// step {STEP_EVENTS}: {STEP_EVENTS_WHAT}\n\
         for (;;) {{\n\
         \x20 const batch = events.find({{ handlers: {{ $exists: false }} }}, {{ createdAt: 1 }}).limit({BATCH}).toArray();\n\
         \x20 if (batch.length === 0) break;\n\
         \x20 const of = new Map(deliveries.aggregate([\n\
         \x20   {{ $match: {{ eventId: {{ $in: batch.map((e) => e._id) }} }} }},\n\
         \x20   {{ $group: {{ _id: \"$eventId\", handlers: {{ $addToSet: \"$handler\" }}, first: {{ $min: \"$createdAt\" }} }} }},\n\
         \x20 ]).toArray().map((g) => [g._id, g]));\n\
         \x20 events.bulkWrite(batch.map((e) => ({{ updateOne: {{ filter: {{ _id: e._id }}, update: {{ $set: {{\n\
         \x20   handlers: (of.get(e._id)?.handlers ?? []).sort(),\n\
         \x20   createdAt: e.createdAt ?? of.get(e._id)?.first ?? new Date() }} }} }} }})));\n\
         }}\n\
         \n// step {STEP_INSTALL}: {STEP_INSTALL_WHAT}\n\
         const retired = [{retired}].map((k) => JSON.stringify(k));\n\
         for (const ix of deliveries.getIndexes()) {{\n\
         \x20 if (retired.includes(JSON.stringify(ix.key))) deliveries.dropIndex(ix.name);\n\
         }}\n",
        deliveries = collection_js(ns, DELIVERIES),
        events = collection_js(ns, EVENTS),
        retired = retired.join(", "),
    )
}

fn grants_js(ns: &Namespace, role: &str) -> String {
    let resources: Vec<String> = COLLECTIONS
        .iter()
        .map(|c| {
            format!(
                "    {{ resource: {{ db: {}, collection: {} }}, actions: [\"find\", \"insert\", \"update\", \"remove\"] }}",
                serde_json::to_string(ns.schema()).expect("a string serialises"),
                serde_json::to_string(&ns.table_name(c)).expect("a string serialises"),
            )
        })
        .collect();
    format!(
        "// relaybus {} MongoDB schema {SCHEMA_VERSION}: a role for runtime users\n\
         // database \"{}\", prefix \"{}\"; rendered by `relaybus schema-sql --grants`.\n\
         // Grant it to the users that publish, run workers and use the admin commands:\n\
         //   db.grantRolesToUser(\"USER\", [{{ role: {role}, db: {db} }}])\n\n\
         const rb = db.getSiblingDB({db});\n\
         const privileges = [\n{},\n\
         \x20 {{ resource: {{ db: {db}, collection: \"\" }}, actions: [\"listCollections\", \"listIndexes\", \"changeStream\"] }},\n\
         ];\n\
         if (rb.getRole({role}) === null) rb.createRole({{ role: {role}, privileges, roles: [] }});\n\
         else rb.updateRole({role}, {{ privileges, roles: [] }});\n",
        env!("CARGO_PKG_VERSION"),
        ns.schema(),
        ns.prefix(),
        resources.join(",\n"),
        role = serde_json::to_string(role).expect("a string serialises"),
        db = serde_json::to_string(ns.schema()).expect("a string serialises"),
    )
}

/// A `mongosh` script: the install, the 0.1 conversion followed by the install, or a runtime
/// role.
pub(crate) fn script(ns: &Namespace, script: &Script) -> String {
    match script {
        Script::Install => header(ns, "install") + &install_js(ns),
        Script::ConvertFrom01 => {
            header(ns, "in-place conversion from 0.1") + &convert_js(ns) + &install_js(ns)
        }
        Script::Grants { role } => grants_js(ns, role),
    }
}

impl Schema for MongoStore {
    async fn schema_status(&self) -> Result<SchemaStatus> {
        self.detect().await
    }

    async fn setup(&self, force: bool) -> Result<SetupOutcome> {
        // What would be refused is refused before the lock is taken, so nothing is written.
        self.refuse(force).await?;
        let lock = self.lock().await?;
        let result = async {
            let before = self.detect().await?;
            match &before {
                SchemaStatus::Current => {}
                SchemaStatus::Newer { .. } => {
                    return Err(before
                        .error(&self.ns)
                        .expect("a newer schema is not current"))
                }
                SchemaStatus::V01 => {
                    self.refuse(force).await?;
                    self.convert(&|_| {}).await?;
                }
                _ => {
                    self.refuse(force).await?;
                    self.install().await?;
                }
            }
            Ok(SetupOutcome {
                before,
                after: self.detect().await?,
            })
        }
        .await;
        lock.release().await;
        result
    }

    async fn upgrade_plan(&self) -> Result<UpgradePlan> {
        let found = self.detect().await?;
        if found != SchemaStatus::V01 {
            return Ok(UpgradePlan {
                found,
                steps: vec![],
                counts: UpgradeCounts::default(),
                live_leases: LiveLeases::default(),
                locks: Locks::default(),
            });
        }
        Ok(UpgradePlan {
            found,
            steps: self.steps().await?,
            counts: self.counts().await?,
            live_leases: self.live_leases().await?,
            locks: Locks {
                what: "none on the collections: the conversion runs in batches of 1,000 \
                       documents under relaybus's setup lock; stop 0.1 workers first"
                    .into(),
                expected_seconds: None,
            },
        })
    }

    async fn upgrade(
        &self,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        if self.detect().await? == SchemaStatus::V01 {
            self.refuse(force).await?;
        }
        let lock = self.lock().await?;
        let result = async {
            let before = self.detect().await?;
            if before != SchemaStatus::V01 {
                return Ok(SetupOutcome {
                    after: before.clone(),
                    before,
                });
            }
            self.refuse(force).await?;
            self.convert(progress).await?;
            Ok(SetupOutcome {
                before,
                after: self.detect().await?,
            })
        }
        .await;
        lock.release().await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_finds_0_1_indexes_duplicates_and_redefinitions_by_definition() {
        let model = |name: &str, keys: Document, partial: Option<Document>| {
            let options = mongodb::options::IndexOptions::builder()
                .name(name.to_owned())
                .partial_filter_expression(partial)
                .build();
            IndexModel::builder().keys(keys).options(options).build()
        };
        let found = vec![
            model("_id_", doc! { "_id": 1 }, None),
            model(
                "old_claim",
                doc! { "status": 1, "lane": 1, "dueAt": 1 },
                None,
            ),
            model(
                "lane_due",
                doc! { "laneId": 1, "dueAt": 1, "_id": 1 },
                Some(doc! { "status": "pending" }),
            ),
            model(
                "copy",
                doc! { "updatedAt": 1, "_id": 1 },
                Some(doc! { "status": "dead" }),
            ),
            model("mine", doc! { "handler": 1 }, None),
        ];
        let (dropped, created) = drift(DELIVERIES, &found);
        assert_eq!(dropped, ["old_claim", "lane_due", "copy"]);
        assert_eq!(
            created,
            [
                "eventId_handler_unique",
                "lane_due",
                "lane_key_sequence",
                "dead_updated"
            ]
        );
    }

    #[test]
    fn scripts_name_their_database_and_every_index() {
        let ns = Namespace::for_mongo("app", "rb_").unwrap();
        let install = script(&ns, &Script::Install);
        assert!(
            install.contains("const rb = db.getSiblingDB(\"app\");"),
            "{install}"
        );
        for spec in indexes() {
            assert!(
                install.contains(&format!("\"name\":\"{}\"", spec.name)),
                "{install}"
            );
        }
        assert!(install.contains("rb.getCollection(\"rb_lanes\").updateOne"));
        let convert = script(&ns, &Script::ConvertFrom01);
        assert!(convert.contains("// step deliveries-lanes:"));
        assert!(convert.ends_with(&install_js(&ns)));
    }
}
