//! The store engine: the data model of relaybus 0.2 behind one trait, so every command and the
//! dispatcher work the same on any store. `open` picks the engine from the URL; the types,
//! errors, options and rules here name no engine. Nothing in this module knows about the
//! command line.

mod any;
pub mod bench;
mod connstr;
pub mod doctor;
mod engine;
mod error;
pub mod handlers;
mod ident;
pub mod lane;
mod mongo;
mod options;
mod postgres;
mod replay;
mod retention;
mod status;
mod types;
mod wake;

use std::future::Future;
use std::time::Duration;

pub use any::{namespace, open, schema_script, AnyStore};
pub use connstr::redact;
use connstr::{refuse_ambiguous, unparsable};
pub use engine::Engine;
pub use error::{BoxError, StoreError};
pub use ident::Namespace;
pub use options::StoreOptions;
pub use replay::{
    replay, EventFilter, EventPosition, EventRow, ReplayOptions, ReplayTally, TargetState,
};
pub use retention::purge;
pub use status::{
    ContractPlan, Conversion, Expansion, ForeignIndex, LiveLeases, Locks, SchemaStatus,
    SetupOutcome, UpgradeCounts, UpgradePlan, UpgradeProgress, UpgradeStep, SCHEMA_VERSION,
};
pub use types::*;
pub use wake::{WakeUp, WakeUps};

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The store's traits, for code that calls a store's methods on a concrete type.
pub mod prelude {
    pub use super::{
        DeadLetters, Dispatch, Doctor, Handlers, History, Inspect, Publish, Retention, Schema,
        SqlHandler, Store, Wake,
    };
}

/// What every store does: each topic is a trait of its own, which each engine implements beside
/// its code; a store is all of them. Futures are `Send` so a store can serve many tasks of the
/// dispatcher.
pub trait Store:
    Schema
    + Doctor
    + Publish
    + Wake
    + Dispatch
    + SqlHandler
    + Inspect
    + DeadLetters
    + Retention
    + Handlers
    + History
{
    /// Where the store lives.
    fn namespace(&self) -> &Namespace;

    /// Fails with the error a command should show unless the schema is current.
    fn require_current(&self) -> impl Future<Output = Result<()>> + Send {
        async move {
            match self.version_status().await?.error(self.namespace()) {
                None => Ok(()),
                Some(e) => Err(e),
            }
        }
    }

    /// What this store has sent so far.
    fn client_counts(&self) -> ClientCounts;
}

/// Which schema script to render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Script {
    /// The complete install, for an empty database.
    Install,
    /// The in-place conversion of a 0.1 store, ending with the install.
    ConvertFrom01,
    /// The least privileges a runtime role needs, for the role named.
    Grants { role: String },
}

/// Installing, detecting and converting the schema.
pub trait Schema: Send + Sync + 'static {
    /// The installed schema, read without writing anything: the catalog, the version, and on
    /// MongoDB the documents, which an install applied over a 0.1 store leaves unconverted
    /// (read through, so only `setup`, `upgrade` and `doctor` ask).
    fn schema_status(&self) -> impl Future<Output = Result<SchemaStatus>> + Send;

    /// What every other command checks before it works: the catalog and the version alone.
    fn version_status(&self) -> impl Future<Output = Result<SchemaStatus>> + Send {
        self.schema_status()
    }

    /// Installs or converts in place, under the store's setup lock. Refuses a 0.1 store with
    /// live leases unless `force`.
    fn setup(&self, force: bool) -> impl Future<Output = Result<SetupOutcome>> + Send;

    /// What `upgrade` would do, read without writing anything.
    fn upgrade_plan(&self, how: Conversion) -> impl Future<Output = Result<UpgradePlan>> + Send;

    /// What `upgrade --contract` would do, read without writing anything: None unless the
    /// store is expanded.
    fn contract_plan(&self) -> impl Future<Output = Result<Option<ContractPlan>>> + Send;

    /// Ends the expansion an online conversion left: removes what only 0.1 publishers needed,
    /// so that the store is exactly a fresh install. Refuses, changing nothing, while a 0.1
    /// write came within `quiet_for`, unless `force`. Returns the expansion it ended, or None
    /// when the store was not expanded.
    fn contract(
        &self,
        quiet_for: Duration,
        force: bool,
    ) -> impl Future<Output = Result<Option<Expansion>>> + Send;

    /// Runs the 0.1 -> 0.2 conversion atomically, reporting each step as it starts (step, its
    /// number from 1, how many). On a store that is not at 0.1 it changes nothing.
    fn upgrade(
        &self,
        how: Conversion,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> impl Future<Output = Result<SetupOutcome>> + Send;
}

/// The engine's own checks for `doctor`.
pub trait Doctor: Send + Sync + 'static {
    /// The engine's own checks for `doctor`: drift of the installed schema from this version's
    /// (each with the statements that repair it), and what only this engine can see. Changes
    /// nothing.
    fn doctor(&self) -> impl Future<Output = Result<Vec<doctor::Check>>> + Send;
}

/// Publishing events.
pub trait Publish: Send + Sync + 'static {
    /// Publishes one batch atomically; returns the deliveries that were new.
    fn publish(
        &self,
        events: &[NewEvent],
    ) -> impl Future<Output = Result<Vec<PublishedDelivery>>> + Send;
}

/// Telling workers of new work.
pub trait Wake: Send + Sync + 'static {
    /// Sends any wake-up this store is holding back, for a caller about to exit.
    fn flush_wake_ups(&self) -> impl Future<Output = Result<()>> + Send;

    /// A subscription to wake-ups, when the store can tell its workers of new work.
    fn wake_ups(&self) -> Option<WakeUps>;

    /// How long after a commit a publishing store may hold back its wake-up: for that long
    /// after finding work, a worker polls briskly instead of waiting for one.
    fn wake_up_delay(&self) -> Duration;
}

/// The delivery path: claims, outcomes, leases.
pub trait Dispatch: Send + Sync + 'static {
    /// Claims due deliveries for a worker atomically.
    fn claim(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<(Vec<ClaimedDelivery>, ClaimStats)>> + Send;

    /// Deletes the deliveries whose tokens are still valid; returns their ids.
    fn complete(
        &self,
        tokens: &[LeaseToken],
        history: bool,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Records a failed attempt: rescheduled, or buried at the handler's last attempt or when
    /// rejected.
    fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> impl Future<Output = Result<FailOutcome>> + Send;

    /// Extends the leases of the owner's lanes that list one of `running` (the deliveries the
    /// worker has not finished) in flight; returns how many. A lane that runs none of them is
    /// left to expire, so that no lane is held by a worker that does nothing in it.
    fn renew(
        &self,
        owner: &str,
        lease: Duration,
        running: &[String],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Whether the owner still holds the token's lane at the token's epoch with the delivery in
    /// flight; if so its lease is extended by `lease`. A worker asks before it starts a handler
    /// whose lease its own clock cannot vouch for.
    fn confirm(
        &self,
        owner: &str,
        lease: Duration,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Releases aborted deliveries (no attempt charged) and hands back every lane of the owner.
    fn release(
        &self,
        owner: &str,
        aborted: &[LeaseToken],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// The sessions that block this store's busy sessions, for a worker to name when one of its
    /// operations stalls. Empty when the engine cannot tell.
    fn blockers(&self) -> impl Future<Output = Result<Vec<BlockingSession>>> + Send {
        async { Ok(vec![]) }
    }

    /// Whether any delivery of these handlers is due.
    fn due_exists(&self, handlers: &[String]) -> impl Future<Output = Result<bool>> + Send;
}

/// A SQL handler's statement, run in the store with its delivery's completion.
pub trait SqlHandler: Send + Sync + 'static {
    /// Checks a handler's statement against the store's database without running it, with the
    /// parameters `complete_with_statement` binds.
    fn check_statement(&self, statement: &str) -> impl Future<Output = Result<()>> + Send;

    /// Runs a handler's statement with the delivery's envelope as parameters and completes the
    /// delivery, in one transaction: both commit or neither does, so after any crash the
    /// statement's effect exists once per delivery. `timeout` bounds the statement.
    fn complete_with_statement(
        &self,
        delivery: &ClaimedDelivery,
        statement: &str,
        timeout: Duration,
        history: bool,
    ) -> impl Future<Output = Result<StatementOutcome>> + Send;
}

/// What operators read: deliveries, events, lanes and per-handler figures.
pub trait Inspect: Send + Sync + 'static {
    /// Deliveries matching a filter, in creation order (completed ones newest first).
    fn list_deliveries(
        &self,
        filter: &DeliveryFilter,
    ) -> impl Future<Output = Result<Vec<DeliveryRow>>> + Send;

    fn show_delivery(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<DeliveryDetail>>> + Send;

    fn show_event(&self, id: &str) -> impl Future<Output = Result<Option<EventDetail>>> + Send;

    fn lanes(&self) -> impl Future<Output = Result<Vec<LaneRow>>> + Send;

    fn stats(&self) -> impl Future<Output = Result<Vec<HandlerStats>>> + Send;

    /// One handler's newest `limit` dead letters and its `limit` keys with the most pending
    /// deliveries. Reads the handler's pending deliveries, as `stats` reads every handler's.
    fn backlog(
        &self,
        handler: &str,
        limit: i64,
    ) -> impl Future<Output = Result<HandlerBacklog>> + Send;

    /// Whether any event carries the name. It stops at the first event found; for a name no
    /// event carries (a typo) it reads every event.
    fn event_named(&self, name: EventName<'_>) -> impl Future<Output = Result<bool>> + Send;

    /// The ids of deliveries or events that begin or end with `part`, at most `limit`, in id
    /// order: what a shortened id stands for. Reads them through.
    fn ids_like(
        &self,
        record: Record,
        part: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
}

/// The events as history: listed by a filter, and given to a handler again (`replay`).
pub trait History: Send + Sync + 'static {
    /// How many events match the filter.
    fn count_events(&self, filter: &EventFilter) -> impl Future<Output = Result<i64>> + Send;

    /// The events matching the filter in publish order (creation time, then id), at most
    /// `limit`; with `target`, each with the state of its delivery for that handler.
    fn events(
        &self,
        filter: &EventFilter,
        limit: i64,
        target: Option<&str>,
    ) -> impl Future<Output = Result<Vec<EventRow>>> + Send;

    /// In one transaction, gives each of `events` (in publish order) a delivery for `handler`
    /// as a publish would have (the lane of its key, the next sequences of its key) and adds
    /// the handler to its handlers, unless the event is gone, already has a live delivery for
    /// it, or (without `again`) was ever published for it. Returns the ids of the events given
    /// a delivery.
    fn replay_events(
        &self,
        handler: &str,
        events: &[EventRow],
        again: bool,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
}

/// Pauses and circuit breakers (`handlers::HandlerRow`), shared by every worker of the
/// store.
pub trait Handlers: Send + Sync + 'static {
    /// Every row of the handlers table, by handler.
    fn handler_rows(&self) -> impl Future<Output = Result<Vec<handlers::HandlerRow>>> + Send;

    /// Applies `change` to one handler's row (the defaults when it has none) atomically,
    /// and writes it when it returns true; returns what was written. `change` may be called
    /// again when another change got there first.
    fn change_handler(
        &self,
        handler: &str,
        change: &(dyn Fn(&mut handlers::HandlerRow) -> bool + Sync),
    ) -> impl Future<Output = Result<Option<handlers::HandlerRow>>> + Send;

    /// Removes one handler's row; false when it had none.
    fn forget_handler(&self, handler: &str) -> impl Future<Output = Result<bool>> + Send;
}

/// Dead letters brought back.
pub trait DeadLetters: Send + Sync + 'static {
    /// How many dead deliveries a requeue would select.
    fn count_dead(&self, selector: &RequeueSelector) -> impl Future<Output = Result<i64>> + Send;

    /// Makes the selected dead deliveries pending, due now, with a fresh attempt budget,
    /// atomically; returns their ids.
    fn requeue(
        &self,
        selector: &RequeueSelector,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
}

/// Deleting what retention allows, in bounded batches.
pub trait Retention: Send + Sync + 'static {
    /// What `purge` would delete.
    fn purge_count(
        &self,
        options: &PurgeOptions,
    ) -> impl Future<Output = Result<PurgeCounts>> + Send;

    /// Deletes one bounded batch of one kind of expired rows.
    fn purge_batch(
        &self,
        kind: PurgeKind,
        age: Duration,
        batch: i64,
    ) -> impl Future<Output = Result<PurgeBatch>> + Send;
}
