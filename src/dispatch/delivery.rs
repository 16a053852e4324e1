//! One delivery, from its claim to its recorded outcome: run the handler, then complete it
//! (batched), or record the failed attempt, or, on shutdown, hand back its token for release.

use std::time::Duration;

use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::complete::RunningGuard;
use super::handler_rows::Admit;
use super::metrics::Ended;
use super::{Context, HandlerSpec, Runner};
use crate::handler::Outcome;
use crate::store::{ClaimedDelivery, FailOutcome, Failure, LeaseToken, StatementOutcome, Store};

/// How a delivery's run ended before its outcome was recorded.
enum Ran {
    /// The handler ended this way; the outcome is still to be recorded.
    Outcome(Outcome),
    /// The outcome is recorded already (a statement commits with its completion).
    Recorded,
    /// Aborted by shutdown: the token, for release.
    Aborted,
}

/// A claimed delivery, with when its lease was last known to start (`since_boot`).
pub(super) struct Leased {
    pub(super) delivery: ClaimedDelivery,
    pub(super) since: Duration,
}

/// A handler starts only with this part of the lease ahead of it at least (a fifth), by the
/// worker's own clock; otherwise the store is asked first.
const START_MARGIN: u32 = 5;

/// Runs one delivery to its end. Returns its token when it was aborted by shutdown.
pub(super) async fn run<S: Store>(
    ctx: &Context<S>,
    leased: Leased,
    running: RunningGuard,
    slot: OwnedSemaphorePermit,
    mut cancel: watch::Receiver<bool>,
) -> Option<LeaseToken> {
    let Leased {
        delivery,
        since: mut leased_at,
    } = leased;
    let spec = ctx
        .handlers
        .get(&delivery.handler)
        .expect("claims only return deliveries of the worker's handlers");
    let _in_flight = ctx.reporter.metrics.in_flight();
    // While outcomes cannot be recorded, nothing more runs: a worker that crashed then would
    // run again everything it ran meanwhile.
    tokio::select! {
        biased;
        _ = ctx.reporter.health.outcomes_recorded() => {}
        _ = cancel.wait_for(|c| *c) => return Some(delivery.token),
    }
    let admit = ctx.rows.admit(&*ctx.store, &delivery.handler).await;
    if admit == Admit::Hold {
        drop((slot, running));
        let error = "circuit breaker open: the endpoint is not sent to until its cool-down ends";
        record(
            ctx,
            &delivery,
            Failure::Postpone {
                delay: super::handler_rows::HOLD,
            },
            error.into(),
            &mut cancel,
        )
        .await;
        return None;
    }
    let started = Instant::now();
    let ran = attempt(ctx, spec, &delivery, &mut leased_at, &mut cancel).await?;
    let outcome = match ran {
        Ran::Aborted => return Some(delivery.token),
        Ran::Recorded => return None,
        Ran::Outcome(outcome) => outcome,
    };
    let probe = admit == Admit::Probe;
    (ctx.rows)
        .attempted(
            &*ctx.store,
            &ctx.reporter,
            &delivery.handler,
            &outcome,
            probe,
        )
        .await;
    if !matches!(outcome, Outcome::NotStarted { .. }) {
        ctx.reporter.health.started();
        ctx.reporter
            .metrics
            .handler_ran(&delivery.handler, started.elapsed());
    }
    // Concurrency bounds running handlers. Recording the outcome overlaps the next claim: the
    // delivery stays in its lane's in-flight list until it is deleted or rescheduled, so the
    // claim cannot pick it again.
    drop(slot);
    conclude(ctx, spec, &delivery, outcome, running, &mut cancel).await;
    None
}

/// Runs the handler once the lease is confirmed live, again while the gate withholds it; None
/// when the lane is no longer the worker's.
async fn attempt<S: Store>(
    ctx: &Context<S>,
    spec: &HandlerSpec,
    delivery: &ClaimedDelivery,
    leased_at: &mut Duration,
    cancel: &mut watch::Receiver<bool>,
) -> Option<Ran> {
    loop {
        if !lease_live(ctx, delivery, leased_at).await {
            return None;
        }
        let ran = match &spec.runner {
            Runner::Handler(handler) => {
                let gate = || lease_fresh(ctx.lease, *leased_at);
                tokio::select! {
                    outcome = handler.handle(delivery, &gate) => Ran::Outcome(outcome),
                    _ = cancel.wait_for(|c| *c) => Ran::Aborted,
                }
            }
            Runner::Statement { sql, timeout } => {
                run_statement(ctx, delivery, sql, *timeout, cancel).await
            }
        };
        // Withheld at the gate: nothing left the worker; the store is asked before it may.
        if !matches!(ran, Ran::Outcome(Outcome::Withheld)) {
            return Some(ran);
        }
    }
}

/// Whether the delivery's lane is still this worker's for long enough to start its handler: by
/// the worker's own clock while the claim is recent, else asked of the store, which extends the
/// lease when it is. So a worker that was frozen past its lease, or a delivery that waited long
/// for a slot, never starts a handler in a lane another worker may have taken over, where a
/// later delivery of its key may have run since.
async fn lease_live<S: Store>(
    ctx: &Context<S>,
    delivery: &ClaimedDelivery,
    leased_at: &mut Duration,
) -> bool {
    let lease = ctx.lease;
    if lease_fresh(lease, *leased_at) {
        return true;
    }
    let asked_at = super::since_boot();
    // Boxed: rare, and every delivery's task would otherwise carry the store's future.
    let confirm = Box::pin(ctx.store.confirm(&ctx.owner, lease, &delivery.token));
    let (id, handler) = (&delivery.token.delivery_id, &delivery.handler);
    match ctx.recorder().watched("confirm", confirm).await {
        Ok(true) => {
            tracing::debug!(delivery = %id, "lane lease confirmed before the handler started");
            *leased_at = asked_at;
            true
        }
        Ok(false) => {
            ctx.reporter.ended(Ended::LeaseLost, handler);
            tracing::warn!(
                delivery = %id,
                token = %delivery.token,
                "lease lost before the handler started (this worker was held up past its lease); not started here"
            );
            false
        }
        Err(e) => {
            ctx.reporter.metrics.database_error("confirm");
            tracing::warn!(
                delivery = %id,
                error = %format!("{e:#}"),
                "could not confirm the lane lease; the handler is not started, and the delivery runs again once the lease expires"
            );
            false
        }
    }
}

/// Whether a lease taken (or extended) at `leased_at` has a fifth of it or more ahead, by the
/// worker's own clock.
fn lease_fresh(lease: Duration, leased_at: Duration) -> bool {
    super::since_boot().saturating_sub(leased_at) + lease / START_MARGIN <= lease
}

/// Records a handler's outcome: a completion joins the completer's next statement, anything else
/// is recorded as a failure on its own.
async fn conclude<S: Store>(
    ctx: &Context<S>,
    spec: &HandlerSpec,
    delivery: &ClaimedDelivery,
    outcome: Outcome,
    running: RunningGuard,
    cancel: &mut watch::Receiver<bool>,
) {
    if outcome == Outcome::Completed {
        let pending = ctx.completer.submit(delivery.token.clone());
        drop(running);
        match pending.verdict().await {
            Ok(true) => ctx.reporter.ended(Ended::Handled, &delivery.handler),
            Ok(false) => lease_lost(ctx, delivery),
            Err(e) => stopped_unrecorded(delivery, "completion", &e),
        }
        return;
    }
    drop(running);
    let (failure, error) = failure(ctx, spec, delivery, outcome);
    record(ctx, delivery, failure, error, cancel).await;
}

/// A statement handler's run: the statement and the completion in one transaction, retried
/// until the database answers. A failed statement is an outcome still to be recorded.
async fn run_statement<S: Store>(
    ctx: &Context<S>,
    delivery: &ClaimedDelivery,
    sql: &str,
    timeout: Duration,
    cancel: &mut watch::Receiver<bool>,
) -> Ran {
    let mut aborted = cancel.clone();
    let recorder = ctx.recorder();
    // Boxed, as the failure path's below: the engines' statement futures are large, and every
    // delivery's task would otherwise carry them, copied at each spawn.
    let run =
        Box::pin(
            recorder.until_recorded("statement", "a handler's statement", cancel, || {
                ctx.store
                    .complete_with_statement(delivery, sql, timeout, ctx.history)
            }),
        );
    // Aborted by a second signal, the transaction rolls back: released like any other.
    let ran = tokio::select! {
        ran = run => ran,
        _ = aborted.wait_for(|c| *c) => return Ran::Aborted,
    };
    match ran {
        Ok(StatementOutcome::Completed) => ctx.reporter.ended(Ended::Handled, &delivery.handler),
        Ok(StatementOutcome::LeaseLost) => lease_lost(ctx, delivery),
        Ok(StatementOutcome::Failed(error)) => {
            return Ran::Outcome(Outcome::Failed {
                error,
                retry_after: None,
            })
        }
        Err(e) => stopped_unrecorded(delivery, "statement", &e),
    }
    Ran::Recorded
}

/// What an attempt that did not complete comes to: rescheduled with back-off, buried, or (when
/// the handler could not be started) postponed without an attempt.
fn failure<S: Store>(
    ctx: &Context<S>,
    spec: &HandlerSpec,
    delivery: &ClaimedDelivery,
    outcome: Outcome,
) -> (Failure, String) {
    let attempt = delivery.attempts + 1;
    match outcome {
        Outcome::Completed | Outcome::Withheld => {
            unreachable!("a completion is recorded by the completer, and a withheld one retried")
        }
        Outcome::Rejected { error } => (Failure::Reject, error),
        Outcome::NotStarted { error } => {
            let delay = ctx.reporter.health.start_failed(&error);
            (Failure::Postpone { delay }, error)
        }
        Outcome::Failed { error, retry_after } | Outcome::Unavailable { error, retry_after } => {
            let backoff = spec.retry.backoff;
            let delay = retry_after
                .map(|d| d.min(backoff.max))
                .unwrap_or_else(|| backoff.delay(attempt.max(1) as u32));
            let max_attempts = spec.retry.max_attempts;
            let retry = Failure::Retry {
                delay,
                max_attempts,
            };
            (retry, error)
        }
    }
}

/// Records an attempt that did not complete, or a delivery postponed without one.
async fn record<S: Store>(
    ctx: &Context<S>,
    delivery: &ClaimedDelivery,
    failure: Failure,
    error: String,
    cancel: &mut watch::Receiver<bool>,
) {
    let attempt = delivery.attempts + 1;
    // A NUL byte (a handler's stderr may hold one) is refused by PostgreSQL's text: the error
    // could never be recorded.
    let error = error.replace('\0', "\u{FFFD}");
    let recorder = ctx.recorder();
    let recorded = Box::pin(
        recorder.until_recorded("fail", "a failed attempt", cancel, || {
            ctx.store.fail(&delivery.token, &failure, &error)
        }),
    )
    .await;
    let (id, event, handler) = (
        &delivery.token.delivery_id,
        &delivery.event_id,
        &delivery.handler,
    );
    let (_, _, _, delay) = failure.terms();
    let retry_in =
        humantime::format_duration(Duration::from_millis(delay.as_millis() as u64)).to_string();
    match (recorded, &failure) {
        (Ok(FailOutcome::Buried), _) => {
            ctx.reporter.ended(Ended::Buried, handler);
            tracing::error!(delivery = %id, event = %event, handler = %handler, attempt, error = %error, "delivery buried (dead letter)");
        }
        (Ok(FailOutcome::Rescheduled), Failure::Postpone { .. }) => {
            ctx.reporter.ended(Ended::Released, handler);
            tracing::debug!(delivery = %id, handler = %handler, retry_in = %retry_in, error = %error, "delivery released without an attempt");
        }
        (Ok(FailOutcome::Rescheduled), _) => {
            ctx.reporter.ended(Ended::Failed, handler);
            tracing::warn!(delivery = %id, event = %event, handler = %handler, attempt, error = %error, retry_in = %retry_in, "attempt failed; rescheduled");
        }
        (Ok(FailOutcome::LeaseLost), _) => lease_lost(ctx, delivery),
        (Err(e), _) => stopped_unrecorded(delivery, "failed attempt", &e),
    }
}

/// The worker stopped before the database took an outcome: the lane is not handed back either,
/// so the delivery runs again once its lease expires and another worker takes the lane over,
/// which charges the attempt.
fn stopped_unrecorded(d: &ClaimedDelivery, what: &str, error: &str) {
    tracing::error!(
        delivery = %d.token.delivery_id,
        error = %error,
        "stopped before the {what} was recorded; the delivery runs again after its lease \
         expires, as attempt {}",
        d.attempts + 2
    );
}

fn lease_lost<S>(ctx: &Context<S>, d: &ClaimedDelivery) {
    ctx.reporter.ended(Ended::LeaseLost, &d.handler);
    tracing::warn!(
        delivery = %d.token.delivery_id,
        token = %d.token,
        "lease lost: another worker took the lane over; the delivery runs again there"
    );
}
