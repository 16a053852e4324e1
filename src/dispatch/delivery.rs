//! One delivery, from its claim to its recorded outcome: run the handler, then complete it
//! (batched), or record the failed attempt, or, on shutdown, hand back its token for release.

use std::time::Duration;

use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::complete::{until_recorded, RunningGuard};
use super::metrics::Ended;
use super::{Context, Runner};
use crate::handler::Outcome;
use crate::store::{ClaimedDelivery, FailOutcome, Failure, LeaseToken, StatementOutcome, Store};

/// Runs one delivery to its end. Returns its token when it was aborted by shutdown.
pub(super) async fn run<S: Store>(
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
    let _in_flight = ctx.reporter.metrics.in_flight();
    let started = Instant::now();
    let outcome = match &spec.runner {
        Runner::Handler(handler) => tokio::select! {
            outcome = handler.handle(&delivery) => outcome,
            _ = cancel.wait_for(|c| *c) => return Some(delivery.token),
        },
        Runner::Statement { sql, timeout } => {
            let mut aborted = cancel.clone();
            // Boxed, as the failure path's below: the engines' statement futures are large,
            // and every delivery's task would otherwise carry them, copied at each spawn.
            let run = Box::pin(until_recorded(
                "statement",
                "a handler's statement",
                &ctx.reporter,
                &mut cancel,
                || {
                    ctx.store
                        .complete_with_statement(&delivery, sql, *timeout, ctx.history)
                },
            ));
            // Aborted by a second signal, the transaction rolls back: released like any other.
            let ran = tokio::select! {
                ran = run => ran,
                _ = aborted.wait_for(|c| *c) => return Some(delivery.token),
            };
            ctx.reporter
                .metrics
                .handler_ran(&delivery.handler, started.elapsed());
            match ran {
                Ok(StatementOutcome::Completed) => {
                    ctx.reporter.ended(Ended::Handled, &delivery.handler);
                    return None;
                }
                Ok(StatementOutcome::LeaseLost) => {
                    lease_lost(ctx, &delivery);
                    return None;
                }
                Ok(StatementOutcome::Failed(error)) => Outcome::Failed {
                    error,
                    retry_after: None,
                },
                Err(e) => {
                    stopped_unrecorded(&delivery, "statement", &e);
                    return None;
                }
            }
        }
    };
    if let Runner::Handler(_) = spec.runner {
        ctx.reporter
            .metrics
            .handler_ran(&delivery.handler, started.elapsed());
    }
    // Concurrency bounds running handlers. Recording the outcome overlaps the next claim: the
    // delivery stays in its lane's in-flight list until it is deleted or rescheduled, so the
    // claim cannot pick it again.
    drop(slot);
    let attempt = delivery.attempts + 1;
    let (failure, error) = match outcome {
        Outcome::Completed => {
            let pending = ctx.completer.submit(delivery.token.clone());
            drop(running);
            match pending.verdict().await {
                Ok(true) => {
                    ctx.reporter.ended(Ended::Handled, &delivery.handler);
                }
                Ok(false) => lease_lost(ctx, &delivery),
                Err(e) => stopped_unrecorded(&delivery, "completion", &e),
            }
            return None;
        }
        Outcome::Rejected { error } => (Failure::Reject, error),
        Outcome::Failed { error, retry_after } => {
            let backoff = spec.retry.backoff;
            let delay = retry_after
                .map(|d| d.min(backoff.max))
                .unwrap_or_else(|| backoff.delay(attempt.max(1) as u32));
            let max_attempts = spec.retry.max_attempts;
            (
                Failure::Retry {
                    delay,
                    max_attempts,
                },
                error,
            )
        }
    };
    drop(running);
    let recorded = Box::pin(until_recorded(
        "fail",
        "a failed attempt",
        &ctx.reporter,
        &mut cancel,
        || ctx.store.fail(&delivery.token, &failure, &error),
    ))
    .await;
    let (id, event, handler) = (
        &delivery.token.delivery_id,
        &delivery.event_id,
        &delivery.handler,
    );
    match recorded {
        Ok(FailOutcome::Buried) => {
            ctx.reporter.ended(Ended::Buried, &delivery.handler);
            tracing::error!(delivery = %id, event = %event, handler = %handler, attempt, error = %error, "delivery buried (dead letter)");
        }
        Ok(FailOutcome::Rescheduled) => {
            ctx.reporter.ended(Ended::Failed, &delivery.handler);
            let Failure::Retry { delay, .. } = failure else {
                unreachable!("a rejected delivery is never rescheduled")
            };
            let retry = humantime::format_duration(Duration::from_millis(delay.as_millis() as u64))
                .to_string();
            tracing::warn!(delivery = %id, event = %event, handler = %handler, attempt, error = %error, retry_in = %retry, "attempt failed; rescheduled");
        }
        Ok(FailOutcome::LeaseLost) => lease_lost(ctx, &delivery),
        Err(e) => stopped_unrecorded(&delivery, "failed attempt", &e),
    }
    None
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
