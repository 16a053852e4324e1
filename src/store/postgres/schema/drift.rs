//! How a namespace's indexes differ from 0.2's: what setup, the conversion and the online
//! upgrade drop, create and keep.

use tokio_postgres::GenericClient;

use super::super::conn::db;
use super::super::PgStore;
use crate::store::{ForeignIndex, Result};

/// How a namespace's indexes differ from 0.2's (`sql/postgres/schema/index_drift.sql`).
#[derive(Debug, Default)]
pub(in crate::store::postgres) struct IndexDrift {
    /// Indexes the install drops: 0.1's, copies of 0.2's, 0.2 names defined otherwise.
    pub(in crate::store::postgres) dropped: Vec<String>,
    /// 0.2 indexes the install creates.
    pub(in crate::store::postgres) created: Vec<String>,
    /// 0.2 indexes an interrupted concurrent build left invalid (in `dropped` too).
    pub(in crate::store::postgres) invalid: Vec<String>,
    /// The application's indexes, which relaybus keeps.
    pub(in crate::store::postgres) foreign: Vec<ForeignIndex>,
}

impl IndexDrift {
    /// Every 0.2 index, as 0.2 defines it, and no other of relaybus's.
    pub(super) fn is_exact(&self) -> bool {
        self.dropped.is_empty() && self.created.is_empty()
    }
}

impl PgStore {
    /// How the indexes differ from 0.2's, by definition.
    pub(in crate::store::postgres) async fn index_drift(
        &self,
        client: &impl GenericClient,
    ) -> Result<IndexDrift> {
        let mut drift = IndexDrift::default();
        for row in client
            .query_typed(&self.sql.index_drift.text, &[])
            .await
            .map_err(db("could not compare the indexes with 0.2's"))?
        {
            let name: String = row.get(0);
            match row.get::<_, &str>(1) {
                "drop" => drift.dropped.push(name),
                "invalid" => {
                    drift.invalid.push(name.clone());
                    drift.dropped.push(name);
                }
                "create" => drift.created.push(name),
                action => drift.foreign.push(ForeignIndex {
                    drop_statement: format!("DROP INDEX {};", self.ns.qualified(&name)),
                    name,
                    definition: row.get(2),
                    blocks: action == "blocking",
                    covered_by: row.get(3),
                }),
            }
        }
        Ok(drift)
    }
}
