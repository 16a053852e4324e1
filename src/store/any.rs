//! Opening the engine a URL names (`Engine::of`): `open` returns one type every command uses,
//! and `schema_script` renders an engine's schema without connecting. A second engine is a
//! variant of `Engine` and of `Engines` here, and an arm in `on_engine!`. Why one type forwards
//! rather than commands generic over the engine: `docs/design/engines.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::bench::{Backlog, BenchStore, DeliveryCounts, ServerCounters};
use super::handlers::HandlerRow;
use super::mongo::MongoStore;
use super::postgres::PgStore;
use super::*;

/// Where a store lives on the engine `url` names: on PostgreSQL the schema (default
/// `public`); on MongoDB the database `schema` names, else the URL's, else `relaybus`.
pub fn namespace(url: Option<&str>, schema: Option<&str>, prefix: &str) -> Result<Namespace> {
    match (Engine::of(url)?, url) {
        (Engine::Mongo, Some(url)) => {
            let database = schema
                .map(str::to_owned)
                .or_else(|| super::mongo::url_database(url))
                .unwrap_or_else(|| "relaybus".into());
            Namespace::for_mongo(&database, prefix)
        }
        _ => Namespace::new(schema.unwrap_or("public"), prefix),
    }
}

/// The store at `url` (None: the libpq variables) in `ns`. Connections open on first use.
pub fn open(url: Option<&str>, ns: Namespace, options: StoreOptions) -> Result<AnyStore> {
    Ok(AnyStore(match (Engine::of(url)?, url) {
        (Engine::Mongo, Some(url)) => Engines::Mongo(MongoStore::open(url, ns, options)?),
        _ => Engines::Postgres(PgStore::open(url, ns, options)?),
    }))
}

/// An engine's schema as a script for the operator's own migration tool, rendered without a
/// connection.
pub fn schema_script(engine: Engine, ns: &Namespace, script: &Script) -> Result<String> {
    match engine {
        Engine::Postgres => Ok(super::postgres::script(ns, script)),
        Engine::Mongo => Ok(super::mongo::script(ns, script)),
    }
}

/// Any engine's store.
pub struct AnyStore(Engines);

impl AnyStore {
    pub fn engine(&self) -> Engine {
        match self.0 {
            Engines::Postgres(_) => Engine::Postgres,
            Engines::Mongo(_) => Engine::Mongo,
        }
    }
}

enum Engines {
    Postgres(PgStore),
    Mongo(MongoStore),
}

macro_rules! on_engine {
    ($self:ident, $store:ident => $body:expr) => {
        match &$self.0 {
            Engines::Postgres($store) => $body,
            Engines::Mongo($store) => $body,
        }
    };
}

impl Store for AnyStore {
    fn namespace(&self) -> &Namespace {
        on_engine!(self, s => s.namespace())
    }
    fn client_counts(&self) -> ClientCounts {
        on_engine!(self, s => s.client_counts())
    }
}

impl Schema for AnyStore {
    async fn schema_status(&self) -> Result<SchemaStatus> {
        on_engine!(self, s => s.schema_status().await)
    }

    async fn version_status(&self) -> Result<SchemaStatus> {
        on_engine!(self, s => s.version_status().await)
    }
    async fn setup(&self, force: bool) -> Result<SetupOutcome> {
        on_engine!(self, s => s.setup(force).await)
    }
    async fn upgrade_plan(&self, how: Conversion) -> Result<UpgradePlan> {
        on_engine!(self, s => s.upgrade_plan(how).await)
    }
    async fn upgrade(
        &self,
        how: Conversion,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        on_engine!(self, s => s.upgrade(how, force, progress).await)
    }
    async fn contract_plan(&self) -> Result<Option<ContractPlan>> {
        on_engine!(self, s => s.contract_plan().await)
    }
    async fn contract(&self, quiet_for: Duration, force: bool) -> Result<Option<Expansion>> {
        on_engine!(self, s => s.contract(quiet_for, force).await)
    }
}

impl Doctor for AnyStore {
    async fn doctor(&self) -> Result<Vec<super::doctor::Check>> {
        on_engine!(self, s => s.doctor().await)
    }
}

impl Publish for AnyStore {
    async fn publish(&self, events: &[NewEvent]) -> Result<Vec<PublishedDelivery>> {
        on_engine!(self, s => s.publish(events).await)
    }
}

impl Wake for AnyStore {
    async fn flush_wake_ups(&self) -> Result<()> {
        on_engine!(self, s => s.flush_wake_ups().await)
    }
    fn wake_ups(&self) -> Option<WakeUps> {
        on_engine!(self, s => s.wake_ups())
    }
    fn wake_up_delay(&self) -> Duration {
        on_engine!(self, s => s.wake_up_delay())
    }
}

impl Dispatch for AnyStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<(Vec<ClaimedDelivery>, ClaimStats)> {
        on_engine!(self, s => s.claim(req).await)
    }
    async fn complete(&self, tokens: &[LeaseToken], history: bool) -> Result<Vec<String>> {
        on_engine!(self, s => s.complete(tokens, history).await)
    }
    async fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> Result<FailOutcome> {
        on_engine!(self, s => s.fail(token, failure, error).await)
    }
    async fn blockers(&self) -> Result<Vec<BlockingSession>> {
        on_engine!(self, s => s.blockers().await)
    }
    async fn renew(&self, owner: &str, lease: Duration, running: &[String]) -> Result<u64> {
        on_engine!(self, s => s.renew(owner, lease, running).await)
    }
    async fn confirm(&self, owner: &str, lease: Duration, token: &LeaseToken) -> Result<bool> {
        on_engine!(self, s => s.confirm(owner, lease, token).await)
    }
    async fn release(&self, owner: &str, aborted: &[LeaseToken]) -> Result<u64> {
        on_engine!(self, s => s.release(owner, aborted).await)
    }
    async fn due_exists(&self, handlers: &[String]) -> Result<bool> {
        on_engine!(self, s => s.due_exists(handlers).await)
    }
}

impl Handlers for AnyStore {
    async fn handler_rows(&self) -> Result<Vec<HandlerRow>> {
        on_engine!(self, s => s.handler_rows().await)
    }
    async fn change_handler(
        &self,
        handler: &str,
        change: &(dyn Fn(&mut HandlerRow) -> bool + Sync),
    ) -> Result<Option<HandlerRow>> {
        on_engine!(self, s => s.change_handler(handler, change).await)
    }
    async fn forget_handler(&self, handler: &str) -> Result<bool> {
        on_engine!(self, s => s.forget_handler(handler).await)
    }
}

impl SqlHandler for AnyStore {
    async fn check_statement(&self, statement: &str) -> Result<()> {
        on_engine!(self, s => s.check_statement(statement).await)
    }
    async fn complete_with_statement(
        &self,
        delivery: &ClaimedDelivery,
        statement: &str,
        timeout: Duration,
        history: bool,
    ) -> Result<StatementOutcome> {
        on_engine!(self, s => s.complete_with_statement(delivery, statement, timeout, history).await)
    }
}

impl Inspect for AnyStore {
    async fn list_deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
        on_engine!(self, s => s.list_deliveries(filter).await)
    }
    async fn show_delivery(&self, id: &str) -> Result<Option<DeliveryDetail>> {
        on_engine!(self, s => s.show_delivery(id).await)
    }
    async fn show_event(&self, id: &str) -> Result<Option<EventDetail>> {
        on_engine!(self, s => s.show_event(id).await)
    }
    async fn lanes(&self) -> Result<Vec<LaneRow>> {
        on_engine!(self, s => s.lanes().await)
    }
    async fn stats(&self) -> Result<Vec<HandlerStats>> {
        on_engine!(self, s => s.stats().await)
    }
    async fn backlog(&self, handler: &str, limit: i64) -> Result<HandlerBacklog> {
        on_engine!(self, s => s.backlog(handler, limit).await)
    }
    async fn event_named(&self, name: EventName<'_>) -> Result<bool> {
        on_engine!(self, s => s.event_named(name).await)
    }
    async fn ids_like(&self, record: Record, part: &str, limit: i64) -> Result<Vec<String>> {
        on_engine!(self, s => s.ids_like(record, part, limit).await)
    }
}

impl History for AnyStore {
    async fn count_events(&self, filter: &EventFilter) -> Result<i64> {
        on_engine!(self, s => s.count_events(filter).await)
    }
    async fn events(
        &self,
        filter: &EventFilter,
        limit: i64,
        target: Option<&str>,
    ) -> Result<Vec<EventRow>> {
        on_engine!(self, s => s.events(filter, limit, target).await)
    }
    async fn replay_events(
        &self,
        handler: &str,
        events: &[EventRow],
        again: bool,
    ) -> Result<Vec<String>> {
        on_engine!(self, s => s.replay_events(handler, events, again).await)
    }
}

impl DeadLetters for AnyStore {
    async fn count_dead(&self, selector: &RequeueSelector) -> Result<i64> {
        on_engine!(self, s => s.count_dead(selector).await)
    }
    async fn requeue(&self, selector: &RequeueSelector) -> Result<Vec<String>> {
        on_engine!(self, s => s.requeue(selector).await)
    }
}

impl Retention for AnyStore {
    async fn purge_count(&self, options: &PurgeOptions) -> Result<PurgeCounts> {
        on_engine!(self, s => s.purge_count(options).await)
    }
    async fn purge_batch(&self, kind: PurgeKind, age: Duration, batch: i64) -> Result<PurgeBatch> {
        on_engine!(self, s => s.purge_batch(kind, age, batch).await)
    }
}

impl BenchStore for AnyStore {
    async fn server_counters(&self) -> Result<ServerCounters> {
        on_engine!(self, s => s.server_counters().await)
    }
    async fn server_settings(&self) -> Result<BTreeMap<String, String>> {
        on_engine!(self, s => s.server_settings().await)
    }
    async fn stores(&self) -> Result<Vec<String>> {
        on_engine!(self, s => s.stores().await)
    }
    async fn preload(&self, backlog: &Backlog, settle: bool) -> Result<()> {
        on_engine!(self, s => s.preload(backlog, settle).await)
    }
    async fn delivery_counts(&self) -> Result<DeliveryCounts> {
        on_engine!(self, s => s.delivery_counts().await)
    }
    async fn pending(&self) -> Result<Vec<(String, String)>> {
        on_engine!(self, s => s.pending().await)
    }
    async fn drop_namespace(&self) -> Result<()> {
        on_engine!(self, s => s.drop_namespace().await)
    }
    async fn floor_publish(&self, events: &[NewEvent]) -> Result<()> {
        on_engine!(self, s => s.floor_publish(events).await)
    }
    async fn floor_dispatch(&self, batch: i64) -> Result<u64> {
        on_engine!(self, s => s.floor_dispatch(batch).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_names_the_engine() {
        assert_eq!(Engine::of(None).unwrap(), Engine::Postgres);
        assert_eq!(
            Engine::of(Some("postgresql://h/db")).unwrap(),
            Engine::Postgres
        );
        assert_eq!(
            Engine::of(Some("mongodb+srv://h/db")).unwrap(),
            Engine::Mongo
        );
        assert_eq!(
            Engine::of(Some("host=db dbname=x")).unwrap(),
            Engine::Postgres
        );
        assert_eq!(
            Engine::of(Some("mysql://u:pw@h/db"))
                .unwrap_err()
                .to_string(),
            "unsupported database URL `mysql://u:***@h/db`: use postgres://, postgresql://, \
             key=value pairs (host=... dbname=...), mongodb:// or mongodb+srv://"
        );
    }
}
