//! What keeps a running worker from working, seen from inside: outcomes the database does not
//! take, operations that wait past the stall bound, handlers that cannot be started. Each is
//! logged when it begins and when it ends, and `/readyz` reports it while it lasts; claims wait
//! while outcomes cannot be recorded, so a worker whose completions fail does not run more
//! deliveries than it can account for. A worker never stops working without saying so.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::Reporter;
use crate::backoff::Backoff;
use crate::store::Store;

/// A stalled operation waits this long at most for the list of sessions blocking it.
const BLOCKERS_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Health {
    /// Operations retrying to record an outcome (a completion, a failed attempt, a statement).
    unrecorded: watch::Sender<usize>,
    /// Operations waiting past the stall bound: what each is, by a number of its own.
    stalled: Mutex<BTreeMap<u64, String>>,
    next_stall: AtomicU64,
    /// Why handlers cannot be started, while they cannot, and how many starts failed since the
    /// last that succeeded.
    starts_failing: Mutex<Option<(String, u32)>>,
    /// Whether `starts_failing` holds anything: read by every delivery, locked by none.
    starts_failed: AtomicBool,
}

/// How long a delivery whose handler could not be started waits before it is due again, by the
/// number of starts that failed in a row.
const START_RETRY: Backoff = Backoff::jittered(Duration::from_secs(1), Duration::from_secs(60));

impl Default for Health {
    fn default() -> Self {
        Self {
            unrecorded: watch::channel(0).0,
            stalled: Mutex::default(),
            next_stall: AtomicU64::new(0),
            starts_failing: Mutex::default(),
            starts_failed: AtomicBool::new(false),
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

/// An operation reported stalled, until it ends.
struct Stalled<'a>(&'a Health, u64);

impl Drop for Stalled<'_> {
    fn drop(&mut self) {
        self.0.stalled.lock().expect("health lock").remove(&self.1);
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

    fn stall(&self, what: String) -> Stalled<'_> {
        let id = self.next_stall.fetch_add(1, Ordering::Relaxed);
        self.stalled.lock().expect("health lock").insert(id, what);
        Stalled(self, id)
    }
}

/// Runs `op`; once it has waited `bound`, reports it stalled until it ends: a log line naming the
/// sessions that block it, a count in `/metrics`, and `/readyz` unready. When it ends, says how
/// long it took.
pub(super) async fn watched<S: Store, T>(
    reporter: &Reporter,
    store: &S,
    operation: &'static str,
    bound: Duration,
    op: impl Future<Output = T>,
) -> T {
    let started = Instant::now();
    tokio::pin!(op);
    tokio::select! {
        biased;
        done = &mut op => return done,
        _ = tokio::time::sleep(bound) => {}
    }
    reporter.metrics.stalled(operation);
    let report = async {
        let blockers = match tokio::time::timeout(BLOCKERS_TIMEOUT, store.blockers()).await {
            Ok(Ok(sessions)) if !sessions.is_empty() => sessions
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            Ok(Ok(_)) => "no blocking session found".to_owned(),
            Ok(Err(e)) => format!("could not list blocking sessions: {e:#}"),
            Err(_) => "could not list blocking sessions in time".to_owned(),
        };
        let waited = humantime::format_duration(bound);
        tracing::warn!(operation, waited = %waited, blocked_by = %blockers, "{operation} is stalled");
        reporter.health.stall(format!(
            "{operation} has waited over {waited}, blocked by {blockers}"
        ))
    };
    tokio::pin!(report);
    let mut stalled = None;
    let done = loop {
        tokio::select! {
            done = &mut op => break done,
            guard = &mut report, if stalled.is_none() => stalled = Some(guard),
        }
    };
    let took = Duration::from_millis(started.elapsed().as_millis() as u64);
    tracing::info!(operation, took = %humantime::format_duration(took), "{operation} went through");
    drop(stalled);
    done
}
