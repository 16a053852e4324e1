//! What `relaybus top` knows: the samples it read from the store, and what follows from them
//! (rates, renewals, the lane map). Nothing here draws or reads the store.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::super::lanes::{workers, Worker};
use crate::store::handlers::{Breaker, HandlerRow};
use crate::store::{HandlerStats, LaneRow};

/// How far back rates reach: the per-minute rate, and the sparkline's samples.
const MINUTE: Duration = Duration::from_secs(60);
/// Interval rates kept for the sparklines: as many as a wide terminal shows.
const SPARK: usize = 200;

/// One read of the store: the statements of `stats`, `handlers list` and `lanes`, and the
/// store's own count of deliveries deleted.
pub struct Sample {
    pub at: DateTime<Utc>,
    pub handlers: Vec<(HandlerStats, HandlerRow)>,
    pub lanes: Vec<LaneRow>,
    /// Deliveries the store's counters say were deleted (completed or purged) since they began;
    /// none where they could not be read.
    pub deleted: Option<i64>,
}

/// What one lane shows on the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum LaneState {
    /// No owner and nothing pending.
    Free,
    /// A live lease, nothing pending beyond what runs.
    Held,
    /// A live lease and pending deliveries.
    Busy,
    /// Pending deliveries and no live lease: they wait for a worker.
    Waiting,
    /// An owner whose lease ended: a dead or stuck worker, until another takes the lane over.
    Expired,
}

impl LaneState {
    pub(super) fn of(l: &LaneRow) -> Self {
        match (&l.owner, l.expired, l.pending > l.in_flight) {
            (Some(_), true, _) => LaneState::Expired,
            (Some(_), false, true) => LaneState::Busy,
            (Some(_), false, false) => LaneState::Held,
            (None, _, true) => LaneState::Waiting,
            (None, _, false) => LaneState::Free,
        }
    }

    /// Its cell on the map.
    pub(super) fn glyph(self) -> char {
        match self {
            LaneState::Free => '.',
            LaneState::Held => 'o',
            LaneState::Busy => '#',
            LaneState::Waiting => '+',
            LaneState::Expired => 'x',
        }
    }
}

/// A handler as the view shows it.
#[derive(Clone, Debug, Serialize)]
pub struct HandlerLine {
    #[serde(flatten)]
    pub stats: HandlerStats,
    /// `running`, `paused`, `breaker-open` or `probe-due`.
    pub state: &'static str,
    pub paused_by: Option<String>,
    pub pause_reason: Option<String>,
    /// While the breaker is open: when its cool-down ends.
    pub breaker_open_until: Option<DateTime<Utc>>,
    /// Completions per second over the last interval and over the last minute (or the time
    /// since the view started, when shorter). None without a completion history to count.
    pub per_second: Option<f64>,
    pub per_second_last_minute: Option<f64>,
    #[serde(skip)]
    pub spark: Vec<u64>,
}

/// A worker, and when the view last saw it extend a lease.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerLine {
    #[serde(flatten)]
    pub worker: Worker,
    /// Seconds since the view saw its lease end move later; none until it has.
    pub renewed_seconds_ago: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HotLane {
    pub lane: i16,
    pub pending: i64,
    pub owner: Option<String>,
    pub oldest_due: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LaneSummary {
    pub free: usize,
    pub held: usize,
    pub busy: usize,
    pub waiting: usize,
    pub expired: usize,
}

/// Everything the view shows, as `top --once --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub at: DateTime<Utc>,
    pub handlers: Vec<HandlerLine>,
    pub workers: Vec<WorkerLine>,
    pub lanes: LaneSummary,
    /// The 256 lanes in order, one character each: `.` free, `o` held, `#` held with a
    /// backlog, `+` a backlog without a live lease, `x` an expired lease.
    pub lane_map: String,
    pub hot_lanes: Vec<HotLane>,
    /// Deliveries deleted per second over the last interval, from the store's counters: every
    /// handler's completions (and purges), with or without a completion history.
    pub deleted_per_second: Option<f64>,
}

/// What a sample adds to the history: its time, each handler's completions, the deletions.
struct Tally {
    at: DateTime<Utc>,
    completed: BTreeMap<String, i64>,
    deleted: Option<i64>,
}

/// The samples so far, and the snapshot they make.
pub struct Board {
    tallies: VecDeque<Tally>,
    /// Per handler, the rates of the last intervals, oldest first.
    sparks: HashMap<String, VecDeque<u64>>,
    /// Per worker: the latest lease end seen, and when the view saw it move later (unknown
    /// until it has).
    renewals: HashMap<String, (DateTime<Utc>, Option<DateTime<Utc>>)>,
    /// Whether any completion was ever counted: without a history, rates per handler are
    /// unknown rather than zero.
    history: bool,
    pub snapshot: Option<Snapshot>,
    /// The last sample's lanes.
    lanes: Vec<LaneRow>,
}

impl Default for Board {
    fn default() -> Self {
        Self::new()
    }
}

impl Board {
    pub fn new() -> Self {
        Self {
            tallies: VecDeque::new(),
            sparks: HashMap::new(),
            renewals: HashMap::new(),
            history: false,
            snapshot: None,
            lanes: Vec::new(),
        }
    }

    pub fn lanes(&self) -> &[LaneRow] {
        &self.lanes
    }

    /// Takes a new sample in.
    pub fn update(&mut self, sample: Sample) {
        let now = sample.at;
        let completed: BTreeMap<String, i64> = sample
            .handlers
            .iter()
            .map(|(s, _)| (s.handler.clone(), s.completed))
            .collect();
        self.history |= completed.values().any(|&c| c > 0);
        let tally = Tally {
            at: now,
            completed,
            deleted: sample.deleted,
        };
        let previous = self.tallies.back();
        let minute_ago = self
            .tallies
            .iter()
            .find(|t| now - t.at <= chrono::Duration::from_std(MINUTE).expect("a minute"));
        let rate = |from: Option<&Tally>, handler: &str| -> Option<f64> {
            let from = from?;
            let seconds = seconds(now - from.at);
            let done = tally.completed.get(handler)? - from.completed.get(handler).unwrap_or(&0);
            (self.history && seconds > 0.0 && done >= 0).then(|| done as f64 / seconds)
        };
        let handlers: Vec<HandlerLine> = sample
            .handlers
            .into_iter()
            .map(|(stats, stored)| {
                let per_second = rate(previous, &stats.handler);
                let spark = self.sparks.entry(stats.handler.clone()).or_default();
                if let Some(r) = per_second {
                    spark.push_back(r.round() as u64);
                    if spark.len() > SPARK {
                        spark.pop_front();
                    }
                }
                row(
                    stats.clone(),
                    &stored,
                    now,
                    per_second,
                    rate(minute_ago, &stats.handler),
                    spark.iter().copied().collect(),
                )
            })
            .collect();
        let deleted_per_second = previous.and_then(|p| {
            let seconds = seconds(now - p.at);
            let done = tally.deleted? - p.deleted?;
            (seconds > 0.0 && done >= 0).then(|| done as f64 / seconds)
        });
        let workers = self.workers_seen(&sample.lanes, now);
        self.tallies.push_back(tally);
        while self.tallies.len() > 2
            && self
                .tallies
                .front()
                .is_some_and(|t| now - t.at > chrono::Duration::from_std(MINUTE).expect("a minute"))
        {
            self.tallies.pop_front();
        }
        let (summary, lane_map, hot_lanes) = lane_view(&sample.lanes);
        self.snapshot = Some(Snapshot {
            at: now,
            handlers,
            workers,
            lanes: summary,
            lane_map,
            hot_lanes,
            deleted_per_second,
        });
        self.lanes = sample.lanes;
    }

    /// The workers holding lanes, each with when the view saw its lease renewed.
    fn workers_seen(&mut self, lanes: &[LaneRow], now: DateTime<Utc>) -> Vec<WorkerLine> {
        let workers: Vec<WorkerLine> = workers(lanes)
            .into_iter()
            .map(|worker| {
                let renewed = match worker.lease_expires_at {
                    Some(lease) => {
                        let seen = self
                            .renewals
                            .entry(worker.owner.clone())
                            .or_insert((lease, None));
                        if lease > seen.0 {
                            *seen = (lease, Some(now));
                        }
                        seen.1
                    }
                    None => None,
                };
                WorkerLine {
                    renewed_seconds_ago: renewed.map(|at| seconds(now - at)),
                    worker,
                }
            })
            .collect();
        self.renewals.retain(|owner, _| {
            workers
                .iter()
                .any(|w: &WorkerLine| &w.worker.owner == owner)
        });
        workers
    }
}

/// The lane map, its counts by state, and the lanes with the longest backlog.
fn lane_view(lanes: &[LaneRow]) -> (LaneSummary, String, Vec<HotLane>) {
    let mut summary = LaneSummary::default();
    let lane_map: String = lanes
        .iter()
        .map(|l| {
            let state = LaneState::of(l);
            *match state {
                LaneState::Free => &mut summary.free,
                LaneState::Held => &mut summary.held,
                LaneState::Busy => &mut summary.busy,
                LaneState::Waiting => &mut summary.waiting,
                LaneState::Expired => &mut summary.expired,
            } += 1;
            state.glyph()
        })
        .collect();
    let mut hot: Vec<&LaneRow> = lanes.iter().filter(|l| l.pending > 0).collect();
    hot.sort_by(|a, b| b.pending.cmp(&a.pending).then(a.lane.cmp(&b.lane)));
    let hot_lanes = hot
        .into_iter()
        .take(10)
        .map(|l| HotLane {
            lane: l.lane,
            pending: l.pending,
            owner: l.owner.clone(),
            oldest_due: l.oldest_due,
        })
        .collect();
    (summary, lane_map, hot_lanes)
}

fn row(
    stats: HandlerStats,
    c: &HandlerRow,
    now: DateTime<Utc>,
    per_second: Option<f64>,
    per_second_last_minute: Option<f64>,
    spark: Vec<u64>,
) -> HandlerLine {
    let breaker = c.breaker(now);
    HandlerLine {
        stats,
        state: c.state(now).name(),
        paused_by: c.paused_by.clone(),
        pause_reason: c.pause_reason.clone(),
        breaker_open_until: c.open_until.filter(|_| breaker == Breaker::Open),
        per_second,
        per_second_last_minute,
        spark,
    }
}

/// A span of time in seconds, to the millisecond.
pub(super) fn seconds(d: chrono::Duration) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}
