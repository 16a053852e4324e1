//! The store engine: the data model of relaybus 0.2 behind one trait, so every command works the
//! same on any store. Domain types and errors live here; `postgres` is the implementation.
//! Nothing in this module knows about the command line.

mod error;
mod ident;
pub mod lane;
pub mod postgres;
mod types;

use std::future::Future;

pub use error::StoreError;
pub use ident::Namespace;
pub use types::*;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A store sends at most one wake-up notification per interval, after the publishes' commits;
/// workers know it, so they can tell how long a wake-up may lag behind a commit.
pub const NOTIFY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// What every store does. Futures are `Send` so a store can serve many tasks of the dispatcher.
pub trait Store: Send + Sync + 'static {
    /// The installed schema version, read without writing anything.
    fn schema_status(&self) -> impl Future<Output = Result<SchemaStatus>> + Send;

    /// Installs or converts in place, under the store's setup lock. Refuses a 0.1 store with
    /// live leases unless `force`.
    fn setup(&self, force: bool) -> impl Future<Output = Result<SetupOutcome>> + Send;

    /// What `upgrade` would do, read inside one read-only transaction.
    fn upgrade_plan(&self) -> impl Future<Output = Result<UpgradePlan>> + Send;

    /// Runs the 0.1 -> 0.2 conversion in one transaction, reporting each step as it starts.
    fn upgrade(
        &self,
        force: bool,
        progress: &(dyn Fn(&UpgradeStep, usize, usize) + Sync),
    ) -> impl Future<Output = Result<SetupOutcome>> + Send;

    /// Publishes one batch atomically; returns the deliveries that were new.
    fn publish(
        &self,
        events: &[NewEvent],
    ) -> impl Future<Output = Result<Vec<PublishedDelivery>>> + Send;

    /// Wakes idle workers now (publishes already coalesce their own wake-ups).
    fn notify(&self) -> impl Future<Output = Result<()>> + Send;

    /// Claims due deliveries for a worker in one short transaction.
    fn claim(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<(Vec<ClaimedDelivery>, postgres::ClaimStats)>> + Send;

    /// Deletes the deliveries whose tokens are still valid; returns their ids.
    fn complete(
        &self,
        tokens: &[LeaseToken],
        history: bool,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Reschedules or buries one delivery; false when its lease was lost.
    fn fail(
        &self,
        token: &LeaseToken,
        failure: &Failure,
        error: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Extends the leases of the lanes the owner runs work in; returns how many.
    fn renew(
        &self,
        owner: &str,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Releases aborted deliveries (no attempt charged) and hands back every lane of the owner.
    fn release(
        &self,
        owner: &str,
        aborted: &[LeaseToken],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Whether any delivery of these handlers is due.
    fn due_exists(&self, handlers: &[String]) -> impl Future<Output = Result<bool>> + Send;

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

    /// How many dead deliveries a requeue would select.
    fn count_dead(&self, selector: &RequeueSelector) -> impl Future<Output = Result<i64>> + Send;

    /// Makes the selected dead deliveries pending, due now, with a fresh attempt budget, in one
    /// transaction; returns their ids.
    fn requeue(
        &self,
        selector: &RequeueSelector,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// What `purge` would delete.
    fn purge_count(
        &self,
        options: &PurgeOptions,
    ) -> impl Future<Output = Result<PurgeCounts>> + Send;

    /// Deletes one bounded batch of one kind of expired rows.
    fn purge_batch(
        &self,
        kind: PurgeKind,
        age: std::time::Duration,
        batch: i64,
    ) -> impl Future<Output = Result<PurgeBatch>> + Send;

    fn lanes(&self) -> impl Future<Output = Result<Vec<LaneRow>>> + Send;

    fn stats(&self) -> impl Future<Output = Result<Vec<HandlerStats>>> + Send;
}

/// Retention: dead deliveries, then completed rows kept from 0.1, the completion history, and
/// last the events left without deliveries (so events freed by this purge go too), each in
/// bounded batches so that no statement holds its locks for long. `progress` sees the running
/// totals after every batch.
pub async fn purge<S: Store>(
    store: &S,
    options: &PurgeOptions,
    progress: impl Fn(&PurgeCounts),
) -> Result<PurgeCounts> {
    let mut done = PurgeCounts::default();
    let steps = [
        (PurgeKind::Dead, options.dead_older_than),
        (PurgeKind::Completed, options.completed_older_than),
        (PurgeKind::History, options.completed_older_than),
        (PurgeKind::Events, options.completed_older_than),
    ];
    for (kind, age) in steps {
        let Some(age) = age else { continue };
        loop {
            let batch = store.purge_batch(kind, age, options.batch).await?;
            let total = match kind {
                PurgeKind::Dead => &mut done.dead,
                PurgeKind::Completed => &mut done.completed,
                PurgeKind::History => &mut done.history,
                PurgeKind::Events => &mut done.events,
            };
            *total += batch.deleted;
            progress(&done);
            if !batch.more {
                break;
            }
        }
    }
    Ok(done)
}
