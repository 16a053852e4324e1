//! The handlers table as this worker acts on it: which handlers its claims ask for (not
//! paused, breaker not open), whether a claimed delivery may be sent now, and what each attempt
//! tells the circuit breaker. The view is read from the store about once a second, so every
//! worker of the store follows one pause and one breaker; this worker's own changes enter it at
//! once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Notify;

use super::{Context, Reporter};
use crate::handler::Outcome;
use crate::store::handlers::{Breaker, BreakerPolicy, HandlerRow};
use crate::store::{ClaimRequest, Store};

/// How often the view is read at most; a shorter poll interval reads it that often.
const REFRESH: Duration = Duration::from_secs(1);
/// How long a delivery waits when the breaker is open, or another worker holds its probe.
pub(super) const HOLD: Duration = Duration::from_secs(1);

/// Whether a claimed delivery may be sent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit {
    Send,
    /// Sent as the breaker's probe: its outcome opens or closes the breaker.
    Probe,
    /// The breaker is open: postponed by `HOLD`, without an attempt.
    Hold,
}

pub(super) struct HandlerRows {
    /// The handlers this worker serves, with the breaker settings configured for each webhook.
    handlers: HashMap<String, Option<BreakerPolicy>>,
    /// The rows of those that have one.
    view: Mutex<HashMap<String, HandlerRow>>,
}

impl HandlerRows {
    pub(super) fn new(handlers: HashMap<String, Option<BreakerPolicy>>) -> Self {
        Self {
            handlers,
            view: Mutex::default(),
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, HashMap<String, HandlerRow>> {
        self.view.lock().expect("handler rows lock")
    }

    /// Leaves out of a claim the handlers it may not ask for now.
    pub(super) fn narrow(&self, request: &mut ClaimRequest) {
        let view = self.view();
        if view.is_empty() {
            return;
        }
        let now = Utc::now();
        let keep = |h: &String| view.get(h).is_none_or(|c| c.claimable(now));
        let (handlers, max_attempts) = request
            .handlers
            .iter()
            .zip(&request.max_attempts)
            .filter(|(h, _)| keep(h))
            .map(|(h, m)| (h.clone(), *m))
            .unzip();
        (request.handlers, request.max_attempts) = (handlers, max_attempts);
    }

    /// Whether a claimed delivery of `handler` may be sent now; when the breaker's cool-down
    /// ended, one delivery of one worker is its probe and the others wait.
    pub(super) async fn admit<S: Store>(&self, store: &S, handler: &str) -> Admit {
        let now = Utc::now();
        let breaker = match self.view().get(handler) {
            None => return Admit::Send,
            Some(c) => c.breaker(now),
        };
        match breaker {
            Breaker::Closed => Admit::Send,
            // Due again soon: claims leave the handler out while its breaker is open, and
            // once it closes (its probe answered, or an operator closed it) nothing waits.
            Breaker::Open => Admit::Hold,
            Breaker::ProbeDue => {
                // Boxed, as is the write in `attempted`: every delivery's task would otherwise
                // carry the store's future, copied at each spawn, for a write that is rare.
                match Box::pin(store.change_handler(handler, &|c| c.take_probe(Utc::now()))).await {
                    Ok(Some(c)) => {
                        self.view().insert(handler.to_owned(), c);
                        tracing::info!(handler, "circuit breaker: sending a probe");
                        Admit::Probe
                    }
                    Ok(None) => Admit::Hold,
                    Err(e) => {
                        tracing::warn!(handler, error = %format!("{e:#}"), "could not take the circuit breaker's probe");
                        Admit::Hold
                    }
                }
            }
        }
    }

    /// What an attempt tells the breaker: an endpoint that did not answer (or answered 5xx)
    /// counts a failure, any other answer closes it. A handler whose endpoint never failed
    /// writes nothing here.
    pub(super) async fn attempted<S: Store>(
        &self,
        store: &S,
        reporter: &Reporter,
        handler: &str,
        outcome: &Outcome,
        probe: bool,
    ) {
        if matches!(outcome, Outcome::NotStarted { .. }) {
            return;
        }
        let failed = matches!(outcome, Outcome::Unavailable { .. });
        let troubled = self
            .view()
            .get(handler)
            .is_some_and(|c| c.failures > 0 || c.open_until.is_some());
        if !(failed || probe || troubled) {
            return;
        }
        let opened = AtomicBool::new(false);
        let closed = AtomicBool::new(false);
        let change = |c: &mut HandlerRow| {
            if failed {
                opened.store(c.failed(probe, Utc::now()), Ordering::Relaxed);
                true
            } else {
                closed.store(c.open_until.is_some(), Ordering::Relaxed);
                c.close_breaker()
            }
        };
        match Box::pin(store.change_handler(handler, &change)).await {
            Ok(Some(c)) => {
                if opened.load(Ordering::Relaxed) {
                    let cooldown = c.breaker_policy.cooldown(c.opened);
                    tracing::warn!(
                        handler,
                        failures = c.failures,
                        cooldown = %humantime::format_duration(cooldown.to_std().unwrap_or_default()),
                        "circuit breaker opened: nothing is sent to the endpoint until the cool-down ends; its deliveries wait without an attempt"
                    );
                    reporter.metrics.breaker_changed(handler, "open");
                } else if closed.load(Ordering::Relaxed) {
                    tracing::info!(handler, "circuit breaker closed: the endpoint answered");
                    reporter.metrics.breaker_changed(handler, "closed");
                }
                reporter
                    .metrics
                    .handler_row(handler, c.paused(), c.open_until.is_some());
                let mut view = self.view();
                if !opened.load(Ordering::Relaxed) && !closed.load(Ordering::Relaxed) {
                    // What another worker changed meanwhile (its failure opened the breaker at
                    // its threshold, say), seen here first.
                    let before = view
                        .get(handler)
                        .cloned()
                        .unwrap_or_else(|| HandlerRow::new(handler));
                    log_changes(handler, &before, &c, reporter);
                }
                view.insert(handler.to_owned(), c);
                reporter.health.set_held(self.held(&view));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(handler, error = %format!("{e:#}"), "could not record the attempt with the circuit breaker")
            }
        }
    }

    /// Why nothing of this worker may be claimed now, when nothing may: every handler it serves
    /// paused, or its breaker open.
    fn held(&self, view: &HashMap<String, HandlerRow>) -> Option<String> {
        let now = Utc::now();
        let mut handlers: Vec<&String> = self.handlers.keys().collect();
        handlers.sort();
        let why = handlers
            .into_iter()
            .map(|h| {
                let c = view.get(h).filter(|c| !c.claimable(now))?;
                Some(match (c.paused(), &c.pause_reason) {
                    (true, Some(reason)) => format!("`{h}` is paused ({reason})"),
                    (true, None) => format!("`{h}` is paused"),
                    (false, _) => format!(
                        "`{h}`'s circuit breaker is open until {}",
                        c.open_until
                            .unwrap_or(now)
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(format!("nothing is claimed: {}", why.join("; ")))
    }

    /// Takes the rows read from the store, logging what changed for the handlers served
    /// (`first`: the worker's first read, whose breaker settings are where it starts, not a
    /// change). True when a handler became claimable.
    fn update(&self, read: Vec<HandlerRow>, r: &Reporter, first: bool) -> bool {
        let now = Utc::now();
        let read: HashMap<String, HandlerRow> = read
            .into_iter()
            .filter(|c| self.handlers.contains_key(&c.handler))
            .map(|c| (c.handler.clone(), c))
            .collect();
        let mut view = self.view();
        let mut freed = false;
        for handler in self.handlers.keys() {
            let default = HandlerRow::new(handler);
            let after = read.get(handler).unwrap_or(&default);
            let before = match view.get(handler) {
                None if first => &HandlerRow {
                    breaker_policy: after.breaker_policy,
                    ..default.clone()
                },
                None => &default,
                Some(before) => before,
            };
            log_changes(handler, before, after, r);
            freed |= !before.claimable(now) && after.claimable(now);
            r.metrics
                .handler_row(handler, after.paused(), after.open_until.is_some());
        }
        r.health.set_held(self.held(&read));
        *view = read;
        freed
    }
}

fn log_changes(handler: &str, before: &HandlerRow, after: &HandlerRow, r: &Reporter) {
    match (before.paused(), after.paused()) {
        (false, true) => tracing::info!(
            handler,
            by = after.paused_by.as_deref().unwrap_or("-"),
            reason = after.pause_reason.as_deref().unwrap_or("-"),
            "handler paused: its deliveries are not claimed until it is resumed"
        ),
        (true, false) => tracing::info!(handler, "handler resumed"),
        _ => {}
    }
    if before.breaker_policy != after.breaker_policy {
        tracing::info!(
            handler,
            settings = %settings(after.breaker_policy),
            "circuit breaker settings changed in the handlers table (another worker's configuration)"
        );
    }
    match (before.open_until.is_some(), after.open_until.is_some()) {
        (false, true) => {
            tracing::warn!(handler, "circuit breaker opened by another worker");
            r.metrics.breaker_changed(handler, "open");
        }
        (true, false) => {
            tracing::info!(handler, "circuit breaker closed by another worker");
            r.metrics.breaker_changed(handler, "closed");
        }
        _ => {}
    }
}

/// Reads the handlers table now and then, and wakes the claim streams when a handler
/// may be claimed again.
pub(super) async fn refresh<S: Store>(
    ctx: Arc<Context<S>>,
    poll_interval: Duration,
    wakes: Vec<Arc<Notify>>,
) {
    let mut failing = false;
    loop {
        tokio::time::sleep(poll_interval.min(REFRESH)).await;
        match ctx.store.handler_rows().await {
            Ok(read) => {
                failing = false;
                if ctx.rows.update(read, &ctx.reporter, false) {
                    wakes.iter().for_each(|w| w.notify_one());
                }
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %format!("{e:#}"), "could not read the handlers table; acting on the last read");
            }
            Err(_) => {}
        }
    }
}

/// The first read, before anything is claimed: a paused handler is not claimed at start. Then
/// the breaker settings this worker is configured with go to the rows whose settings differ,
/// so that every worker of the store counts against the last started one's.
pub(super) async fn load<S: Store>(ctx: &Context<S>) {
    match ctx.store.handler_rows().await {
        Ok(read) => {
            ctx.rows.update(read, &ctx.reporter, true);
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "could not read the handlers table");
            return;
        }
    }
    let mut webhooks: Vec<(&String, BreakerPolicy)> = (ctx.rows.handlers.iter())
        .filter_map(|(h, policy)| Some((h, (*policy)?)))
        .collect();
    webhooks.sort_by_key(|(h, _)| *h);
    for (handler, policy) in webhooks {
        let stored = ctx.rows.view().get(handler).map(|c| c.breaker_policy);
        if stored.unwrap_or_default() == policy {
            continue;
        }
        let set = |c: &mut HandlerRow| c.set_breaker_policy(policy);
        match ctx.store.change_handler(handler, &set).await {
            Ok(changed) => {
                tracing::info!(
                    handler = %handler,
                    settings = %settings(policy),
                    "circuit breaker settings written to the handlers table: every worker of the store counts against them"
                );
                if let Some(c) = changed {
                    ctx.rows.view().insert(handler.clone(), c);
                }
            }
            Err(e) => {
                tracing::warn!(handler = %handler, error = %format!("{e:#}"), "could not write the circuit breaker settings; the store's apply")
            }
        }
    }
}

/// A breaker's settings for a log line: `threshold 5, max cool-down 2m`.
fn settings(policy: BreakerPolicy) -> String {
    format!(
        "threshold {}, max cool-down {}",
        policy.threshold,
        humantime::format_duration(policy.max_cooldown)
    )
}
