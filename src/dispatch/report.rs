//! What the operator sees while a worker runs: counters, and a live status line on a terminal.
//! Events of note are `tracing` events, which the command line writes as text or JSON lines
//! (above the status line). Nothing logged names a password or a webhook secret: callers pass
//! only ids, names and error texts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::health::Health;
use super::metrics::{Ended, Metrics};

#[derive(Default, Debug)]
pub struct Counters {
    pub handled: AtomicU64,
    pub failed: AtomicU64,
    pub dead: AtomicU64,
    pub lease_lost: AtomicU64,
    pub released: AtomicU64,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub handled: u64,
    pub failed: u64,
    pub dead: u64,
    pub lease_lost: u64,
    pub released: u64,
}

impl Counters {
    pub fn summary(&self) -> Summary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            handled: get(&self.handled),
            failed: get(&self.failed),
            dead: get(&self.dead),
            lease_lost: get(&self.lease_lost),
            released: get(&self.released),
        }
    }
}

pub struct Reporter {
    pub metrics: Metrics,
    pub counters: Counters,
    /// What keeps the worker from working, for back-pressure and `/readyz`.
    pub health: Health,
    /// The live status line, on a terminal with text logs; log lines are printed above it.
    status: Option<ProgressBar>,
    /// (when, attempts ended) a few seconds back, for the recent rate.
    recent: Mutex<VecDeque<(Instant, u64)>>,
}

/// The rate the status line shows is over this window.
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl Reporter {
    /// Counters and log lines, no status line.
    pub fn new() -> Self {
        Self {
            metrics: Metrics::new(false),
            counters: Counters::default(),
            health: Health::default(),
            status: None,
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// A reporter that draws the status line on `bar`.
    pub fn with_status_line(self, bar: ProgressBar) -> Self {
        Self {
            status: Some(bar),
            ..self
        }
    }

    /// A reporter that also records the metrics `run --metrics-addr` serves.
    pub fn with_metrics(self) -> Self {
        Self {
            metrics: Metrics::new(true),
            ..self
        }
    }

    /// Counts how a delivery's attempt ended, in the summary and per handler.
    pub fn ended(&self, how: Ended, handler: &str) {
        let counter = match how {
            Ended::Handled => &self.counters.handled,
            Ended::Failed => &self.counters.failed,
            Ended::Buried => &self.counters.dead,
            Ended::LeaseLost => &self.counters.lease_lost,
            Ended::Released => &self.counters.released,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.metrics.ended(how, handler);
    }

    /// Redraws the status line: the counters, what is in flight, and the rate over the last
    /// ten seconds. indicatif fits it to the terminal's width.
    pub fn status(&self, in_flight: usize) {
        let Some(bar) = &self.status else {
            return;
        };
        let s = self.counters.summary();
        let now = Instant::now();
        // Every attempt that ended counts: a worker burying a poisoned backlog is busy too.
        let ended = s.handled + s.failed + s.dead;
        let rate = {
            let mut recent = self.recent.lock().expect("reporter lock");
            recent.push_back((now, ended));
            while recent
                .front()
                .is_some_and(|(at, _)| now - *at > RATE_WINDOW)
            {
                recent.pop_front();
            }
            let (since, then) = recent.front().copied().unwrap_or((now, ended));
            let seconds = (now - since).as_secs_f64();
            if seconds > 0.0 {
                (ended - then) as f64 / seconds
            } else {
                0.0
            }
        };
        bar.set_message(format!(
            "handled {}  failed {}  dead {}  in flight {in_flight}  {rate:.0} attempts/s",
            s.handled, s.failed, s.dead
        ));
        bar.tick();
    }

    /// Takes the status line away, before the summary is printed.
    pub fn stopped(&self) {
        if let Some(bar) = &self.status {
            bar.finish_and_clear();
        }
    }
}

impl Default for Reporter {
    fn default() -> Self {
        Self::new()
    }
}
