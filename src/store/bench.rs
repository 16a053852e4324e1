//! What `relaybus bench` needs of a store beyond the `Store` trait: the server's own counters,
//! a backlog written directly, the state the exactness check reads, and the raw floors the
//! figures are held against. Each engine measures in its own terms (WAL on PostgreSQL), so
//! counters are named, not typed.

use std::collections::BTreeMap;
use std::future::Future;

use serde::Serialize;

use super::{NewEvent, Result, Store};

/// Server counters at one moment; a sample reports the difference of two.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerCounters {
    /// Server-wide totals by name (`transactions`, `wal_bytes`, ...).
    #[serde(flatten)]
    pub totals: BTreeMap<String, i64>,
    /// Per table (without the prefix): rows inserted, updated, HOT-updated, deleted.
    pub tables: BTreeMap<String, [i64; 4]>,
}

impl ServerCounters {
    /// `self - before`.
    pub fn since(&self, before: &ServerCounters) -> ServerCounters {
        ServerCounters {
            totals: self
                .totals
                .iter()
                .map(|(k, v)| (k.clone(), v - before.totals.get(k).copied().unwrap_or(0)))
                .collect(),
            tables: self
                .tables
                .iter()
                .map(|(k, a)| {
                    let b = before.tables.get(k).copied().unwrap_or_default();
                    (
                        k.clone(),
                        [a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]],
                    )
                })
                .collect(),
        }
    }
}

/// A dispatch backlog: events `e0` .. `e{events - 1}`, keyed `k{n % key_modulus}` when a
/// modulus is given, one delivery per handler, with per-key sequences in the order of the
/// numbers.
#[derive(Clone, Debug)]
pub struct Backlog {
    pub events: u64,
    pub handlers: Vec<String>,
    pub key_modulus: Option<u64>,
}

/// Deliveries left in the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub total: i64,
    pub pending: i64,
    pub dead: i64,
}

pub trait BenchStore: Store {
    fn server_counters(&self) -> impl Future<Output = Result<ServerCounters>> + Send;

    /// The server's version and the settings a report records.
    fn server_settings(&self) -> impl Future<Output = Result<BTreeMap<String, String>>> + Send;

    /// The namespaces on the server that hold a relaybus store, the benchmark's own aside.
    fn stores(&self) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Writes a backlog directly. `settle` leaves the store as a long-running one would be
    /// (cleaned up, statistics fresh, nothing waiting to be flushed), so a sample's counters
    /// start clean; without it only the planner's statistics are refreshed.
    fn preload(&self, backlog: &Backlog, settle: bool) -> impl Future<Output = Result<()>> + Send;

    fn delivery_counts(&self) -> impl Future<Output = Result<DeliveryCounts>> + Send;

    /// (event id, handler) of every pending delivery.
    fn pending(&self) -> impl Future<Output = Result<Vec<(String, String)>>> + Send;

    /// Removes the benchmark's namespace with everything in it.
    fn drop_namespace(&self) -> impl Future<Output = Result<()>> + Send;

    /// The floor of publishing: the same rows as a publish of `events`, written the plainest
    /// way the engine knows.
    fn floor_publish(&self, events: &[NewEvent]) -> impl Future<Output = Result<()>> + Send;

    /// The floor of dispatch: deletes up to `batch` pending deliveries; returns how many.
    fn floor_dispatch(&self, batch: i64) -> impl Future<Output = Result<u64>> + Send;
}
