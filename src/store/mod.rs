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
}
