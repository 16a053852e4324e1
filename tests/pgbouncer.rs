//! Workers behind a real PgBouncer in transaction mode: they find it and send their statements
//! unnamed, or start that way with `--no-prepared-statements`.

use std::collections::BTreeSet;

use serde_json::json;

use crate::common::pgbouncer::PgBouncer;
use crate::common::scenario::Target;
use crate::common::{stderr, TestSchema};

/// Publishes `n` events for handler `h`, straight to the server.
fn publish(s: &TestSchema, n: usize) {
    let events: Vec<_> = (0..n)
        .map(|i| json!({"id": format!("ev-{i}"), "type": "t", "key": format!("k{}", i % 7), "handlers": ["h"]}))
        .collect();
    s.publish(&events);
}

/// The warning of a process that found a transaction pooler, with why.
fn pooler_warnings(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.contains("the connection goes through a transaction pooler"))
        .collect()
}

/// Behind a pooler that resets a server session after each transaction, the probe's statement
/// is gone in the next round trip: the worker sends its statements unnamed and says so, once.
#[test]
fn behind_a_transaction_pooler_a_worker_sends_statements_unnamed_and_says_so() {
    let bouncer = PgBouncer::start();
    let s = TestSchema::installed("pgbouncer_prepared");
    publish(&s, 20);
    let out = s
        .cmd()
        .env("RELAYBUS_DATABASE_URL", bouncer.url())
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "true",
            "--drain",
            "--json",
        ])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let warnings = pooler_warnings(&err);
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("prepared statement \\\"relaybus_probe_"),
        "{err}"
    );
    assert!(
        warnings[0].contains(
            "statements are sent unnamed from now on (--no-prepared-statements starts that way)"
        ),
        "{err}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&summary["handled"], &summary["failed"]),
        (&20.into(), &0.into())
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

/// PgBouncer in transaction mode keeps one server session for every client, and the statements
/// each process prepares stay in it. The first process finds a session of its own and prepares
/// its statements; every later one finds statements there and sends its own unnamed, so no
/// process's statement ever runs as another's (with the driver's names, `s0`, `s1`... in every
/// process, the second publish would meet the first one's `s0`).
#[test]
fn processes_sharing_a_server_session_never_share_a_statement_name() {
    let bouncer = PgBouncer::one_session();
    let s = TestSchema::installed("pgbouncer_names");
    let events: Vec<String> = (0..40)
        .map(|i| json!({"id": format!("ev-{i}"), "type": "t", "handlers": ["h"]}).to_string())
        .collect();
    let through = |args: &[&str], stdin: &str| {
        let out = s
            .cmd()
            .env("RELAYBUS_DATABASE_URL", bouncer.url())
            .args(args)
            .write_stdin(stdin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        out
    };
    for half in events.chunks(20) {
        through(&["publish", "--json"], &half.join("\n"));
    }
    let out = through(
        &["run", "--handler", "h", "--noop", "--drain", "--json"],
        "",
    );
    let err = stderr(&out);
    let warnings = pooler_warnings(&err);
    assert_eq!(warnings.len(), 1, "{err}");
    // Whichever of its connections meets the session first says why: other statements in it, or
    // its own probe, which another connection of the process prepared there.
    assert!(
        warnings[0].contains("the session holds ")
            || warnings[0].contains("prepared statement \\\"relaybus_probe_"),
        "{err}"
    );
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
