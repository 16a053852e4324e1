//! `doctor` on MongoDB: the collections, the indexes (by definition), the 256 lane documents
//! and the version document against what this version installs, each finding with the
//! `mongosh` statements that repair it; parked deliveries left at the head of their key, which
//! no claim would ever see; and the mistakes of an application that writes events and
//! deliveries itself (README: "Publishing to MongoDB from an application").

use std::collections::{BTreeMap, HashMap};

use mongodb::bson::{doc, Bson, Document};

use super::model::{all, LANE_RULES};
use super::schema::{
    collection_js, drift, index_name, indexes, js, matches, retired, same_keys, IndexSpec,
    COLLECTIONS, VERSION_ID,
};
use super::{MongoStore, DELIVERIES, EVENTS, LANES, PARKED, SCHEMA};
use crate::store::doctor::Check;
use crate::store::lane::lane_of;
use crate::store::{Doctor, Result, SCHEMA_VERSION};

impl MongoStore {
    /// The missing collections, each with the script that creates it and its indexes.
    fn collection_checks(&self, existing: &[String]) -> Vec<Check> {
        let mut checks: Vec<Check> = COLLECTIONS
            .iter()
            .filter(|c| !existing.iter().any(|e| e == *c))
            .map(|c| {
                let mut fix = format!("rb.createCollection({});\n", quoted(&self.name(c)));
                for spec in indexes().into_iter().filter(|s| s.collection == *c) {
                    fix.push_str(&create_index(&collection_js(&self.ns, c), &spec));
                }
                Check::fail(
                    "table",
                    self.name(c),
                    "missing",
                    "create it and its indexes",
                )
                .with_fix(fix)
            })
            .collect();
        if checks.is_empty() {
            checks.push(Check::ok("table", "collections", "every 0.2 collection"));
        }
        checks
    }

    /// The indexes of the collections that have them, by definition.
    async fn index_checks(&self, existing: &[String]) -> Result<Vec<Check>> {
        let mut checks = vec![];
        for c in existing
            .iter()
            .filter(|c| [DELIVERIES, "events", "completions"].contains(&c.as_str()))
        {
            let (dropped, created) = drift(c, &self.indexes_of(c).await?);
            let coll = collection_js(&self.ns, c);
            for name in &dropped {
                let mut fix = format!("{coll}.dropIndex({});\n", quoted(name));
                let recreated = created.contains(&name.as_str());
                if let Some(spec) = indexes()
                    .into_iter()
                    .find(|s| s.collection == c && s.name == name && recreated)
                {
                    fix.push_str(&create_index(&coll, &spec));
                }
                let (found, advice) = if recreated {
                    ("defined otherwise than 0.2 defines it", "recreate it")
                } else {
                    (
                        "not an index of 0.2 (a 0.1 index, or a copy of a 0.2 one)",
                        "drop it",
                    )
                };
                let subject = format!("{}.{name}", self.name(c));
                checks.push(Check::fail("index", subject, found, advice).with_fix(fix));
            }
            for spec in indexes().into_iter().filter(|s| {
                s.collection == c
                    && created.contains(&s.name)
                    && !dropped.iter().any(|d| d == s.name)
            }) {
                let subject = format!("{}.{}", self.name(c), spec.name);
                checks.push(
                    Check::fail("index", subject, "missing", "create it")
                        .with_fix(create_index(&coll, &spec)),
                );
            }
        }
        let foreign = self.foreign_indexes(existing).await?;
        if checks.is_empty() {
            checks.push(Check::ok(
                "index",
                "indexes",
                if foreign.is_empty() {
                    "every 0.2 index, by definition, and no other"
                } else {
                    "every 0.2 index, by definition"
                },
            ));
        }
        checks.extend(foreign);
        Ok(checks)
    }

    /// The indexes of relaybus's collections that are neither 0.2's (by name or definition) nor
    /// 0.1's: the application's, which relaybus keeps.
    async fn foreign_indexes(&self, existing: &[String]) -> Result<Vec<Check>> {
        let mut checks = vec![];
        for c in existing
            .iter()
            .filter(|c| [DELIVERIES, "events", "completions", LANES].contains(&c.as_str()))
        {
            for found in self.indexes_of(c).await? {
                let name = index_name(&found);
                let relaybus = name == "_id_"
                    || indexes()
                        .iter()
                        .any(|s| s.collection == c && (s.name == name || matches(s, &found)))
                    || (c == DELIVERIES && retired().iter().any(|r| same_keys(r, &found.keys)));
                if !relaybus {
                    checks.push(Check::warn(
                        "index",
                        format!("{}.{name}", self.name(c)),
                        format!("not relaybus's: {}", js(&found.keys)),
                        "relaybus keeps it; it slows every write of the collection it indexes",
                    ));
                }
            }
        }
        Ok(checks)
    }

    /// Exactly the lanes 0..255, each as the rules say (`LANE_RULES`).
    async fn lane_check(&self) -> Result<Check> {
        let failed = self.conn.error("could not read the store");
        let lanes = self.coll(LANES).await?;
        let inside = lanes
            .count_documents(doc! { "_id": { "$gte": 0, "$lt": 256 } })
            .await
            .map_err(&failed)?;
        let outside = lanes
            .count_documents(doc! { "_id": { "$not": { "$gte": 0, "$lt": 256 } } })
            .await
            .map_err(&failed)?;
        let subject = self.name(LANES);
        let coll = collection_js(&self.ns, LANES);
        let (mut found, mut fix) = (vec![], String::new());
        if (inside, outside) != (256, 0) {
            found.push(format!(
                "{inside} of the 256 lane documents, {outside} outside 0..255"
            ));
            fix.push_str(&format!(
                "for (let lane = 0; lane < 256; lane++) {{\n  {coll}.updateOne({{ _id: lane }}, {{ $setOnInsert: {{ epoch: NumberLong(\"0\"), owner: null, holder: null, leaseExpiresAt: null, inFlight: [], lost: [] }} }}, {{ upsert: true }});\n}}\n"
            ));
            if outside > 0 {
                fix.push_str(&format!(
                    "{coll}.deleteMany({{ _id: {{ $not: {{ $gte: 0, $lt: 256 }} }} }});\n"
                ));
            }
        }
        for rule in &LANE_RULES {
            let broken: Vec<Document> = all(lanes
                .find(rule.broken())
                .projection(doc! { "_id": 1 })
                .await
                .map_err(&failed)?)
            .await
            .map_err(&failed)?;
            if !broken.is_empty() {
                let ids: Vec<String> = broken
                    .iter()
                    .filter_map(|d| d.get("_id").map(ToString::to_string))
                    .collect();
                found.push(format!(
                    "lanes {} without {}, not claimed",
                    ids.join(", "),
                    rule.rule
                ));
                fix.push_str(&rule.repair_js(&coll));
            }
        }
        if found.is_empty() {
            return Ok(Check::ok("lanes", subject, "256 lane documents, 0..255"));
        }
        Ok(Check::fail(
            "lanes",
            subject,
            found.join("; "),
            "restore exactly the lanes 0..255, each sound (`relaybus setup` does too)",
        )
        .with_fix(fix))
    }

    async fn version_check(&self) -> Result<Check> {
        let subject = self.name(SCHEMA);
        Ok(match self.version().await?.as_deref() {
            Some(SCHEMA_VERSION) => Check::ok("version", subject, format!("version {SCHEMA_VERSION}")),
            other => Check::fail(
                "version",
                subject,
                format!("the version document says {}", other.unwrap_or("nothing")),
                "record the version",
            )
            .with_fix(format!(
                "{}.updateOne({{ _id: \"{VERSION_ID}\" }}, {{ $set: {{ version: \"{SCHEMA_VERSION}\" }} }}, {{ upsert: true }});\n",
                collection_js(&self.ns, SCHEMA)
            )),
        })
    }

    /// Keys whose head (lowest pending sequence) is parked: nothing would ever release them.
    async fn stranded(&self) -> Result<Check> {
        let failed = self.conn.error("could not read the keyed deliveries");
        let cursor = self
            .coll(DELIVERIES)
            .await?
            .aggregate([
                doc! { "$match": { "status": "pending", "key": { "$type": "string" } } },
                doc! { "$sort": { "laneId": 1, "handler": 1, "key": 1, "sequence": 1 } },
                doc! { "$group": {
                    "_id": { "lane": "$laneId", "handler": "$handler", "key": "$key" },
                    "head": { "$first": "$_id" }, "lane": { "$first": "$lane" },
                } },
                doc! { "$match": { "lane": PARKED } },
            ])
            .await
            .map_err(&failed)?;
        let heads: Vec<Bson> = all(cursor)
            .await
            .map_err(&failed)?
            .iter()
            .filter_map(|d: &Document| d.get("head").cloned())
            .collect();
        let subject = self.name(DELIVERIES);
        Ok(if heads.is_empty() {
            Check::ok("parking", subject, "every key's head is ready")
        } else {
            let ids = Bson::Array(heads.clone()).into_relaxed_extjson();
            Check::fail(
                "parking",
                subject,
                format!("{} keys have a parked head that no claim would see", heads.len()),
                "make their heads ready",
            )
            .with_fix(format!(
                "{}.updateMany({{ _id: {{ $in: {ids} }} }}, {{ $set: {{ lane: \"ready\", holdsBack: 1 }} }});\n",
                collection_js(&self.ns, DELIVERIES)
            ))
        })
    }
}

/// What a hand-written publisher got wrong in the deliveries: each kind of mistake with the ids
/// of the deliveries (or events) that make it.
#[derive(Default)]
struct Mistakes {
    /// By the lane they belong in: a `laneId` that is not an integer, or another lane's.
    misplaced: BTreeMap<i32, Vec<Bson>>,
    /// Keyed, without an integer `sequence`: their key's order is not known.
    unsequenced: Vec<Bson>,
    /// Of an event that does not exist (or no `eventId` at all).
    orphaned: Vec<Bson>,
    /// By event: handlers with a delivery that the event's `handlers` do not list, so a
    /// republish would run them again.
    unlisted: BTreeMap<String, Vec<String>>,
}

impl MongoStore {
    /// Reads the identifying fields of every delivery (the backlog, not the history: a
    /// completed delivery is deleted) and the handlers of their events.
    async fn mistakes(&self) -> Result<Mistakes> {
        let failed = self
            .conn
            .error("could not read the deliveries and their events");
        let cursor = self
            .coll(DELIVERIES)
            .await?
            .find(doc! {})
            .projection(doc! { "eventId": 1, "handler": 1, "key": 1, "laneId": 1, "sequence": 1 })
            .await
            .map_err(&failed)?;
        let mut m = Mistakes::default();
        let mut by_event: HashMap<String, Vec<(Bson, String)>> = HashMap::new();
        for d in all::<Document>(cursor).await.map_err(&failed)? {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            let key = d.get_str("key").ok();
            if key.is_some() && !matches!(d.get("sequence"), Some(Bson::Int32(_) | Bson::Int64(_)))
            {
                m.unsequenced.push(id.clone());
            }
            let Ok(event) = d.get_str("eventId") else {
                m.orphaned.push(id);
                continue;
            };
            let lane = i32::from(lane_of(key, event));
            // Without a `laneId` at all a delivery is a 0.1 document: the store reads as 0.1
            // (or, expanded, its workers adopt it).
            let stored = match d.get("laneId") {
                None => Some(i64::from(lane)),
                Some(Bson::Int32(l)) => Some(i64::from(*l)),
                Some(Bson::Int64(l)) => Some(*l),
                Some(_) => None,
            };
            if stored != Some(i64::from(lane)) {
                m.misplaced.entry(lane).or_default().push(id.clone());
            }
            let handler = d.get_str("handler").unwrap_or_default().to_owned();
            by_event
                .entry(event.to_owned())
                .or_default()
                .push((id, handler));
        }
        let handlers = self.listed_handlers(by_event.keys()).await?;
        for (event, deliveries) in by_event {
            let Some(listed) = handlers.get(&event) else {
                m.orphaned.extend(deliveries.into_iter().map(|(id, _)| id));
                continue;
            };
            let mut missing: Vec<String> = deliveries
                .into_iter()
                .map(|(_, h)| h)
                .filter(|h| !listed.contains(h))
                .collect();
            if !missing.is_empty() {
                missing.sort();
                missing.dedup();
                m.unlisted.insert(event, missing);
            }
        }
        m.orphaned.sort_by_key(ToString::to_string);
        m.unsequenced.sort_by_key(ToString::to_string);
        Ok(m)
    }

    /// The handlers each of these events lists.
    async fn listed_handlers<'a>(
        &self,
        ids: impl Iterator<Item = &'a String>,
    ) -> Result<HashMap<String, Vec<String>>> {
        let failed = self
            .conn
            .error("could not read the events of the deliveries");
        let ids: Vec<&String> = ids.collect();
        let events = self.coll(EVENTS).await?;
        let mut handlers: HashMap<String, Vec<String>> = HashMap::new();
        for chunk in ids.chunks(1000) {
            let cursor = events
                .find(doc! { "_id": { "$in": chunk } })
                .projection(doc! { "handlers": 1 })
                .await
                .map_err(&failed)?;
            for e in all::<Document>(cursor).await.map_err(&failed)? {
                let listed = e.get_array("handlers").map_or(vec![], |a| {
                    a.iter()
                        .filter_map(|h| h.as_str().map(str::to_owned))
                        .collect()
                });
                if let Ok(id) = e.get_str("_id") {
                    handlers.insert(id.to_owned(), listed);
                }
            }
        }
        Ok(handlers)
    }

    /// The rules every delivery keeps when `relaybus publish` writes it, which an application
    /// writing its own must keep too: one check, failing with what breaks them and the fix.
    async fn publisher_check(&self) -> Result<Check> {
        let m = self.mistakes().await?;
        let subject = self.name(DELIVERIES);
        let deliveries = collection_js(&self.ns, DELIVERIES);
        let (mut found, mut fix) = (vec![], String::new());
        let mut misplaced: Vec<&Bson> = m.misplaced.values().flatten().collect();
        misplaced.sort_by_key(|id| id.to_string());
        if !misplaced.is_empty() {
            found.push(format!(
                "{} not in the lane of their key or event id (`laneId` not an integer, or \
                 another lane), so never claimed or out of their key's order: {}",
                counted(misplaced.len(), "delivery", "deliveries"),
                some(&misplaced)
            ));
            for (lane, ids) in &m.misplaced {
                fix.push_str(&format!(
                    "{deliveries}.updateMany({{ _id: {{ $in: {} }} }}, {{ $set: {{ laneId: {lane} }} }});\n",
                    Bson::Array(ids.clone()).into_relaxed_extjson()
                ));
            }
        }
        if !m.unsequenced.is_empty() {
            found.push(format!(
                "{} with a key and no integer `sequence`, out of their key's order: {}",
                counted(m.unsequenced.len(), "delivery", "deliveries"),
                some(&m.unsequenced.iter().collect::<Vec<_>>())
            ));
        }
        if !m.orphaned.is_empty() {
            found.push(format!(
                "{} of events that do not exist, which fail every attempt: {}",
                counted(m.orphaned.len(), "delivery", "deliveries"),
                some(&m.orphaned.iter().collect::<Vec<_>>())
            ));
            fix.push_str(&format!(
                "{deliveries}.deleteMany({{ _id: {{ $in: {} }} }});\n",
                Bson::Array(m.orphaned.clone()).into_relaxed_extjson()
            ));
        }
        if !m.unlisted.is_empty() {
            let events: Vec<Bson> = m.unlisted.keys().map(|e| Bson::String(e.clone())).collect();
            found.push(format!(
                "{} without the handlers of their deliveries in `handlers`, which a \
                 republish would run again: {}",
                counted(m.unlisted.len(), "event", "events"),
                some(&events.iter().collect::<Vec<_>>())
            ));
            let coll = collection_js(&self.ns, EVENTS);
            for (event, handlers) in &m.unlisted {
                fix.push_str(&format!(
                    "{coll}.updateOne({{ _id: {} }}, {{ $addToSet: {{ handlers: {{ $each: {} }} }} }});\n",
                    quoted(event),
                    serde_json::to_string(handlers).expect("strings serialise")
                ));
            }
        }
        if found.is_empty() {
            return Ok(Check::ok(
                "publish",
                subject,
                "every delivery in its lane, with its event and a sequence where keyed",
            ));
        }
        let check = Check::fail(
            "publish",
            subject,
            found.join("; "),
            "fix the application that writes them (README: Publishing to MongoDB from an \
             application); the fix moves, deletes and lists them, with no worker running",
        );
        Ok(if fix.is_empty() {
            check
        } else {
            check.with_fix(fix)
        })
    }
}

fn counted(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// The first ids of a list, quoted, and how many more.
fn some(ids: &[&Bson]) -> String {
    let shown: Vec<String> = ids.iter().take(3).map(|id| id.to_string()).collect();
    match ids.len() {
        n if n > 3 => format!("{}, and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

fn create_index(coll: &str, spec: &IndexSpec) -> String {
    format!(
        "{coll}.createIndex({}, {});\n",
        js(&spec.keys),
        js(&spec.options())
    )
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serialises")
}

impl Doctor for MongoStore {
    async fn doctor(&self) -> Result<Vec<Check>> {
        let existing = self.existing().await?;
        let has = |c: &str| existing.iter().any(|e| e == c);
        let mut checks = self.collection_checks(&existing);
        checks.extend(self.index_checks(&existing).await?);
        if has(LANES) {
            checks.push(self.lane_check().await?);
        }
        if has(SCHEMA) {
            checks.push(self.version_check().await?);
        }
        if has(DELIVERIES) {
            checks.push(self.stranded().await?);
            if has(EVENTS) {
                checks.push(self.publisher_check().await?);
            }
        }
        Ok(checks)
    }
}
