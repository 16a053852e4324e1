//! `relaybus bench` and the hidden `relaybus bench-worker` that each of its processes runs.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use super::output::{confirm, declined};
use super::{within, GlobalArgs, Output};
use crate::bench::cells::{presets, Cell};
use crate::bench::worker::{self, WorkerPlan};
use crate::bench::{report, BenchOptions, Coordinator, Sample};
use crate::bounds::Bounds;

/// Measure publish and dispatch throughput, mixed-load latency and the database's
/// counters.
///
///   relaybus bench                          # the quick set: every cell, 1 sample
///   relaybus bench dispatch --cell disp-1i-tuned --samples 3
///   relaybus bench publish --compare ./relaybus-old --samples 3 \
///     --out bench-results
///   relaybus bench --list
///
/// Each publisher and dispatcher is its own process; each sample is a warm-up plus
/// a fixed window; dispatch starts from a preloaded backlog; the handler is a
/// built-in no-op. Every sample runs in a schema of its own (relaybus_bench_*, with
/// --prefix), created and dropped by the bench; --schema is not used. Counters are
/// deltas of the server's statistics (nothing is reset) and the workers' own
/// statement counts, per event or delivery. Dispatch and mixed samples are checked
/// for exactness (each delivery handled once, per-key order, nothing lost or dead)
/// and an invalid sample is reported as such. A raw-SQL floor runs beside each
/// cell. With --compare the two binaries alternate (A, B, then B, A) and the ratio
/// of each pair is reported with its median. --out DIR writes report.md,
/// samples.jsonl and env.json.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Only this scenario's cells.
    #[arg(value_enum)]
    pub scenario: Option<Scenario>,
    /// Only these cells (repeatable); see --list.
    #[arg(long = "cell", value_name = "NAME")]
    pub cells: Vec<String>,
    /// List the cells and exit.
    #[arg(long)]
    pub list: bool,
    /// Samples per cell (and per binary with --compare).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub samples: u32,
    /// Work before the window starts, not counted.
    #[arg(long, default_value = "500ms", value_parser = within(Bounds::UP_TO_A_DAY), value_name = "DURATION")]
    pub warmup: Duration,
    /// The measured window. The default keeps the quick set to a few minutes; the seed's method
    /// is --warmup 3s --window 15s.
    #[arg(long, default_value = "2s", value_parser = within(Bounds::POSITIVE_UP_TO_A_DAY), value_name = "DURATION")]
    pub window: Duration,
    /// A second relaybus binary to compare with, interleaved sample by sample.
    #[arg(long, value_name = "BINARY")]
    pub compare: Option<PathBuf>,
    /// Directory for report.md, samples.jsonl and env.json.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Skip the raw-SQL floor runs.
    #[arg(long)]
    pub no_floor: bool,
    /// The longest one sample (and one floor run) may take, from creating its store to its
    /// checks: on a server too slow for a cell, the sample is reported as beyond it and the
    /// bench goes on.
    #[arg(long, default_value = "2m", value_parser = within(Bounds::POSITIVE_UP_TO_A_DAY), value_name = "DURATION")]
    pub sample_limit: Duration,
    /// Events preloaded for each dispatch and floor sample (default: more than the cell's
    /// configuration can take in the warm-up and window, at least 10,000). A backlog that runs
    /// out inside the window is doubled and the sample measured again.
    #[arg(long, value_name = "EVENTS", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub backlog: Option<u64>,
    /// Run even when the server holds relaybus stores with deliveries in them.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Scenario {
    Publish,
    Dispatch,
    Mixed,
}

/// A bench error as the command line reports it: a store's error stays one, so that its exit
/// code is the same as in every other command (2 for a bad URL, 69 for no server).
fn bench_error(e: crate::bench::Error) -> anyhow::Error {
    match e.downcast::<crate::store::StoreError>() {
        Ok(store) => anyhow::Error::from(*store),
        Err(other) => anyhow::Error::from_boxed(other),
    }
}

pub(super) async fn run_worker(out: &Output) -> Result<ExitCode> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
        .context("could not read the worker plan from stdin")?;
    let plan: WorkerPlan = serde_json::from_str(&text).context("invalid worker plan on stdin")?;
    let report = worker::run(plan).await.map_err(bench_error)?;
    out.line(serde_json::to_string(&report)?)?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, a: BenchArgs) -> Result<ExitCode> {
    let cells = selected(&a)?;
    if a.list {
        list(out, &cells)?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = options(g, &a, &cells)?;
    let (base, candidate) = (opts.base.clone(), opts.candidate.clone());
    let mut coordinator = Coordinator::new(opts).map_err(bench_error)?;
    let env = coordinator.environment().await.map_err(bench_error)?;
    let stores = coordinator.stores().await.map_err(bench_error)?;
    if !stores.is_empty() {
        let question = format!(
            "This server holds relaybus stores with deliveries in them ({}): the bench loads \
             it to its limit, beside their workers. Run it here?",
            stores.join(", ")
        );
        if !confirm(&question, a.yes)? {
            return declined();
        }
    }
    let total = cells.len() as u32 * a.samples * if candidate.is_some() { 2 } else { 1 };
    let bar = out.progress(Some(u64::from(total)), "samples");
    let mut current = None;
    let samples = coordinator
        .run(|cell, binary, done| match done {
            None => {
                current = Some(cell);
                bar.set_message(format!("{cell} ({})", binary.display()));
            }
            Some(sample) => {
                if !out.json {
                    // A line that cannot be written does not stop the samples; the summary
                    // written after them reports the error.
                    let _ = bar.suspend(|| out.line(report::line(sample)));
                }
                bar.inc(1);
            }
        })
        .await
        .map_err(bench_error)
        .with_context(|| current.map(|c| c.to_string()).unwrap_or_default())?;
    if !out.json {
        summarize(out, &samples, &base, candidate.as_deref())?;
    }
    if out.json {
        out.print_json(&samples)?;
    }
    if let Some(dir) = &a.out {
        write_out(dir, &coordinator, &samples, env)?;
    }
    let invalid = samples
        .iter()
        .filter(|s| s.exactness.as_ref().is_some_and(|e| !e.valid))
        .count();
    if invalid > 0 {
        eprintln!("{invalid} sample(s) failed the exactness check");
        return Ok(ExitCode::from(super::exit::FAILURE));
    }
    Ok(ExitCode::SUCCESS)
}

/// The cells, as `--list` shows them.
fn list(out: &Output, cells: &[Cell]) -> Result<()> {
    if out.json {
        let list: Vec<_> = cells
            .iter()
            .map(|c| serde_json::json!({"cell": c.to_string(), "scenario": c.scenario(), "description": c.describe()}))
            .collect();
        out.print_json(&list)?;
    } else {
        let rows: Vec<Vec<String>> = cells
            .iter()
            .map(|c| vec![c.to_string(), c.describe()])
            .collect();
        out.table_wrapping(&[1], &["CELL", "WHAT IT MEASURES"], &rows)?;
    }
    Ok(())
}

/// `--out DIR`: the report, the samples as JSON lines, and the environment with the commit.
fn write_out(
    dir: &std::path::Path,
    coordinator: &Coordinator,
    samples: &[Sample],
    mut env: serde_json::Value,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("could not create `{}`", dir.display()))?;
    std::fs::write(
        dir.join("report.md"),
        report::markdown(coordinator.options(), samples),
    )?;
    let mut jsonl = std::fs::File::create(dir.join("samples.jsonl"))?;
    for s in samples {
        writeln!(jsonl, "{}", serde_json::to_string(s)?)?;
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    env["commit"] = commit.into();
    std::fs::write(dir.join("env.json"), serde_json::to_string_pretty(&env)?)?;
    eprintln!("wrote {}", dir.display());
    Ok(())
}

/// The cells of the quick set that `--scenario` and `--cell` select.
fn selected(a: &BenchArgs) -> Result<Vec<Cell>> {
    let mut cells = presets();
    if let Some(scenario) = a.scenario {
        let name = format!("{scenario:?}").to_lowercase();
        cells.retain(|c| c.scenario() == name);
    }
    if !a.cells.is_empty() {
        for wanted in &a.cells {
            if !cells.iter().any(|c| c.to_string() == *wanted) {
                super::usage!("no cell `{wanted}`; `relaybus bench --list` shows them");
            }
        }
        cells.retain(|c| a.cells.contains(&c.to_string()));
    }
    Ok(cells)
}

fn options(g: &GlobalArgs, a: &BenchArgs, cells: &[Cell]) -> Result<BenchOptions> {
    let base = std::env::current_exe().context("could not find this binary")?;
    let candidate = match &a.compare {
        Some(p) => Some(
            std::fs::canonicalize(p).with_context(|| format!("no binary at `{}`", p.display()))?,
        ),
        None => None,
    };
    Ok(BenchOptions {
        cells: cells.to_vec(),
        samples: a.samples,
        warmup: a.warmup,
        window: a.window,
        backlog: a.backlog,
        base,
        candidate,
        database_url: g.url()?,
        prefix: g.namespace()?.prefix().to_owned(),
        prepared_statements: !g.no_prepared_statements,
        floor: !a.no_floor,
        sample_limit: a.sample_limit,
    })
}

/// The noisy samples, and with `--compare` the median ratio of each cell's pairs.
fn summarize(
    out: &Output,
    samples: &[Sample],
    base: &std::path::Path,
    candidate: Option<&std::path::Path>,
) -> Result<()> {
    let limit = report::noise_limit(samples);
    let noisy: Vec<String> = samples
        .iter()
        .filter(|s| s.spin_ms > limit)
        .map(|s| format!("{} #{}", s.cell, s.sample))
        .collect();
    if !noisy.is_empty() {
        out.line(format!(
            "noisy (CPU spin over 1.25x the quietest): {}",
            noisy.join(", ")
        ))?;
    }
    if let Some(c) = candidate {
        for (cell, r) in report::ratios(samples, &base.display().to_string()) {
            if let Some(m) = report::median(&r) {
                out.line(format!(
                    "{cell}: {} / base median {m:.3} over {} pairs",
                    c.display(),
                    r.len()
                ))?;
            }
        }
    }
    Ok(())
}
