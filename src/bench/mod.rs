//! `relaybus bench`: throughput of publish and dispatch, end-to-end latency under mixed load,
//! and the database's own counters per unit, following the seed's method. Every publisher and
//! dispatcher is its own process (the binary under test starting `bench-worker`); each sample
//! is a warm-up and a fixed window; dispatch starts from a preloaded backlog; nothing waits for
//! a drain. A dispatch or mixed sample is checked for exactness and reported as invalid, never
//! as a number, when it fails. A raw-SQL floor runs beside each cell. With a second binary the
//! two alternate (A, B, then B, A) and the ratios are taken pair by pair.

pub mod cells;
pub mod report;
pub mod worker;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio_postgres::Client;

use cells::{Cell, Config, Keys};
use worker::{Role, StoreTarget, WorkerPlan, WorkerReport};

use crate::store::postgres::ConnectOptions;
use crate::store::StoreError;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the coordinator runs.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub cells: Vec<Cell>,
    pub samples: u32,
    pub warmup: Duration,
    pub window: Duration,
    /// The binary under test, and an optional second one to compare with.
    pub base: PathBuf,
    pub candidate: Option<PathBuf>,
    /// The database URL the workers use (None: the libpq variables they inherit).
    pub database_url: Option<String>,
    pub floor: bool,
}

/// Server counters, as deltas over one sample.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    pub transactions: i64,
    pub wal_records: i64,
    pub wal_fpi: i64,
    pub wal_bytes: i64,
    /// Per table (without the prefix): rows inserted, updated, HOT-updated, deleted.
    pub tables: BTreeMap<String, [i64; 4]>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Exactness {
    pub valid: bool,
    pub lost: u64,
    pub duplicates: u64,
    pub duplicates_after_lease_loss: u64,
    pub order_violations: u64,
    pub dead: i64,
    /// A dispatch backlog ran out inside the window, so the window measured an emptying store.
    pub ran_out: bool,
    pub problems: Vec<String>,
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
    pub counters: Counters,
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

pub struct Coordinator {
    opts: BenchOptions,
    client: Client,
    dir: tempfile::TempDir,
    counter: u32,
    /// `server_version_num`.
    server_version: i32,
    /// Grows when a dispatch backlog runs out inside the window (a faster machine than the
    /// ceilings assume), for the rest of the run.
    backlog_scale: f64,
}

impl Coordinator {
    pub async fn new(opts: BenchOptions, connect: &ConnectOptions) -> Result<Self, Error> {
        let (client, conn) = connect
            .config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|cause| StoreError::Connect {
                target: connect.target.clone(),
                cause,
            })?;
        tokio::spawn(conn);
        let server_version = client
            .query_one("SELECT current_setting('server_version_num')::int4", &[])
            .await?
            .get(0);
        Ok(Self {
            opts,
            client,
            server_version,
            dir: tempfile::tempdir()?,
            counter: 0,
            backlog_scale: 1.0,
        })
    }

    /// The server's settings and versions, for env.json.
    pub async fn environment(&self) -> Result<serde_json::Value, Error> {
        let mut settings = serde_json::Map::new();
        for name in [
            "server_version",
            "shared_buffers",
            "synchronous_commit",
            "full_page_writes",
            "fsync",
            "wal_level",
            "max_wal_size",
            "max_connections",
            "jit",
        ] {
            let value: String = self
                .client
                .query_one(&format!("SELECT current_setting('{name}')"), &[])
                .await?
                .get(0);
            settings.insert(name.into(), value.into());
        }
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

    async fn counters(&self, schema: &str) -> Result<Counters, Error> {
        // A backend publishes its statistics at most once a second, so the WAL and rows of a
        // preload that just ended could land in the sample (measured: 2,110 WAL bytes per
        // delivery instead of 410). Its own statistics are flushed first; the workers' are
        // flushed when they exit, before the sample ends.
        if self.server_version >= 150_000 {
            self.client
                .batch_execute("SELECT pg_stat_force_next_flush()")
                .await?;
        }
        let r = self
            .client
            .query_one(
                "SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database \
                          WHERE datname = current_database()), \
                        wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal",
                &[],
            )
            .await?;
        let mut c = Counters {
            transactions: r.get(0),
            wal_records: r.get(1),
            wal_fpi: r.get(2),
            wal_bytes: r.get(3),
            tables: BTreeMap::new(),
        };
        for row in self
            .client
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
                   FROM pg_stat_user_tables WHERE schemaname = $1",
                &[&schema],
            )
            .await?
        {
            let name: String = row.get(0);
            let name = name.trim_start_matches("relaybus_").to_owned();
            c.tables
                .insert(name, [row.get(1), row.get(2), row.get(3), row.get(4)]);
        }
        Ok(c)
    }

    async fn fresh_schema(&mut self, binary: &Path) -> Result<String, Error> {
        self.counter += 1;
        let schema = format!("relaybus_bench_{}_{}", std::process::id(), self.counter);
        self.drop_schema(&schema).await?;
        let status = self
            .command(binary, &schema)
            .arg("setup")
            .stdout(Stdio::null())
            .status()
            .await?;
        if !status.success() {
            return Err(format!("`{} setup` failed", binary.display()).into());
        }
        Ok(schema)
    }

    fn command(&self, binary: &Path, schema: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(binary);
        if let Some(url) = &self.opts.database_url {
            cmd.env("RELAYBUS_DATABASE_URL", url);
        }
        cmd.args(["--schema", schema]).kill_on_drop(true);
        cmd
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

    /// The plans of a cell's publishers (or of its floor), all with one start time.
    fn publishers(
        &self,
        role: Role,
        schema: &str,
        publishers: u32,
        batch: u32,
        handlers: u32,
        keys: Keys,
    ) -> Vec<WorkerPlan> {
        let base = self.plan(role, schema);
        (0..publishers)
            .map(|index| WorkerPlan {
                index,
                batch,
                handlers,
                keys,
                ..base.clone()
            })
            .collect()
    }

    /// A worker plan for one sample of this run, starting a moment from now (every plan of a
    /// cell is cloned from one, so their windows line up).
    fn plan(&self, role: Role, schema: &str) -> WorkerPlan {
        WorkerPlan {
            target: StoreTarget {
                database_url: self.opts.database_url.clone(),
                schema: schema.to_owned(),
                prefix: "relaybus_".into(),
                prepared_statements: true,
            },
            role,
            start_at_ms: now_ms() + 700,
            warmup: self.opts.warmup,
            window: self.opts.window,
            index: 0,
            batch: 1,
            handlers: 1,
            keys: Keys::None,
            config: Config::Defaults,
            events: 0,
            phase: 0.0,
            records: None,
        }
    }

    async fn drop_schema(&self, schema: &str) -> Result<(), Error> {
        self.sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
    }

    async fn sql(&self, statement: &str) -> Result<(), Error> {
        self.client
            .batch_execute(statement)
            .await
            .map_err(StoreError::db(format!("`{statement}` failed")))?;
        Ok(())
    }

    /// Backlog for a dispatch cell: more than warm-up and window can take at `rate` per second
    /// from one process (fewer events when each has several handlers). More processes share
    /// the cores, so they take less than `rate` each.
    fn backlog(&self, processes: u32, handlers: u32, rate: f64) -> u64 {
        let seconds = (self.opts.warmup + self.opts.window).as_secs_f64();
        let deliveries =
            seconds * rate * f64::from(processes.min(4)).sqrt() * 1.3 * self.backlog_scale;
        (deliveries as u64 / u64::from(handlers)).max(10_000)
    }

    /// The backlog of a dispatch cell, written by two set-based inserts: events `e0`, `e1`, ...
    /// with the generator's keys, one delivery per handler with the lane relaybus computes and
    /// per-key sequences in the order of the numbers, which the exactness check relies on.
    /// Delivery ids ascend in publish order, as relaybus's UUIDv7 ids do (random ones made the
    /// preload a fifth slower).
    /// `settle` vacuums and checkpoints, so the counters of the sample start from a clean
    /// state; the floor only needs the planner's statistics.
    async fn preload(
        &self,
        schema: &str,
        events: u64,
        handlers: u32,
        keys: Keys,
        settle: bool,
    ) -> Result<(), Error> {
        let key = match keys {
            Keys::None => "NULL::text",
            Keys::Distinct => "'k' || (g % 1000)",
            Keys::Hot10 => "'k' || (g % 10)",
            Keys::Hot1 => "'k0'",
        };
        let handler_list: Vec<String> = (0..handlers).map(|h| format!("h{h}")).collect();
        self.sql(&format!(
            "INSERT INTO {schema}.relaybus_events (id, type, key, payload, handlers) \
             SELECT 'e' || g, 'bench.event', {key}, jsonb_build_object('pad', repeat('x', 150)), \
                    '{{{handlers}}}' FROM generate_series(0, {last}) AS g",
            handlers = handler_list.join(","),
            last = events - 1
        ))
        .await?;
        self.sql(&format!(
            "INSERT INTO {schema}.relaybus_deliveries (id, event_id, handler, lane, key, sequence) \
             SELECT '00000000-0000-7000-8000-' || lpad(to_hex(g * {count} + i - 1), 12, '0'), \
                    'e' || g, h, {schema}.relaybus_lane_of(coalesce({key}, 'e' || g)), {key}, \
                    CASE WHEN {key} IS NOT NULL THEN row_number() OVER (PARTITION BY h, {key} ORDER BY g) END \
               FROM generate_series(0, {last}) AS g, \
                    unnest('{{{handlers}}}'::text[]) WITH ORDINALITY AS u(h, i)",
            handlers = handler_list.join(","),
            count = handlers,
            last = events - 1
        ))
        .await?;
        // One statement each: several in one query string form a transaction, which VACUUM
        // refuses.
        let how = if settle { "VACUUM ANALYZE" } else { "ANALYZE" };
        for table in ["deliveries", "events", "lanes"] {
            self.sql(&format!("{how} {schema}.relaybus_{table}"))
                .await?;
        }
        if settle {
            self.sql("CHECKPOINT").await?;
        }
        Ok(())
    }

    /// One sample of one cell with one binary.
    pub async fn sample(&mut self, cell: Cell, binary: &Path, index: u32) -> Result<Sample, Error> {
        let spin_ms = spin();
        let (reports, counters, exactness, latency) = loop {
            let schema = self.fresh_schema(binary).await?;
            let result = self.measure(cell, binary, &schema).await;
            self.drop_schema(&schema).await?;
            let result = result?;
            match &result.2 {
                Some(e) if e.ran_out && self.backlog_scale < 16.0 => {
                    self.backlog_scale *= 2.0;
                    eprintln!(
                        "{cell}: the backlog ran out inside the window; measuring again with a \
                         backlog {}x as large",
                        self.backlog_scale
                    );
                }
                _ => break result,
            }
        };
        let window = self.opts.window.as_secs_f64();
        let units_window: u64 = reports.iter().map(|r| r.units_window).sum();
        let units: u64 = reports.iter().map(|r| r.units_total).sum();
        let mut calls: Vec<u64> = reports
            .iter()
            .flat_map(|r| r.latencies_us.iter().copied())
            .collect();
        calls.sort_unstable();
        let floor_throughput = if self.opts.floor && !matches!(cell, Cell::Mixed { .. }) {
            Some(self.floor(cell, binary).await?)
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
            units,
            statements: reports.iter().map(|r| r.statements).sum(),
            parses: reports.iter().map(|r| r.parses).sum(),
            counters,
            call_p50_ms: (!calls.is_empty()).then(|| percentile(&calls, 0.5) / 1000.0),
            call_p99_ms: (!calls.is_empty()).then(|| percentile(&calls, 0.99) / 1000.0),
            latency,
            exactness,
            spin_ms,
        })
    }

    #[allow(clippy::type_complexity)]
    async fn measure(
        &mut self,
        cell: Cell,
        binary: &Path,
        schema: &str,
    ) -> Result<
        (
            Vec<WorkerReport>,
            Counters,
            Option<Exactness>,
            Option<Latency>,
        ),
        Error,
    > {
        match cell {
            Cell::Publish {
                publishers,
                batch,
                handlers,
                keys,
            } => {
                let before = self.counters(schema).await?;
                let plans =
                    self.publishers(Role::Publish, schema, publishers, batch, handlers, keys);
                let reports = self.workers(binary, plans).await?;
                tokio::time::sleep(Duration::from_millis(600)).await;
                let counters = delta(&before, &self.counters(schema).await?);
                let published: u64 = reports.iter().map(|r| r.units_total).sum();
                let deliveries: i64 = self
                    .client
                    .query_one(
                        &format!("SELECT count(*) FROM {schema}.relaybus_deliveries"),
                        &[],
                    )
                    .await?
                    .get(0);
                let expected = published * u64::from(handlers);
                let exact = Exactness {
                    valid: deliveries as u64 == expected,
                    lost: expected.saturating_sub(deliveries as u64),
                    duplicates: (deliveries as u64).saturating_sub(expected),
                    duplicates_after_lease_loss: 0,
                    order_violations: 0,
                    dead: 0,
                    ran_out: false,
                    problems: if deliveries as u64 == expected {
                        vec![]
                    } else {
                        vec![format!(
                            "{deliveries} deliveries for {published} events x {handlers} handlers"
                        )]
                    },
                };
                Ok((reports, counters, Some(exact), None))
            }
            Cell::Dispatch {
                processes,
                config,
                handlers,
                keys,
            } => {
                let events = self.backlog(processes, handlers, config.ceiling());
                self.preload(schema, events, handlers, keys, true).await?;
                let before = self.counters(schema).await?;
                let base = WorkerPlan {
                    config,
                    handlers,
                    ..self.plan(Role::Dispatch, schema)
                };
                let mut files = vec![];
                let plans = (0..processes)
                    .map(|i| {
                        let file = self.dir.path().join(format!("{schema}-d{i}"));
                        files.push(file.clone());
                        WorkerPlan {
                            records: Some(file),
                            ..base.clone()
                        }
                    })
                    .collect();
                let reports = self.workers(binary, plans).await?;
                tokio::time::sleep(Duration::from_millis(600)).await;
                let counters = delta(&before, &self.counters(schema).await?);
                let expected: Vec<(String, String, u64)> = (0..events)
                    .flat_map(|n| (0..handlers).map(move |h| (format!("e{n}"), format!("h{h}"), n)))
                    .collect();
                let exact = self
                    .exactness(schema, &files, &expected, keys, true)
                    .await?;
                Ok((reports, counters, Some(exact), None))
            }
            Cell::Mixed { rate, config } => {
                let before = self.counters(schema).await?;
                let base = self.plan(Role::MixedPublish, schema);
                let publishers = 4u32;
                let mut pub_files = vec![];
                let mut disp_files = vec![];
                let mut plans = vec![];
                for i in 0..publishers {
                    let file = self.dir.path().join(format!("{schema}-p{i}"));
                    pub_files.push(file.clone());
                    plans.push(WorkerPlan {
                        index: i,
                        events: u64::from(rate / publishers),
                        phase: f64::from(i) / f64::from(publishers),
                        records: Some(file),
                        ..base.clone()
                    });
                }
                let file = self.dir.path().join(format!("{schema}-d0"));
                disp_files.push(file.clone());
                plans.push(WorkerPlan {
                    role: Role::Dispatch,
                    config,
                    records: Some(file),
                    ..base
                });
                // The largest backlog, sampled while the workers run.
                let client = &self.client;
                let query = format!(
                    "SELECT count(*) FROM {schema}.relaybus_deliveries WHERE status = 'pending'"
                );
                let watch = async {
                    let mut max = 0i64;
                    let deadline = Instant::now()
                        + Duration::from_millis(700)
                        + self.opts.warmup
                        + self.opts.window;
                    while Instant::now() < deadline {
                        if let Ok(r) = client.query_one(&query, &[]).await {
                            max = max.max(r.get(0));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    max
                };
                let (reports, max_backlog) = tokio::join!(self.workers(binary, plans), watch);
                let reports = reports?;
                tokio::time::sleep(Duration::from_millis(600)).await;
                let counters = delta(&before, &self.counters(schema).await?);
                // Commit time of every event, and whether it counts: latencies are those of
                // events committed inside the window, not of the warm-up's.
                let mut committed: HashMap<String, (u64, bool)> = HashMap::new();
                for f in &pub_files {
                    for line in std::fs::read_to_string(f)?.lines() {
                        let p: Vec<&str> = line.split('\t').collect();
                        let [id, t, in_window] = p[..] else {
                            return Err("bad publisher record".into());
                        };
                        committed.insert(id.to_owned(), (t.parse()?, in_window == "1"));
                    }
                }
                let expected: Vec<(String, String, u64)> = committed
                    .keys()
                    .map(|id| (id.clone(), "h0".into(), 0))
                    .collect();
                let exact = self
                    .exactness(schema, &disp_files, &expected, Keys::None, false)
                    .await?;
                let mut latencies: Vec<u64> = vec![];
                for f in &disp_files {
                    for line in std::fs::read_to_string(f)?.lines() {
                        let parts: Vec<&str> = line.split('\t').collect();
                        if let (Some((c, true)), Ok(t)) =
                            (committed.get(parts[0]), parts[3].parse::<u64>())
                        {
                            latencies.push(t.saturating_sub(*c));
                        }
                    }
                }
                latencies.sort_unstable();
                let latency = Latency {
                    p50_ms: percentile(&latencies, 0.5) / 1000.0,
                    p95_ms: percentile(&latencies, 0.95) / 1000.0,
                    p99_ms: percentile(&latencies, 0.99) / 1000.0,
                    max_backlog,
                };
                // Throughput of a mixed cell is what was accepted: the publishers' events.
                let published: Vec<WorkerReport> =
                    reports.into_iter().take(publishers as usize).collect();
                Ok((published, counters, Some(exact), Some(latency)))
            }
        }
    }

    /// Every (event, handler) published was handled once or is still pending, none twice
    /// unless a lease was lost, nothing dead, and per key the handled deliveries ran in order
    /// and precede every pending one.
    async fn exactness(
        &self,
        schema: &str,
        files: &[PathBuf],
        expected: &[(String, String, u64)],
        keys: Keys,
        backlog: bool,
    ) -> Result<Exactness, Error> {
        let mut handled: HashMap<(String, String), Vec<(i32, u64)>> = HashMap::new();
        for f in files {
            for line in std::fs::read_to_string(f)?.lines() {
                let p: Vec<&str> = line.split('\t').collect();
                handled
                    .entry((p[0].to_owned(), p[1].to_owned()))
                    .or_default()
                    .push((p[2].parse()?, p[3].parse()?));
            }
        }
        let pending: HashSet<(String, String)> = self
            .client
            .query(&format!("SELECT event_id, handler FROM {schema}.relaybus_deliveries WHERE status = 'pending'"), &[])
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let dead: i64 = self
            .client
            .query_one(
                &format!("SELECT count(*) FROM {schema}.relaybus_deliveries WHERE status = 'dead'"),
                &[],
            )
            .await?
            .get(0);
        let mut e = Exactness {
            valid: true,
            lost: 0,
            duplicates: 0,
            duplicates_after_lease_loss: 0,
            order_violations: 0,
            dead,
            ran_out: backlog && pending.is_empty(),
            problems: vec![],
        };
        // Per (handler, key): (run time, number) of the handled ones, and the first pending one.
        type KeyRuns = (Vec<(u64, u64)>, u64);
        let mut by_key: HashMap<(String, String), KeyRuns> = HashMap::new();
        for (event, handler, n) in expected {
            let k = (event.clone(), handler.clone());
            let runs = handled.get(&k);
            match runs.map(|r| r.len()).unwrap_or(0) {
                0 if !pending.contains(&k) => e.lost += 1,
                0 | 1 => {}
                _ if runs.unwrap().iter().any(|(attempt, _)| *attempt > 1) => {
                    e.duplicates_after_lease_loss += 1
                }
                _ => e.duplicates += 1,
            }
            if let Some(key) = keys.key(*n) {
                let entry = by_key
                    .entry((handler.clone(), key))
                    .or_insert((vec![], u64::MAX));
                match runs.and_then(|r| r.first()) {
                    Some((_, t)) if !pending.contains(&k) => entry.0.push((*t, *n)),
                    _ => entry.1 = entry.1.min(*n),
                }
            }
        }
        for (runs, first_pending) in by_key.values_mut() {
            runs.sort_unstable();
            let in_order = runs.windows(2).all(|w| w[0].1 < w[1].1);
            let before_pending = runs.iter().all(|(_, n)| n < first_pending);
            if !(in_order && before_pending) {
                e.order_violations += 1;
            }
        }
        if e.lost > 0 {
            e.problems.push(format!("{} lost", e.lost));
        }
        if e.duplicates > 0 {
            e.problems.push(format!(
                "{} handled twice without a lost lease",
                e.duplicates
            ));
        }
        if e.order_violations > 0 {
            e.problems
                .push(format!("{} keys out of order", e.order_violations));
        }
        if e.dead > 0 {
            e.problems.push(format!("{} dead", e.dead));
        }
        if e.ran_out {
            e.problems
                .push("the backlog ran out inside the window".into());
        }
        e.valid = e.problems.is_empty();
        Ok(e)
    }

    /// The raw-SQL floor of a cell: its units per second with the plainest statements.
    async fn floor(&mut self, cell: Cell, binary: &Path) -> Result<f64, Error> {
        let schema = self.fresh_schema(binary).await?;
        let own = std::env::current_exe()?;
        let plans: Vec<WorkerPlan> = match cell {
            Cell::Publish {
                publishers,
                batch,
                handlers,
                keys,
            } => self.publishers(
                Role::FloorPublish,
                &schema,
                publishers,
                batch,
                handlers,
                keys,
            ),
            Cell::Dispatch {
                processes,
                config,
                handlers,
                keys,
            } => {
                let events = self.backlog(processes, handlers, config.ceiling());
                self.preload(&schema, events, handlers, keys, false).await?;
                let base = WorkerPlan {
                    config,
                    ..self.plan(Role::FloorDispatch, &schema)
                };
                vec![base; processes as usize]
            }
            Cell::Mixed { .. } => vec![],
        };
        let reports = self.workers(&own, plans).await;
        self.drop_schema(&schema).await?;
        let window = self.opts.window.as_micros() as f64;
        Ok(reports?
            .iter()
            .map(|r| {
                let lasted = r.ran_out_after_us.map_or(window, |us| us as f64);
                r.units_window as f64 * 1e6 / lasted.max(1.0)
            })
            .sum())
    }

    pub fn options(&self) -> &BenchOptions {
        &self.opts
    }
}

fn delta(before: &Counters, after: &Counters) -> Counters {
    Counters {
        transactions: after.transactions - before.transactions,
        wal_records: after.wal_records - before.wal_records,
        wal_fpi: after.wal_fpi - before.wal_fpi,
        wal_bytes: after.wal_bytes - before.wal_bytes,
        tables: after
            .tables
            .iter()
            .map(|(k, a)| {
                let b = before.tables.get(k).copied().unwrap_or_default();
                (
                    k.clone(),
                    [a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]],
                )
            })
            .collect(),
    }
}
