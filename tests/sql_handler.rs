//! SQL handlers: the statement and the completion of its delivery commit together or not at
//! all, against the real server, through the real binary.

use std::time::Duration;

use relaybus::store::prelude::*;

use relaybus::store::{ClaimRequest, StatementOutcome, StoreOptions};
use serde_json::json;

use crate::common::scenario::Target;
use crate::common::{
    claim_request, finish, open_store, signal, spawn_worker, stderr, stdout, wait_until, TestSchema,
};

/// A table of the test's schema that a handler's statement writes.
fn ledger(s: &TestSchema, columns: &str) -> String {
    let table = format!("\"{}\".ledger", s.name);
    s.exec(&format!("CREATE TABLE {table} ({columns})"));
    table
}

#[test]
fn the_statement_gets_the_envelope_and_commits_with_the_completion() {
    let s = TestSchema::installed("sql_envelope");
    let table = ledger(
        &s,
        "event_id text, amount numeric, key text, type text, headers jsonb, delivery_id text, attempt int",
    );
    s.publish(&[
        json!({"id": "e1", "type": "order.paid", "key": "k1", "payload": {"amount": 12.5},
               "headers": {"trace": "t1"}, "handlers": ["ledger", "later"]}),
        json!({"id": "e2", "type": "order.paid", "payload": {"amount": 7}, "handlers": ["ledger"]}),
    ]);
    let ids = s.rows(&format!(
        "SELECT event_id, id FROM {} WHERE handler = 'ledger' ORDER BY event_id",
        s.table("deliveries")
    ));
    let sql =
        format!("INSERT INTO {table} VALUES ($1, ($2->>'amount')::numeric, $3, $4, $5, $6, $7)");
    let out = s
        .cmd()
        .args(["run", "--handler", "ledger", "--sql", &sql, "--drain"])
        .args(["--completion-history"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 2, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let delivery = |event: &str| {
        ids.iter()
            .find_map(|r| r.strip_prefix(&format!("{event}|")))
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        s.rows(&format!("SELECT * FROM {table} ORDER BY event_id")),
        [
            format!(
                "e1|12.5|k1|order.paid|{{\"trace\": \"t1\"}}|{}|1",
                delivery("e1")
            ),
            format!("e2|7|NULL|order.paid|{{}}|{}|1", delivery("e2")),
        ]
    );
    // Completed by the same transaction: gone from deliveries, in the history; the other
    // handler's delivery is untouched.
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler FROM {} ORDER BY 1, 2",
            s.table("deliveries")
        )),
        ["e1|later"]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler, attempts FROM {} ORDER BY 1",
            s.table("completions")
        )),
        ["e1|ledger|1", "e2|ledger|1"]
    );
}

#[test]
fn a_failing_statement_is_a_failed_attempt_with_the_database_s_message() {
    let s = TestSchema::installed("sql_fails");
    let table = ledger(&s, "event_id text, amount numeric CHECK (amount > 0)");
    s.publish(&[
        json!({"id": "neg", "type": "t", "payload": {"amount": -1}, "handlers": ["ledger"]}),
    ]);
    let insert = format!("INSERT INTO {table} VALUES ($1, ($2->>'amount')::numeric)");
    let slow = "SELECT pg_sleep(5)";
    for (sql, timeout, error) in [
        (
            insert.as_str(),
            "30s",
            "new row for relation \"ledger\" violates check constraint \"ledger_amount_check\" \
             (23514): Failing row contains (neg, -1).",
        ),
        (
            slow,
            "200ms",
            "canceling statement due to statement timeout (57014)",
        ),
    ] {
        let out = s
            .cmd()
            .args(["run", "--handler", "ledger", "--sql", sql, "--drain"])
            .args(["--timeout", timeout, "--retry-delay", "1ms"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out).starts_with("handled 0, failed attempts "),
            "{}",
            stdout(&out)
        );
        let row = s.rows(&format!(
            "SELECT status, last_error FROM {}",
            s.table("deliveries")
        ));
        assert_eq!(row, [format!("pending|{error}")]);
    }
    assert_eq!(s.count(&format!("SELECT count(*) FROM {table}")), 0);
}

/// A worker that lost its lane runs nothing with its old token; the new holder runs the
/// statement once.
#[test]
fn after_a_takeover_the_old_token_runs_nothing() {
    let s = TestSchema::installed("sql_takeover");
    let table = ledger(&s, "event_id text, attempt int");
    s.publish(&[json!({"id": "e1", "type": "t", "handlers": ["ledger"]})]);
    let store = open_store(&s, StoreOptions::worker(2));
    let sql = format!("INSERT INTO {table} VALUES ($1, $7)");
    let request = |owner: &str, lease: Duration| ClaimRequest {
        new_lanes: 4,
        lease,
        ..claim_request(owner, &["ledger"])
    };
    let minute = Duration::from_secs(60);
    crate::common::block_on(async {
        let (old, _) = store
            .claim(&request("w1", Duration::from_millis(100)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (_, stats) = store.claim(&request("w2", minute)).await.unwrap();
        assert_eq!(stats.charged, 1);
        let stale = store.complete_with_statement(&old[0], &sql, minute, false);
        assert_eq!(stale.await.unwrap(), StatementOutcome::LeaseLost);
        let (new, _) = store.claim(&request("w2", minute)).await.unwrap();
        let fresh = store.complete_with_statement(&new[0], &sql, minute, false);
        assert_eq!(fresh.await.unwrap(), StatementOutcome::Completed);
    });
    // The takeover charged attempt 1; the run that committed was attempt 2.
    assert_eq!(s.rows(&format!("SELECT * FROM {table}")), ["e1|2"]);
}

#[test]
fn a_statement_that_cannot_run_stops_the_worker_before_it_claims() {
    let s = TestSchema::installed("sql_invalid");
    s.publish(&[json!({"id": "e1", "type": "t", "handlers": ["ledger"]})]);
    let out = s
        .cmd()
        .args(["run", "--handler", "ledger", "--drain", "--sql"])
        .arg("INSERT INTO no_such_table VALUES ($1)")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: handler `ledger`: the statement does not run on this database: relation \
         \"no_such_table\" does not exist (42P01); its parameters are $1 event id (text), $2 \
         payload (jsonb), $3 key (text), $4 type (text), $5 headers (jsonb), $6 delivery id \
         (text), $7 attempt (int4)\n"
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, claims FROM {}",
            s.table("deliveries")
        )),
        ["pending|0|0"]
    );
}

/// Workers killed with `kill -9` again and again while they work through 2,000 deliveries, then
/// a drain: every statement's effect exists exactly once. Each statement takes a couple of
/// milliseconds, so every kill finds transactions in flight.
#[test]
fn kill_9_again_and_again_leaves_exactly_one_row_per_event() {
    let s = TestSchema::installed("sql_kill9");
    let table = ledger(&s, "event_id text NOT NULL");
    let events: Vec<_> = (0..2000)
        .map(|i| json!({"id": format!("e{i:04}"), "type": "t", "key": if i % 2 == 0 { json!(format!("k{}", i % 40)) } else { json!(null) }, "handlers": ["ledger"]}))
        .collect();
    s.publish(&events);
    let sql = format!("INSERT INTO {table} SELECT $1 FROM pg_sleep(0.002)");
    let args = [
        "--handler",
        "ledger",
        "--sql",
        &sql,
        "--lease-duration",
        "1s",
        "--poll-interval",
        "50ms",
        "--concurrency",
        "20",
        "--batch-size",
        "20",
    ];
    let written = || s.count(&format!("SELECT count(*) FROM {table}"));
    let mut kills = 0;
    while written() < 1600 {
        let before = written();
        let worker = spawn_worker(&s, &args);
        wait_until("the worker to write", Duration::from_secs(30), || {
            written() >= before + 150
        });
        signal(&worker, nix::sys::signal::Signal::SIGKILL);
        finish(worker, Duration::from_secs(10));
        kills += 1;
    }
    let mut drain = args.to_vec();
    drain.push("--drain");
    let out = s.cmd().arg("run").args(&drain).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(kills >= 5, "{kills} kills");
    assert_eq!(
        s.rows(&format!(
            "SELECT count(*), count(DISTINCT event_id) FROM {table}"
        )),
        ["2000|2000"]
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}
