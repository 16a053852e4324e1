//! The PostgreSQL store: connections, the rendered statements, schema management and the
//! delivery path. Statements are rendered once per store for its namespace; each is prepared
//! once per connection.

mod admin;
mod conn;
mod dispatch;
mod notify;
mod publish;
mod schema;

use std::sync::Arc;

pub use conn::{redact_url, ConnectOptions};
pub use dispatch::ClaimStats;
pub use schema::{conversion_script, install_script};

use conn::{Pool, Sql};
use notify::Notifier;
use tokio_postgres::types::Type;

use crate::store::{
    ClaimRequest, ClaimedDelivery, DeliveryDetail, DeliveryFilter, DeliveryRow, EventDetail,
    Failure, HandlerStats, LaneRow, LeaseToken, Namespace, NewEvent, PublishedDelivery, PurgeBatch,
    PurgeCounts, PurgeKind, PurgeOptions, RequeueSelector, Result, SchemaStatus, SetupOutcome,
    Store, UpgradePlan, UpgradeStep,
};

/// The statements of one store, rendered for its namespace.
pub(crate) struct Statements {
    publish: Sql,
    claim: Sql,
    complete: Sql,
    complete_with_history: Sql,
    fail: Sql,
    renew: Sql,
    release: Sql,
    due_exists: Sql,
}

/// The wake-up notification's slot; the others follow in `Statements::render`.
const SLOT_NOTIFY: usize = 0;

impl Statements {
    fn render(ns: &Namespace) -> Self {
        let mut slot = SLOT_NOTIFY;
        let mut sql = |text: &str, types: &'static [Type]| {
            slot += 1;
            Sql {
                slot,
                text: ns.render(text),
                types,
            }
        };
        Self {
            publish: sql(publish::PUBLISH, publish::PUBLISH_TYPES),
            claim: sql(dispatch::CLAIM, dispatch::CLAIM_TYPES),
            complete: sql(dispatch::COMPLETE, dispatch::COMPLETE_TYPES),
            complete_with_history: sql(dispatch::COMPLETE_WITH_HISTORY, dispatch::COMPLETE_TYPES),
            fail: sql(dispatch::FAIL, dispatch::FAIL_TYPES),
            renew: sql(dispatch::RENEW, dispatch::RENEW_TYPES),
            release: sql(dispatch::RELEASE, dispatch::RELEASE_TYPES),
            due_exists: sql(dispatch::DUE_EXISTS, dispatch::DUE_EXISTS_TYPES),
        }
    }
}

pub struct PgStore {
    ns: Namespace,
    pool: Arc<Pool>,
    sql: Statements,
    notifier: Arc<Notifier>,
}

/// How a store behaves beyond where it connects.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub pool_size: usize,
    /// Send wake-up notifications after publishing (`false` for poolers that cannot LISTEN).
    pub notify: bool,
}

impl StoreOptions {
    /// For one-shot commands: two connections, no wake-ups.
    pub fn admin() -> Self {
        Self {
            pool_size: 2,
            notify: false,
        }
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            pool_size: 10,
            notify: true,
        }
    }
}

impl PgStore {
    /// Creates the store; connections open on first use.
    pub fn new(connect: ConnectOptions, ns: Namespace, options: StoreOptions) -> Self {
        let pool = Arc::new(Pool::new(connect, options.pool_size));
        // A wake-up lost in a crash only costs latency, so its commit does not wait for the WAL
        // flush (the setting lasts for this statement's own transaction, also behind a pooler).
        let notify_sql = Sql {
            slot: SLOT_NOTIFY,
            text: format!(
                "SELECT set_config('synchronous_commit', 'off', true), pg_notify('{}', '')",
                ns.render(notify::CHANNEL)
            ),
            types: &[] as &[Type],
        };
        Self {
            notifier: Notifier::new(Arc::clone(&pool), notify_sql, options.notify),
            sql: Statements::render(&ns),
            ns,
            pool,
        }
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// (statements sent, statements the server parsed) by this store so far.
    pub fn statement_counts(&self) -> (u64, u64) {
        self.pool.counts.get()
    }

    /// The channel workers LISTEN on for wake-ups.
    pub fn channel(&self) -> String {
        self.ns.render(notify::CHANNEL)
    }

    /// Where the store connects, for a listener connection of its own.
    pub fn connect_options(&self) -> &ConnectOptions {
        self.pool.options()
    }

    /// Fails with the error a command should show unless the schema is current.
    pub async fn require_current(&self) -> Result<()> {
        let conn = self.pool.get().await?;
        match self.detect(&conn.client).await? {
            SchemaStatus::Current => Ok(()),
            SchemaStatus::V01 => Err(crate::store::StoreError::Outdated),
            SchemaStatus::Newer { version } => Err(crate::store::StoreError::TooNew {
                found: version,
                supported: crate::store::SCHEMA_VERSION.into(),
            }),
            SchemaStatus::NotInstalled | SchemaStatus::Incomplete => {
                Err(crate::store::StoreError::NotInstalled {
                    schema: self.ns.schema().into(),
                    prefix: self.ns.prefix().into(),
                })
            }
        }
    }
}

impl Store for PgStore {
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
        progress: &(dyn Fn(&UpgradeStep, usize, usize) + Sync),
    ) -> Result<SetupOutcome> {
        self.upgrade_impl(force, progress).await
    }

    async fn publish(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        self.publish_impl(events).await
    }

    async fn notify(&self) -> Result<()> {
        self.notifier.send().await;
        Ok(())
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        self.claim_impl(req).await
    }

    async fn complete(&self, tokens: &[LeaseToken], history: bool) -> Result<Vec<String>> {
        self.complete_impl(tokens, history).await
    }

    async fn fail(&self, token: &LeaseToken, failure: &Failure, error: &str) -> Result<bool> {
        self.fail_impl(token, failure, error).await
    }

    async fn renew(&self, owner: &str, lease: std::time::Duration) -> Result<u64> {
        self.renew_impl(owner, lease).await
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

    async fn purge_batch(
        &self,
        kind: PurgeKind,
        age: std::time::Duration,
        batch: i64,
    ) -> Result<PurgeBatch> {
        self.purge_batch_impl(kind, age, batch).await
    }

    async fn lanes(&self) -> Result<Vec<LaneRow>> {
        self.lanes_impl().await
    }

    async fn stats(&self) -> Result<Vec<HandlerStats>> {
        self.stats_impl().await
    }
}

/// Helpers for the plan tests: a large store in a throwaway schema, and generic plans.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::time::Duration;

    pub fn database_url() -> String {
        std::env::var("RELAYBUS_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// `events` events, every other one keyed (1,000 keys), each with deliveries for `h1` and
    /// `h2`; one in a hundred dead. Analyzed, so plans see the sizes.
    pub async fn large_store(name: &str, events: u32) -> PgStore {
        let schema = format!("t{}_{name}", std::process::id());
        let config = ConnectOptions::resolve(Some(&database_url())).unwrap();
        let store = PgStore::new(
            ConnectOptions::new(config, true, Duration::from_secs(10)),
            Namespace::new(&schema, "relaybus_").unwrap(),
            StoreOptions::admin(),
        );
        let conn = store.pool.get().await.unwrap();
        conn.client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .unwrap();
        drop(conn);
        store.setup(false).await.unwrap();
        let (d, e) = (store.ns.table("deliveries"), store.ns.table("events"));
        let key = "CASE WHEN g % 2 = 0 THEN 'key' || (g % 1000) END";
        let conn = store.pool.get().await.unwrap();
        conn.client
            .batch_execute(&format!(
                "INSERT INTO {e} (id, type, key, payload, handlers) \
                   SELECT 'e' || g, 'type' || (g % 10), {key}, '{{}}', '{{h1,h2}}' \
                     FROM generate_series(1, {events}) g; \
                 INSERT INTO {d} (id, event_id, handler, lane, key, sequence, status, last_error) \
                   SELECT 'd' || lpad(g::text, 7, '0') || h, 'e' || g, h, \
                          {schema}.relaybus_lane_of(coalesce({key}, 'e' || g)), {key}, g, \
                          CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'pending' END, \
                          CASE WHEN g % 100 = 0 THEN 'HTTP 500' END \
                     FROM generate_series(1, {events}) g, unnest(ARRAY['h1', 'h2']) h; \
                 ANALYZE {e}; ANALYZE {d}"
            ))
            .await
            .unwrap();
        drop(conn);
        store
    }

    pub async fn drop_store(store: PgStore) {
        let conn = store.pool.get().await.unwrap();
        conn.client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", store.ns.schema()))
            .await
            .unwrap();
    }

    /// The plan the server uses once it settles on a generic plan for a prepared statement
    /// (which the workers' connections force): PREPARE, then EXPLAIN EXECUTE. `args` are SQL
    /// literals; a statement that writes is only planned, not run.
    pub async fn generic_plan(
        store: &PgStore,
        text: &str,
        types: &[&str],
        args: &[String],
    ) -> String {
        let conn = store.pool.get().await.unwrap();
        conn.client
            .batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; PREPARE q ({}) AS {text}",
                types.join(", ")
            ))
            .await
            .unwrap_or_else(|e| panic!("{e:?}: {text}"));
        let rows = conn
            .client
            .query(&format!("EXPLAIN EXECUTE q ({})", args.join(", ")), &[])
            .await
            .unwrap();
        conn.client.batch_execute("DEALLOCATE q").await.unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
