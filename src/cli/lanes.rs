//! `relaybus lanes`, `relaybus workers` and `relaybus stats`: who holds what, and how far
//! behind each handler is.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::output::{age, time, when};
use super::{GlobalArgs, Output};
use crate::store::handlers::Breaker;
use crate::store::prelude::*;
use crate::store::{HandlerStats, LaneRow, StoreOptions};

/// Show the 256 lanes: owner, epoch, lease, in flight, pending, oldest due.
///
/// By default only lanes with an owner or pending work, and a summary line.
#[derive(Debug, Args)]
pub struct LanesArgs {
    /// Show every lane.
    #[arg(long)]
    pub all: bool,
}

/// Every worker that holds lanes: host, process, lanes, in flight, lease end.
///
/// A worker whose leases have expired has stopped renewing them: it is
/// dead or stuck, and another worker takes its lanes over.
///
///   relaybus workers
///   relaybus workers --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct WorkersArgs {}

/// One worker as `relaybus workers` shows it, from the lanes it holds.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct Worker {
    /// The worker's name: `host:pid:random` for `relaybus run`.
    pub owner: String,
    /// The host and process its name gives; none for a name another client chose.
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub lanes: usize,
    pub in_flight: i64,
    /// The earliest end of its lanes' leases.
    pub lease_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Lanes whose lease has ended.
    pub expired_lanes: usize,
}

/// The workers holding the lanes, by name.
pub(super) fn workers(lanes: &[LaneRow]) -> Vec<Worker> {
    let mut by_owner: std::collections::BTreeMap<&str, Worker> = Default::default();
    for l in lanes {
        let Some(owner) = l.owner.as_deref() else {
            continue;
        };
        let w = by_owner.entry(owner).or_insert_with(|| {
            let (host, pid) = crate::identity::worker_host_and_pid(owner).unzip();
            Worker {
                owner: owner.to_owned(),
                host: host.map(str::to_owned),
                pid,
                lanes: 0,
                in_flight: 0,
                lease_expires_at: None,
                expired_lanes: 0,
            }
        });
        w.lanes += 1;
        w.in_flight += l.in_flight;
        w.expired_lanes += usize::from(l.expired);
        w.lease_expires_at = match (w.lease_expires_at, l.lease_expires_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    by_owner.into_values().collect()
}

pub(super) async fn run_workers(g: &GlobalArgs, out: &Output, _: WorkersArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    let workers = workers(&store.lanes().await?);
    if out.json {
        out.print_json(&json!({ "workers": workers }))?;
        return Ok(ExitCode::SUCCESS);
    }
    if workers.is_empty() {
        out.line("no worker holds a lane")?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            let until = w
                .lease_expires_at
                .map(time_of_day)
                .unwrap_or_else(|| "-".into());
            vec![
                w.owner.clone(),
                w.host.clone().unwrap_or_else(|| "-".into()),
                w.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                w.lanes.to_string(),
                w.in_flight.to_string(),
                match w.expired_lanes {
                    0 => until,
                    n => format!("{until} ({n} expired)"),
                },
            ]
        })
        .collect();
    out.table_wrapping(
        &[0],
        &["WORKER", "HOST", "PID", "LANES", "IN FLIGHT", "LEASE UNTIL"],
        &rows,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Per handler: its state (running, paused, or its circuit breaker open), due, scheduled,
/// processing, dead, completed and the lag (age of the oldest due delivery).
#[derive(Debug, Args)]
pub struct StatsArgs {}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: LanesArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    let lanes = store.lanes().await?;
    let held: Vec<_> = lanes.iter().filter(|l| l.owner.is_some()).collect();
    let mut owners: Vec<&str> = held.iter().filter_map(|l| l.owner.as_deref()).collect();
    owners.sort_unstable();
    owners.dedup();
    let expired = held.iter().filter(|l| l.expired).count();
    let shown: Vec<_> = lanes
        .iter()
        .filter(|l| args.all || l.owner.is_some() || l.pending > 0)
        .collect();
    if out.json {
        out.print_json(&json!({
            "lanes": shown,
            "summary": {
                "held": held.len(),
                "owners": owners.len(),
                "expired": expired,
                "uncharged": lanes.iter().map(|l| l.uncharged).sum::<i64>(),
            },
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    if shown.is_empty() {
        out.line("no lane is held or has pending work")?;
    } else {
        print_lanes(out, &shown)?;
    }
    let uncharged: i64 = lanes.iter().map(|l| l.uncharged).sum();
    let waiting = if uncharged > 0 {
        format!(
            "; {uncharged} deliveries of lanes taken over wait for another transaction to end \
             (see `relaybus doctor`)"
        )
    } else {
        String::new()
    };
    out.line(format!(
        "{} lanes held by {} owners, {} expired leases{waiting}",
        held.len(),
        owners.len(),
        expired
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// The lanes' table.
fn print_lanes(out: &Output, shown: &[&LaneRow]) -> Result<()> {
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|l| {
            vec![
                l.lane.to_string(),
                l.owner.clone().unwrap_or_else(|| "-".into()),
                l.epoch.to_string(),
                match (l.lease_expires_at, l.expired) {
                    (None, _) => "-".into(),
                    (Some(t), true) => format!("{} (expired)", time_of_day(t)),
                    (Some(t), false) => time_of_day(t),
                },
                l.in_flight.to_string(),
                l.pending.to_string(),
                if out.terminal() {
                    when(l.oldest_due)
                } else {
                    time(l.oldest_due)
                },
            ]
        })
        .collect();
    // Only the owner's name may wrap: a lease's time and whether it expired matter most.
    out.table_wrapping(
        &[1],
        &[
            "LANE",
            "OWNER",
            "EPOCH",
            "LEASE UNTIL",
            "IN FLIGHT",
            "PENDING",
            "OLDEST DUE",
        ],
        &rows,
    )?;
    Ok(())
}

pub(super) async fn run_stats(g: &GlobalArgs, out: &Output, _: StatsArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    let states = super::handlers::states(&store).await?;
    let now = chrono::Utc::now();
    if out.json {
        /// A handler's statistics and, beside them, its state.
        #[derive(serde::Serialize)]
        struct Row<'a> {
            #[serde(flatten)]
            stats: &'a HandlerStats,
            paused: bool,
            breaker: Breaker,
        }
        let rows: Vec<Row> = states
            .iter()
            .map(|(stats, c)| Row {
                stats,
                paused: c.paused(),
                breaker: c.breaker(now),
            })
            .collect();
        out.print_json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    if states.is_empty() {
        out.line("no deliveries: nothing pending, dead or completed")?;
        return Ok(ExitCode::SUCCESS);
    }
    let lag = |s: Option<f64>| s.map(age).unwrap_or_else(|| "-".into());
    let mut rows: Vec<Vec<String>> = states
        .iter()
        .map(|(s, c)| {
            vec![
                s.handler.clone(),
                c.state(now).name().to_owned(),
                s.due.to_string(),
                s.scheduled.to_string(),
                s.processing.to_string(),
                s.dead.to_string(),
                s.completed.to_string(),
                lag(s.lag_seconds),
            ]
        })
        .collect();
    let stats: Vec<&HandlerStats> = states.iter().map(|(s, _)| s).collect();
    let sum = |f: fn(&HandlerStats) -> i64| stats.iter().map(|s| f(s)).sum::<i64>().to_string();
    rows.push(vec![
        "TOTAL".into(),
        String::new(),
        sum(|s| s.due),
        sum(|s| s.scheduled),
        sum(|s| s.processing),
        sum(|s| s.dead),
        sum(|s| s.completed),
        lag(stats.iter().filter_map(|s| s.lag_seconds).reduce(f64::max)),
    ]);
    // A long handler name wraps; the state and the figures stay whole.
    out.table_wrapping(
        &[0],
        &[
            "HANDLER",
            "STATE",
            "DUE",
            "SCHEDULED",
            "PROCESSING",
            "DEAD",
            "COMPLETED",
            "LAG",
        ],
        &rows,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// A lease's end, which is seconds from now unless its worker died long ago: the time of day
/// when it is today (UTC), so that a table with its owner and counts fits a terminal.
fn time_of_day(t: chrono::DateTime<chrono::Utc>) -> String {
    if t.date_naive() == chrono::Utc::now().date_naive() {
        t.format("%H:%M:%S").to_string()
    } else {
        time(Some(t))
    }
}
