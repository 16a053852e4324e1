//! How a store behaves beyond where it connects: every default in one place.

use std::time::Duration;

use crate::bounds::Bounds;

/// What a command asks of its store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Connections at most.
    pub pool_size: usize,
    /// Send wake-ups after publishing (workers of this store learn of new work sooner).
    pub notify: bool,
    /// Long-lived stores (workers, publishers) tune their sessions for the delivery path: each
    /// statement is planned once, for every call. One-shot commands keep the server's settings.
    pub long_lived: bool,
    /// Prepare each statement once per connection; off for poolers that cannot keep prepared
    /// statements (PgBouncer before 1.21 in transaction mode).
    pub prepared_statements: bool,
    /// How long a schema change waits for a lock before it gives up, having changed nothing.
    pub lock_timeout: Duration,
    /// Which store instance this is, recorded beside the owner name on the lanes it holds: a
    /// restarted process that reuses its owner name never adopts the live lanes of its dead
    /// predecessor. Random per set of options; a clone continues the same instance.
    pub instance: String,
}

impl StoreOptions {
    pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
    pub const LOCK_TIMEOUT_BOUNDS: Bounds = Bounds::POSITIVE_UP_TO_A_DAY;
    /// A worker's connections, unless told otherwise.
    pub const WORKER_POOL_SIZE: usize = 10;

    /// For one-shot commands: two connections, no wake-ups, the server's own session settings.
    pub fn admin() -> Self {
        Self {
            pool_size: 2,
            notify: false,
            long_lived: false,
            prepared_statements: true,
            lock_timeout: Self::LOCK_TIMEOUT,
            instance: uuid::Uuid::now_v7().simple().to_string(),
        }
    }

    /// For publishers: one connection publishes, the second sends the coalesced wake-up, which
    /// must not hold up the next publish.
    pub fn publisher() -> Self {
        Self {
            pool_size: 2,
            notify: true,
            long_lived: true,
            ..Self::admin()
        }
    }

    /// For workers: their pool, no wake-ups of their own.
    pub fn worker(pool_size: usize) -> Self {
        Self {
            pool_size,
            notify: false,
            long_lived: true,
            ..Self::admin()
        }
    }
}
