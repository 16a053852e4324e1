//! What keeps a running worker from working, seen from inside: outcomes the database does not
//! take, operations that wait past the stall bound, handlers that cannot be started. Each is
//! logged when it begins and when it ends, and `/readyz` reports it while it lasts; claims wait
//! while outcomes cannot be recorded, so a worker whose completions fail does not run more
//! deliveries than it can account for. A worker never stops working without saying so.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backoff::Backoff;

pub struct Health {
    /// Operations retrying to record an outcome (a completion, a failed attempt, a statement).
    unrecorded: watch::Sender<usize>,
    /// Database operations in progress, by a number of their own (see `watchdog`).
    operations: Mutex<BTreeMap<u64, Operation>>,
    next_operation: AtomicU64,
    /// Operations waiting past the stall bound: what each is, by its number.
    stalled: Mutex<BTreeMap<u64, String>>,
    /// Why handlers cannot be started, while they cannot, and how many starts failed since the
    /// last that succeeded.
    starts_failing: Mutex<Option<(String, u32)>>,
    /// Whether `starts_failing` holds anything: read by every delivery, locked by none.
    starts_failed: AtomicBool,
    /// Why nothing of this worker may be claimed, while nothing may: every handler paused, or
    /// its circuit breaker open. The worker is doing what it was asked, so it is ready.
    held: Mutex<Option<String>>,
}

/// How long a delivery whose handler could not be started waits before it is due again, by the
/// number of starts that failed in a row.
const START_RETRY: Backoff = Backoff::jittered(Duration::from_secs(1), Duration::from_secs(60));

impl Default for Health {
    fn default() -> Self {
        Self {
            unrecorded: watch::channel(0).0,
            operations: Mutex::default(),
            next_operation: AtomicU64::new(0),
            stalled: Mutex::default(),
            starts_failing: Mutex::default(),
            starts_failed: AtomicBool::new(false),
            held: Mutex::default(),
        }
    }
}

/// An operation that could not record an outcome, until it records it or gives up.
pub(super) struct Unrecorded<'a>(&'a Health);

impl Drop for Unrecorded<'_> {
    fn drop(&mut self) {
        let mut last = false;
        self.0.unrecorded.send_modify(|n| {
            *n -= 1;
            last = *n == 0;
        });
        if last {
            tracing::info!("outcomes are recorded again; claiming resumes");
        }
    }
}

/// A database operation in progress.
struct Operation {
    name: &'static str,
    started: Instant,
    /// Reported stalled by the watchdog.
    stalled: bool,
}

/// An operation in progress until dropped; one that was reported stalled says how long it took.
pub(super) struct InProgress<'a>(&'a Health, u64);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        let health = self.0;
        let Some(op) = health
            .operations
            .lock()
            .expect("health lock")
            .remove(&self.1)
        else {
            return;
        };
        if op.stalled {
            health.stalled.lock().expect("health lock").remove(&self.1);
            let took = Duration::from_millis(op.started.elapsed().as_millis() as u64);
            tracing::info!(operation = op.name, took = %humantime::format_duration(took), "{} went through", op.name);
        }
    }
}

impl Health {
    /// Counts an operation that could not record an outcome until the guard is dropped. The
    /// first one stops the worker's claims, and says so.
    pub(super) fn unrecorded(&self) -> Unrecorded<'_> {
        let mut first = false;
        self.unrecorded.send_modify(|n| {
            first = *n == 0;
            *n += 1;
        });
        if first {
            tracing::warn!(
                "outcomes cannot be recorded; no new claims and no new handlers until they are"
            );
        }
        Unrecorded(self)
    }

    /// Whether every outcome so far could be recorded.
    pub(super) fn recording(&self) -> bool {
        *self.unrecorded.borrow() == 0
    }

    /// Resolves once every outcome so far could be recorded (at once on the happy path).
    pub(super) async fn outcomes_recorded(&self) {
        if self.recording() {
            return;
        }
        let mut unrecorded = self.unrecorded.subscribe();
        let _ = unrecorded.wait_for(|n| *n == 0).await;
    }

    /// A handler could not be started for lack of resources (no process, no file descriptor):
    /// logged when the shortage begins. Returns how long its delivery waits, longer with each
    /// start that fails in a row.
    pub(super) fn start_failed(&self, error: &str) -> Duration {
        let mut failing = self.starts_failing.lock().expect("health lock");
        let failed = match failing.take() {
            None => {
                tracing::error!(
                    error,
                    "handlers cannot be started; their deliveries are released without an \
                     attempt until they can"
                );
                1
            }
            Some((_, n)) => n.saturating_add(1),
        };
        *failing = Some((error.to_owned(), failed));
        self.starts_failed.store(true, Ordering::Relaxed);
        START_RETRY.delay(failed)
    }

    /// A handler was started: a shortage, if there was one, is over.
    pub(super) fn started(&self) {
        if !self.starts_failed.load(Ordering::Relaxed) {
            return;
        }
        if self
            .starts_failing
            .lock()
            .expect("health lock")
            .take()
            .is_some()
        {
            tracing::info!("handlers can be started again");
        }
        self.starts_failed.store(false, Ordering::Relaxed);
    }

    /// Ready unless something keeps the worker from working; otherwise why not.
    /// Says why nothing of this worker may be claimed (None: something may).
    pub(super) fn set_held(&self, why: Option<String>) {
        *self.held.lock().expect("health lock") = why;
    }

    /// Why nothing of this worker may be claimed, while nothing may.
    pub(super) fn held(&self) -> Option<String> {
        self.held.lock().expect("health lock").clone()
    }

    pub fn readiness(&self) -> Result<(), String> {
        if *self.unrecorded.borrow() > 0 {
            return Err("outcomes cannot be recorded; claims wait for them".into());
        }
        if let Some(what) = self.stalled.lock().expect("health lock").values().next() {
            return Err(format!("stalled: {what}"));
        }
        if let Some((error, _)) = &*self.starts_failing.lock().expect("health lock") {
            return Err(format!("handlers cannot be started: {error}"));
        }
        Ok(())
    }

    /// Counts an operation in progress until the guard is dropped.
    pub(super) fn begin(&self, name: &'static str) -> InProgress<'_> {
        let id = self.next_operation.fetch_add(1, Ordering::Relaxed);
        let op = Operation {
            name,
            started: Instant::now(),
            stalled: false,
        };
        self.operations.lock().expect("health lock").insert(id, op);
        InProgress(self, id)
    }

    /// The operations that have waited past `bound` and were not reported yet, now marked.
    pub(super) fn newly_stalled(&self, bound: Duration) -> Vec<(u64, &'static str)> {
        let mut operations = self.operations.lock().expect("health lock");
        operations
            .iter_mut()
            .filter(|(_, op)| !op.stalled && op.started.elapsed() >= bound)
            .map(|(id, op)| {
                op.stalled = true;
                (*id, op.name)
            })
            .collect()
    }

    /// Reports an operation stalled, for `/readyz`, unless it ended meanwhile.
    pub(super) fn mark_stalled(&self, id: u64, what: String) {
        let operations = self.operations.lock().expect("health lock");
        if operations.contains_key(&id) {
            self.stalled.lock().expect("health lock").insert(id, what);
        }
    }
}
