//! `relaybus bench` end to end with tiny windows: one cell of each scenario, their exactness
//! verdicts, the exact row counters of the sample's own schema, and the files of `--out`.

use std::time::Duration;

use serde_json::Value;

use crate::common::{connect, database_url, finish, stdout};

/// Rows inserted, updated, HOT-updated and deleted in one table during a sample.
fn rows(sample: &Value, table: &str) -> [u64; 4] {
    let t = &sample["counters"]["tables"][table];
    [0, 1, 2, 3].map(|i| t[i].as_u64().unwrap_or(0))
}

#[test]
fn one_cell_of_each_scenario_is_measured_exactly_and_reported() {
    let out = tempfile::tempdir().unwrap();
    let bench = std::process::Command::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", database_url())
        .args([
            "bench",
            "--cell",
            "pub-p1-b1",
            "--cell",
            "disp-1i-defaults",
            "--cell",
            "mixed-1000-defaults",
            // Long enough that a debug build on a busy machine handles something in the window.
            "--warmup",
            "1s",
            "--window",
            "1s",
            // The test database holds the other tests' stores.
            "--yes",
            "--json",
            "--out",
        ])
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The bench names its schemas after its process: others' benches run beside this one.
    let pid = bench.id();
    let o = finish(bench, Duration::from_secs(300));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let samples: Vec<Value> = serde_json::from_str(&stdout(&o)).unwrap();
    let cells: Vec<&str> = samples
        .iter()
        .map(|s| s["cell"].as_str().unwrap())
        .collect();
    assert_eq!(
        cells,
        ["pub-p1-b1", "disp-1i-defaults", "mixed-1000-defaults"]
    );
    for s in &samples {
        assert_eq!(s["exactness"]["valid"], true, "{s}");
        assert_eq!(s["exactness"]["problems"], serde_json::json!([]), "{s}");
        assert!(s["throughput"].as_f64().unwrap() > 0.0, "{s}");
    }

    // Publish: one event row and one delivery row per event, nothing updated or deleted.
    let publish = &samples[0];
    let events = publish["units"].as_u64().unwrap();
    assert_eq!(rows(publish, "events"), [events, 0, 0, 0]);
    assert_eq!(rows(publish, "deliveries"), [events, 0, 0, 0]);
    assert!(publish["floor_throughput"].as_f64().unwrap() > 0.0);

    // Dispatch: every handled delivery deleted once, no delivery row updated.
    let dispatch = &samples[1];
    let handled = dispatch["units"].as_u64().unwrap();
    assert_eq!(rows(dispatch, "deliveries"), [0, 0, 0, handled]);
    assert_eq!(
        rows(dispatch, "events")[3],
        0,
        "events outlive their deliveries"
    );
    assert!(dispatch["floor_throughput"].as_f64().unwrap() > 0.0);

    // Mixed: every accepted event written once; what was handled before the window closed was
    // deleted (the rest is pending, which the exactness check allows here).
    let mixed = &samples[2];
    let accepted = mixed["units"].as_u64().unwrap();
    assert_eq!(rows(mixed, "events")[0], accepted);
    let [inserted, updated, hot, deleted] = rows(mixed, "deliveries");
    assert_eq!([inserted, updated, hot], [accepted, 0, 0]);
    assert!(
        deleted > 0 && deleted <= accepted,
        "{deleted} of {accepted}"
    );
    let latency = &mixed["latency"];
    assert!(latency["p50_ms"].as_f64().unwrap() <= latency["p99_ms"].as_f64().unwrap());
    assert_eq!(mixed["floor_throughput"], Value::Null);

    // The files of --out, one sample per line and a table row per cell.
    let jsonl = std::fs::read_to_string(out.path().join("samples.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 3);
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for cell in cells {
        assert!(
            report.contains(&format!("| {cell} | relaybus |")),
            "{report}"
        );
    }
    let env: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("env.json")).unwrap())
            .unwrap();
    assert!(
        env["server"]["server_version"]
            .as_str()
            .unwrap()
            .starts_with("15"),
        "{env}"
    );

    // Every sample's schema, and every floor's, is gone.
    let left = crate::common::block_on(connect().query(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1",
        &[&format!("relaybus\\_bench\\_{pid}\\_%")],
    ))
    .unwrap();
    assert_eq!(left.len(), 0);
}

/// The same on MongoDB, where the counters come from the oplog: a publish inserts one event and
/// one delivery per event, a dispatch deletes each delivery once and writes none, and the report
/// shows the oplog columns.
#[test]
fn publish_and_dispatch_are_measured_exactly_on_mongodb() {
    // A server of its own: the test server is one Python process, and the other MongoDB tests
    // running beside this one on the shared server could stall its claims for a whole window
    // (CI saw a dispatch handle 144 deliveries in the warm-up and none in the window).
    let server = crate::common::mongo::OwnServer::start(&[]);
    let out = tempfile::tempdir().unwrap();
    let o = crate::common::relaybus()
        .timeout(Duration::from_secs(300))
        .env("RELAYBUS_DATABASE_URL", server.url(""))
        .args([
            "bench",
            "--cell",
            "pub-p1-b100",
            "--cell",
            "disp-1i-tuned",
            // Long enough that a debug build on a busy machine, and the test server, have
            // started before the window does; a 2 s window once measured nothing of the
            // dispatch cell during a loaded CI run.
            "--warmup",
            "2s",
            "--window",
            "4s",
            // The test server scans on `$in` filters: a small backlog keeps claims short.
            "--backlog",
            "2000",
            "--json",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        stdout(&o)
    );
    let samples: Vec<Value> = serde_json::from_str(&stdout(&o)).unwrap();
    for s in &samples {
        assert_eq!(s["exactness"]["valid"], true, "{s}");
        assert!(s["counters"]["oplog_entries"].as_u64().unwrap() > 0, "{s}");
    }
    let publish = &samples[0];
    let events = publish["units"].as_u64().unwrap();
    assert!(events >= 100, "{publish}");
    assert_eq!(rows(publish, "events"), [events, 0, 0, 0]);
    assert_eq!(rows(publish, "deliveries"), [events, 0, 0, 0]);
    let dispatch = &samples[1];
    let handled = dispatch["units"].as_u64().unwrap();
    assert!(handled > 0, "{dispatch}");
    assert_eq!(rows(dispatch, "deliveries"), [0, 0, 0, handled]);
    assert!(rows(dispatch, "lanes")[1] > 0, "{dispatch}");
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(
        report.contains("| oplog B/unit | oplog entries/unit | server ops/unit |"),
        "{report}"
    );
    assert!(!report.contains("WAL B/unit"), "{report}");
}

/// `--compare` alternates the two binaries and prints the median ratio per cell; with `--json`
/// standard output is the samples alone, so that a script can parse it.
#[test]
fn a_comparison_prints_its_ratios_and_with_json_only_the_samples() {
    // The same build under another name: the samples are told apart by the binary's path.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("relaybus-other");
    std::fs::copy(assert_cmd::cargo::cargo_bin("relaybus"), &other).unwrap();
    let compare = |json: bool| {
        let mut cmd = crate::common::relaybus();
        cmd.timeout(Duration::from_secs(120))
            .env("RELAYBUS_DATABASE_URL", database_url())
            .args(["bench", "--cell", "pub-p1-b1", "--no-floor", "--yes"])
            // Long enough that a debug build on a busy machine handles something in the window.
            .args(["--warmup", "1s", "--window", "1s", "--compare"])
            .arg(&other);
        if json {
            cmd.arg("--json");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        stdout(&o)
    };
    let text = compare(false);
    let ratio = format!("pub-p1-b1: {} / base median ", other.display());
    assert_eq!(
        text.lines().filter(|l| l.starts_with(&ratio)).count(),
        1,
        "{text}"
    );
    let samples: Vec<Value> = serde_json::from_str(&compare(true)).unwrap();
    let binaries: Vec<&str> = samples
        .iter()
        .map(|s| s["binary"].as_str().unwrap())
        .collect();
    assert_eq!(binaries.len(), 2, "{binaries:?}");
    assert_eq!(binaries[1], other.display().to_string());
}

/// A bench beside a store with deliveries in it asks first; without a terminal to ask on and
/// without --yes it names the store and measures nothing.
#[test]
fn a_server_holding_a_store_with_deliveries_is_not_benchmarked_without_yes() {
    let s = crate::common::TestSchema::installed("bench_refusal");
    s.cmd()
        .args(["publish", "--type", "t", "--handler", "h"])
        .assert()
        .success();
    let o = crate::common::relaybus()
        .timeout(Duration::from_secs(60))
        .env("RELAYBUS_DATABASE_URL", database_url())
        .args(["bench", "--cell", "pub-p1-b1", "--window", "1s"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("error: This server holds relaybus stores with deliveries in them ("),
        "{err}"
    );
    assert!(err.contains(&s.name), "{err}");
    assert!(err.ends_with("Run it here? Not confirmed: standard input is not a terminal; rerun with --yes to proceed\n"), "{err}");
}

/// A server too slow for a cell does not keep the bench: the sample is reported as beyond
/// `--sample-limit`, its floor is not run, and the bench ends (exit 1, as for an inexact
/// sample). The test server loads the
/// default backlog (10,000 events and their deliveries) in well over 3 s.
#[test]
fn a_sample_beyond_its_limit_is_reported_and_the_bench_goes_on() {
    let server = crate::common::mongo::OwnServer::start(&[]);
    let started = std::time::Instant::now();
    let o = crate::common::relaybus()
        .timeout(Duration::from_secs(120))
        .env("RELAYBUS_DATABASE_URL", server.url(""))
        .args([
            "bench",
            "--cell",
            "disp-1i-defaults",
            "--sample-limit",
            "3s",
            "--json",
        ])
        .output()
        .unwrap();
    // A sample that measured nothing fails the run, as an inexact one does.
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let samples: Vec<Value> = serde_json::from_str(&stdout(&o)).unwrap();
    let s = &samples[0];
    assert_eq!(
        (
            &s["exactness"]["valid"],
            &s["floor_throughput"],
            &s["units"]
        ),
        (&Value::Bool(false), &Value::Null, &serde_json::json!(0)),
        "{s}"
    );
    assert_eq!(
        s["exactness"]["problems"][0],
        "could not be measured within --sample-limit 3s on this server (loading the store, \
         the warm-up, the window and the checks took longer): give a longer --sample-limit, a \
         smaller --backlog or a faster server",
    );
    // The sample's store is dropped once the limit passed; nothing else waits.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}
