//! The dispatcher: the claim loop, bounded concurrency, lease renewal, completion batching,
//! retries, wake-ups and graceful shutdown. It knows stores only through the `Store` trait and
//! handlers only through the `Handler` trait.
//!
//! Guarantees it keeps with the store: a delivery runs only under a live lane lease; every state
//! change carries the lease token; a crash is charged as an attempt at takeover; a graceful stop
//! lets running handlers finish within the grace period, releases the rest without charging an
//! attempt and hands every lane back at once.

mod complete;
pub mod listen;
pub mod report;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::handler::{Handler, Outcome};
use crate::store::{ClaimRequest, ClaimedDelivery, Failure, LeaseToken, Store, NOTIFY_INTERVAL};
use complete::{Completer, Running, RunningGuard};
pub use report::{LogFormat, Reporter, Summary};

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

/// Exponential backoff with jitter: `base * 2^(attempt-1)`, capped, then scaled by a random
/// factor in [0.5, 1) so failing deliveries do not retry in lockstep.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn delay(&self, attempt: i32) -> Duration {
        let exp = attempt.clamp(1, 32) as u32 - 1;
        let raw = self
            .base
            .saturating_mul(2u32.saturating_pow(exp))
            .min(self.max);
        raw.mul_f64(rand::thread_rng().gen_range(0.5..1.0))
    }
}

pub struct HandlerSpec {
    pub name: String,
    pub handler: Arc<dyn Handler>,
    pub max_attempts: i32,
    pub backoff: Backoff,
}

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
}

/// A unique worker name: host, process and a random suffix.
pub fn worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}:{}:{:06x}",
        std::process::id(),
        rand::thread_rng().gen::<u32>() & 0xff_ffff
    )
}

/// Lanes the first claim after a short one may take; doubled while claims stay short, so a
/// worker holds only as many lanes as its batch needs.
const FIRST_NEW_LANES: i64 = 4;
const MAX_CLAIM_BACKOFF: Duration = Duration::from_secs(5);
/// How long a claim waits for more free slots before it claims a partial batch (plus twice the
/// completion window, the time deliveries finishing together need to be recorded).
const CLAIM_LINGER: Duration = Duration::from_millis(2);
/// A publishing store notifies at most once per NOTIFY_INTERVAL, so under a steady stream an
/// event can commit just after its store's notification and wait for the next one. For one
/// such interval after a claim that found work, an empty claim is followed by another after
/// BUSY_POLL instead of waiting for a wake-up; an idle worker polls at --poll-interval.
const BUSY_POLL: Duration = Duration::from_millis(2);

struct Context<S> {
    store: Arc<S>,
    handlers: HashMap<String, HandlerSpec>,
    completer: Completer,
    running: Arc<Running>,
    /// Claimed deliveries whose task has not ended (its outcome may not be committed yet).
    outstanding: Mutex<HashSet<String>>,
    reporter: Arc<Reporter>,
}

/// Runs the worker until `shutdown` says stop (or, with `drain`, until no due work is left).
/// `wake` ends an idle wait early (a wake-up listener signals it); polling works without it.
pub async fn run<S: Store>(
    store: Arc<S>,
    options: DispatchOptions,
    handlers: Vec<HandlerSpec>,
    reporter: Arc<Reporter>,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<Shutdown>,
) -> crate::store::Result<Summary> {
    let names: Vec<String> = handlers.iter().map(|h| h.name.clone()).collect();
    let max_attempts: Vec<i32> = handlers.iter().map(|h| h.max_attempts).collect();
    let running = Arc::new(Running::default());
    let (completer, completer_task) = Completer::start(
        Arc::clone(&store),
        Arc::clone(&running),
        options.completion_window,
        options.completion_history,
    );
    let ctx = Arc::new(Context {
        store: Arc::clone(&store),
        handlers: handlers.into_iter().map(|h| (h.name.clone(), h)).collect(),
        completer,
        running,
        outstanding: Mutex::new(HashSet::new()),
        reporter: Arc::clone(&reporter),
    });
    let slots = Arc::new(Semaphore::new(options.concurrency));
    let renewer = tokio::spawn(renew(
        Arc::clone(&store),
        options.owner.clone(),
        options.lease_duration,
        Arc::clone(&reporter),
    ));
    let status = tokio::spawn(status_line(
        Arc::clone(&reporter),
        Arc::clone(&slots),
        options.concurrency,
    ));
    reporter.log(
        "info",
        "worker started",
        &[
            ("worker", &options.owner),
            ("handlers", &names.join(",")),
            ("concurrency", &options.concurrency),
            ("batch_size", &options.batch_size),
        ],
    );

    let (cancel_tx, cancel_rx) = watch::channel(false);
    let mut tasks: JoinSet<Option<LeaseToken>> = JoinSet::new();
    let mut new_lanes = FIRST_NEW_LANES;
    let full_batch = options.batch_size.min(options.concurrency);
    let linger = options.completion_window * 2 + CLAIM_LINGER;
    let mut linger_until = None;
    let mut claim_backoff = Duration::from_millis(100);
    let mut found_work_at = None;
    while *shutdown.borrow() == Shutdown::Running {
        while tasks.try_join_next().is_some() {}
        let free = slots.available_permits();
        if free == 0 {
            tokio::select! {
                slot = slots.acquire() => drop(slot),
                _ = next_signal(&mut shutdown) => {}
            }
            continue;
        }
        // Handlers that finish together free their slots together: wait a moment for them, so
        // a claim carries a full batch instead of one claim per finished handler.
        if free < full_batch {
            let until = *linger_until.get_or_insert_with(|| tokio::time::Instant::now() + linger);
            if tokio::time::Instant::now() < until {
                tokio::select! {
                    slots = slots.acquire_many(full_batch as u32) => drop(slots),
                    _ = tokio::time::sleep_until(until) => {}
                    _ = next_signal(&mut shutdown) => {}
                }
                continue;
            }
        }
        linger_until = None;
        let want = free.min(options.batch_size);
        let request = ClaimRequest {
            owner: options.owner.clone(),
            handlers: names.clone(),
            max_attempts: max_attempts.clone(),
            batch: want as i64,
            new_lanes,
            lease: options.lease_duration,
            outstanding: ctx
                .outstanding
                .lock()
                .expect("outstanding lock")
                .iter()
                .cloned()
                .collect(),
        };
        let (claimed, stats) = match store.claim(&request).await {
            Ok(c) => {
                claim_backoff = Duration::from_millis(100);
                c
            }
            Err(e) => {
                reporter.log(
                    "warn",
                    "claim failed; retrying",
                    &[
                        ("error", &format!("{e:#}")),
                        ("retry_in", &humantime::format_duration(claim_backoff)),
                    ],
                );
                tokio::select! {
                    _ = tokio::time::sleep(claim_backoff) => {}
                    _ = next_signal(&mut shutdown) => {}
                }
                claim_backoff = (claim_backoff * 2).min(MAX_CLAIM_BACKOFF);
                continue;
            }
        };
        if stats.charged > 0 {
            reporter.log(
                "warn",
                "took over expired lanes; charged one attempt to each delivery they had in flight",
                &[("deliveries", &stats.charged)],
            );
        }
        let got = claimed.len();
        ctx.outstanding
            .lock()
            .expect("outstanding lock")
            .extend(claimed.iter().map(|d| d.token.delivery_id.clone()));
        // The whole claim counts as running before any of it starts, so the completer does not
        // flush the first delivery to finish alone.
        let guards: Vec<RunningGuard> = claimed.iter().map(|_| ctx.running.enter()).collect();
        for (delivery, running) in claimed.into_iter().zip(guards) {
            let permit = Arc::clone(&slots)
                .try_acquire_owned()
                .expect("a claim never exceeds the free slots");
            let ctx = Arc::clone(&ctx);
            let cancel = cancel_rx.clone();
            tasks.spawn(async move {
                let id = delivery.token.delivery_id.clone();
                let aborted = run_delivery(&ctx, delivery, running, permit, cancel).await;
                ctx.outstanding
                    .lock()
                    .expect("outstanding lock")
                    .remove(&id);
                aborted
            });
        }
        let searched = request.new_lanes > 0;
        // A full batch from the lanes it holds needs no search for free lanes (the search probes
        // every lane); a short one widens it: 4, 8, 16... lanes at a time.
        new_lanes = if got == want {
            0
        } else {
            (new_lanes * 2).clamp(FIRST_NEW_LANES, 256)
        };
        if got > 0 {
            found_work_at = Some(tokio::time::Instant::now());
        }
        if got > 0 || stats.lanes_taken > 0 || !searched {
            continue;
        }
        if options.drain && tasks.is_empty() {
            match store.due_exists(&names).await {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => reporter.log(
                    "warn",
                    "could not check for due work",
                    &[("error", &format!("{e:#}"))],
                ),
            }
        }
        let busy = found_work_at.is_some_and(|t| t.elapsed() < NOTIFY_INTERVAL);
        let poll = if busy {
            BUSY_POLL.min(options.poll_interval)
        } else {
            options.poll_interval
        };
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(poll) => {}
            _ = next_signal(&mut shutdown) => {}
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }

    let mode = *shutdown.borrow();
    if mode != Shutdown::Running {
        reporter.log(
            "info",
            "stopping: no new claims",
            &[
                ("running", &tasks.len()),
                ("grace", &humantime::format_duration(options.shutdown_grace)),
            ],
        );
    }
    let deadline = tokio::time::Instant::now() + options.shutdown_grace;
    while !tasks.is_empty() && *shutdown.borrow() != Shutdown::Immediate {
        tokio::select! {
            _ = tasks.join_next() => {}
            _ = tokio::time::sleep_until(deadline) => break,
            _ = signalled(&mut shutdown, Shutdown::Immediate) => break,
        }
    }
    let _ = cancel_tx.send(true);
    let mut aborted = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(Some(token)) = done {
            aborted.push(token);
        }
    }
    renewer.abort();
    status.abort();
    drop(ctx);
    let _ = completer_task.await;
    let release = store.release(&options.owner, &aborted);
    match tokio::time::timeout(Duration::from_secs(10), release).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => reporter.log(
            "warn",
            "could not hand the lanes back; they free up when the lease expires",
            &[("error", &format!("{e:#}"))],
        ),
        Err(_) => reporter.log(
            "warn",
            "handing the lanes back timed out; they free up when the lease expires",
            &[],
        ),
    }
    reporter
        .counters
        .released
        .fetch_add(aborted.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let summary = reporter.counters.summary();
    reporter.log(
        "info",
        "worker stopped",
        &[
            ("handled", &summary.handled),
            ("failed", &summary.failed),
            ("dead", &summary.dead),
            ("lease_lost", &summary.lease_lost),
            ("released", &summary.released),
        ],
    );
    Ok(summary)
}

/// Runs one delivery to its end. Returns its token when it was aborted by shutdown.
async fn run_delivery<S: Store>(
    ctx: &Context<S>,
    delivery: ClaimedDelivery,
    running: RunningGuard,
    slot: OwnedSemaphorePermit,
    mut cancel: watch::Receiver<bool>,
) -> Option<LeaseToken> {
    let spec = ctx
        .handlers
        .get(&delivery.handler)
        .expect("claims only return deliveries of the worker's handlers");
    let outcome = tokio::select! {
        outcome = spec.handler.handle(&delivery) => outcome,
        _ = cancel.wait_for(|c| *c) => return Some(delivery.token),
    };
    // Concurrency bounds running handlers. Recording the outcome overlaps the next claim: the
    // delivery stays in its lane's in-flight list until it is deleted or rescheduled, so the
    // claim cannot pick it again.
    drop(slot);
    let attempt = delivery.attempts + 1;
    let counters = &ctx.reporter.counters;
    use std::sync::atomic::Ordering::Relaxed;
    let (failure, error) = match outcome {
        Outcome::Completed => {
            let pending = ctx.completer.submit(delivery.token.clone());
            drop(running);
            match pending.verdict().await {
                Ok(true) => {
                    counters.handled.fetch_add(1, Relaxed);
                }
                Ok(false) => {
                    counters.lease_lost.fetch_add(1, Relaxed);
                    lease_lost(ctx, &delivery);
                }
                Err(e) => ctx.reporter.log(
                    "error",
                    "could not record the completion; the delivery runs again after its lease expires",
                    &[("delivery", &delivery.token.delivery_id), ("error", &e)],
                ),
            }
            return None;
        }
        Outcome::Rejected { error } => (Failure::Bury, error),
        Outcome::Failed { error, .. } if attempt >= spec.max_attempts => (Failure::Bury, error),
        Outcome::Failed { error, retry_after } => {
            let delay = retry_after
                .map(|d| d.min(spec.backoff.max))
                .unwrap_or_else(|| spec.backoff.delay(attempt));
            (Failure::Reschedule { delay }, error)
        }
    };
    drop(running);
    match ctx.store.fail(&delivery.token, &failure, &error).await {
        Ok(true) => {
            let fields: [(&str, &dyn std::fmt::Display); 5] = [
                ("delivery", &delivery.token.delivery_id),
                ("event", &delivery.event_id),
                ("handler", &delivery.handler),
                ("attempt", &attempt),
                ("error", &error),
            ];
            match failure {
                Failure::Bury => {
                    counters.dead.fetch_add(1, Relaxed);
                    ctx.reporter
                        .log("error", "delivery buried (dead letter)", &fields);
                }
                Failure::Reschedule { delay } => {
                    counters.failed.fetch_add(1, Relaxed);
                    let retry =
                        humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
                            .to_string();
                    let mut with_retry = fields.to_vec();
                    with_retry.push(("retry_in", &retry));
                    ctx.reporter
                        .log("warn", "attempt failed; rescheduled", &with_retry);
                }
            }
        }
        Ok(false) => {
            counters.lease_lost.fetch_add(1, Relaxed);
            lease_lost(ctx, &delivery);
        }
        Err(e) => ctx.reporter.log(
            "error",
            "could not record the failed attempt; the delivery runs again after its lease expires",
            &[
                ("delivery", &delivery.token.delivery_id),
                ("error", &format!("{e:#}")),
            ],
        ),
    }
    None
}

fn lease_lost<S>(ctx: &Context<S>, d: &ClaimedDelivery) {
    ctx.reporter.log(
        "warn",
        "lease lost: another worker took the lane over; the delivery runs again there",
        &[("delivery", &d.token.delivery_id), ("token", &d.token)],
    );
}

async fn renew<S: Store>(store: Arc<S>, owner: String, lease: Duration, reporter: Arc<Reporter>) {
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = store.renew(&owner, lease).await {
            reporter.log(
                "warn",
                "lease renewal failed; retrying",
                &[("error", &format!("{e:#}"))],
            );
        }
    }
}

async fn status_line(reporter: Arc<Reporter>, slots: Arc<Semaphore>, concurrency: usize) {
    loop {
        reporter.status(concurrency - slots.available_permits());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
