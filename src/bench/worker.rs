//! One benchmark process: a publisher, a dispatcher, a preloader, or a raw-SQL floor. The
//! coordinator starts them all with the same start time, so their windows line up; each prints
//! one JSON report on stdout and writes what it handled (or published, in mixed load) to a file,
//! outside the database, so checking exactness adds no database writes.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::cells::{Config, Keys};
use super::Error;
use crate::dispatch::{
    DispatchOptions, Dispatcher, HandlerSpec, Reporter, RetryPolicy, Runner, Shutdown,
};
use crate::handler::{Gate, Handler, HandlerFuture, Outcome};
use crate::store::bench::BenchStore;
use crate::store::prelude::*;
use crate::store::{AnyStore, ClaimedDelivery, Namespace, NewEvent, StoreOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Publish,
    MixedPublish,
    Dispatch,
    FloorPublish,
    FloorDispatch,
}

/// The store a worker connects to: the coordinator's global options, so `--prefix` and the
/// statement mode reach every process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoreTarget {
    /// None: the libpq variables the worker inherits.
    pub database_url: Option<String>,
    pub schema: String,
    pub prefix: String,
    pub prepared_statements: bool,
}

/// What one worker process does. The coordinator writes it as JSON to the worker's stdin (never
/// in its command line, where a password in the URL would be visible to every user).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerPlan {
    pub target: StoreTarget,
    pub role: Role,
    /// Unix milliseconds at which the warm-up starts; the window follows it.
    pub start_at_ms: u64,
    pub warmup: Duration,
    pub window: Duration,
    /// Distinguishes publishers, so their event ids never collide.
    pub index: u32,
    pub batch: u32,
    pub handlers: u32,
    pub keys: Keys,
    pub config: Config,
    /// Events per second, for a mixed publisher.
    pub events: u64,
    /// Where in the interval between its events a mixed publisher starts, as a fraction: the
    /// publishers of a cell are spread over it, so that together they offer an even stream
    /// instead of bursts of one event each.
    pub phase: f64,
    pub records: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Events published or deliveries handled inside the window.
    pub units_window: u64,
    pub units_total: u64,
    /// Statements and parses this process sent.
    pub statements: u64,
    pub parses: u64,
    /// Publish call latencies inside the window, microseconds (publishers only).
    pub latencies_us: Vec<u64>,
    /// How far into the window a floor dispatcher's backlog lasted, when it ran out early: its
    /// rate is taken over the time it had work, so the floor needs no backlog for the whole
    /// window.
    #[serde(default)]
    pub ran_out_after_us: Option<u64>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The benchmark's event: 160 bytes of payload, like the seed's.
pub fn event(id: String, n: u64, handlers: u32, keys: Keys) -> NewEvent {
    NewEvent {
        id,
        event_type: "bench.event".into(),
        key: keys.key(n),
        payload: serde_json::json!({ "pad": "x".repeat(150) }),
        headers: Default::default(),
        handlers: (0..handlers).map(|h| format!("h{h}")).collect(),
    }
}

struct Window {
    start_us: u64,
    end_us: u64,
}

impl WorkerPlan {
    fn window(&self) -> Window {
        let start = self.start_at_ms * 1000 + self.warmup.as_micros() as u64;
        Window {
            start_us: start,
            end_us: start + self.window.as_micros() as u64,
        }
    }

    async fn wait_for_start(&self) {
        let start = self.start_at_ms * 1000;
        let now = now_us();
        if start > now {
            tokio::time::sleep(Duration::from_micros(start - now)).await;
        }
    }
}

fn report(store: &AnyStore, mut r: WorkerReport) -> WorkerReport {
    let counts = store.client_counts();
    (r.statements, r.parses) = (counts.statements, counts.parses);
    r
}

/// Runs a plan: opens its store and does its part.
pub async fn run(plan: WorkerPlan) -> Result<WorkerReport, Error> {
    let t = &plan.target;
    let options = StoreOptions {
        prepared_statements: t.prepared_statements,
        ..store_options(&plan)
    };
    let ns = Namespace::new(&t.schema, &t.prefix)?;
    let store = crate::store::open(t.database_url.as_deref(), ns, options)?;
    match plan.role {
        Role::Publish => publish(store, plan, false).await,
        Role::MixedPublish => mixed_publish(store, plan).await,
        Role::Dispatch => dispatch_worker(store, plan).await,
        Role::FloorPublish => publish(store, plan, true).await,
        Role::FloorDispatch => floor_dispatch(store, plan).await,
    }
}

/// Publishes batches back to back until the window ends: through `publish`, or for the floor
/// the same rows written by the plainest statement, one multi-row insert of events and
/// deliveries per batch.
async fn publish(store: AnyStore, plan: WorkerPlan, floor: bool) -> Result<WorkerReport, Error> {
    let w = plan.window();
    let mut r = WorkerReport::default();
    let prefix = if floor { "f" } else { "p" };
    plan.wait_for_start().await;
    let mut n = 0u64;
    while now_us() < w.end_us {
        let batch: Vec<NewEvent> = (n..n + u64::from(plan.batch))
            .map(|i| {
                event(
                    format!("{prefix}{}-{i}", plan.index),
                    i,
                    plan.handlers,
                    plan.keys,
                )
            })
            .collect();
        n += u64::from(plan.batch);
        let t0 = now_us();
        if floor {
            store.floor_publish(&batch).await?;
        } else {
            store.publish(&batch).await?;
        }
        let t1 = now_us();
        r.units_total += batch.len() as u64;
        if t1 >= w.start_us && t1 < w.end_us {
            r.units_window += batch.len() as u64;
            r.latencies_us.push(t1 - t0);
        }
    }
    if floor {
        r.statements = r.units_total / u64::from(plan.batch.max(1));
        r.parses = 1;
        return Ok(r);
    }
    Ok(report(&store, r))
}

/// Publishes one event per transaction at a fixed rate and records each commit time, and
/// whether the commit fell inside the window.
async fn mixed_publish(store: AnyStore, plan: WorkerPlan) -> Result<WorkerReport, Error> {
    let w = plan.window();
    let store = Arc::new(store);
    let committed = Arc::new(Mutex::new(Vec::new()));
    plan.wait_for_start().await;
    let interval = Duration::from_secs_f64(1.0 / plan.events.max(1) as f64);
    tokio::time::sleep(interval.mul_f64(plan.phase)).await;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0u64;
    while now_us() < w.end_us {
        ticker.tick().await;
        let e = event(format!("m{}-{n}", plan.index), n, 1, Keys::None);
        n += 1;
        let (store, committed) = (Arc::clone(&store), Arc::clone(&committed));
        tasks.spawn(async move {
            let id = e.id.clone();
            let result = store.publish(&[e]).await;
            if result.is_ok() {
                committed.lock().expect("records").push((id, now_us()));
            }
            result.map(|_| ())
        });
        while let Some(done) = tasks.try_join_next() {
            done??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let committed = std::mem::take(&mut *committed.lock().expect("records"));
    let in_window = |t: u64| t >= w.start_us && t < w.end_us;
    let r = WorkerReport {
        units_total: committed.len() as u64,
        units_window: committed.iter().filter(|(_, t)| in_window(*t)).count() as u64,
        ..Default::default()
    };
    if let Some(path) = &plan.records {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (id, t) in &committed {
            writeln!(f, "{id}\t{t}\t{}", u8::from(in_window(*t)))?;
        }
        f.flush()?;
    }
    Ok(report(&store, r))
}

/// A no-op handler that remembers what it handled and when, for the exactness check.
struct Recording {
    seen: Mutex<Vec<(String, String, i32, u64)>>,
}

impl Handler for Recording {
    fn handle<'a>(&'a self, d: &'a ClaimedDelivery, gate: Gate<'a>) -> HandlerFuture<'a> {
        if !gate() {
            return Box::pin(std::future::ready(Outcome::Withheld));
        }
        self.seen.lock().expect("records").push((
            d.event_id.clone(),
            d.handler.clone(),
            d.attempts + 1,
            now_us(),
        ));
        Box::pin(std::future::ready(Outcome::Completed))
    }
}

/// A dispatcher with the cell's configuration, stopped gracefully when the window ends.
async fn dispatch_worker(store: AnyStore, plan: WorkerPlan) -> Result<WorkerReport, Error> {
    let w = plan.window();
    let settings = plan.config.settings();
    let recording = Arc::new(Recording {
        seen: Mutex::new(Vec::new()),
    });
    let handlers: Vec<HandlerSpec> = (0..plan.handlers)
        .map(|h| HandlerSpec {
            name: format!("h{h}"),
            runner: Runner::Handler(Arc::clone(&recording) as Arc<dyn Handler>),
            retry: RetryPolicy::default(),
            breaker: None,
        })
        .collect();
    let store = Arc::new(store);
    // No log is set up in a benchmark worker: its report is its output.
    let reporter = Arc::new(Reporter::new());
    let (tx, rx) = watch::channel(Shutdown::Running);
    let options = DispatchOptions {
        concurrency: settings.concurrency,
        batch_size: settings.batch_size,
        poll_interval: settings.poll_interval,
        ..DispatchOptions::new(crate::identity::worker_name())
    };
    let dispatcher = Dispatcher::new(Arc::clone(&store), options, handlers, reporter);
    plan.wait_for_start().await;
    let end = w.end_us;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_micros(end.saturating_sub(now_us()))).await;
        let _ = tx.send(Shutdown::Graceful);
    });
    dispatcher.run(rx).await;
    let seen = std::mem::take(&mut *recording.seen.lock().expect("records"));
    let r = WorkerReport {
        units_total: seen.len() as u64,
        units_window: seen
            .iter()
            .filter(|s| s.3 >= w.start_us && s.3 < w.end_us)
            .count() as u64,
        ..Default::default()
    };
    if let Some(path) = &plan.records {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (event, handler, attempt, t) in &seen {
            writeln!(f, "{event}\t{handler}\t{attempt}\t{t}")?;
        }
        f.flush()?;
    }
    Ok(report(&store, r))
}

/// The same deliveries deleted by the plainest statement: a batch picked with SKIP LOCKED.
async fn floor_dispatch(store: AnyStore, plan: WorkerPlan) -> Result<WorkerReport, Error> {
    let batch = plan.config.settings().batch_size as i64;
    let w = plan.window();
    let mut r = WorkerReport::default();
    plan.wait_for_start().await;
    while now_us() < w.end_us {
        let deleted = store.floor_dispatch(batch).await?;
        let t = now_us();
        r.statements += 1;
        r.units_total += deleted;
        if t >= w.start_us && t < w.end_us {
            r.units_window += deleted;
        }
        if deleted == 0 {
            r.ran_out_after_us = Some(t.clamp(w.start_us, w.end_us) - w.start_us);
            break;
        }
    }
    r.parses = 1;
    Ok(r)
}

/// Store options of a worker: a publisher publishes on one connection, a dispatcher has the
/// cell's pool, a floor keeps the server's own session settings.
fn store_options(plan: &WorkerPlan) -> StoreOptions {
    match plan.role {
        Role::Dispatch => StoreOptions::worker(plan.config.settings().pool_size),
        Role::MixedPublish => StoreOptions {
            pool_size: 8,
            ..StoreOptions::publisher()
        },
        Role::Publish => StoreOptions::publisher(),
        Role::FloorPublish | Role::FloorDispatch => StoreOptions {
            long_lived: false,
            ..StoreOptions::publisher()
        },
    }
}
