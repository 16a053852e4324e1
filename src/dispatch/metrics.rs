//! What a worker tells Prometheus, and whether it is ready: the counters and histograms the
//! dispatcher records as it works, which `endpoint` serves. Labels name handlers and operations only, never an event id or a key,
//! so a series count stays bounded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry, Unit};

use super::health::Health;
use crate::store::Store;

/// Lag is read from the store at most this often, however often Prometheus scrapes.
const LAG_EVERY: Duration = Duration::from_secs(10);
/// A scrape waits this long at most for the lag query.
const LAG_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandlerLabel {
    handler: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabel {
    handler: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

/// How a delivery's attempt ended, as counted per handler.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    Handled,
    /// A failed attempt, rescheduled.
    Failed,
    Buried,
    LeaseLost,
    /// Handed back without an attempt (a handler that could not be started).
    Released,
}

/// Where the worker is, for `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Starting = 0,
    Claiming = 1,
    ClaimsFailing = 2,
    Stopping = 3,
}

type Seconds = Histogram;
type Lag = Gauge<f64, AtomicU64>;

pub struct Metrics {
    /// Off unless the worker serves them: recording costs a few per cent of a tuned worker's
    /// throughput, which a worker nobody scrapes should not pay.
    enabled: bool,
    registry: Registry,
    ended: [Family<HandlerLabel, Counter>; 5],
    in_flight: Gauge,
    claims: Counter,
    claim_size: Histogram,
    claim_duration: Seconds,
    completion_duration: Seconds,
    handler_duration: Family<HandlerLabel, Seconds, fn() -> Seconds>,
    lag: Family<HandlerLabel, Lag>,
    paused: Family<HandlerLabel, Gauge>,
    breaker_open: Family<HandlerLabel, Gauge>,
    breaker_transitions: Family<TransitionLabel, Counter>,
    lanes_held: Gauge,
    wake_ups: Counter,
    database_errors: Family<OperationLabel, Counter>,
    stalls: Family<OperationLabel, Counter>,
    phase: AtomicU8,
    lag_sampled: Mutex<Option<Instant>>,
    /// Each handler's series, looked up by name without building a label per delivery.
    series: OnceLock<HashMap<String, HandlerSeries>>,
}

struct HandlerSeries {
    ended: [Counter; 5],
    duration: Seconds,
}

fn seconds() -> Seconds {
    // 100 µs to about 3.5 minutes.
    Histogram::new(exponential_buckets(0.0001, 2.0, 22))
}

/// Counts one delivery in flight until dropped.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The counters of deliveries that ended, by how, in the order of `Metrics::ended`.
const ENDED: [(&str, &str); 5] = [
    ("deliveries_handled", "Deliveries completed"),
    (
        "delivery_attempts_failed",
        "Failed attempts rescheduled for a later attempt",
    ),
    ("deliveries_buried", "Deliveries buried as dead letters"),
    (
        "deliveries_lease_lost",
        "Outcomes refused because another worker had taken the lane over",
    ),
    (
        "deliveries_released",
        "Deliveries handed back without an attempt: their handler not started, or its circuit breaker open",
    ),
];

const CLAIM_SIZES: [f64; 11] = [
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];

fn registered<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

fn in_seconds<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register_with_unit(name, help, Unit::Seconds, metric.clone());
    metric
}

impl Metrics {
    pub fn new(enabled: bool) -> Self {
        let mut r = Registry::with_prefix("relaybus");
        Self {
            enabled,
            ended: ENDED.map(|(name, help)| registered(&mut r, name, help, Family::default())),
            in_flight: registered(
                &mut r,
                "deliveries_in_flight",
                "Deliveries claimed by this worker and not ended yet",
                Gauge::default(),
            ),
            claims: registered(&mut r, "claims", "Claims made", Counter::default()),
            claim_size: registered(
                &mut r,
                "claim_size",
                "Deliveries per claim",
                Histogram::new(CLAIM_SIZES),
            ),
            claim_duration: in_seconds(&mut r, "claim_duration", "Time a claim took", seconds()),
            completion_duration: in_seconds(
                &mut r,
                "completion_duration",
                "Time a completion statement took (one per window of completions)",
                seconds(),
            ),
            handler_duration: in_seconds(
                &mut r,
                "handler_duration",
                "Time a handler's attempt took",
                Family::<HandlerLabel, Seconds, fn() -> Seconds>::new_with_constructor(seconds),
            ),
            lag: in_seconds(
                &mut r,
                "lag",
                "Age of the oldest due delivery of each handler, read at most every 10 s",
                Family::default(),
            ),
            paused: registered(
                &mut r,
                "handler_paused",
                "1 while the handler is paused (`relaybus handlers pause`)",
                Family::default(),
            ),
            breaker_open: registered(
                &mut r,
                "breaker_open",
                "1 while the circuit breaker of the handler's endpoint is open",
                Family::default(),
            ),
            breaker_transitions: registered(
                &mut r,
                "breaker_transitions",
                "Changes of a handler's circuit breaker seen by this worker, by the state entered",
                Family::default(),
            ),
            lanes_held: registered(
                &mut r,
                "lanes_held",
                "Lanes this worker held at its last lease renewal",
                Gauge::default(),
            ),
            wake_ups: registered(&mut r, "wake_ups", "Wake-ups received", Counter::default()),
            database_errors: registered(
                &mut r,
                "database_errors",
                "Database operations that failed, by operation",
                Family::default(),
            ),
            stalls: registered(
                &mut r,
                "stalls",
                "Database operations that waited past --stall-after, by operation",
                Family::default(),
            ),
            registry: r,
            phase: AtomicU8::new(Phase::Starting as u8),
            lag_sampled: Mutex::new(None),
            series: OnceLock::new(),
        }
    }

    /// The handlers this worker runs: their series exist from the start, at zero.
    pub fn handlers(&self, names: &[String]) {
        if !self.enabled {
            return;
        }
        self.series.get_or_init(|| {
            names
                .iter()
                .map(|handler| {
                    let label = HandlerLabel {
                        handler: handler.clone(),
                    };
                    let _ = self.lag.get_or_create(&label);
                    let _ = self.paused.get_or_create(&label);
                    let _ = self.breaker_open.get_or_create(&label);
                    let series = HandlerSeries {
                        ended: self
                            .ended
                            .each_ref()
                            .map(|family| family.get_or_create_owned(&label)),
                        duration: self.handler_duration.get_or_create_owned(&label),
                    };
                    (handler.clone(), series)
                })
                .collect()
        });
    }

    fn of(&self, handler: &str) -> Option<&HandlerSeries> {
        self.series.get()?.get(handler)
    }

    pub fn ended(&self, how: Ended, handler: &str) {
        if let Some(series) = self.of(handler) {
            series.ended[how as usize].inc();
        }
    }

    pub fn in_flight(&self) -> Option<InFlight> {
        if !self.enabled {
            return None;
        }
        self.in_flight.inc();
        Some(InFlight(self.in_flight.clone()))
    }

    pub fn claimed(&self, size: usize, took: Duration) {
        if !self.enabled {
            return;
        }
        self.claims.inc();
        self.claim_size.observe(size as f64);
        self.claim_duration.observe(took.as_secs_f64());
        self.set_phase(Phase::Claiming);
    }

    pub fn claim_failed(&self) {
        if !self.enabled {
            return;
        }
        self.database_error("claim");
        self.set_phase(Phase::ClaimsFailing);
    }

    pub fn completed(&self, took: Duration) {
        if !self.enabled {
            return;
        }
        self.completion_duration.observe(took.as_secs_f64());
    }

    pub fn handler_ran(&self, handler: &str, took: Duration) {
        if let Some(series) = self.of(handler) {
            series.duration.observe(took.as_secs_f64());
        }
    }

    /// A handler's row as the worker last read it.
    pub fn handler_row(&self, handler: &str, paused: bool, breaker_open: bool) {
        if !self.enabled {
            return;
        }
        let label = HandlerLabel {
            handler: handler.to_owned(),
        };
        self.paused.get_or_create(&label).set(i64::from(paused));
        self.breaker_open
            .get_or_create(&label)
            .set(i64::from(breaker_open));
    }

    pub fn breaker_changed(&self, handler: &str, state: &'static str) {
        if !self.enabled {
            return;
        }
        self.breaker_transitions
            .get_or_create(&TransitionLabel {
                handler: handler.to_owned(),
                state,
            })
            .inc();
    }

    pub fn lanes_held(&self, lanes: u64) {
        if !self.enabled {
            return;
        }
        self.lanes_held.set(lanes as i64);
    }

    pub fn woken(&self) {
        if !self.enabled {
            return;
        }
        self.wake_ups.inc();
    }

    pub fn database_error(&self, operation: &'static str) {
        if !self.enabled {
            return;
        }
        self.database_errors
            .get_or_create(&OperationLabel { operation })
            .inc();
    }

    pub fn stalled(&self, operation: &'static str) {
        if !self.enabled {
            return;
        }
        self.stalls
            .get_or_create(&OperationLabel { operation })
            .inc();
    }

    /// From here on the worker is not ready, whatever its claims do.
    pub fn stopping(&self) {
        self.phase.store(Phase::Stopping as u8, Ordering::Relaxed);
    }

    fn set_phase(&self, phase: Phase) {
        let _ = self
            .phase
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (now != Phase::Stopping as u8).then_some(phase as u8)
            });
    }

    /// Ready when claims succeed, the worker is not stopping and nothing keeps it from working
    /// (`health`), or when it claims nothing because every handler of it is paused or its
    /// breaker open (the operator asked for that), with a note why; otherwise why not, the most
    /// telling reason first.
    pub(super) fn readiness(&self, health: &Health) -> Result<Option<String>, String> {
        let phase = self.phase.load(Ordering::Relaxed);
        if phase == Phase::Stopping as u8 {
            return Err("shutting down".into());
        }
        health.readiness()?;
        if let Some(held) = health.held() {
            return Ok(Some(held));
        }
        match phase {
            p if p == Phase::Starting as u8 => Err("starting: no claim has succeeded yet".into()),
            p if p == Phase::ClaimsFailing as u8 => Err("claims are failing".into()),
            _ => Ok(None),
        }
    }

    /// Reads the lag of these handlers from the store unless it was read within `LAG_EVERY`.
    pub(super) async fn sample_lag<S: Store>(&self, store: &S, handlers: &[String]) {
        {
            let mut sampled = self.lag_sampled.lock().expect("lag lock");
            if sampled.is_some_and(|at| at.elapsed() < LAG_EVERY) {
                return;
            }
            *sampled = Some(Instant::now());
        }
        match tokio::time::timeout(LAG_TIMEOUT, store.stats()).await {
            Ok(Ok(stats)) => {
                for s in stats.iter().filter(|s| handlers.contains(&s.handler)) {
                    let label = HandlerLabel {
                        handler: s.handler.clone(),
                    };
                    self.lag
                        .get_or_create(&label)
                        .set(s.lag_seconds.unwrap_or(0.0));
                }
            }
            _ => self.database_error("stats"),
        }
    }

    pub(super) fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}
