//! `doctor` on MongoDB: the collections, the indexes (by definition), the 256 lane documents
//! and the version document against what this version installs, each finding with the
//! `mongosh` statements that repair it; and parked deliveries left at the head of their key,
//! which no claim would ever see.

use mongodb::bson::{doc, Bson, Document};

use super::model::{all, LANE_RULES};
use super::schema::{
    collection_js, drift, index_name, indexes, js, matches, retired, same_keys, IndexSpec,
    COLLECTIONS, VERSION_ID,
};
use super::{MongoStore, DELIVERIES, LANES, PARKED, SCHEMA};
use crate::store::doctor::Check;
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
        }
        Ok(checks)
    }
}
