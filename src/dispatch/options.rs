//! What a worker is told: its options and every default, in one place (the command line, the
//! config file and the benchmark all start from these).

use std::time::Duration;

use crate::backoff::Backoff;
use crate::bounds::Bounds;

#[derive(Clone, Debug)]
pub struct DispatchOptions {
    /// This worker instance; unique per process start.
    pub owner: String,
    pub concurrency: usize,
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub lease_duration: Duration,
    pub completion_window: Duration,
    pub shutdown_grace: Duration,
    /// Exit once no due work is left.
    pub drain: bool,
    pub completion_history: bool,
    /// Subscribe to the store's wake-ups; polling alone otherwise.
    pub wake_ups: bool,
    /// A claim, renewal or recording of an outcome that waits this long is reported stalled.
    pub stall_after: Duration,
}

impl DispatchOptions {
    pub const CONCURRENCY: usize = 10;
    pub const BATCH_SIZE: usize = 10;
    pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
    pub const LEASE_DURATION: Duration = Duration::from_secs(30);
    pub const COMPLETION_WINDOW: Duration = Duration::from_millis(2);
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
    pub const STALL_AFTER: Duration = Duration::from_secs(5);

    pub const POLL_INTERVAL_BOUNDS: Bounds = Bounds::POSITIVE_UP_TO_A_DAY;
    /// At least a second: renewals run every third of it, and a lease that expires before its
    /// renewal commits is taken over by its own worker.
    pub const LEASE_DURATION_BOUNDS: Bounds =
        Bounds::new(Duration::from_secs(1), Bounds::UP_TO_A_DAY.max);
    pub const COMPLETION_WINDOW_BOUNDS: Bounds =
        Bounds::new(Duration::ZERO, Duration::from_secs(1));
    pub const SHUTDOWN_GRACE_BOUNDS: Bounds = Bounds::UP_TO_A_DAY;
    /// Claims and completions take milliseconds; a bound under 100 ms would report the
    /// ordinary as stalls.
    pub const STALL_AFTER_BOUNDS: Bounds =
        Bounds::new(Duration::from_millis(100), Bounds::UP_TO_A_DAY.max);

    /// Claims this worker keeps in flight at once. A claim waits on the database for most of
    /// its cycle, and the worker's own work waits for the claim: with slots for two claims of
    /// at least `MIN_STREAM_CLAIM` each, two streams claim side by side, each on lanes of its
    /// own (docs/design/delivery-path.md, "Two claim streams").
    pub fn claim_streams(&self) -> usize {
        if self.batch_size.min(self.concurrency / 2) >= Self::MIN_STREAM_CLAIM {
            2
        } else {
            1
        }
    }

    /// The most deliveries one claim of a stream takes: the batch size, or the slots when that
    /// is less. Two streams may claim the same free slots at once; a delivery that finds none
    /// waits for one (docs/design/delivery-path.md, "Slots are taken, not reserved").
    pub fn claim_size(&self) -> usize {
        self.batch_size.min(self.concurrency)
    }

    /// A second stream's claims are worth their fixed cost only when they are this large.
    const MIN_STREAM_CLAIM: usize = 50;

    /// The defaults, for the worker `owner`.
    pub fn new(owner: String) -> Self {
        Self {
            owner,
            concurrency: Self::CONCURRENCY,
            batch_size: Self::BATCH_SIZE,
            poll_interval: Self::POLL_INTERVAL,
            lease_duration: Self::LEASE_DURATION,
            completion_window: Self::COMPLETION_WINDOW,
            shutdown_grace: Self::SHUTDOWN_GRACE,
            drain: false,
            completion_history: false,
            wake_ups: true,
            stall_after: Self::STALL_AFTER,
        }
    }
}

/// How a handler's failed attempts are retried: exponential back-off with jitter, buried at the
/// last attempt.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub max_attempts: i32,
    pub backoff: Backoff,
}

impl RetryPolicy {
    pub const MAX_ATTEMPTS: i32 = 25;
    pub const RETRY_DELAY: Duration = Duration::from_secs(1);
    pub const RETRY_MAX_DELAY: Duration = Duration::from_secs(3600);
    pub const RETRY_DELAY_BOUNDS: Bounds = Bounds::UP_TO_A_MONTH;
    pub const MAX_ATTEMPTS_LIMIT: i32 = 10_000;
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: Self::MAX_ATTEMPTS,
            backoff: Backoff::jittered(Self::RETRY_DELAY, Self::RETRY_MAX_DELAY),
        }
    }
}
