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
    let err = stderr(&out);
    let name = err
        .split_once("prepared statement \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("", |(name, _)| name);
    assert!(is_relaybus_statement_name(name), "{err}");
    assert!(
        err.replace(name, "NAME").ends_with(
            "error: could not claim deliveries: prepared statement \"NAME\" does not exist (26000); \
             the connection goes through a transaction pooler (PgBouncer in transaction mode, for \
             one) that shares prepared statements between its clients: run with \
             --no-prepared-statements, or use PgBouncer 1.21 or later with max_prepared_statements \
             set\n"
        ),
        "{err}"
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

/// `s`, the process's tag in 16 hex digits, `_`, the statement's number in the process.
fn is_relaybus_statement_name(name: &str) -> bool {
    name.strip_prefix('s')
        .and_then(|rest| rest.split_once('_'))
        .is_some_and(|(tag, n)| {
            tag.len() == 16
                && tag.bytes().all(|b| b.is_ascii_hexdigit())
                && !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
        })
}

/// PgBouncer in transaction mode keeps one server session for every client, and the statements
/// each process prepares stay in it. Statement names of their own keep a publisher's and a
/// worker's apart: with names like every other process's (`s0`, `s1`...), the worker's first
/// statement was refused as "already exists" (or, of the same shape, ran as the publisher's).
#[test]
fn processes_sharing_a_server_session_never_share_a_statement_name() {
    let bouncer = PgBouncer::one_session();
    let s = TestSchema::installed("pgbouncer_names");
    let events: Vec<String> = (0..40)
        .map(|i| json!({"id": format!("ev-{i}"), "type": "t", "handlers": ["h"]}).to_string())
        .collect();
    let through = |args: &[&str], stdin: &str| {
        s.cmd()
            .env("RELAYBUS_DATABASE_URL", bouncer.url())
            .args(args)
            .write_stdin(stdin)
            .output()
            .unwrap()
    };
    for half in events.chunks(20) {
        let out = through(&["publish", "--json"], &half.join("\n"));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = through(
        &["run", "--handler", "h", "--noop", "--drain", "--json"],
        "",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&summary["handled"], &summary["failed"]),
        (&40.into(), &0.into())
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("events"))),
        40
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
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
