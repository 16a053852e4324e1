//! A claim stream: it claims, starts what it claimed, and rests when nothing is due.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::shutdown::{next_signal, signalled, Shutdown};
use super::{delivery, since_boot, Running, Shared};
use crate::backoff::{Backoff, Retries};
use crate::store::{ClaimRequest, ClaimStats, ClaimedDelivery, LaneShare, LeaseToken, Store};

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

/// One claim stream: it claims, starts what it claimed, and rests when nothing is due. Its
/// lanes are its own, so its claims run beside the other stream's without waiting for them, and
/// it alone writes the in-flight lists of its lanes.
pub(super) struct Claimer {
    /// The parts of every claim of this stream that never change.
    pub(super) template: ClaimRequest,
    pub(super) tasks: JoinSet<Option<LeaseToken>>,
    pub(super) wake: Arc<Notify>,
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

impl Claimer {
    /// Stream `index` of `streams`, on its share of the lanes.
    pub(super) fn new(template: &ClaimRequest, index: usize, streams: usize) -> Self {
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
    pub(super) async fn run<S: Store>(
        &mut self,
        shared: &Shared<S>,
        mut shutdown: watch::Receiver<Shutdown>,
    ) {
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
        shared.ctx.rows.narrow(&mut request);
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
        shared.ctx.rows.narrow(&mut claimable);
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
