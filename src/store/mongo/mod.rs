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

/// A delivery's membership of the claim index: `parked` keyed followers wait out of it.
const READY: &str = "ready";
const PARKED: &str = "parked";

pub(crate) struct MongoStore {
    ns: Namespace,
    conn: std::sync::Arc<Connection>,
    /// This store instance, recorded on the lanes it holds: a restarted process that reuses its
    /// owner name never adopts the live lanes of its dead predecessor.
    holder: String,
    /// Lanes whose losses could not be charged (a dead client's transaction still writes them):
    /// when to try again, and how many tries conflicted in a row.
    charge_later: std::sync::Mutex<std::collections::HashMap<i32, (std::time::Instant, u32)>>,
    /// What `bench` has counted of the oplog so far.
    tally: std::sync::Mutex<bench::Tally>,
    /// Tests hold the next completion between its reads and its writes.
    #[cfg(test)]
    completion_pause: std::sync::Mutex<Option<dispatch::tests::Pause>>,
}

impl MongoStore {
    /// The store at `url` in the database `ns` names. Connections open on first use.
    pub(crate) fn open(url: &str, ns: Namespace, options: StoreOptions) -> Result<Self> {
        Ok(Self {
            conn: std::sync::Arc::new(Connection::new(url, ns.schema(), &options)?),
            holder: uuid::Uuid::now_v7().to_string(),
            charge_later: std::sync::Mutex::default(),
            tally: std::sync::Mutex::default(),
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

    async fn schema_status(&self) -> Result<SchemaStatus> {
        self.detect().await
    }

    async fn setup(&self, force: bool) -> Result<SetupOutcome> {
        self.setup_impl(force).await
    }

    async fn upgrade_plan(&self) -> Result<UpgradePlan> {
        self.upgrade_plan_impl().await
    }

    async fn upgrade(
        &self,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        self.upgrade_impl(force, progress).await
    }

    async fn publish(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        self.publish_impl(events).await
    }

    /// Workers learn of new deliveries from a change stream: nothing is held back.
    async fn flush_wake_ups(&self) -> Result<()> {
        Ok(())
    }

    fn wake_ups(&self) -> Option<WakeUps> {
        Some(self.watch())
    }

    fn wake_up_delay(&self) -> Duration {
        wake::DELIVERY_DELAY
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        self.claim_impl(req).await
    }

    async fn complete(&self, tokens: &[LeaseToken], history: bool) -> Result<Vec<String>> {
        self.complete_impl(tokens, history).await
    }

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

    async fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> Result<FailOutcome> {
        self.fail_impl(token, failure, error).await
    }

    async fn renew(&self, owner: &str, lease: Duration, running: &[String]) -> Result<u64> {
        self.renew_impl(owner, lease, running).await
    }

    async fn release(&self, owner: &str, aborted: &[LeaseToken]) -> Result<u64> {
        self.release_impl(owner, aborted).await
    }

    async fn due_exists(&self, handlers: &[String]) -> Result<bool> {
        self.due_exists_impl(handlers).await
    }

    async fn list_deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
        self.list_deliveries_impl(filter).await
    }

    async fn show_delivery(&self, id: &str) -> Result<Option<DeliveryDetail>> {
        self.show_delivery_impl(id).await
    }

    async fn show_event(&self, id: &str) -> Result<Option<EventDetail>> {
        self.show_event_impl(id).await
    }

    async fn count_dead(&self, selector: &RequeueSelector) -> Result<i64> {
        self.count_dead_impl(selector).await
    }

    async fn requeue(&self, selector: &RequeueSelector) -> Result<Vec<String>> {
        self.requeue_impl(selector).await
    }

    async fn purge_count(&self, options: &PurgeOptions) -> Result<PurgeCounts> {
        self.purge_count_impl(options).await
    }

    async fn purge_batch(&self, kind: PurgeKind, age: Duration, batch: i64) -> Result<PurgeBatch> {
        self.purge_batch_impl(kind, age, batch).await
    }

    async fn lanes(&self) -> Result<Vec<LaneRow>> {
        self.lanes_impl().await
    }

    async fn stats(&self) -> Result<Vec<HandlerStats>> {
        self.stats_impl().await
    }

    fn client_counts(&self) -> ClientCounts {
        self.conn.counts()
    }

    async fn doctor(&self) -> Result<Vec<crate::store::doctor::Check>> {
        self.doctor_impl().await
    }
}
