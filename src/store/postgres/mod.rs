//! The PostgreSQL store: connections, the statements of `sql/postgres/` rendered for one
//! namespace, schema management, the delivery path, wake-ups and the operator's queries.
//! `docs/design/delivery-path.md` says why the delivery path's statements are shaped as they
//! are.

mod admin;
mod bench;
mod conn;
mod conninfo;
mod dispatch;
mod doctor;
mod publish;
mod schema;
mod sql;
mod statement;
#[cfg(test)]
mod testing;
mod wake;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use conn::{ConnectOptions, Pool};
use sql::Statements;
use wake::Notifier;

pub(crate) use schema::script;

use crate::store::*;

pub(crate) struct PgStore {
    ns: Namespace,
    pool: Arc<Pool>,
    sql: Arc<Statements>,
    notifier: Arc<Notifier>,
    lock_timeout: Duration,
    /// Set when a batch held an event published before, cleared by a batch that held none:
    /// while set, batches skip `publish_new.sql`, whose failure on a republish the server logs.
    republishing: AtomicBool,
}

impl PgStore {
    /// The store at `url` (None: the libpq variables). Connections open on first use.
    pub(crate) fn open(url: Option<&str>, ns: Namespace, options: StoreOptions) -> Result<Self> {
        let pool = Arc::new(Pool::new(ConnectOptions::resolve(url)?, &options));
        let sql = Arc::new(Statements::render(&ns));
        Ok(Self {
            notifier: Notifier::new(
                Arc::clone(&pool),
                sql.notify.clone(),
                wake::channel(&ns),
                options.notify,
            ),
            lock_timeout: options.lock_timeout,
            republishing: AtomicBool::new(false),
            sql,
            ns,
            pool,
        })
    }
}

impl Store for PgStore {
    fn namespace(&self) -> &Namespace {
        &self.ns
    }

    async fn schema_status(&self) -> Result<SchemaStatus> {
        let conn = self.pool.get().await?;
        self.detect(&conn.client).await
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

    async fn flush_wake_ups(&self) -> Result<()> {
        self.notifier.flush().await
    }

    fn wake_ups(&self) -> Option<WakeUps> {
        Some(wake::listen(
            self.pool.options().clone(),
            wake::channel(&self.ns),
        ))
    }

    fn wake_up_delay(&self) -> Duration {
        wake::NOTIFY_INTERVAL
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        self.claim_impl(req).await
    }

    async fn complete(&self, tokens: &[LeaseToken], history: bool) -> Result<Vec<String>> {
        self.complete_impl(tokens, history).await
    }

    async fn check_statement(&self, statement: &str) -> Result<()> {
        self.check_statement_impl(statement).await
    }

    async fn complete_with_statement(
        &self,
        delivery: &ClaimedDelivery,
        statement: &str,
        timeout: Duration,
        history: bool,
    ) -> Result<StatementOutcome> {
        self.complete_with_statement_impl(delivery, statement, timeout, history)
            .await
    }

    async fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> Result<FailOutcome> {
        self.fail_impl(token, failure, error).await
    }

    async fn blockers(&self) -> Result<Vec<BlockingSession>> {
        self.blockers_impl().await
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
        self.pool.counts()
    }

    async fn doctor(&self) -> Result<Vec<crate::store::doctor::Check>> {
        self.doctor_impl().await
    }
}
