//! Workers behind a real PgBouncer in transaction mode: with prepared statements they stop at
//! once and say what to do, with `--no-prepared-statements` they work.

use std::collections::BTreeSet;

use serde_json::json;

use crate::common::pgbouncer::PgBouncer;
use crate::common::{stderr, stdout, TestSchema};

/// Publishes `n` events for handler `h`, straight to the server.
fn publish(s: &TestSchema, n: usize) {
    let events: Vec<_> = (0..n)
        .map(|i| json!({"id": format!("ev-{i}"), "type": "t", "key": format!("k{}", i % 7), "handlers": ["h"]}))
        .collect();
    s.publish(&events);
}

#[test]
fn prepared_statements_behind_a_transaction_pooler_stop_the_worker_with_what_to_do() {
    let bouncer = PgBouncer::start();
    let s = TestSchema::installed("pgbouncer_prepared");
    publish(&s, 20);
    let out = s
        .cmd()
        .env("RELAYBUS_DATABASE_URL", bouncer.url())
        .args(["run", "--handler", "h", "--exec", "true", "--drain"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).ends_with(
            "error: could not claim deliveries: prepared statement \"s0\" does not exist (26000); \
             the connection goes through a transaction pooler (PgBouncer in transaction mode, for \
             one) that shares prepared statements between its clients: run with \
             --no-prepared-statements, or use PgBouncer 1.21 or later with max_prepared_statements \
             set\n"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
    // Nothing was claimed, so nothing was charged an attempt.
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, count(*) FROM {} GROUP BY 1, 2",
            s.table("deliveries")
        )),
        ["pending|0|20"]
    );
}

#[test]
fn without_prepared_statements_two_workers_drain_through_a_transaction_pooler() {
    let bouncer = PgBouncer::start();
    let s = TestSchema::new("pgbouncer_unnamed");
    let through = |args: &[&str]| {
        let mut cmd = s.cmd();
        cmd.env("RELAYBUS_DATABASE_URL", bouncer.url())
            .arg("--no-prepared-statements")
            .args(args);
        cmd
    };
    through(&["setup"]).assert().success();
    publish(&s, 150);
    let log = tempfile::NamedTempFile::new().unwrap();
    let handler = format!("echo \"$RELAYBUS_DELIVERY_ID\" >> {}", log.path().display());
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let mut cmd = through(&[
                "run",
                "--handler",
                "h",
                "--exec",
                &handler,
                "--drain",
                "--json",
            ]);
            std::thread::spawn(move || cmd.output().unwrap())
        })
        .collect();
    let mut handled = 0;
    for worker in workers {
        let out = worker.join().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (&summary["failed"], &summary["scheduled"]),
            (&0.into(), &0.into())
        );
        handled += summary["handled"].as_u64().unwrap();
    }
    assert_eq!(handled, 150);
    let lines = std::fs::read_to_string(log.path()).unwrap();
    let ids: BTreeSet<&str> = lines.lines().collect();
    assert_eq!((lines.lines().count(), ids.len()), (150, 150));
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}
