//! What relaybus keeps when things go wrong: a worker killed mid-batch, a worker frozen past its
//! lease, a database restart, a lost or stalled wake-up connection. Tests that stop or freeze a
//! server use a throwaway cluster of their own.

use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::common::cluster::{connect, TestCluster};
use relaybus::store::{Store, StoreOptions};

use crate::common::{
    claim_request, database_url, finish, open_store, runtime, signal, spawn_worker, stderr, stdout,
    wait_in_flight, wait_until, Spawned, TestSchema,
};

fn event(id: &str) -> String {
    serde_json::json!({"id": id, "type": "t", "handlers": ["h"]}).to_string()
}

/// relaybus against a throwaway cluster.
fn relaybus(cluster: &TestCluster) -> StdCommand {
    let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"));
    cmd.env("RELAYBUS_DATABASE_URL", cluster.url());
    cmd
}

fn run_ok(cmd: &mut StdCommand, input: &str) -> String {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = finish(child, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

fn worker(cluster: &TestCluster, args: &[&str]) -> Spawned {
    relaybus(cluster)
        .arg("run")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .into()
}

fn count(cluster: &TestCluster, sql: &str) -> i64 {
    runtime()
        .block_on(connect(&cluster.url()).query_one(sql, &[]))
        .map(|r| r.get(0))
        .unwrap_or(-1)
}

#[test]
fn a_killed_worker_s_deliveries_are_redelivered_after_its_lease_with_one_attempt_charged() {
    let s = TestSchema::installed("run_kill9");
    let lines: Vec<String> = (0..12).map(|i| event(&format!("e{i:02}"))).collect();
    let out = s
        .cmd()
        .arg("publish")
        .write_stdin(lines.join("\n"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let marker = format!("{}.{}", 200 + std::process::id() % 100, std::process::id());
    let cmd =
        format!("cat >/dev/null; [ \"$RELAYBUS_ATTEMPT\" = 1 ] && exec sleep {marker}; exit 0");
    let args = [
        "--handler",
        "h",
        "--exec",
        &cmd,
        "--lease-duration",
        "1s",
        "--concurrency",
        "12",
        "--batch-size",
        "12",
        "--poll-interval",
        "50ms",
        "--completion-history",
    ];
    let victim = spawn_worker(&s, &args);
    wait_in_flight(&s, 12);
    signal(&victim, nix::sys::signal::Signal::SIGKILL);
    finish(victim, Duration::from_secs(10));
    let mut drain_args = args.to_vec();
    drain_args.push("--drain");
    let out = s
        .cmd()
        .arg("run")
        .args(&drain_args)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let _ = StdCommand::new("pkill")
        .args(["-f", &format!("sleep {marker}")])
        .status();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 12, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    assert!(stderr(&out).contains("charged one attempt to each delivery they had in flight"));
    // Completed at attempt 2: the crash was charged as one attempt.
    assert_eq!(
        s.rows(&format!(
            "SELECT count(*), min(attempts), max(attempts) FROM {}",
            s.table("completions")
        )),
        ["12|2|2"]
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

/// A worker frozen past its lease (a long GC pause, a stopped VM) comes back to find its lanes
/// taken over: every write it then makes is refused, so each delivery is recorded once.
#[test]
fn a_frozen_worker_s_late_writes_are_all_refused() {
    let s = TestSchema::installed("frozen");
    let lines: Vec<String> = (0..6).map(|i| event(&format!("e{i}"))).collect();
    let out = s
        .cmd()
        .arg("publish")
        .write_stdin(lines.join("\n"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let slow = [
        "--handler",
        "h",
        "--exec",
        "cat >/dev/null; sleep 1",
        "--lease-duration",
        "1s",
        "--concurrency",
        "6",
        "--batch-size",
        "6",
        "--poll-interval",
        "50ms",
        "--completion-history",
    ];
    let frozen = spawn_worker(&s, &slow);
    wait_in_flight(&s, 6);
    signal(&frozen, Signal::SIGSTOP);
    // Its lease runs out; another worker takes the lanes over and does the work.
    let mut fresh = slow.to_vec();
    fresh.push("--drain");
    let out = s.cmd().arg("run").args(&fresh).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 6, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    signal(&frozen, Signal::SIGCONT);
    // Its handlers finished while it was frozen; every completion it now records is refused.
    std::thread::sleep(Duration::from_millis(500));
    signal(&frozen, Signal::SIGTERM);
    let out = finish(frozen, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 0, failed attempts 0, dead 0, lease lost 6, released 0\n"
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT count(*), count(DISTINCT event_id), min(attempts), max(attempts) FROM {}",
            s.table("completions")
        )),
        ["6|6|2|2"]
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

/// A completion reads the lane without a lock, so a takeover can commit after the completion's
/// snapshot says the token is good: the completion then waits for the row the takeover charged,
/// and once the takeover commits it must delete nothing. The takeover's writes are held open in
/// a transaction, so the order is certain.
#[test]
fn a_completion_that_waits_for_a_takeover_deletes_nothing() {
    let s = TestSchema::installed("complete_vs_takeover");
    s.publish(&[serde_json::json!({"id": "e1", "type": "t", "handlers": ["h"]})]);
    let store = open_store(&s, StoreOptions::worker(1));
    let claimed = runtime()
        .block_on(store.claim(&claim_request("w1", &["h"])))
        .unwrap()
        .0;
    let token = claimed[0].token.clone();
    let (lanes, deliveries) = (s.table("lanes"), s.table("deliveries"));
    let (takeover, holder) = runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "BEGIN; \
                 UPDATE {lanes} SET epoch = epoch + 1, lease_owner = 'w2' WHERE lane = {lane}; \
                 UPDATE {deliveries} SET claims = claims + 1, attempts = attempts + 1 \
                  WHERE id = '{id}'",
                lane = token.lane,
                id = token.delivery_id
            ))
            .await
            .unwrap();
        let holder: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        (client, holder)
    });
    let completion = runtime().spawn({
        let token = token.clone();
        async move { store.complete(&[token], false).await }
    });
    wait_until(
        "the completion to wait for the takeover's row lock",
        Duration::from_secs(10),
        || {
            s.count(&format!(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE {holder} = ANY (pg_blocking_pids(pid)) AND query LIKE '%Completion%'"
            )) == 1
        },
    );
    runtime()
        .block_on(takeover.batch_execute("COMMIT"))
        .unwrap();
    let deleted = runtime().block_on(completion).unwrap().unwrap();
    assert_eq!(deleted, Vec::<String>::new());
    assert_eq!(
        s.rows(&format!("SELECT id, claims, attempts FROM {deliveries}")),
        [format!("{}|1|1", token.delivery_id)]
    );
}

/// The database restarts while handlers run: their completions are retried until it answers
/// again, so nothing runs twice and no attempt is counted that was not made; the worker goes
/// on without an operator.
#[test]
fn a_database_restart_loses_nothing_and_runs_nothing_twice() {
    let cluster = TestCluster::start();
    run_ok(relaybus(&cluster).arg("setup"), "");
    let lines: Vec<String> = (0..20).map(|i| event(&format!("e{i:02}"))).collect();
    run_ok(relaybus(&cluster).arg("publish"), &lines.join("\n"));
    let log = cluster.path().join("handled");
    let command = format!(
        "cat >/dev/null; sleep 1; echo \"$RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let w = worker(
        &cluster,
        &[
            "--handler",
            "h",
            "--exec",
            &command,
            "--concurrency",
            "20",
            "--batch-size",
            "20",
            "--poll-interval",
            "100ms",
            "--drain",
        ],
    );
    wait_until("20 deliveries in flight", Duration::from_secs(20), || {
        count(
            &cluster,
            "SELECT coalesce(sum(cardinality(in_flight)), 0) FROM relaybus_lanes",
        ) == 20
    });
    cluster.stop();
    // The handlers finish while the server is down; their completions wait for it.
    std::thread::sleep(Duration::from_secs(2));
    cluster.start_again();
    let out = finish(w, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 20, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let mut handled: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    handled.sort();
    let expected: Vec<String> = (0..20).map(|i| format!("e{i:02} 1")).collect();
    assert_eq!(handled, expected);
    assert!(
        stderr(&out).contains("retrying until the database answers"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        count(&cluster, "SELECT count(*) FROM relaybus_deliveries"),
        0
    );
}

/// The wake-up connection's server process freezes: nothing fails, it only stops answering. A
/// worker that polls once an hour notices and listens anew, so a publish still wakes it.
#[test]
fn a_stalled_wake_up_connection_is_noticed() {
    let cluster = TestCluster::start();
    run_ok(relaybus(&cluster).arg("setup"), "");
    let done = cluster.path().join("done");
    let w = worker(
        &cluster,
        &[
            "--handler",
            "h",
            "--exec",
            &format!("cat > {}", done.display()),
            "--poll-interval",
            "1h",
        ],
    );
    let listener = cluster.backend("query LIKE 'LISTEN %'");
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(listener), Signal::SIGSTOP).unwrap();
    run_ok(relaybus(&cluster).arg("publish"), &event("wake"));
    let woken = std::time::Instant::now();
    let seen = std::panic::catch_unwind(|| {
        wait_until(
            "the worker to listen anew and handle the event",
            Duration::from_secs(40),
            || done.exists(),
        )
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(listener), Signal::SIGCONT).unwrap();
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert!(seen.is_ok(), "{}", stderr(&out));
    assert!(woken.elapsed() < Duration::from_secs(40));
    assert!(
        stderr(&out).contains("the server did not answer a check within 5s"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}

/// The wake-up connection is killed (a failover, an idle-session reaper): the worker listens
/// anew at once, and a publish wakes it.
#[test]
fn a_killed_wake_up_connection_is_replaced() {
    let cluster = TestCluster::start();
    run_ok(relaybus(&cluster).arg("setup"), "");
    let done = cluster.path().join("done");
    let w = worker(
        &cluster,
        &[
            "--handler",
            "h",
            "--exec",
            &format!("cat > {}", done.display()),
            "--poll-interval",
            "1h",
        ],
    );
    let listener = cluster.backend("query LIKE 'LISTEN %'");
    let admin = connect(&cluster.url());
    runtime()
        .block_on(admin.query("SELECT pg_terminate_backend($1)", &[&listener]))
        .unwrap();
    let replaced = cluster.backend(&format!("query LIKE 'LISTEN %' AND pid <> {listener}"));
    assert_ne!(replaced, listener);
    run_ok(relaybus(&cluster).arg("publish"), &event("wake"));
    wait_until(
        "the worker to handle the event",
        Duration::from_secs(20),
        || done.exists(),
    );
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert!(
        stderr(&out).contains("wake-up connection lost; polling until it is back"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}
