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

    /// Wakes idle workers; callers coalesce (see `Notifier`).
    fn notify(&self) -> impl Future<Output = Result<()>> + Send;
}
