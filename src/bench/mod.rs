//! `relaybus bench`: throughput of publish and dispatch, end-to-end latency under mixed load,
//! and the database's own counters per unit, following the seed's method. Every publisher and
//! dispatcher is its own process (the binary under test starting `bench-worker` with a typed
//! plan); each sample is a warm-up and a fixed window in a namespace of its own; dispatch starts
//! from a preloaded backlog; nothing waits for a drain. A dispatch or mixed sample is checked
//! for exactness and reported as invalid, never as a number, when it fails. A raw floor runs
//! beside each cell. With a second binary the two alternate (A, B, then B, A) and the ratios are
//! taken pair by pair.
//!
//! The coordinator (this module) runs samples; `measure` runs a cell's processes and reads the
//! store's counters; `exactness` checks what they handled.

pub mod cells;
mod exactness;
mod measure;
pub mod report;
pub mod worker;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use cells::Cell;
pub use exactness::Exactness;
use measure::Measured;
use worker::{StoreTarget, WorkerPlan, WorkerReport};

use crate::store::bench::{BenchStore, ServerCounters};
use crate::store::{AnyStore, Namespace, StoreOptions};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the coordinator runs, and against which store.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub cells: Vec<Cell>,
    pub samples: u32,
    pub warmup: Duration,
    pub window: Duration,
    /// Events of a dispatch backlog, when not sized from the cell.
    pub backlog: Option<u64>,
    /// The binary under test, and an optional second one to compare with.
    pub base: PathBuf,
    pub candidate: Option<PathBuf>,
    /// The database URL (None: the libpq variables the workers inherit).
    pub database_url: Option<String>,
    /// The prefix of every sample's namespace; each sample has a schema of its own.
    pub prefix: String,
    pub prepared_statements: bool,
    pub floor: bool,
    /// The longest a sample's measurement, and a floor run, may take (store, preload, window,
    /// checks): on a server too slow for the cell it is reported as beyond it, not waited for.
    pub sample_limit: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_backlog: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub cell: String,
    pub scenario: &'static str,
    pub binary: String,
    pub sample: u32,
    /// Units (events or deliveries) per second inside the window.
    pub throughput: f64,
    pub floor_throughput: Option<f64>,
    /// Units done from the first statement to the last, the denominator of the counters.
    pub units: u64,
    pub statements: u64,
    pub parses: u64,
    pub counters: ServerCounters,
    pub call_p50_ms: Option<f64>,
    pub call_p99_ms: Option<f64>,
    pub latency: Option<Latency>,
    pub exactness: Option<Exactness>,
    /// Time of a fixed CPU spin just before the sample; a slow one flags a noisy machine.
    pub spin_ms: f64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fixed amount of CPU work, timed.
pub fn spin() -> f64 {
    let start = Instant::now();
    let mut x = 0u64;
    for i in 0..40_000_000u64 {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
    }
    std::hint::black_box(x);
    start.elapsed().as_secs_f64() * 1000.0
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

/// The namespace of one sample, and its store.
struct SampleStore {
    store: AnyStore,
    target: StoreTarget,
}

pub struct Coordinator {
    opts: BenchOptions,
    dir: tempfile::TempDir,
    counter: u32,
    /// Grows when a dispatch backlog runs out inside the window (a faster machine than the
    /// ceilings assume), for the rest of the run.
    backlog_scale: f64,
}

impl Coordinator {
    pub fn new(opts: BenchOptions) -> Result<Self, Error> {
        Ok(Self {
            opts,
            dir: tempfile::tempdir()?,
            counter: 0,
            backlog_scale: 1.0,
        })
    }

    pub fn options(&self) -> &BenchOptions {
        &self.opts
    }

    fn open(&self, schema: &str) -> Result<AnyStore, Error> {
        let options = StoreOptions {
            prepared_statements: self.opts.prepared_statements,
            ..StoreOptions::admin()
        };
        let ns = Namespace::new(schema, &self.opts.prefix)?;
        Ok(crate::store::open(
            self.opts.database_url.as_deref(),
            ns,
            options,
        )?)
    }

    /// The server's settings and versions, for env.json. Also the first check that the server
    /// answers.
    pub async fn environment(&self) -> Result<serde_json::Value, Error> {
        let settings = self.open("public")?.server_settings().await?;
        Ok(serde_json::json!({
            "relaybus": env!("CARGO_PKG_VERSION"),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "server": settings,
            "base": self.opts.base,
            "candidate": self.opts.candidate,
            "warmup_ms": self.opts.warmup.as_millis() as u64,
            "window_ms": self.opts.window.as_millis() as u64,
        }))
    }

    /// The namespaces holding relaybus stores with deliveries in them, the bench's own aside.
    pub async fn stores(&self) -> Result<Vec<String>, Error> {
        Ok(self.open("public")?.stores().await?)
    }

    /// A fresh namespace, installed by the binary under test itself.
    async fn fresh_store(&mut self, binary: &Path) -> Result<SampleStore, Error> {
        self.counter += 1;
        let schema = format!("relaybus_bench_{}_{}", std::process::id(), self.counter);
        let store = self.open(&schema)?;
        store.drop_namespace().await?;
        let target = StoreTarget {
            database_url: self.opts.database_url.clone(),
            schema,
            prefix: self.opts.prefix.clone(),
            prepared_statements: self.opts.prepared_statements,
        };
        let mut setup = tokio::process::Command::new(binary);
        if let Some(url) = &target.database_url {
            setup.env("RELAYBUS_DATABASE_URL", url);
        }
        setup.args(["--schema", &target.schema, "--prefix", &target.prefix]);
        if !target.prepared_statements {
            setup.arg("--no-prepared-statements");
        }
        let status = setup
            .arg("setup")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await?;
        if !status.success() {
            return Err(format!("`{} setup` failed", binary.display()).into());
        }
        Ok(SampleStore { store, target })
    }

    /// Starts one `bench-worker` process per plan, hands each its plan on stdin, and collects
    /// their reports.
    async fn workers(
        &self,
        binary: &Path,
        plans: Vec<WorkerPlan>,
    ) -> Result<Vec<WorkerReport>, Error> {
        use tokio::io::AsyncWriteExt;
        let mut children = vec![];
        for plan in plans {
            let mut child = tokio::process::Command::new(binary)
                .arg("bench-worker")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let mut stdin = child.stdin.take().expect("stdin is piped");
            stdin.write_all(&serde_json::to_vec(&plan)?).await?;
            drop(stdin);
            children.push(child);
        }
        let mut reports = vec![];
        for child in children {
            let out = child.wait_with_output().await?;
            if !out.status.success() {
                return Err(format!(
                    "a benchmark worker failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )
                .into());
            }
            reports.push(serde_json::from_slice(&out.stdout)?);
        }
        Ok(reports)
    }

    /// A worker plan for one sample, starting a moment from now (every plan of a cell is cloned
    /// from one, so their windows line up).
    fn plan(&self, role: worker::Role, target: &StoreTarget) -> WorkerPlan {
        WorkerPlan {
            target: target.clone(),
            role,
            start_at_ms: now_ms() + 700,
            warmup: self.opts.warmup,
            window: self.opts.window,
            index: 0,
            batch: 1,
            handlers: 1,
            keys: cells::Keys::None,
            config: cells::Config::Defaults,
            events: 0,
            phase: 0.0,
            records: None,
        }
    }

    /// Backlog for a dispatch cell: more than warm-up and window can take at `rate` per second
    /// from one process (fewer events when each has several handlers). More processes share
    /// the cores, so they take less than `rate` each.
    fn backlog(&self, processes: u32, handlers: u32, rate: f64) -> u64 {
        if let Some(events) = self.opts.backlog {
            return (events as f64 * self.backlog_scale) as u64;
        }
        let seconds = (self.opts.warmup + self.opts.window).as_secs_f64();
        let deliveries =
            seconds * rate * f64::from(processes.min(4)).sqrt() * 1.3 * self.backlog_scale;
        (deliveries as u64 / u64::from(handlers)).max(10_000)
    }

    /// Every sample of the cells: in each round every cell with each binary, the two
    /// alternating (A, B, then B, A) so that a machine that drifts weighs on both. `each` hears
    /// of a sample before it is measured (`None`) and after (`Some`).
    pub async fn run(
        &mut self,
        mut each: impl FnMut(Cell, &Path, Option<&Sample>),
    ) -> Result<Vec<Sample>, Error> {
        let (base, candidate) = (self.opts.base.clone(), self.opts.candidate.clone());
        let mut samples = vec![];
        for round in 1..=self.opts.samples {
            for cell in self.opts.cells.clone() {
                let mut binaries = vec![base.clone()];
                if let Some(c) = &candidate {
                    binaries.push(c.clone());
                    if round % 2 == 0 {
                        binaries.reverse();
                    }
                }
                for binary in binaries {
                    each(cell, &binary, None);
                    let sample = self.sample(cell, &binary, round).await?;
                    each(cell, &binary, Some(&sample));
                    samples.push(sample);
                }
            }
        }
        Ok(samples)
    }

    /// One sample of one cell with one binary.
    pub async fn sample(&mut self, cell: Cell, binary: &Path, index: u32) -> Result<Sample, Error> {
        let spin_ms = spin();
        let measured = loop {
            let sample = self.fresh_store(binary).await?;
            let limit = self.opts.sample_limit;
            let result = tokio::time::timeout(limit, self.measure(cell, binary, &sample)).await;
            sample.store.drop_namespace().await?;
            let measured = match result {
                Ok(measured) => measured?,
                Err(_) => Measured::beyond(limit),
            };
            match &measured.exactness {
                Some(e) if e.ran_out && self.backlog_scale < 16.0 => {
                    self.backlog_scale *= 2.0;
                    eprintln!(
                        "{cell}: the backlog ran out inside the window; measuring again with a \
                         backlog {}x as large",
                        self.backlog_scale
                    );
                }
                _ => break measured,
            }
        };
        let reports = &measured.reports;
        let window = self.opts.window.as_secs_f64();
        let units_window: u64 = reports.iter().map(|r| r.units_window).sum();
        let mut calls: Vec<u64> = reports
            .iter()
            .flat_map(|r| r.latencies_us.iter().copied())
            .collect();
        calls.sort_unstable();
        // A cell that measured nothing here gets no floor either: its sample says why.
        let floor_throughput =
            if self.opts.floor && units_window > 0 && !matches!(cell, Cell::Mixed { .. }) {
                self.floor(cell).await?
            } else {
                None
            };
        Ok(Sample {
            cell: cell.to_string(),
            scenario: cell.scenario(),
            binary: binary.display().to_string(),
            sample: index,
            throughput: units_window as f64 / window,
            floor_throughput,
            units: reports.iter().map(|r| r.units_total).sum(),
            statements: reports.iter().map(|r| r.statements).sum(),
            parses: reports.iter().map(|r| r.parses).sum(),
            call_p50_ms: (!calls.is_empty()).then(|| percentile(&calls, 0.5) / 1000.0),
            call_p99_ms: (!calls.is_empty()).then(|| percentile(&calls, 0.99) / 1000.0),
            counters: measured.counters,
            latency: measured.latency,
            exactness: measured.exactness,
            spin_ms,
        })
    }
}
