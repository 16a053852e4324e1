//! The indexes 0.2 defines, and how a collection's indexes differ from them.

use mongodb::bson::{doc, Bson, Document};
use mongodb::IndexModel;

use crate::store::mongo::{
    COMPLETIONS, DELIVERIES, EVENTS, HANDLERS, KEY_SEQUENCES, LANES, READY, SCHEMA,
};

/// An index of 0.2, with why it exists.
pub(in crate::store::mongo) struct IndexSpec {
    pub(in crate::store::mongo) collection: &'static str,
    pub(in crate::store::mongo) name: &'static str,
    pub(in crate::store::mongo) keys: Document,
    pub(in crate::store::mongo) unique: bool,
    pub(in crate::store::mongo) partial: Option<Document>,
    pub(in crate::store::mongo) why: &'static str,
}

/// The indexes 0.2 needs: the claim, the per-key rule, idempotent publish, the dead letters and
/// the purges; nothing else.
pub(in crate::store::mongo) fn indexes() -> Vec<IndexSpec> {
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
pub(in crate::store::mongo) fn retired() -> Vec<Document> {
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
pub(in crate::store::mongo) const COLLECTIONS: [&str; 7] = [
    SCHEMA,
    EVENTS,
    DELIVERIES,
    LANES,
    KEY_SEQUENCES,
    COMPLETIONS,
    HANDLERS,
];

/// Index key patterns compare field by field, in order, with numbers of any type.
pub(in crate::store::mongo) fn same_keys(a: &Document, b: &Document) -> bool {
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

pub(in crate::store::mongo) fn matches(spec: &IndexSpec, found: &IndexModel) -> bool {
    let options = found.options.as_ref();
    same_keys(&spec.keys, &found.keys)
        && options.and_then(|o| o.unique).unwrap_or(false) == spec.unique
        && options.and_then(|o| o.partial_filter_expression.as_ref()) == spec.partial.as_ref()
}

pub(in crate::store::mongo) fn index_name(found: &IndexModel) -> String {
    found
        .options
        .as_ref()
        .and_then(|o| o.name.clone())
        .unwrap_or_default()
}

/// How a collection's indexes differ from 0.2's, by definition: names to drop (0.1 indexes,
/// a second copy of a 0.2 index, a 0.2 name with another definition) and 0.2 indexes to
/// create. A 0.2 index found only under another name is kept under it.
pub(in crate::store::mongo) fn drift(
    collection: &str,
    found: &[IndexModel],
) -> (Vec<String>, Vec<&'static str>) {
    let wanted: Vec<IndexSpec> = indexes()
        .into_iter()
        .filter(|s| s.collection == collection)
        .collect();
    let mut dropped = vec![];
    // 0.2 indexes held by an index of their definition under another name (0.1's unique
    // `eventId_1_handler_1`): kept as they are, since dropping one to create it again leaves
    // publishers without it meanwhile.
    let mut adopted: Vec<&str> = vec![];
    for f in found {
        let name = index_name(f);
        let stale = match wanted.iter().find(|s| s.name == name) {
            Some(spec) => !matches(spec, f),
            None if collection == DELIVERIES && retired().iter().any(|r| same_keys(r, &f.keys)) => {
                true
            }
            None => match wanted.iter().find(|s| matches(s, f)) {
                Some(spec)
                    if !adopted.contains(&spec.name)
                        && !found
                            .iter()
                            .any(|g| index_name(g) == spec.name && matches(spec, g)) =>
                {
                    adopted.push(spec.name);
                    false
                }
                Some(_) => true,
                None => false,
            },
        };
        if stale {
            dropped.push(name);
        }
    }
    let created = wanted
        .iter()
        .filter(|s| !adopted.contains(&s.name))
        .filter(|s| {
            dropped.contains(&s.name.to_owned()) || !found.iter().any(|f| index_name(f) == s.name)
        })
        .map(|s| s.name)
        .collect();
    (dropped, created)
}

impl IndexSpec {
    /// The index's options, as `createIndex` takes them.
    pub(in crate::store::mongo) fn options(&self) -> Document {
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

pub(in crate::store::mongo) fn index_document(spec: &IndexSpec) -> Document {
    let mut d = spec.options();
    d.insert("key", spec.keys.clone());
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_finds_0_1_indexes_second_copies_and_redefinitions_by_definition() {
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
            model(
                "second_copy",
                doc! { "updatedAt": 1, "_id": 1 },
                Some(doc! { "status": "dead" }),
            ),
            model("mine", doc! { "handler": 1 }, None),
        ];
        let (dropped, created) = drift(DELIVERIES, &found);
        // `copy` stands for dead_updated; a second copy goes.
        assert_eq!(dropped, ["old_claim", "lane_due", "second_copy"]);
        assert_eq!(
            created,
            ["eventId_handler_unique", "lane_due", "lane_key_sequence"]
        );
    }
}
