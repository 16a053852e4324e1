//! The tasks a worker runs beside its claim streams: wake-ups, lease renewal, the stall watchdog
//! and the status line.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

use super::{Context, Reporter};
use crate::store::{Store, WakeUp};

/// Turns the store's wake-ups into a wake-up of every stream, logging a lost subscription as it
/// happens: at info when it is lost (a server or pooler that closes idle sessions does that
/// often, and the first reconnect mends it), as a warning once a reconnect failed too.
pub(super) fn relay_wake_ups<S: Store>(
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
pub(super) async fn renew<S: Store>(ctx: Arc<Context<S>>, owner: String, lease: Duration) {
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

pub(super) async fn status_line(
    reporter: Arc<Reporter>,
    slots: Arc<Semaphore>,
    concurrency: usize,
) {
    loop {
        reporter.status(concurrency - slots.available_permits());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A stalled operation waits this long at most for the list of sessions blocking it.
const BLOCKERS_TIMEOUT: Duration = Duration::from_secs(3);

/// Reports every operation that has waited `bound`, until it ends: a log line naming the
/// sessions that block it, a count in `/metrics`, and `/readyz` unready; when it ends, it says
/// how long it took. Operations are looked at every quarter of the bound, so a stall is
/// reported once it has waited between one and one and a quarter bounds.
pub(super) async fn watchdog<S: Store>(reporter: Arc<Reporter>, store: Arc<S>, bound: Duration) {
    let mut every = tokio::time::interval(bound / 4);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        for (id, operation) in reporter.health.newly_stalled(bound) {
            reporter.metrics.stalled(operation);
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
            reporter.health.mark_stalled(
                id,
                format!("{operation} has waited over {waited}, blocked by {blockers}"),
            );
        }
    }
}
