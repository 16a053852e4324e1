//! The MongoDB store: the data model of the seed's MongoDB section. 256 lane documents are
//! leased instead of deliveries; a claim records its batch with one conditional write of lane
//! documents and writes no delivery; a completion deletes its batch in one transaction; a
//! takeover moves `inFlight` into `lost` in the write that bumps the epoch and then charges
//! each one an attempt. `docs/design/mongodb.md` says why each part is shaped as it is, and
//! which 0.1 layout `setup` converts from.

mod admin;
mod bench;
mod conn;
mod dispatch;
mod doctor;
mod handlers;
mod history;
mod json;
mod keys;
mod model;
mod publish;
mod schema;
mod wake;

use std::time::Duration;

use conn::Connection;

pub(crate) use conn::url_database;
pub(crate) use schema::script;

use crate::store::*;

/// Collection names after the prefix.
pub(crate) const EVENTS: &str = "events";
pub(crate) const DELIVERIES: &str = "deliveries";
pub(crate) const LANES: &str = "lanes";
pub(crate) const KEY_SEQUENCES: &str = "key_sequences";
pub(crate) const COMPLETIONS: &str = "completions";
pub(crate) const SCHEMA: &str = "schema";
pub(crate) const HANDLERS: &str = "handlers";

/// A delivery's membership of the claim index: `parked` keyed followers wait out of it.
const READY: &str = "ready";
const PARKED: &str = "parked";

pub(crate) struct MongoStore {
    ns: Namespace,
    conn: std::sync::Arc<Connection>,
    /// This store instance (`StoreOptions::instance`), recorded on the lanes it holds.
    holder: String,
    /// Lanes whose losses could not be charged (a dead client's transaction still writes them):
    /// when to try again, and how many tries conflicted in a row.
    charge_later: std::sync::Mutex<std::collections::HashMap<i32, (std::time::Instant, u32)>>,
    /// What `bench` has counted of the oplog so far.
    tally: std::sync::Mutex<bench::Tally>,
    /// Lanes whose documents break the rules, as claims last found them: each is logged when
    /// found, not at every claim.
    unsound: std::sync::Mutex<std::collections::BTreeSet<i32>>,
    /// When this instance last looked for 0.1 publishers' deliveries to adopt.
    adoption: std::sync::Mutex<schema::Adoption>,
    /// Tests hold the next completion between its reads and its writes.
    #[cfg(test)]
    completion_pause: std::sync::Mutex<Option<dispatch::tests::Pause>>,
}

impl MongoStore {
    /// The store at `url` in the database `ns` names. Connections open on first use.
    pub(crate) fn open(url: &str, ns: Namespace, options: StoreOptions) -> Result<Self> {
        Ok(Self {
            conn: std::sync::Arc::new(Connection::new(url, ns.schema(), &options)?),
            holder: options.instance.clone(),
            charge_later: std::sync::Mutex::default(),
            tally: std::sync::Mutex::default(),
            unsound: std::sync::Mutex::default(),
            adoption: std::sync::Mutex::default(),
            #[cfg(test)]
            completion_pause: std::sync::Mutex::new(None),
            ns,
        })
    }

    fn name(&self, collection: &str) -> String {
        self.ns.table_name(collection)
    }
}

impl Store for MongoStore {
    fn namespace(&self) -> &Namespace {
        &self.ns
    }

    fn client_counts(&self) -> ClientCounts {
        self.conn.counts()
    }
}

/// SQL handlers run in PostgreSQL only: a MongoDB store refuses them before anything is claimed.
impl SqlHandler for MongoStore {
    async fn check_statement(&self, _statement: &str) -> Result<()> {
        Err(StoreError::StatementsUnsupported)
    }

    async fn complete_with_statement(
        &self,
        _delivery: &ClaimedDelivery,
        _statement: &str,
        _timeout: Duration,
        _history: bool,
    ) -> Result<StatementOutcome> {
        Err(StoreError::StatementsUnsupported)
    }
}
