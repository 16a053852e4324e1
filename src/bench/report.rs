//! The benchmark's output: a table per sample on the terminal, and with `--out DIR` the files
//! `report.md`, `samples.jsonl` and `env.json`. Counters are divided by the units done.

use std::fmt::Write as _;
use std::path::Path;

use super::{BenchOptions, Sample};

/// The server totals a report shows as columns, as each engine counts them: (heading, total,
/// decimals). Only those some sample of the run has are shown.
const HEADLINES: [(&str, &str, usize); 6] = [
    ("WAL B/unit", "wal_bytes", 0),
    ("WAL rec/unit", "wal_records", 2),
    ("FPI/unit", "wal_fpi", 3),
    ("oplog B/unit", "oplog_bytes", 0),
    ("oplog entries/unit", "oplog_entries", 3),
    ("server ops/unit", "operations", 3),
];

fn headlines(samples: &[Sample]) -> Vec<(&'static str, &'static str, usize)> {
    HEADLINES
        .into_iter()
        .filter(|(_, key, _)| samples.iter().any(|s| s.counters.totals.contains_key(*key)))
        .collect()
}

/// A server total of a sample per unit (0 when the store does not count it).
fn total_per_unit(s: &Sample, name: &str) -> f64 {
    s.counters.totals.get(name).copied().unwrap_or(0) as f64 / s.units.max(1) as f64
}

/// Per-unit counters of a sample, in the order the table shows them: the client's statements,
/// the server's totals, then rows per table.
pub fn per_unit(s: &Sample) -> Vec<(String, f64)> {
    let u = s.units.max(1) as f64;
    let c = &s.counters;
    let mut out = vec![
        ("statements".to_owned(), s.statements as f64 / u),
        ("parses".to_owned(), s.parses as f64 / u),
    ];
    out.extend(c.totals.keys().map(|k| (k.clone(), total_per_unit(s, k))));
    for (table, [ins, upd, hot, del]) in &c.tables {
        if ins + upd + del == 0 {
            continue;
        }
        out.push((format!("{table}.ins"), *ins as f64 / u));
        out.push((format!("{table}.upd"), *upd as f64 / u));
        out.push((format!("{table}.hot"), *hot as f64 / u));
        out.push((format!("{table}.del"), *del as f64 / u));
    }
    out
}

fn verdict(s: &Sample) -> String {
    match &s.exactness {
        Some(e) if !e.valid => format!("INVALID: {}", e.problems.join("; ")),
        Some(e) if e.duplicates_after_lease_loss > 0 => {
            format!(
                "valid ({} redelivered after a lost lease)",
                e.duplicates_after_lease_loss
            )
        }
        _ => "valid".into(),
    }
}

fn unit(s: &Sample) -> &'static str {
    if s.scenario == "dispatch" {
        "deliveries/s"
    } else {
        "events/s"
    }
}

/// One line per sample for the terminal.
pub fn line(s: &Sample) -> String {
    let rate = match &s.exactness {
        Some(e) if !e.valid => "-".to_owned(),
        _ => format!("{:.0} {}", s.throughput, unit(s)),
    };
    let floor = s
        .floor_throughput
        .map(|f| format!(", floor {f:.0} ({:.2} of it)", s.throughput / f.max(1.0)))
        .unwrap_or_default();
    let latency = s
        .latency
        .as_ref()
        .map(|l| {
            format!(
                ", e2e p50/p95/p99 {:.1}/{:.1}/{:.1} ms, backlog max {}",
                l.p50_ms, l.p95_ms, l.p99_ms, l.max_backlog
            )
        })
        .unwrap_or_default();
    let calls = s
        .call_p50_ms
        .map(|p| {
            format!(
                ", call p50/p99 {p:.2}/{:.2} ms",
                s.call_p99_ms.unwrap_or(0.0)
            )
        })
        .unwrap_or_default();
    let counters: Vec<String> = per_unit(s)
        .iter()
        .filter(|(k, _)| {
            [
                "statements",
                "parses",
                "wal_bytes",
                "wal_fpi",
                "oplog_bytes",
                "oplog_entries",
            ]
            .contains(&k.as_str())
                || k.ends_with(".upd")
                || k.ends_with(".hot")
        })
        .map(|(k, v)| format!("{k} {v:.3}"))
        .collect();
    format!(
        "{:<22} {rate}{floor}{calls}{latency} | per unit: {} | {} | spin {:.0} ms",
        s.cell,
        counters.join(", "),
        verdict(s),
        s.spin_ms
    )
}

/// The CPU-spin time over which a sample is noisy: 1.25 times the quietest of the run, as the
/// seed's method flags noise.
pub fn noise_limit(samples: &[Sample]) -> f64 {
    samples.iter().map(|s| s.spin_ms).fold(f64::MAX, f64::min) * 1.25
}

/// Ratios of candidate to base, pair by pair, per cell: (cell, ratios). A pair with a noisy
/// sample is left out while at least two clean pairs remain.
pub fn ratios(samples: &[Sample], base: &str) -> Vec<(String, Vec<f64>)> {
    // Samples go cell after cell within each round, so a cell comes back once per round.
    let mut cells: Vec<String> = vec![];
    for s in samples {
        if !cells.contains(&s.cell) {
            cells.push(s.cell.clone());
        }
    }
    cells
        .into_iter()
        .map(|cell| {
            let of = |is_base: bool| -> Vec<&Sample> {
                samples
                    .iter()
                    .filter(|s| s.cell == cell && (s.binary == base) == is_base)
                    .collect()
            };
            let limit = noise_limit(samples);
            let pairs: Vec<(f64, bool)> = of(true)
                .into_iter()
                .zip(of(false))
                .filter(|(a, b)| {
                    [a, b]
                        .iter()
                        .all(|s| s.exactness.as_ref().is_none_or(|e| e.valid))
                })
                .map(|(a, b)| {
                    let clean = a.spin_ms <= limit && b.spin_ms <= limit;
                    (b.throughput / a.throughput.max(1e-9), clean)
                })
                .collect();
            let clean = pairs.iter().filter(|(_, c)| *c).count() >= 2;
            let kept = pairs
                .into_iter()
                .filter(|(_, c)| *c || !clean)
                .map(|(r, _)| r)
                .collect();
            (cell, kept)
        })
        .collect()
}

/// The middle value, or the mean of the two middle ones: of two pairs whose ratios are 0.95 and
/// 1.20 it is 1.075, not either.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `report.md`: one table of throughput and the counters per unit, then the comparison.
pub fn markdown(opts: &BenchOptions, samples: &[Sample]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# relaybus bench\n");
    let _ = writeln!(
        md,
        "Warm-up {} ms, window {} ms, {} sample(s) per cell. Counters are server deltas (WAL is \
         cluster-wide on PostgreSQL; the oplog is this database's on MongoDB) and client \
         statement (operation) counts, divided by the units done from the first statement to \
         the last. A sample that failed exactness shows no number.\n",
        opts.warmup.as_millis(),
        opts.window.as_millis(),
        opts.samples
    );
    samples_table(&mut md, samples);
    rows_table(&mut md, samples);
    if let Some(candidate) = &opts.candidate {
        let _ = writeln!(
            md,
            "\n## {} / {}\n",
            candidate.display(),
            opts.base.display()
        );
        ratios_table(&mut md, samples, &opts.base.display().to_string());
    }
    md
}

/// A row per sample: its rate, floor, counters per unit, latency and verdict.
fn samples_table(md: &mut String, samples: &[Sample]) {
    let limit = noise_limit(samples);
    let columns = headlines(samples);
    let headings: String = columns.iter().map(|(h, _, _)| format!(" {h} |")).collect();
    let aligns = "---:|".repeat(columns.len());
    let _ = writeln!(md, "| cell | binary | throughput | floor | of floor | stmts/unit |{headings} latency / calls | exactness | spin ms |");
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|{aligns}---|---|---:|");
    for s in samples {
        let valid = s.exactness.as_ref().is_none_or(|e| e.valid);
        let extra = match (&s.latency, s.call_p50_ms) {
            (Some(l), _) => format!(
                "e2e p50 {:.1} / p95 {:.1} / p99 {:.1} ms, backlog {}",
                l.p50_ms, l.p95_ms, l.p99_ms, l.max_backlog
            ),
            (None, Some(p)) => format!(
                "call p50 {p:.2} / p99 {:.2} ms",
                s.call_p99_ms.unwrap_or(0.0)
            ),
            _ => String::new(),
        };
        let totals: String = columns
            .iter()
            .map(|(_, key, decimals)| format!(" {:.*} |", decimals, total_per_unit(s, key)))
            .collect();
        let binary = Path::new(&s.binary)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let throughput = if valid {
            format!("{:.0} {}", s.throughput, unit(s))
        } else {
            "-".into()
        };
        let floor =
            |f: &dyn Fn(f64) -> String| s.floor_throughput.map(f).unwrap_or_else(|| "-".into());
        let spin = if s.spin_ms > limit {
            format!("{:.0} (noisy)", s.spin_ms)
        } else {
            format!("{:.0}", s.spin_ms)
        };
        let _ = writeln!(
            md,
            "| {} | {binary} | {throughput} | {} | {} | {:.3} |{totals} {extra} | {} | {spin} |",
            s.cell,
            floor(&|f| format!("{f:.0}")),
            floor(&|f| format!("{:.2}", s.throughput / f.max(1.0))),
            s.statements as f64 / s.units.max(1) as f64,
            verdict(s),
        );
    }
}

/// Rows inserted, updated, HOT-updated and deleted per unit, per table.
fn rows_table(md: &mut String, samples: &[Sample]) {
    let _ = writeln!(md, "\n## Rows written per unit\n");
    let _ = writeln!(md, "| cell | table | inserted | updated | HOT | deleted |");
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|");
    for s in samples {
        let u = s.units.max(1) as f64;
        for (t, [i, up, h, d]) in &s.counters.tables {
            if i + up + d > 0 {
                let _ = writeln!(
                    md,
                    "| {} | {t} | {:.3} | {:.3} | {:.3} | {:.3} |",
                    s.cell,
                    *i as f64 / u,
                    *up as f64 / u,
                    *h as f64 / u,
                    *d as f64 / u
                );
            }
        }
    }
}

/// The candidate's rate over the base's, per cell, over the pairs.
fn ratios_table(md: &mut String, samples: &[Sample], base: &str) {
    let _ = writeln!(md, "| cell | pairs | median | min | max |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for (cell, r) in ratios(samples, base) {
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        match median(&r) {
            Some(m) => {
                let _ = writeln!(md, "| {cell} | {} | {m:.3} | {lo:.3} | {hi:.3} |", r.len());
            }
            None => {
                let _ = writeln!(md, "| {cell} | 0 | - | - | - |");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::bench::ServerCounters;

    fn sample(binary: &str, n: u32, throughput: f64, spin_ms: f64) -> Sample {
        Sample {
            cell: "disp-1i-tuned".into(),
            scenario: "dispatch",
            binary: binary.into(),
            sample: n,
            throughput,
            floor_throughput: None,
            units: 1,
            statements: 0,
            parses: 0,
            counters: ServerCounters::default(),
            call_p50_ms: None,
            call_p99_ms: None,
            latency: None,
            exactness: None,
            spin_ms,
        }
    }

    #[test]
    fn noisy_pairs_are_left_out_while_two_clean_pairs_remain() {
        // A, B, then B, A, ... as the bench interleaves them; pair 2 ran on a busy machine.
        let mut samples = vec![
            sample("a", 1, 100.0, 40.0),
            sample("b", 1, 110.0, 41.0),
            sample("b", 2, 300.0, 60.0),
            sample("a", 2, 100.0, 40.0),
            sample("a", 3, 100.0, 42.0),
            sample("b", 3, 120.0, 40.0),
        ];
        let r = ratios(&samples, "a");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, vec![1.1, 1.2]);
        // Of two ratios, the median is their mean.
        assert!((median(&r[0].1).unwrap() - 1.15).abs() < 1e-9);
        assert_eq!(median(&[0.9, 1.3, 1.0]), Some(1.0));
        // With only one clean pair left, every pair counts.
        samples.truncate(4);
        assert_eq!(ratios(&samples, "a")[0].1, vec![1.1, 3.0]);
        // Rounds repeat the cells; each is reported once.
        let other = |mut s: Sample| {
            s.cell = "pub-p1-b1".into();
            s
        };
        let rounds = vec![
            sample("a", 1, 100.0, 40.0),
            sample("b", 1, 110.0, 40.0),
            other(sample("a", 1, 10.0, 40.0)),
            other(sample("b", 1, 20.0, 40.0)),
            sample("b", 2, 120.0, 40.0),
            sample("a", 2, 100.0, 40.0),
            other(sample("b", 2, 30.0, 40.0)),
            other(sample("a", 2, 10.0, 40.0)),
        ];
        let cells: Vec<(String, Vec<f64>)> = ratios(&rounds, "a");
        assert_eq!(
            cells,
            [
                ("disp-1i-tuned".to_owned(), vec![1.1, 1.2]),
                ("pub-p1-b1".to_owned(), vec![2.0, 3.0])
            ]
        );
    }
}
