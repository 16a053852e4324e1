//! Measuring one cell: its processes, the store's counters around them, and what the exactness
//! check needs; and the raw floor beside it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cells::{Cell, Config, Keys};
use super::exactness::{self, Exactness, Expected};
use super::worker::{Role, WorkerPlan, WorkerReport};
use super::{percentile, Coordinator, Error, Latency, SampleStore};
use crate::store::bench::{Backlog, BenchStore, ServerCounters};

/// What one run of a cell's processes showed.
pub(super) struct Measured {
    /// The reports the throughput is taken from (a mixed cell's publishers).
    pub(super) reports: Vec<WorkerReport>,
    pub(super) counters: ServerCounters,
    pub(super) exactness: Option<Exactness>,
    pub(super) latency: Option<Latency>,
}

impl Measured {
    /// A sample that did not end within the limit: nothing of it counts.
    pub(super) fn beyond(limit: Duration) -> Self {
        let mut exactness = Exactness::new(0, false);
        exactness.refuse(&format!(
            "could not be measured within --sample-limit {} on this server (loading the store, \
             the warm-up, the window and the checks took longer): give a longer --sample-limit, \
             a smaller --backlog or a faster server",
            humantime::format_duration(limit)
        ));
        Self {
            reports: vec![],
            counters: ServerCounters::default(),
            exactness: Some(exactness),
            latency: None,
        }
    }
}

/// Workers' statistics reach the server when they exit; this much later they are all in.
const SETTLE: Duration = Duration::from_millis(600);

fn backlog(events: u64, handlers: u32, keys: Keys) -> Backlog {
    Backlog {
        events,
        handlers: (0..handlers).map(|h| format!("h{h}")).collect(),
        key_modulus: keys.modulus(),
    }
}

impl Coordinator {
    /// The plans of a cell's publishers (or of its floor), all with one start time.
    fn publishers(
        &self,
        role: Role,
        sample: &SampleStore,
        publishers: u32,
        batch: u32,
        handlers: u32,
        keys: Keys,
    ) -> Vec<WorkerPlan> {
        let base = self.plan(role, &sample.target);
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

    async fn counters_after(
        &self,
        store: &impl BenchStore,
        before: &ServerCounters,
    ) -> Result<ServerCounters, Error> {
        tokio::time::sleep(SETTLE).await;
        Ok(store.server_counters().await?.since(before))
    }

    pub(super) async fn measure(
        &mut self,
        cell: Cell,
        binary: &std::path::Path,
        sample: &SampleStore,
    ) -> Result<Measured, Error> {
        let mut measured = match cell {
            Cell::Publish {
                publishers,
                batch,
                handlers,
                keys,
            } => {
                let plans =
                    self.publishers(Role::Publish, sample, publishers, batch, handlers, keys);
                self.measure_publish(binary, sample, plans, handlers)
                    .await?
            }
            Cell::Dispatch {
                processes,
                config,
                handlers,
                keys,
            } => {
                self.measure_dispatch(binary, sample, processes, config, handlers, keys)
                    .await?
            }
            Cell::Mixed { rate, config } => {
                self.measure_mixed(binary, sample, rate, config).await?
            }
        };
        if measured.reports.iter().map(|r| r.units_window).sum::<u64>() == 0 {
            if let Some(e) = measured.exactness.as_mut() {
                e.refuse(
                    "nothing was measured inside the window (on a slow server, give a longer \
                     --window)",
                );
            }
        }
        Ok(measured)
    }

    async fn measure_publish(
        &mut self,
        binary: &std::path::Path,
        sample: &SampleStore,
        plans: Vec<WorkerPlan>,
        handlers: u32,
    ) -> Result<Measured, Error> {
        let store = &sample.store;
        let before = store.server_counters().await?;
        let reports = self.workers(binary, plans).await?;
        let counters = self.counters_after(store, &before).await?;
        let published: u64 = reports.iter().map(|r| r.units_total).sum();
        let deliveries = store.delivery_counts().await?.total as u64;
        let exactness = Exactness::of_publish(deliveries, published, handlers);
        Ok(Measured {
            reports,
            counters,
            exactness: Some(exactness),
            latency: None,
        })
    }

    async fn measure_dispatch(
        &mut self,
        binary: &std::path::Path,
        sample: &SampleStore,
        processes: u32,
        config: Config,
        handlers: u32,
        keys: Keys,
    ) -> Result<Measured, Error> {
        let store = &sample.store;
        let events = self.backlog(processes, handlers, config.ceiling());
        store
            .preload(&backlog(events, handlers, keys), true)
            .await?;
        let before = store.server_counters().await?;
        let base = WorkerPlan {
            config,
            handlers,
            ..self.plan(Role::Dispatch, &sample.target)
        };
        let mut files = vec![];
        let plans = (0..processes)
            .map(|i| {
                let file = self
                    .dir
                    .path()
                    .join(format!("{}-d{i}", sample.target.schema));
                files.push(file.clone());
                WorkerPlan {
                    records: Some(file),
                    ..base.clone()
                }
            })
            .collect();
        let reports = self.workers(binary, plans).await?;
        let counters = self.counters_after(store, &before).await?;
        let expected: Vec<Expected> = (0..events)
            .flat_map(|n| (0..handlers).map(move |h| (format!("e{n}"), format!("h{h}"), n)))
            .collect();
        let pending: HashSet<(String, String)> = store.pending().await?.into_iter().collect();
        let dead = store.delivery_counts().await?.dead;
        let exactness = exactness::check(&files, &expected, &pending, dead, keys, true)?;
        Ok(Measured {
            reports,
            counters,
            exactness: Some(exactness),
            latency: None,
        })
    }

    async fn measure_mixed(
        &mut self,
        binary: &std::path::Path,
        sample: &SampleStore,
        rate: u32,
        config: Config,
    ) -> Result<Measured, Error> {
        let store = &sample.store;
        let before = store.server_counters().await?;
        let base = self.plan(Role::MixedPublish, &sample.target);
        let publishers = 4u32;
        let mut pub_files = vec![];
        let mut plans = vec![];
        for i in 0..publishers {
            let file = self
                .dir
                .path()
                .join(format!("{}-p{i}", sample.target.schema));
            pub_files.push(file.clone());
            plans.push(WorkerPlan {
                index: i,
                events: u64::from(rate / publishers),
                phase: f64::from(i) / f64::from(publishers),
                records: Some(file),
                ..base.clone()
            });
        }
        let disp_file = self.dir.path().join(format!("{}-d0", sample.target.schema));
        plans.push(WorkerPlan {
            role: Role::Dispatch,
            config,
            records: Some(disp_file.clone()),
            ..base
        });
        // The largest backlog, sampled while the workers run.
        let watch = async {
            let mut max = 0i64;
            let deadline =
                Instant::now() + Duration::from_millis(700) + self.opts.warmup + self.opts.window;
            while Instant::now() < deadline {
                if let Ok(c) = store.delivery_counts().await {
                    max = max.max(c.pending);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            max
        };
        let (reports, max_backlog) = tokio::join!(self.workers(binary, plans), watch);
        let reports = reports?;
        let counters = self.counters_after(store, &before).await?;
        let committed = commit_times(&pub_files)?;
        let expected: Vec<Expected> = committed
            .keys()
            .map(|id| (id.clone(), "h0".into(), 0))
            .collect();
        let pending: HashSet<(String, String)> = store.pending().await?.into_iter().collect();
        let dead = store.delivery_counts().await?.dead;
        let files = [disp_file];
        let exactness = exactness::check(&files, &expected, &pending, dead, Keys::None, false)?;
        let latency = latency(&files[0], &committed, max_backlog)?;
        // Throughput of a mixed cell is what was accepted: the publishers' events.
        let published: Vec<WorkerReport> = reports.into_iter().take(publishers as usize).collect();
        Ok(Measured {
            reports: published,
            counters,
            exactness: Some(exactness),
            latency: Some(latency),
        })
    }

    /// The raw floor of a cell: its units per second with the plainest statements, run by this
    /// binary whichever is under test.
    /// None when it did not end within the sample limit.
    pub(super) async fn floor(&mut self, cell: Cell) -> Result<Option<f64>, Error> {
        let own = std::env::current_exe()?;
        let sample = self.fresh_store(&own).await?;
        let limit = self.opts.sample_limit;
        let run = tokio::time::timeout(limit, self.floor_run(cell, &own, &sample)).await;
        sample.store.drop_namespace().await?;
        match run {
            Ok(throughput) => throughput.map(Some),
            Err(_) => {
                eprintln!(
                    "{cell}: the floor did not end within --sample-limit {}",
                    humantime::format_duration(limit)
                );
                Ok(None)
            }
        }
    }

    async fn floor_run(
        &mut self,
        cell: Cell,
        own: &std::path::Path,
        sample: &SampleStore,
    ) -> Result<f64, Error> {
        let plans: Vec<WorkerPlan> = match cell {
            Cell::Publish {
                publishers,
                batch,
                handlers,
                keys,
            } => self.publishers(
                Role::FloorPublish,
                sample,
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
                sample
                    .store
                    .preload(&backlog(events, handlers, keys), false)
                    .await?;
                let base = WorkerPlan {
                    config,
                    ..self.plan(Role::FloorDispatch, &sample.target)
                };
                vec![base; processes as usize]
            }
            Cell::Mixed { .. } => vec![],
        };
        let reports = self.workers(own, plans).await;
        let window = self.opts.window.as_micros() as f64;
        Ok(reports?
            .iter()
            .map(|r| {
                let lasted = r.ran_out_after_us.map_or(window, |us| us as f64);
                r.units_window as f64 * 1e6 / lasted.max(1.0)
            })
            .sum())
    }
}

/// The commit time of every event the publishers recorded, and whether it counts: latencies
/// are those of events committed inside the window, not of the warm-up's.
fn commit_times(files: &[PathBuf]) -> Result<HashMap<String, (u64, bool)>, Error> {
    let mut committed = HashMap::new();
    for f in files {
        for line in std::fs::read_to_string(f)?.lines() {
            let p: Vec<&str> = line.split('\t').collect();
            let [id, t, in_window] = p[..] else {
                return Err("bad publisher record".into());
            };
            committed.insert(id.to_owned(), (t.parse()?, in_window == "1"));
        }
    }
    Ok(committed)
}

/// Commit-to-handler latencies of the events committed inside the window.
fn latency(
    handled: &Path,
    committed: &HashMap<String, (u64, bool)>,
    max_backlog: i64,
) -> Result<Latency, Error> {
    let mut latencies: Vec<u64> = vec![];
    for line in std::fs::read_to_string(handled)?.lines() {
        let parts: Vec<&str> = line.split('\t').collect();
        if let (Some((c, true)), Ok(t)) = (committed.get(parts[0]), parts[3].parse::<u64>()) {
            latencies.push(t.saturating_sub(*c));
        }
    }
    latencies.sort_unstable();
    Ok(Latency {
        p50_ms: percentile(&latencies, 0.5) / 1000.0,
        p95_ms: percentile(&latencies, 0.95) / 1000.0,
        p99_ms: percentile(&latencies, 0.99) / 1000.0,
        max_backlog,
    })
}
