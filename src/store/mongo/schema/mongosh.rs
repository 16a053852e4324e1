//! The same as `mongosh` scripts, for teams whose migrations run elsewhere.

use mongodb::bson::{Bson, Document};

use super::convert::*;
use super::detect::*;
use super::indexes::*;
use crate::store::mongo::model::LANE_RULES;
use crate::store::mongo::{DELIVERIES, EVENTS, LANES, READY, SCHEMA};
use crate::store::{Namespace, Script, SCHEMA_VERSION};

/// Extended JSON of a document, as mongosh reads it.
pub(in crate::store::mongo) fn js(d: &Document) -> String {
    Bson::Document(d.clone()).into_relaxed_extjson().to_string()
}

pub(in crate::store::mongo) fn header(ns: &Namespace, what: &str) -> String {
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

pub(in crate::store::mongo) fn collection_js(ns: &Namespace, c: &str) -> String {
    format!(
        "rb.getCollection({})",
        serde_json::to_string(&ns.table_name(c)).expect("a string serialises")
    )
}

/// The install script's first statement: a 0.1 store is refused, not installed over. The
/// install alone would record 0.2 over deliveries that no worker could claim.
fn refuse_0_1_js(ns: &Namespace) -> String {
    format!(
        "\n// A 0.1 store (deliveries without a laneId, events without handlers) is converted by\n\
         // `relaybus schema-sql --from 0.1`; installing over it would strand its deliveries.\n\
         if ({}.findOne({{ laneId: {{ $exists: false }} }}, {{ _id: 1 }}) !== null\n\
         \x20   || {}.findOne({{ handlers: {{ $exists: false }} }}, {{ _id: 1 }}) !== null) {{\n\
         \x20 throw new Error(\"database \" + rb.getName() + \" holds a relaybus 0.1 store: apply \
         the conversion that `relaybus schema-sql --from 0.1` renders instead; nothing was changed\");\n\
         }}\n",
        collection_js(ns, DELIVERIES),
        collection_js(ns, EVENTS),
    )
}

pub(in crate::store::mongo) fn install_js(ns: &Namespace) -> String {
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
        "\n// An index of a 0.2 name with another definition is dropped; a 0.2 index found under\n\
         // another name (0.1's eventId_1_handler_1) is kept as it is, so that publishers are never\n\
         // without it, and a second copy is dropped: what follows leaves one of each 0.2 index.\n\
         function ensureIndex(coll, keys, options) {\n\
         \x20 const same = (ix) => JSON.stringify(ix.key) === JSON.stringify(keys)\n\
         \x20   && JSON.stringify(ix.partialFilterExpression) === JSON.stringify(options.partialFilterExpression)\n\
         \x20   && Boolean(ix.unique) === Boolean(options.unique);\n\
         \x20 const indexes = coll.getIndexes();\n\
         \x20 let kept = indexes.some((ix) => ix.name === options.name && same(ix));\n\
         \x20 for (const ix of indexes) {\n\
         \x20   if (ix.name === options.name && !same(ix)) coll.dropIndex(ix.name);\n\
         \x20   else if (ix.name !== options.name && same(ix)) {\n\
         \x20     if (kept) coll.dropIndex(ix.name); else kept = true;\n\
         \x20   }\n\
         \x20 }\n\
         \x20 if (!kept) coll.createIndex(keys, options);\n\
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
    let lanes = collection_js(ns, LANES);
    out.push_str(&format!(
        "\n// Workers lease lanes, not deliveries: 256 lane documents.\n\
         for (let lane = 0; lane < 256; lane++) {{\n\
         \x20 {lanes}.updateOne({{ _id: lane }}, {{ $setOnInsert: {{ epoch: NumberLong(\"0\"), owner: null,\n\
         \x20   holder: null, leaseExpiresAt: null, inFlight: [], lost: [] }} }}, {{ upsert: true }});\n\
         }}\n\
         // A lane document that breaks the rules is repaired: a new epoch, empty lists.\n"
    ));
    for rule in &LANE_RULES {
        out.push_str(&rule.repair_js(&lanes));
    }
    out.push_str(&format!(
        "\n// The version, written last: `relaybus setup --check` reads it.\n\
         {}.updateOne({{ _id: \"{VERSION_ID}\" }}, {{ $set: {{ version: \"{SCHEMA_VERSION}\" }} }}, {{ upsert: true }});\n",
        collection_js(ns, SCHEMA),
    ));
    out
}

pub(in crate::store::mongo) fn convert_js(ns: &Namespace) -> String {
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

pub(in crate::store::mongo) fn grants_js(ns: &Namespace, role: &str) -> String {
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
        Script::Install => header(ns, "install") + &refuse_0_1_js(ns) + &install_js(ns),
        Script::ConvertFrom01 => {
            header(ns, "in-place conversion from 0.1") + &convert_js(ns) + &install_js(ns)
        }
        Script::Grants { role } => grants_js(ns, role),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
