//! What relaybus keeps when things go wrong: a worker killed mid-batch, a worker frozen past its
//! lease, a database restart, a lost or stalled wake-up connection. Tests that stop or freeze a
//! server use a throwaway cluster of their own.

use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::common::cluster::{connect, TestCluster};
use crate::common::scenario::Target;
use relaybus::store::prelude::*;
use relaybus::store::StoreOptions;

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
    crate::common::block_on(connect(&cluster.url()).query_one(sql, &[]))
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
    let claimed = crate::common::block_on(store.claim(&claim_request("w1", &["h"])))
        .unwrap()
        .0;
    let token = claimed[0].token.clone();
    let (lanes, deliveries) = (s.table("lanes"), s.table("deliveries"));
    let (takeover, holder) = crate::common::block_on(async {
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
    crate::common::block_on(takeover.batch_execute("COMMIT")).unwrap();
    let deleted = crate::common::block_on(completion).unwrap().unwrap();
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
    crate::common::block_on(admin.query("SELECT pg_terminate_backend($1)", &[&listener])).unwrap();
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
    // Mended by the first reconnect: said, and no warning.
    assert!(
        stderr(&out).contains("INFO wake-up connection lost; listening anew"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("WARN"), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}

/// Status and body of a GET, or None when nothing answers.
fn get(url: &str) -> Option<(u16, String)> {
    crate::common::block_on(async {
        let response = reqwest::get(url).await.ok()?;
        Some((response.status().as_u16(), response.text().await.ok()?))
    })
}

/// Events for handler `h`, half of them keyed over 40 keys.
fn events(n: usize) -> String {
    (0..n)
        .map(|i| {
            let mut e =
                serde_json::json!({"id": format!("e{i:05}"), "type": "t", "handlers": ["h"]});
            if i % 2 == 0 {
                e["key"] = format!("k{}", i % 80 / 2).into();
            }
            e.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lanes table is locked past the lease (a migration, a `LOCK TABLE` by hand): the stall is
/// logged with the session holding the lock, counted, and turns `/readyz` unready; once the
/// lock goes, the worker keeps its lanes (their leases expired, but nobody took them), resumes
/// within the lease plus 10 s and drains every delivery.
#[test]
fn lanes_locked_past_the_lease_are_reported_and_drain_once_the_lock_goes() {
    let cluster = TestCluster::start();
    run_ok(relaybus(&cluster).arg("setup"), "");
    run_ok(relaybus(&cluster).arg("publish"), &events(2000));
    let addr = format!("127.0.0.1:{}", crate::common::cluster::free_port());
    let w = worker(
        &cluster,
        &[
            "--handler",
            "h",
            "--exec",
            "cat >/dev/null",
            "--lease-duration",
            "2s",
            "--concurrency",
            "20",
            "--batch-size",
            "20",
            "--poll-interval",
            "100ms",
            "--stall-after",
            "1s",
            "--metrics-addr",
            &addr,
        ],
    );
    let left = || count(&cluster, "SELECT count(*) FROM relaybus_deliveries");
    wait_until(
        "the worker to start draining",
        Duration::from_secs(30),
        || left() < 1900,
    );
    let holder = connect(&format!("{}&application_name=lock-holder", cluster.url()));
    crate::common::block_on(
        holder.batch_execute("BEGIN; LOCK TABLE relaybus_lanes IN ACCESS EXCLUSIVE MODE"),
    )
    .unwrap();
    let locked = std::time::Instant::now();
    let mut readyz = None;
    wait_until(
        "/readyz to report the stall",
        Duration::from_secs(10),
        || {
            readyz = get(&format!("http://{addr}/readyz"));
            readyz.as_ref().is_some_and(|(status, _)| *status == 503)
        },
    );
    let (_, why) = readyz.unwrap();
    assert!(why.starts_with("not ready: stalled: "), "{why}");
    assert!(why.contains("application `lock-holder`"), "{why}");
    let (_, metrics) = get(&format!("http://{addr}/metrics")).unwrap();
    assert!(
        metrics.contains("relaybus_stalls_total{operation=\"claim\"} 1"),
        "{metrics}"
    );
    // Past the lease, then the lock goes.
    std::thread::sleep(Duration::from_secs(5).saturating_sub(locked.elapsed()));
    crate::common::block_on(holder.batch_execute("COMMIT")).unwrap();
    let released = std::time::Instant::now();
    let stuck = left();
    // The worker resumes on the lanes it held within the lease plus 10 s; the rest of the drain
    // is the speed of spawning 2000 shells, which a loaded machine stretches.
    wait_until(
        "the worker to resume within the lease plus 10 s",
        Duration::from_secs(12),
        || left() < stuck,
    );
    println!("resumed {:?} after the lock went", released.elapsed());
    wait_until("every delivery to drain", Duration::from_secs(120), || {
        left() == 0
    });
    println!("drained {:?} after the lock went", released.elapsed());
    wait_until("/readyz to be ready again", Duration::from_secs(5), || {
        get(&format!("http://{addr}/readyz")).is_some_and(|(status, _)| status == 200)
    });
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 2000, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let log = stderr(&out);
    for line in [
        "claim is stalled",
        "application `lock-holder`",
        "claim went through",
    ] {
        assert!(log.contains(line), "{line}: {log}");
    }
}

/// The database turns read-only for new sessions and the worker's sessions are terminated but
/// one (a failover to a standby, `default_transaction_read_only` set by hand): claims and
/// completions fail, and the worker stops starting handlers instead of running deliveries whose
/// outcomes it cannot record. Once the database is writable again, the sessions opened
/// read-only are replaced and the worker resumes within 10 s; every event is handled once.
#[test]
fn read_only_sessions_are_replaced_and_handlers_wait_for_outcomes_to_be_recorded() {
    let cluster = TestCluster::start();
    run_ok(relaybus(&cluster).arg("setup"), "");
    let total = 1500;
    run_ok(relaybus(&cluster).arg("publish"), &events(total));
    let log = cluster.path().join("handled");
    // Handlers that take a moment: some always run when the sessions turn read-only, and
    // their outcomes are the ones that cannot be recorded.
    let command = format!(
        "cat >/dev/null; echo \"$RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}; sleep 0.02",
        log.display()
    );
    let concurrency = 10;
    let addr = format!("127.0.0.1:{}", crate::common::cluster::free_port());
    let w = worker(
        &cluster,
        &[
            "--handler",
            "h",
            "--exec",
            &command,
            "--concurrency",
            "10",
            "--batch-size",
            "10",
            "--pool-size",
            "3",
            "--poll-interval",
            "100ms",
            "--metrics-addr",
            &addr,
        ],
    );
    let runs = || {
        std::fs::read_to_string(&log)
            .map(|t| t.lines().count() as i64)
            .unwrap_or(0)
    };
    let recorded = || total as i64 - count(&cluster, "SELECT count(*) FROM relaybus_deliveries");
    wait_until("100 handled", Duration::from_secs(30), || recorded() >= 100);
    // With one pool session open, "all but one" would terminate none, and the worker would go
    // on through a session that stays writable.
    let pool = "FROM pg_stat_activity WHERE application_name = 'relaybus' \
                AND query NOT LIKE 'LISTEN%'";
    wait_until("two pool sessions", Duration::from_secs(10), || {
        count(&cluster, &format!("SELECT count(*) {pool}")) >= 2
    });
    let admin = connect(&cluster.url());
    crate::common::block_on(
        admin.batch_execute("ALTER DATABASE postgres SET default_transaction_read_only = on"),
    )
    .unwrap();
    let terminate =
        format!("SELECT pg_terminate_backend(pid) {pool} AND pid <> (SELECT min(pid) {pool})");
    let terminated = crate::common::block_on(admin.query(&terminate, &[])).unwrap();
    assert!(
        !terminated.is_empty(),
        "no session of the worker was terminated"
    );
    let mut readyz = None;
    let mut seen = (0, 0);
    // The session left open stays writable until the worker opens a new one beside it (a
    // busy worker does at once; a loaded machine took over 10 s once), whose read-only error
    // closes it too.
    wait_until(
        "/readyz to report outcomes unrecorded",
        Duration::from_secs(30),
        || {
            seen = (runs(), recorded());
            readyz = get(&format!("http://{addr}/readyz"));
            readyz
                .as_ref()
                .is_some_and(|(_, why)| why.contains("outcomes cannot be recorded"))
        },
    );
    // From the first outcome that could not be recorded on, handlers run at most `concurrency`
    // times more than outcomes are recorded: those that were running then. (What had run and
    // was being recorded then stays unrecorded too; it was unrecorded before the outage.)
    let (runs_before, recorded_before) = seen;
    println!(
        "unrecorded when the worker said so: {}",
        runs_before - recorded_before
    );
    let outage = std::time::Instant::now();
    let mut unrecorded = vec![];
    while outage.elapsed() < Duration::from_secs(5) {
        unrecorded.push((runs() - runs_before) - (recorded() - recorded_before));
        std::thread::sleep(Duration::from_millis(250));
    }
    let worst = *unrecorded.iter().max().unwrap();
    assert!(worst <= concurrency, "unrecorded outcomes: {unrecorded:?}");
    crate::common::block_on(
        admin.batch_execute("ALTER DATABASE postgres RESET default_transaction_read_only"),
    )
    .unwrap();
    let reset = std::time::Instant::now();
    let stuck = recorded();
    wait_until(
        "outcomes to be recorded again within 10 s",
        Duration::from_secs(10),
        || recorded() > stuck,
    );
    println!(
        "unrecorded at most {worst} during the outage; resumed {:?} after the reset",
        reset.elapsed()
    );
    wait_until("every delivery to drain", Duration::from_secs(120), || {
        recorded() == total as i64
    });
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    let text = stderr(&out);
    for line in [
        "outcomes cannot be recorded; no new claims and no new handlers until they are",
        "outcomes are recorded again; claiming resumes",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    let mut handled: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    handled.sort();
    let expected: Vec<String> = (0..total).map(|i| format!("e{i:05} 1")).collect();
    assert!(handled == expected, "some event ran twice or not at all");
}

/// A worker in `s` whose limit of open files is `files`, soft and hard, so that it cannot raise
/// it.
fn worker_with_files(s: &TestSchema, files: u64, args: &[&str]) -> Spawned {
    use std::os::unix::process::CommandExt;
    let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"));
    cmd.env("RELAYBUS_DATABASE_URL", database_url())
        .args(["--schema", &s.name, "run"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, files, files)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn().unwrap().into()
}

/// Hundreds of idle connections to the metrics endpoint (a misbehaving scraper, a port scan)
/// hold a bounded number of the worker's file descriptors, so its handlers still start.
#[test]
fn idle_metrics_connections_do_not_starve_the_handlers() {
    let s = TestSchema::installed("metrics_fds");
    let lines: Vec<String> = (0..100).map(|i| event(&format!("e{i:03}"))).collect();
    s.publish(
        &lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect::<Vec<_>>(),
    );
    let addr = format!("127.0.0.1:{}", crate::common::cluster::free_port());
    let w = worker_with_files(
        &s,
        256,
        &[
            "--handler",
            "h",
            "--exec",
            "cat >/dev/null; sleep 0.2",
            "--concurrency",
            "20",
            "--poll-interval",
            "1h",
            "--metrics-addr",
            &addr,
        ],
    );
    wait_until("the metrics endpoint", Duration::from_secs(20), || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    let idle: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // The worker has been waiting for a poll; a publish wakes it with the metrics clients in.
    s.publish(&[serde_json::json!({"id": "wake", "type": "t", "handlers": ["h"]})]);
    let left = format!("SELECT count(*) FROM {}", s.table("deliveries"));
    wait_until("every delivery handled", Duration::from_secs(60), || {
        s.count(&left) == 0
    });
    drop(idle);
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 101, failed attempts 0, dead 0, lease lost 0, released 0\n",
        "{}",
        stderr(&out)
    );
}

/// A handler that cannot be started for want of file descriptors is not an attempt of its
/// delivery's: the delivery is released and runs later, at attempt 1, and the worker says why.
#[test]
fn a_handler_that_cannot_be_started_costs_its_delivery_no_attempt() {
    let s = TestSchema::installed("emfile");
    let lines: Vec<serde_json::Value> = (0..60)
        .map(|i| serde_json::from_str(&event(&format!("e{i:02}"))).unwrap())
        .collect();
    s.publish(&lines);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled");
    let command = format!(
        "cat >/dev/null; echo \"$RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}; sleep 0.5",
        log.display()
    );
    let w = worker_with_files(
        &s,
        48,
        &[
            "--handler",
            "h",
            "--exec",
            &command,
            "--concurrency",
            "30",
            "--batch-size",
            "30",
            "--pool-size",
            "2",
            "--poll-interval",
            "100ms",
        ],
    );
    // Not --drain: a drain does not wait for the deliveries that were released for later.
    let left = format!("SELECT count(*) FROM {}", s.table("deliveries"));
    wait_until("every delivery handled", Duration::from_secs(120), || {
        s.count(&left) == 0
    });
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    let text = stderr(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("handlers cannot be started; their deliveries are released"),
        "{text}"
    );
    let summary = stdout(&out);
    assert!(
        summary.starts_with("handled 60, failed attempts 0, dead 0, lease lost 0, released "),
        "{summary}"
    );
    assert_ne!(
        summary,
        "handled 60, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let mut handled: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    handled.sort();
    let expected: Vec<String> = (0..60).map(|i| format!("e{i:02} 1")).collect();
    assert_eq!(handled, expected);
}

/// A worker frozen (SIGSTOP) while it holds deliveries it has claimed but not started yet (its
/// two claim streams took the same free slots, so half wait for one) stays frozen past its
/// lease; another worker takes its lanes over and drains everything. When the frozen worker
/// wakes, it starts no handler at all: the ones waiting for a slot find their lease gone
/// before they start. Across both workers' handler logs, no event of a key starts after a later
/// one of its key. Three runs, with keyed and unkeyed events.
#[test]
fn a_worker_frozen_past_its_lease_starts_nothing_stale_when_it_wakes() {
    for run in 0..3 {
        frozen_worker_run(run);
    }
}

fn frozen_worker_run(run: usize) {
    use std::fmt::Write;
    let s = TestSchema::installed(&format!("frozen_start_{run}"));
    // 40 keys of 4 events each, and 160 unkeyed events, interleaved.
    let mut lines = String::new();
    for i in 0..320 {
        let line = if i % 2 == 0 {
            let (key, n) = (i / 2 % 40, i / 80);
            serde_json::json!({"id": format!("k{key:02}-{n}"), "type": "t", "key": format!("k{key:02}"), "handlers": ["h"]})
        } else {
            serde_json::json!({"id": format!("u{i:03}"), "type": "t", "handlers": ["h"]})
        };
        writeln!(lines, "{line}").unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let log = |tag: &str| dir.path().join(format!("{tag}.log"));
    // A handler starts when it has its envelope: a process forked just as the worker froze is
    // killed at the wake-up before it has it all, when the lease can no longer be vouched for.
    // Each line has when the process started and when it had its envelope.
    let handler = "s=$(date +%s%N); cat >/dev/null; echo \"$RELAYBUS_EVENT_ID $s $(date +%s%N)\" >> \"$LOG\"; sleep 1";
    let args = [
        "--handler",
        "h",
        "--exec",
        handler,
        "--lease-duration",
        "2s",
        "--concurrency",
        "100",
        "--batch-size",
        "100",
        "--poll-interval",
        "50ms",
    ];
    let spawn = |tag: &str, drain: bool| -> Spawned {
        let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"));
        cmd.env("RELAYBUS_DATABASE_URL", &s.url)
            .env("LOG", log(tag))
            .args(["--schema", &s.name, "run"])
            .args(args)
            .args(drain.then_some("--drain"))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join(format!("{tag}.err"))).unwrap());
        cmd.spawn().unwrap().into()
    };
    let a = spawn("a", false);
    let out = s.cmd().arg("publish").write_stdin(lines).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Both streams claimed the free slots: more deliveries in flight than run.
    let in_flight = format!(
        "SELECT coalesce(sum(cardinality(in_flight)), 0) FROM {}",
        s.table("lanes")
    );
    wait_until(
        "deliveries waiting for a slot",
        Duration::from_secs(20),
        || s.count(&in_flight) > 100,
    );
    signal(&a, Signal::SIGSTOP);
    let b = spawn("b", true);
    let out = finish(b, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    let woken = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    signal(&a, Signal::SIGCONT);
    std::thread::sleep(Duration::from_secs(2));
    signal(&a, Signal::SIGTERM);
    let out = finish(a, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    // (started, fed, id) of each handler a worker ran.
    let starts = |tag: &str| -> Vec<(u128, u128, String)> {
        std::fs::read_to_string(log(tag))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[0].to_owned(),
                )
            })
            .collect()
    };
    let (a_starts, b_starts) = (starts("a"), starts("b"));
    // No process forked after the wake-up, and none fed after it: one fed before the freeze
    // may log its envelope late when the machine is busy, so a second is allowed for that
    // (the freeze lasts several).
    let slack = Duration::from_secs(1).as_nanos();
    let stale: Vec<_> = a_starts
        .iter()
        .filter(|(started, fed, _)| *started > woken || *fed > woken + slack)
        .collect();
    assert!(
        stale.is_empty(),
        "run {run}: the woken worker started {} handlers (woken at {woken}): {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
    let mut all: Vec<_> = a_starts.iter().chain(&b_starts).collect();
    all.sort();
    let mut last = std::collections::HashMap::new();
    for (_, _, id) in &all {
        let Some((key, n)) = id.split_once('-') else {
            continue;
        };
        let n: u32 = n.parse().unwrap();
        let before = last.insert(key, n).unwrap_or(0);
        assert!(n >= before, "run {run}: {id} started after {key}-{before}");
    }
    let started: std::collections::HashSet<_> = all.iter().map(|(_, _, id)| id.as_str()).collect();
    assert_eq!(started.len(), 320, "run {run}: every event started");
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0,
        "run {run}: every delivery completed"
    );
}

/// The primary crashes mid-drain and its synchronous standby is promoted (`doctor` has said it
/// is one): see `failover_under_a_running_worker`.
#[test]
fn a_worker_and_a_publisher_follow_a_promoted_standby() {
    failover_under_a_running_worker(&|primary| primary.kill());
}

/// The primary turns read-only mid-drain (`default_transaction_read_only`, its sessions
/// terminated) and the standby is promoted: the worker moves to the writable host.
#[test]
fn a_worker_moves_from_a_read_only_primary_to_the_promoted_standby() {
    failover_under_a_running_worker(&|primary| {
        let client = connect(&primary.url());
        for sql in [
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        ] {
            crate::common::block_on(client.batch_execute(sql)).unwrap();
        }
    });
}

/// A primary and its synchronous standby; a worker and the publisher are given both hosts with
/// `target_session_attrs=read-write`. Mid-drain of 300 keyed events the primary is fenced off
/// (`fence`) and the standby promoted; 100 more events are published through the same URL.
/// The worker follows by itself and never exits: every event is handled, each run of a handler
/// is an attempt the worker counted (attempts 1..n, n runs), each key's events in publish
/// order, and the first event published after the promotion is handled within
/// `connect_timeout` (2 s) and 5 s.
fn failover_under_a_running_worker(fence: &dyn Fn(&TestCluster)) {
    let primary = TestCluster::start();
    let standby = primary.standby();
    let on_primary = connect(&primary.url());
    // After the base backup, so that the promoted standby does not wait for a standby itself.
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        crate::common::block_on(on_primary.batch_execute(sql)).unwrap();
    }
    wait_until(
        "the standby to be synchronous",
        Duration::from_secs(20),
        || {
            count(
                &primary,
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
            ) == 1
        },
    );
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
        primary.port, standby.port
    );
    let relaybus = || {
        let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"));
        cmd.env("RELAYBUS_DATABASE_URL", &url);
        cmd
    };
    let events = |range: std::ops::Range<usize>| -> String {
        let lines: Vec<String> = range
            .map(|i| {
                serde_json::json!({"id": format!("e{i:03}"), "type": "t", "key": format!("k{}", i % 10), "handlers": ["h"]})
                    .to_string()
            })
            .collect();
        lines.join("\n")
    };
    run_ok(relaybus().arg("setup"), "");
    let (code, verdict, found) = replication_check(&url);
    assert_eq!((code, verdict.as_str()), (0, "ok"));
    assert!(
        found.starts_with("1 standby: walreceiver streaming sync, replay lag ")
            && found.ends_with(
                "; synchronous_commit = on; a promoted synchronous standby has every commit"
            ),
        "{found}"
    );
    assert_eq!(
        replication_check(&standby.url()),
        (
            1,
            "fail".to_owned(),
            "this server is a standby: it refuses every write relaybus makes, and doctor's \
             comparison with a scratch install"
                .to_owned()
        )
    );
    // The standby named first is passed over for a host that takes writes.
    let standby_first = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?sslmode=disable&target_session_attrs=read-write",
        standby.port, primary.port
    );
    run_ok(
        StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
            .env("RELAYBUS_DATABASE_URL", &standby_first)
            .args(["setup", "--check"]),
        "",
    );
    run_ok(relaybus().arg("publish"), &events(0..300));
    let log = primary.path().join("handled");
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let command = format!(
        "cat >/dev/null; sleep 0.05; echo \"$RELAYBUS_KEY $RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let mut w: Spawned = relaybus()
        .args(["run", "--handler", "h", "--exec", &command])
        .args(["--poll-interval", "100ms", "--lease-duration", "5s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .into();
    wait_until("100 handled", Duration::from_secs(30), || {
        lines().len() >= 100
    });
    fence(&primary);
    standby.promote();
    let promoted = std::time::Instant::now();
    run_ok(relaybus().arg("publish"), &events(300..400));
    let handled_after = || lines().iter().any(|l| l.split(' ').nth(1) >= Some("e300"));
    wait_until(
        "an event published after the promotion handled",
        Duration::from_secs(30),
        handled_after,
    );
    let resumed = promoted.elapsed();
    let distinct = || {
        let mut ids: Vec<String> = lines()
            .iter()
            .map(|l| l.split(' ').nth(1).unwrap().to_owned())
            .collect();
        ids.sort();
        ids.dedup();
        ids.len()
    };
    wait_until("all 400 handled", Duration::from_secs(60), || {
        distinct() == 400
    });
    assert!(w.try_wait().unwrap().is_none(), "the worker exited");
    signal(&w, Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    let handled = lines();
    let mut runs: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for line in &handled {
        let fields: Vec<&str> = line.split(' ').collect();
        runs.entry(fields[1])
            .or_default()
            .push(fields[2].parse().unwrap());
    }
    assert_eq!(runs.len(), 400);
    for (id, attempts) in &runs {
        let counted: Vec<u32> = (1..=attempts.len() as u32).collect();
        assert_eq!(attempts, &counted, "{id}: every run an attempt counted");
    }
    for key in 0..10 {
        let firsts: Vec<&str> = handled
            .iter()
            .filter(|l| l.starts_with(&format!("k{key} ")) && l.ends_with(" 1"))
            .map(|l| l.split(' ').nth(1).unwrap())
            .collect();
        let mut sorted = firsts.clone();
        sorted.sort();
        assert_eq!(firsts, sorted, "key k{key} in publish order");
    }
    assert!(
        resumed < Duration::from_secs(7),
        "handled {resumed:?} after the promotion"
    );
    eprintln!(
        "{} runs of 400 events; the first event published after the promotion handled {resumed:?} after it",
        handled.len()
    );
}

/// `doctor --json` at `url`: its exit code, and the verdict and findings of its replication
/// check.
fn replication_check(url: &str) -> (i32, String, String) {
    let out = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", url)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "replication")
        .unwrap_or_else(|| panic!("no replication check: {report}"));
    (
        out.status.code().unwrap(),
        check["verdict"].as_str().unwrap().to_owned(),
        check["found"].as_str().unwrap().to_owned(),
    )
}
