//! The dispatcher: the claim loop, bounded concurrency, lease renewal, completion batching,
//! retries, wake-ups and graceful shutdown. It knows stores only through the `Store` trait and
//! handlers only through the `Handler` trait.
//!
//! Guarantees it keeps with the store: a delivery runs only under a live lane lease; every state
//! change carries the lease token; a crash is charged as an attempt at takeover; a graceful stop
//! lets running handlers finish within the grace period, releases the rest without charging an
//! attempt and hands every lane back at once.

mod background;
mod claimer;
mod complete;
mod delivery;
pub mod endpoint;
mod handler_rows;
mod health;
pub mod metrics;
mod options;
pub mod report;
mod shutdown;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::handler::Handler;
use crate::store::handlers::BreakerPolicy;
use crate::store::{ClaimRequest, LaneShare, Store};
use complete::{Completer, Recorder, Running};
pub use options::{DispatchOptions, RetryPolicy};
pub use report::{Reporter, Summary};
pub use shutdown::{next_signal, signalled, Shutdown};

use background::{relay_wake_ups, renew, status_line, watchdog};
use claimer::Claimer;

/// A handler as the dispatcher runs it.
pub struct HandlerSpec {
    pub name: String,
    pub runner: Runner,
    pub retry: RetryPolicy,
    /// A webhook's circuit breaker settings; other handlers have no breaker.
    pub breaker: Option<BreakerPolicy>,
}

/// What runs a handler's deliveries.
#[derive(Clone)]
pub enum Runner {
    /// A handler whose outcome is recorded after it ends (completions batched).
    Handler(Arc<dyn Handler>),
    /// A statement the store runs in the transaction that completes the delivery, bounded by
    /// the timeout.
    Statement { sql: String, timeout: Duration },
}

/// The time since the machine booted, time it spent suspended included: a lease runs on the
/// database's clock while this machine sleeps or this process is stopped, so the worker's own
/// reckoning of a lease must count that time too (`Instant` does not count a suspend on Linux).
fn since_boot() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .expect("the boot clock is readable")
}

/// How long handing the lanes back at the end may take before they are left to expire.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ids of claimed deliveries whose task has not ended, shared by the claim streams, their
/// tasks and the renewals.
#[derive(Clone, Default)]
struct Outstanding(Arc<Mutex<HashSet<String>>>);

impl Outstanding {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().expect("outstanding lock")
    }

    fn ids(&self) -> Vec<String> {
        self.set().iter().cloned().collect()
    }

    fn add(&self, ids: impl Iterator<Item = String>) {
        self.set().extend(ids);
    }

    fn remove(&self, id: &str) {
        self.set().remove(id);
    }
}

/// What the delivery tasks share.
struct Context<S> {
    store: Arc<S>,
    handlers: HashMap<String, HandlerSpec>,
    completer: Completer,
    running: Arc<Running>,
    /// Claimed deliveries whose task has not ended (its outcome may not be committed yet).
    outstanding: Outstanding,
    reporter: Arc<Reporter>,
    /// Completions are also appended to the history.
    history: bool,
    /// Pauses and circuit breakers: the handlers table as this worker reads it.
    rows: handler_rows::HandlerRows,
    /// The worker's name and lease, to confirm a lane before a handler starts in it.
    owner: String,
    lease: Duration,
}

impl<S: Store> Context<S> {
    fn recorder(&self) -> Recorder<'_> {
        Recorder {
            reporter: &self.reporter,
        }
    }
}

/// A worker: construct it, then `run` it until shutdown (or, with `drain`, until no due work is
/// left).
pub struct Dispatcher<S: Store> {
    shared: Shared<S>,
    /// One claim loop per stream, each on lanes of its own (`DispatchOptions::claim_streams`).
    claimers: Vec<Claimer>,
    /// The completer's loop until `run` starts it.
    recording: Option<complete::Recording<S>>,
}

/// The tasks a running worker started beside its claim streams.
struct Started {
    completer: JoinHandle<()>,
    /// Lease renewal and the status line: they last until every delivery has ended.
    background: Vec<JoinHandle<()>>,
    /// Wake-ups mean nothing once the worker stops claiming.
    wake_relay: Option<JoinHandle<()>>,
}

/// What the claim streams share.
struct Shared<S: Store> {
    store: Arc<S>,
    options: DispatchOptions,
    ctx: Arc<Context<S>>,
    reporter: Arc<Reporter>,
    slots: Arc<Semaphore>,
    cancel: watch::Sender<bool>,
}

impl<S: Store> Dispatcher<S> {
    pub fn new(
        store: Arc<S>,
        options: DispatchOptions,
        handlers: Vec<HandlerSpec>,
        reporter: Arc<Reporter>,
    ) -> Self {
        let streams = options.claim_streams();
        let template = ClaimRequest {
            owner: options.owner.clone(),
            handlers: handlers.iter().map(|h| h.name.clone()).collect(),
            max_attempts: handlers.iter().map(|h| h.retry.max_attempts).collect(),
            batch: 0,
            new_lanes: 0,
            lease: options.lease_duration,
            outstanding: vec![],
            lanes: LaneShare::ALL,
            held: None,
        };
        reporter.metrics.handlers(&template.handlers);
        let running = Arc::new(Running::default());
        let cancel = watch::channel(false).0;
        let (completer, recording) = Completer::new(
            Arc::clone(&store),
            Arc::clone(&running),
            complete::Settings {
                window: options.completion_window,
                history: options.completion_history,
                reporter: Arc::clone(&reporter),
                stopping: cancel.subscribe(),
            },
        );
        let breakers = handlers.iter().map(|h| (h.name.clone(), h.breaker));
        let rows = handler_rows::HandlerRows::new(breakers.collect());
        let ctx = Arc::new(Context {
            store: Arc::clone(&store),
            handlers: handlers.into_iter().map(|h| (h.name.clone(), h)).collect(),
            completer,
            running,
            outstanding: Outstanding::default(),
            reporter: Arc::clone(&reporter),
            history: options.completion_history,
            rows,
            owner: options.owner.clone(),
            lease: options.lease_duration,
        });
        let claimers = (0..streams)
            .map(|index| Claimer::new(&template, index, streams))
            .collect();
        Self {
            shared: Shared {
                store,
                slots: Arc::new(Semaphore::new(options.concurrency)),
                options,
                ctx,
                reporter,
                cancel,
            },
            claimers,
            recording: Some(recording),
        }
    }

    /// Starts the completer, lease renewal, the status line and the wake-up relay.
    fn start_tasks(&self, recording: complete::Recording<S>) -> Started {
        let Shared {
            store,
            options,
            ctx,
            reporter,
            slots,
            ..
        } = &self.shared;
        let wakes: Vec<_> = self.claimers.iter().map(|c| Arc::clone(&c.wake)).collect();
        Started {
            completer: recording.start(),
            background: vec![
                tokio::spawn(watchdog(
                    Arc::clone(reporter),
                    Arc::clone(store),
                    options.stall_after,
                )),
                tokio::spawn(renew(
                    Arc::clone(ctx),
                    options.owner.clone(),
                    options.lease_duration,
                )),
                tokio::spawn(status_line(
                    Arc::clone(reporter),
                    Arc::clone(slots),
                    options.concurrency,
                )),
                tokio::spawn(handler_rows::refresh(
                    Arc::clone(ctx),
                    options.poll_interval,
                    wakes.clone(),
                )),
            ],
            wake_relay: options
                .wake_ups
                .then(|| relay_wake_ups(&**store, wakes, Arc::clone(reporter)))
                .flatten(),
        }
    }

    /// Claims and runs deliveries until `shutdown` says stop, then stops as it says.
    pub async fn run(mut self, shutdown: watch::Receiver<Shutdown>) -> Summary {
        let recording = self.recording.take().expect("a dispatcher runs once");
        handler_rows::load(&self.shared.ctx).await;
        let started = self.start_tasks(recording);
        let options = &self.shared.options;
        tracing::info!(
            worker = %options.owner,
            handlers = %self.claimers[0].template.handlers.join(","),
            concurrency = options.concurrency,
            batch_size = options.batch_size,
            claim_streams = self.claimers.len(),
            "worker started"
        );
        let shared = &self.shared;
        futures_util::future::join_all(
            self.claimers
                .iter_mut()
                .map(|c| c.run(shared, shutdown.clone())),
        )
        .await;
        self.stop(shutdown, started).await
    }

    /// Stops claiming, lets running handlers finish within the grace period (none with a
    /// second signal), aborts and releases the rest, and hands every lane back.
    async fn stop(
        mut self,
        mut shutdown: watch::Receiver<Shutdown>,
        mut started: Started,
    ) -> Summary {
        let Shared {
            store,
            options,
            ctx,
            reporter,
            cancel,
            ..
        } = self.shared;
        reporter.metrics.stopping();
        if let Some(relay) = started.wake_relay.take() {
            relay.abort();
        }
        let running: usize = self.claimers.iter().map(|c| c.tasks.len()).sum();
        if *shutdown.borrow() != Shutdown::Running {
            tracing::info!(
                running,
                grace = %humantime::format_duration(options.shutdown_grace),
                "stopping: no new claims"
            );
        }
        // The tokens of deliveries that end without an outcome: aborted, or never started.
        let mut aborted = Vec::new();
        let deadline = Instant::now() + options.shutdown_grace;
        'grace: for tasks in self.claimers.iter_mut().map(|c| &mut c.tasks) {
            while !tasks.is_empty() && *shutdown.borrow() != Shutdown::Immediate {
                tokio::select! {
                    Some(done) = tasks.join_next() => aborted.extend(done.ok().flatten()),
                    _ = tokio::time::sleep_until(deadline) => break 'grace,
                    _ = signalled(&mut shutdown, Shutdown::Immediate) => break 'grace,
                }
            }
        }
        let _ = cancel.send(true);
        for tasks in self.claimers.iter_mut().map(|c| &mut c.tasks) {
            while let Some(done) = tasks.join_next().await {
                aborted.extend(done.ok().flatten());
            }
        }
        for task in started.background.drain(..) {
            task.abort();
        }
        // The last sender of completions goes with the context; the completer then flushes
        // what it has and ends.
        drop(ctx);
        let _ = started.completer.await;
        let release = store.release(&options.owner, &aborted);
        match tokio::time::timeout(RELEASE_TIMEOUT, release).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                error = %format!("{e:#}"),
                "could not hand the lanes back; they free up when the lease expires"
            ),
            Err(_) => tracing::warn!(
                "handing the lanes back timed out; they free up when the lease expires"
            ),
        }
        let counters = &reporter.counters;
        counters
            .released
            .fetch_add(aborted.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let summary = counters.summary();
        reporter.stopped();
        tracing::info!(
            handled = summary.handled,
            failed = summary.failed,
            dead = summary.dead,
            lease_lost = summary.lease_lost,
            released = summary.released,
            "worker stopped"
        );
        summary
    }
}
