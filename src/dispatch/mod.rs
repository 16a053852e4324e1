//! The dispatcher: the claim loop, bounded concurrency, lease renewal, completion batching,
//! retries, wake-ups and graceful shutdown. It knows stores only through the `Store` trait and
//! handlers only through the `Handler` trait.
//!
//! Guarantees it keeps with the store: a delivery runs only under a live lane lease; every state
//! change carries the lease token; a crash is charged as an attempt at takeover; a graceful stop
//! lets running handlers finish within the grace period, releases the rest without charging an
//! attempt and hands every lane back at once.

mod complete;
mod controls;
mod delivery;
mod health;
pub mod metrics;
mod options;
pub mod report;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::backoff::{Backoff, Retries};
use crate::handler::Handler;
use crate::store::controls::BreakerPolicy;
use crate::store::{
    ClaimRequest, ClaimStats, ClaimedDelivery, LaneShare, LeaseToken, Store, WakeUp,
};
use complete::{Completer, Recorder, Running};
pub use options::{hostname, worker_host_and_pid, worker_name, DispatchOptions, RetryPolicy};
pub use report::{Reporter, Summary};

/// How the dispatcher is asked to stop: the first signal drains, the second cancels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    Running,
    /// Stop claiming, let running handlers finish within the grace period, release the rest.
    Graceful,
    /// Abort running handlers now, release them and hand the lanes back.
    Immediate,
}

/// Resolves when the shutdown state changes. A dropped sender sends nothing more, so it never
/// resolves then (a closed channel must not read as a signal).
pub async fn next_signal(shutdown: &mut watch::Receiver<Shutdown>) {
    if shutdown.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves once the shutdown state is `state` (or further along), never on a dropped sender.
pub async fn signalled(shutdown: &mut watch::Receiver<Shutdown>, state: Shutdown) {
    let reached = |s: &Shutdown| match state {
        Shutdown::Running => true,
        Shutdown::Graceful => *s != Shutdown::Running,
        Shutdown::Immediate => *s == Shutdown::Immediate,
    };
    if shutdown.wait_for(reached).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A handler as the dispatcher runs it.
pub struct HandlerSpec {
    pub name: String,
    pub runner: Runner,
    pub retry: RetryPolicy,
    pub breaker: BreakerPolicy,
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

/// Lanes the first claim after a short one may take; doubled while claims stay short, so a
/// worker holds only as many lanes as its batch needs.
const FIRST_NEW_LANES: i64 = 4;
const CLAIM_RETRY: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// How long a claim waits for more free slots before it claims a partial batch (plus twice the
/// completion window, the time deliveries finishing together need to be recorded).
const CLAIM_LINGER: Duration = Duration::from_millis(2);
/// A publishing store may hold a wake-up back for a moment, so under a steady stream an event
/// can commit just after its store's wake-up and wait for the next one. For that moment after a
/// claim that found work, an empty claim is followed by another after BUSY_POLL instead of
/// waiting for a wake-up; an idle worker polls at --poll-interval.
const BUSY_POLL: Duration = Duration::from_millis(2);
/// How often a stream's claim names no held lanes, so that the store finds them by owner: the
/// stream's view and the lane rows meet again, and PostgreSQL looks for lanes a dead worker left
/// with deliveries in flight and nothing due (other claims look only where work is due). Such a
/// claim reads every lane, about three times the work of a claim by name, and every stream of
/// every worker makes one; a tenth of the lease (at least a second) keeps that small while a
/// dead worker's lane waits at most a tenth longer than its lease.
fn census_every(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_secs(1))
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
    /// Pauses and circuit breakers.
    controls: controls::Controls,
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

/// One claim stream: it claims, starts what it claimed, and rests when nothing is due. Its
/// lanes are its own, so its claims run beside the other stream's without waiting for them, and
/// it alone writes the in-flight lists of its lanes.
struct Claimer {
    /// The parts of every claim of this stream that never change.
    template: ClaimRequest,
    tasks: JoinSet<Option<LeaseToken>>,
    wake: Arc<Notify>,
    new_lanes: i64,
    /// How many deliveries the last claim found.
    last_found: usize,
    linger_until: Option<Instant>,
    claim_retries: Retries,
    found_work_at: Option<Instant>,
    /// The last claim picked keyed deliveries: a key's next delivery can be picked only once
    /// the outcome of the one before is recorded, so the next claim waits (at most the linger)
    /// for the outcomes of this stream's deliveries being recorded rather than finding their
    /// keys still in flight. The other stream's keys lie in its own lanes. Unkeyed claims do
    /// not wait: they overlap the recording of the last claim's outcomes.
    keys_held: bool,
    /// This stream's deliveries whose handler has not ended.
    running: Arc<Running>,
    /// The lanes this stream holds, as its last claim reported them: the next claim reads only
    /// those of its own. Unknown at first and after a failed claim.
    held: Option<Vec<i16>>,
    /// When a claim last found the stream's lanes by owner (`census_every`).
    census_at: Instant,
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
        let controls = controls::Controls::new(breakers.collect());
        let ctx = Arc::new(Context {
            store: Arc::clone(&store),
            handlers: handlers.into_iter().map(|h| (h.name.clone(), h)).collect(),
            completer,
            running,
            outstanding: Outstanding::default(),
            reporter: Arc::clone(&reporter),
            history: options.completion_history,
            controls,
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
                tokio::spawn(health::watchdog(
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
                tokio::spawn(controls::refresh(
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
        controls::load(&self.shared.ctx).await;
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

impl Claimer {
    /// Stream `index` of `streams`, on its share of the lanes.
    fn new(template: &ClaimRequest, index: usize, streams: usize) -> Self {
        Claimer {
            template: ClaimRequest {
                lanes: LaneShare {
                    count: streams as i16,
                    index: index as i16,
                },
                ..template.clone()
            },
            tasks: JoinSet::new(),
            wake: Arc::new(Notify::new()),
            new_lanes: FIRST_NEW_LANES,
            last_found: 0,
            linger_until: None,
            claim_retries: CLAIM_RETRY.retries(),
            found_work_at: None,
            keys_held: false,
            running: Arc::default(),
            held: None,
            census_at: Instant::now(),
        }
    }

    /// Claims and starts deliveries until `shutdown` says stop (or, with `drain`, until no due
    /// work is left).
    async fn run<S: Store>(&mut self, shared: &Shared<S>, mut shutdown: watch::Receiver<Shutdown>) {
        while *shutdown.borrow() == Shutdown::Running {
            while self.tasks.try_join_next().is_some() {}
            let Some(want) = self.ready(shared, &mut shutdown).await else {
                continue;
            };
            let searched = self.new_lanes > 0;
            let Some(request) = self.request(shared, want) else {
                // Every handler of this worker is paused, or its breaker open.
                if self.drained(shared).await {
                    break;
                }
                self.idle(shared, &mut shutdown).await;
                continue;
            };
            let asked_at = since_boot();
            let Some((claimed, stats)) = self.claim(shared, request, &mut shutdown).await else {
                continue;
            };
            let got = claimed.len();
            self.keys_held = claimed.iter().any(|d| d.key.is_some());
            self.start(shared, claimed, asked_at, &shutdown);
            if !self.nothing_to_do(want, got, &stats, searched) {
                continue;
            }
            if self.drained(shared).await {
                break;
            }
            self.idle(shared, &mut shutdown).await;
        }
    }

    /// Waits until a claim is worth making and returns how many deliveries it may take (the free
    /// slots, at most a full claim), or returns None to look again (a slot freed, a signal
    /// came). While a backlog lasts, handlers that finish together free their slots together: a
    /// moment's wait for as many as the last claim found makes one claim of a full batch
    /// instead of one per handler. At light load the last claim found few, and the next goes
    /// at once rather than wait for slots it would not fill. After a claim of keyed deliveries
    /// it also waits for the outcomes being recorded, which free their keys. The slots are not
    /// reserved: the other stream may claim them too while this claim runs.
    async fn ready<S: Store>(
        &mut self,
        shared: &Shared<S>,
        shutdown: &mut watch::Receiver<Shutdown>,
    ) -> Option<usize> {
        let health = &shared.reporter.health;
        if !health.recording() {
            tokio::select! {
                _ = health.outcomes_recorded() => {}
                _ = next_signal(shutdown) => {}
            }
            return None;
        }
        let slots = &shared.slots;
        let free = slots.available_permits();
        if free == 0 {
            tokio::select! {
                slot = slots.acquire() => drop(slot),
                _ = next_signal(shutdown) => {}
            }
            return None;
        }
        let full = shared.options.claim_size();
        // This stream's deliveries whose handler has ended and whose outcome is not recorded
        // yet: they still hold their lane's room and their key.
        let recording = if self.keys_held {
            self.tasks.len().saturating_sub(self.running.count())
        } else {
            0
        };
        // As many as the last claim found: a backlog fills them, a trickle does not.
        let wanted = full.min(self.last_found);
        if free < wanted || recording > 0 {
            let linger = shared.options.completion_window * 2 + CLAIM_LINGER;
            let until = *self
                .linger_until
                .get_or_insert_with(|| Instant::now() + linger);
            if Instant::now() < until {
                tokio::select! {
                    slots = slots.acquire_many(wanted as u32), if free < wanted => drop(slots),
                    Some(_) = self.tasks.join_next(), if recording > 0 && !self.tasks.is_empty() => {}
                    _ = tokio::time::sleep_until(until) => {}
                    _ = next_signal(shutdown) => {}
                }
                return None;
            }
        }
        self.linger_until = None;
        Some(free.min(full))
    }

    /// The next claim of up to `want` deliveries, for the handlers that may be claimed now;
    /// None when none may.
    fn request<S: Store>(&mut self, shared: &Shared<S>, want: usize) -> Option<ClaimRequest> {
        let mut request = ClaimRequest {
            batch: want as i64,
            new_lanes: self.new_lanes,
            ..self.template.clone()
        };
        shared.ctx.controls.narrow(&mut request);
        if request.handlers.is_empty() {
            return None;
        }
        request.outstanding = shared.ctx.outstanding.ids();
        let census_due = self.census_at.elapsed() >= census_every(self.template.lease);
        request.held = self.held.take().filter(|_| !census_due);
        if request.held.is_none() {
            self.census_at = Instant::now();
        }
        Some(request)
    }

    /// One claim; a failing one is logged and retried after a back-off.
    async fn claim<S: Store>(
        &mut self,
        shared: &Shared<S>,
        request: ClaimRequest,
        shutdown: &mut watch::Receiver<Shutdown>,
    ) -> Option<(Vec<ClaimedDelivery>, ClaimStats)> {
        let started = Instant::now();
        let recorder = shared.ctx.recorder();
        let claim = recorder.watched("claim", shared.store.claim(&request));
        // A stop is honoured even while a claim waits (behind a lock, a conflict): the claim is
        // abandoned, and whatever it may have written is handed back with every lane at the end.
        let claimed = tokio::select! {
            claimed = claim => claimed,
            _ = signalled(shutdown, Shutdown::Graceful) => return None,
        };
        let metrics = &shared.reporter.metrics;
        match claimed {
            Ok(mut claimed) => {
                metrics.claimed(claimed.0.len(), started.elapsed());
                self.claim_retries.reset();
                self.held = claimed.1.held.take();
                Some(claimed)
            }
            Err(e) => {
                metrics.claim_failed();
                let retry_in = self.claim_retries.next_delay();
                tracing::warn!(
                    error = %format!("{e:#}"),
                    retry_in = %humantime::format_duration(retry_in),
                    "claim failed; retrying"
                );
                tokio::select! {
                    _ = tokio::time::sleep(retry_in) => {}
                    _ = next_signal(shutdown) => {}
                }
                None
            }
        }
    }

    /// Starts a task per claimed delivery, each with a slot taken now; when the other stream's
    /// claim took the slots first, the rest wait for one, and one still waiting when the worker
    /// stops is handed back unstarted. `asked_at` is when the claim was sent (`since_boot`):
    /// the leases it took run from no earlier.
    fn start<S: Store>(
        &mut self,
        shared: &Shared<S>,
        claimed: Vec<ClaimedDelivery>,
        asked_at: Duration,
        shutdown: &watch::Receiver<Shutdown>,
    ) {
        let ctx = &shared.ctx;
        ctx.outstanding
            .add(claimed.iter().map(|d| d.token.delivery_id.clone()));
        // The whole claim counts as running before any of it starts, so the completer does not
        // flush the first delivery to finish alone.
        let guards: Vec<_> = claimed
            .iter()
            .map(|_| Running::enter(&ctx.running, &self.running))
            .collect();
        for (claimed, running) in claimed.into_iter().zip(guards) {
            let ctx = Arc::clone(ctx);
            // What a delivery without a free slot needs to wait for one, cloned only then.
            let slot = Arc::clone(&shared.slots)
                .try_acquire_owned()
                .map_err(|_| (Arc::clone(&shared.slots), shutdown.clone()));
            let cancel = shared.cancel.subscribe();
            self.tasks.spawn(async move {
                let id = claimed.token.delivery_id.clone();
                let slot = match slot {
                    Ok(slot) => Some(slot),
                    Err((slots, mut stopping)) => tokio::select! {
                        biased;
                        slot = slots.acquire_owned() => slot.ok(),
                        _ = signalled(&mut stopping, Shutdown::Graceful) => None,
                    },
                };
                let aborted = match slot {
                    Some(slot) => {
                        let leased = delivery::Leased {
                            delivery: claimed,
                            since: asked_at,
                        };
                        delivery::run(&ctx, leased, running, slot, cancel).await
                    }
                    None => Some(claimed.token),
                };
                ctx.outstanding.remove(&id);
                aborted
            });
        }
    }

    /// Learns from a claim: how widely the next one searches for free lanes (a full batch from
    /// the lanes it holds needs no search; a short one widens it, 4, 8, 16... lanes at a
    /// time), and how many free slots it waits for. True when the claim found nothing, so the
    /// stream may rest.
    fn nothing_to_do(
        &mut self,
        want: usize,
        got: usize,
        stats: &ClaimStats,
        searched: bool,
    ) -> bool {
        if stats.charged > 0 {
            tracing::warn!(
                deliveries = stats.charged,
                "took over expired lanes; charged one attempt to each delivery they had in flight"
            );
        }
        self.last_found = got;
        self.new_lanes = if got == want {
            0
        } else {
            (self.new_lanes * 2).clamp(FIRST_NEW_LANES, 256)
        };
        if got > 0 {
            self.found_work_at = Some(Instant::now());
        }
        got == 0 && stats.lanes_taken == 0 && searched
    }

    /// With `drain`: true once nothing of this stream runs and nothing is due for the handlers
    /// it may claim (a paused handler's deliveries wait for a worker after its resume).
    async fn drained<S: Store>(&self, shared: &Shared<S>) -> bool {
        if !(shared.options.drain && self.tasks.is_empty()) {
            return false;
        }
        let mut claimable = self.template.clone();
        shared.ctx.controls.narrow(&mut claimable);
        if claimable.handlers.is_empty() {
            return true;
        }
        match shared.store.due_exists(&claimable.handlers).await {
            Ok(due) => !due,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "could not check for due work");
                false
            }
        }
    }

    /// Rests until a wake-up, the poll interval, a signal, or a delivery that ends.
    async fn idle<S: Store>(
        &mut self,
        shared: &Shared<S>,
        shutdown: &mut watch::Receiver<Shutdown>,
    ) {
        let busy = self
            .found_work_at
            .is_some_and(|t| t.elapsed() < shared.store.wake_up_delay());
        let poll = if busy {
            BUSY_POLL.min(shared.options.poll_interval)
        } else {
            shared.options.poll_interval
        };
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(poll) => {}
            _ = next_signal(shutdown) => {}
            Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
        }
    }
}

/// Turns the store's wake-ups into a wake-up of every stream, logging a lost subscription as it
/// happens: at info when it is lost (a server or pooler that closes idle sessions does that
/// often, and the first reconnect mends it), as a warning once a reconnect failed too.
fn relay_wake_ups<S: Store>(
    store: &S,
    wakes: Vec<Arc<Notify>>,
    reporter: Arc<Reporter>,
) -> Option<JoinHandle<()>> {
    let mut wake_ups = store.wake_ups()?;
    Some(tokio::spawn(async move {
        let mut lost = 0u32;
        loop {
            match wake_ups.next().await {
                WakeUp::Signal => {
                    if lost > 1 {
                        tracing::info!("wake-up connection is back");
                    }
                    lost = 0;
                    reporter.metrics.woken();
                    for wake in &wakes {
                        wake.notify_one();
                    }
                }
                WakeUp::Lost { error, retry_in } => {
                    lost += 1;
                    let retry_in = humantime::format_duration(retry_in);
                    if lost == 1 {
                        tracing::info!(error = %error, retry_in = %retry_in, "wake-up connection lost; listening anew");
                    } else {
                        tracing::warn!(error = %error, retry_in = %retry_in, "wake-up connection lost; polling until it is back");
                    }
                }
            }
        }
    }))
}

/// Renews the leases of the lanes that run the worker's outstanding deliveries, every third of
/// the lease.
async fn renew<S: Store>(ctx: Arc<Context<S>>, owner: String, lease: Duration) {
    let every = (lease / 3).max(Duration::from_millis(100));
    let (store, reporter) = (&ctx.store, &ctx.reporter);
    loop {
        tokio::time::sleep(every).await;
        let running = ctx.outstanding.ids();
        let renewal = store.renew(&owner, lease, &running);
        match ctx.recorder().watched("renew", renewal).await {
            Ok(lanes) => reporter.metrics.lanes_held(lanes),
            Err(e) => {
                reporter.metrics.database_error("renew");
                tracing::warn!(error = %format!("{e:#}"), "lease renewal failed; retrying");
            }
        }
    }
}

async fn status_line(reporter: Arc<Reporter>, slots: Arc<Semaphore>, concurrency: usize) {
    loop {
        reporter.status(concurrency - slots.available_permits());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
