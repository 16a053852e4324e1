//! relaybus run: real worker processes, real shell commands, a real HTTP server.

use std::process::Command as StdCommand;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::common::cluster::TestCluster;
use crate::common::drain::three_workers_drain_exactly_once;
use crate::common::http::serve;
use crate::common::scenario::Target;
use crate::common::{
    finish, reads_of, signal, spawn_worker, stderr, stdout, wait_in_flight, wait_until, Spawned,
    TestSchema,
};

/// `count` unkeyed events for handler `h` whose ids fall in lanes 0 to `lanes` - 1.
fn events_in_lanes(lanes: i16, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("e{i}"))
        .filter(|id| relaybus::store::lane::lane_of(None, id) < lanes)
        .take(count)
        .map(|id| event(&id, None, &["h"], serde_json::json!({})))
        .collect()
}

fn publish(s: &TestSchema, lines: &[String]) {
    let out = s
        .cmd()
        .arg("publish")
        .write_stdin(lines.join("\n"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

fn event(id: &str, key: Option<&str>, handlers: &[&str], payload: serde_json::Value) -> String {
    serde_json::json!({"id": id, "type": "test.event", "key": key, "handlers": handlers, "payload": payload})
        .to_string()
}

/// Table counters of this test's schema, once the server has them all.
fn table_stats(s: &TestSchema, table: &str) -> (i64, i64, i64, i64) {
    s.exec("SELECT pg_stat_clear_snapshot()");
    let r = &s.query(&format!(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables \
          WHERE schemaname = '{}' AND relname = 'relaybus_{table}'",
        s.name
    ))[0];
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[test]
fn three_workers_handle_3000_deliveries_exactly_once_in_key_order() {
    let s = TestSchema::installed("run_exactly_once");
    three_workers_drain_exactly_once(
        &|events| s.publish(events),
        &|args| spawn_worker(&s, args),
        1500,
        20,
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE lease_owner IS NOT NULL",
            s.table("lanes")
        )),
        0
    );
}

/// On a server of its own: a long transaction anywhere on a server (another test's, in another
/// database) holds back what the server may prune, and lane pages then fill with versions.
#[test]
fn the_happy_path_writes_no_delivery_row_and_hot_lane_updates() {
    let cluster = TestCluster::start();
    let s = TestSchema::in_database("run_counters", &cluster.url());
    s.cmd().arg("setup").assert().success();
    let lines: Vec<String> = (0..2000)
        .map(|i| {
            event(
                &format!("e{i}"),
                (i % 2 == 0).then_some("k"),
                &["h"],
                serde_json::json!({}),
            )
        })
        .collect();
    publish(&s, &lines);
    s.cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "true",
            "--drain",
            "--concurrency",
            "50",
            "--batch-size",
            "50",
        ])
        .timeout(Duration::from_secs(60))
        .assert()
        .success()
        .stdout("handled 2000, failed attempts 0, dead 0, lease lost 0, released 0\n");
    let mut deliveries = (0, 0, 0, 0);
    wait_until(
        "the server's table statistics",
        Duration::from_secs(10),
        || {
            deliveries = table_stats(&s, "deliveries");
            deliveries.3 == 2000
        },
    );
    assert_eq!(deliveries, (2000, 0, 0, 2000));
    let (_, upd, hot, del) = table_stats(&s, "lanes");
    assert!(upd > 0);
    assert_eq!(del, 0);
    // Every lane update is eligible for HOT (no indexed column changes); each one is HOT when
    // its new version finds room on the lane's page, which the install makes sure of by giving
    // each lane a page of its own. With 60 lanes to a page, 2-3% of these updates moved a row
    // instead.
    assert_eq!(hot, upd, "{hot} of {upd} lane updates were HOT");
}

/// The regression budget of a tuned drain (two claim streams) over four busy lanes: no
/// delivery row written but its insert and delete, every lane update HOT, no lane row ever
/// written to TOAST (a lane keeps at most 30 ids in flight, so its row stays inline and its
/// page holds several of its versions: with 200 a lane, 58 rows went to TOAST here; with 40 and
/// two lanes to a page, one update in 400 was not HOT in a third of the runs), and lane updates
/// within 4,000 / 30 for the picks plus what the completions' timing adds (192-205 measured,
/// the install's own aside). The test counts the worker's own writes, so its cluster runs
/// without autovacuum: an analyze of the deliveries in the middle of the drain holds a snapshot
/// that keeps the lanes' old versions on their pages for as long as it runs. With autovacuum on
/// and two lanes to a page, one update in 449 went to another page in one run of the suite. A
/// claim reads only the lanes the claim before reported held: the lanes are scanned by the
/// first claim of each stream, which finds its lanes by owner, and by the hand-back at the end
/// (with a lease of an hour, neither a renewal nor a census, every tenth of the lease, falls
/// inside the run). A lane write (the drain's only HOT updates) logs its whole in-flight list: 1,031-1,033
/// bytes a write, 1,261-1,267 while delivery ids were 36-character UUIDs.
#[test]
fn a_tuned_drain_keeps_lane_rows_inline_and_within_its_write_budget() {
    let cluster = TestCluster::start_with("-c autovacuum=off");
    let s = TestSchema::in_database("run_tuned_counters", &cluster.url());
    s.cmd().arg("setup").assert().success();
    // 1,000 events in each of lanes 0 to 3, two of each stream's, so that lanes could hold far
    // more than 30 in flight.
    publish(&s, &events_in_lanes(4, 4000));
    let lane_scans = || reads_of(&s, "lanes").0;
    wait_until(
        "the install's scans of the lanes",
        Duration::from_secs(10),
        || lane_scans() > 0,
    );
    let scans = lane_scans();
    // The install's own updates of the lanes (two per lane) are counted by now too.
    let (_, install_updates, install_hot, _) = table_stats(&s, "lanes");
    s.exec("CREATE EXTENSION pg_walinspect");
    let flushed = || -> String { s.query("SELECT pg_current_wal_flush_lsn()::text")[0].get(0) };
    let start = flushed();
    s.cmd()
        .args(["run", "--handler", "h", "--noop", "--drain"])
        .args(["--concurrency", "200", "--batch-size", "200"])
        .args(["--lease-duration", "1h"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success()
        .stdout("handled 4000, failed attempts 0, dead 0, lease lost 0, released 0\n");
    let lane_write = s.count(&format!(
        "SELECT (sum(record_length - fpi_length) / count(*))::int8 \
           FROM pg_get_wal_records_info('{start}', '{}') WHERE record_type = 'HOT_UPDATE'",
        flushed()
    ));
    assert!(lane_write <= 1100, "{lane_write} WAL bytes per lane write");
    let mut deliveries = (0, 0, 0, 0);
    wait_until(
        "the server's table statistics",
        Duration::from_secs(10),
        || {
            deliveries = table_stats(&s, "deliveries");
            deliveries.3 == 4000
        },
    );
    assert_eq!(deliveries, (4000, 0, 0, 4000));
    let scanned = lane_scans() - scans;
    assert_eq!(scanned, 3, "sequential scans of the lanes");
    let (_, upd, hot, _) = table_stats(&s, "lanes");
    let (upd, hot) = (upd - install_updates, hot - install_hot);
    assert_eq!(hot, upd, "{hot} of {upd} lane updates were HOT");
    assert!(
        (134..=250).contains(&upd),
        "{upd} lane updates for 4,000 deliveries (the install's {install_updates} aside)"
    );
    let toasted = s.count(&format!(
        "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_all_tables \
          WHERE relid = (SELECT reltoastrelid FROM pg_class WHERE oid = '{}'::regclass)",
        s.table("lanes")
    ));
    assert_eq!(toasted, 0, "lane rows written to TOAST");
}

/// The claim budget of a tuned drain: each of the two streams claims up to the batch size, not
/// half the slots, since neither reserves slots for its claim while it runs (a delivery that
/// finds its slot taken waits for one). With the slots reserved, a claim took 100 at most and
/// this drain took 131 claims in two runs; 68-75 in three runs without.
#[test]
fn a_tuned_drain_claims_up_to_the_batch_size_in_each_stream() {
    let cluster = TestCluster::start_with("-c shared_preload_libraries=pg_stat_statements");
    let s = TestSchema::in_database("run_tuned_claims", &cluster.url());
    s.cmd().arg("setup").assert().success();
    let lines: Vec<String> = (0..8000)
        .map(|i| event(&format!("e{i}"), None, &["h"], serde_json::json!({})))
        .collect();
    publish(&s, &lines);
    s.exec("CREATE EXTENSION pg_stat_statements");
    s.exec("SELECT pg_stat_statements_reset()");
    s.cmd()
        .args(["run", "--handler", "h", "--noop", "--drain"])
        .args(["--concurrency", "200", "--batch-size", "200"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success()
        .stdout("handled 8000, failed attempts 0, dead 0, lease lost 0, released 0\n");
    let claims =
        s.query("SELECT calls, rows FROM pg_stat_statements WHERE query LIKE '-- Claim:%'");
    let (calls, rows): (i64, i64) = (claims[0].get(0), claims[0].get(1));
    assert!(rows >= 8000, "{rows} rows from the claims");
    assert!(calls <= 100, "{calls} claims for 8,000 deliveries");
}

/// The two streams' first claims both see all 100 slots free and take 100 each: the first
/// claim back starts its deliveries, the other's wait for slots. Stopped then, the worker lets
/// the running ones finish and hands the waiting ones back unstarted, without an attempt.
#[test]
fn deliveries_waiting_for_a_slot_are_handed_back_unstarted_at_stop() {
    let s = TestSchema::installed("run_waiting_released");
    // 50 events in each of lanes 0 to 7: four lanes of each stream, room for 120 a stream.
    publish(&s, &events_in_lanes(8, 400));
    let started = tempfile::tempdir().unwrap();
    let handler = format!(
        "touch {}/$RELAYBUS_DELIVERY_ID; sleep 5",
        started.path().display()
    );
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &handler,
            "--concurrency",
            "100",
            "--batch-size",
            "100",
        ],
    );
    let count = || std::fs::read_dir(started.path()).unwrap().count();
    wait_until("100 handlers to start", Duration::from_secs(20), || {
        count() == 100
    });
    // The other claim may come back after the first one's handlers have started.
    wait_in_flight(&s, 200);
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(count(), 100, "handlers started");
    assert_eq!(
        stdout(&out),
        "handled 100, failed attempts 0, dead 0, lease lost 0, released 100\n"
    );
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FILTER (WHERE attempts = 0 AND status = 'pending') FROM {}",
            s.table("deliveries")
        )),
        300
    );
}

/// Without a backlog a stream claims at once, though a running handler holds one of its slots:
/// waiting for a full claim's free slots would hold each event for the linger (with a
/// completion window of 1 s, two seconds). The slow handler runs until the second event's
/// handler has run.
#[test]
fn a_running_handler_does_not_hold_back_the_next_claim_at_light_load() {
    let s = TestSchema::installed("run_light_load");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!(
        "touch {d}/$RELAYBUS_EVENT_ID; [ $RELAYBUS_EVENT_ID = fast ] && exit 0; \
         for i in $(seq 100); do [ -e {d}/fast ] && exit 0; sleep 0.1; done; exit 1"
    );
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &handler,
            "--concurrency",
            "200",
            "--batch-size",
            "200",
            "--completion-window",
            "1s",
        ],
    );
    publish(&s, &[event("slow", None, &["h"], serde_json::json!({}))]);
    wait_until("the slow handler to start", Duration::from_secs(20), || {
        dir.path().join("slow").exists()
    });
    publish(&s, &[event("fast", None, &["h"], serde_json::json!({}))]);
    let published = std::time::Instant::now();
    wait_until("the fast handler to run", Duration::from_secs(20), || {
        dir.path().join("fast").exists()
    });
    let waited = published.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "the second event waited {waited:?} for a claim"
    );
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 2, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}

/// Zero retry delay makes every failure race the next claim of its lane: a claim whose snapshot
/// predates the failure must not pick the delivery again (that showed as "lease lost" and a
/// second run of the same attempt).
#[test]
fn failures_are_retried_then_buried_with_the_stderr_tail() {
    let s = TestSchema::installed("run_retries");
    let lines: Vec<String> = (0..20)
        .map(|i| event(&format!("e{i:02}"), None, &["h"], serde_json::json!({})))
        .collect();
    publish(&s, &lines);
    s.cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "cat >/dev/null; echo \"boom $RELAYBUS_ATTEMPT\" >&2; exit 3",
            "--max-attempts",
            "3",
            "--retry-delay",
            "0s",
            "--drain",
            "--poll-interval",
            "5ms",
            "--concurrency",
            "20",
            "--batch-size",
            "20",
        ])
        .timeout(Duration::from_secs(60))
        .assert()
        .success()
        .stdout("handled 0, failed attempts 40, dead 20, lease lost 0, released 0\n");
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, claims, last_error, count(*) FROM {} GROUP BY 1, 2, 3, 4",
            s.table("deliveries")
        )),
        ["dead|3|3|exit 3: boom 3|20"]
    );
}

#[test]
fn exit_65_buries_at_once_and_the_envelope_is_on_stdin() {
    let s = TestSchema::installed("run_exit65");
    publish(
        &s,
        &[event(
            "e1",
            Some("k1"),
            &["h"],
            serde_json::json!({"a": [1, 2]}),
        )],
    );
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    let cmd = format!(
        "cat > {0}.json; env | grep ^RELAYBUS_ | grep -v ^RELAYBUS_TEST_ | sort > {0}; exit 65",
        env_file.display()
    );
    s.cmd()
        .args(["run", "--handler", "h", "--exec", &cmd, "--drain"])
        .timeout(Duration::from_secs(30))
        .assert()
        .success()
        .stdout("handled 0, failed attempts 0, dead 1, lease lost 0, released 0\n");
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, last_error FROM {}",
            s.table("deliveries")
        )),
        ["dead|1|exit 65"]
    );
    let delivery_id: String =
        s.query(&format!("SELECT id FROM {}", s.table("deliveries")))[0].get(0);
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert_eq!(
        env,
        format!(
            "RELAYBUS_ATTEMPT=1\nRELAYBUS_DELIVERY_ID={delivery_id}\nRELAYBUS_EVENT_ID=e1\nRELAYBUS_EVENT_TYPE=test.event\nRELAYBUS_HANDLER=h\nRELAYBUS_KEY=k1\n"
        )
    );
    let envelope: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("env.json")).unwrap())
            .unwrap();
    let created_at = envelope["createdAt"].as_str().unwrap().to_owned();
    assert_eq!(
        envelope,
        serde_json::json!({
            "id": "e1", "type": "test.event", "key": "k1", "payload": {"a": [1, 2]}, "headers": {},
            "createdAt": created_at, "handler": "h", "deliveryId": delivery_id, "attempt": 1
        })
    );
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let s = TestSchema::installed("run_timeout");
    publish(&s, &[event("e1", None, &["h"], serde_json::json!({}))]);
    let marker = format!("{}.{}", 300 + std::process::id() % 100, std::process::id());
    let cmd = format!("(sleep {marker} &); sleep {marker}");
    s.cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            &cmd,
            "--timeout",
            "300ms",
            "--max-attempts",
            "1",
            "--drain",
        ])
        .timeout(Duration::from_secs(30))
        .assert()
        .success()
        .stdout("handled 0, failed attempts 0, dead 1, lease lost 0, released 0\n");
    assert_eq!(
        s.rows(&format!(
            "SELECT status, last_error FROM {}",
            s.table("deliveries")
        )),
        ["dead|timed out after 300ms; the process group was killed"]
    );
    let survivors = StdCommand::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .unwrap();
    assert_eq!(stdout(&survivors), "", "a grandchild survived the timeout");
}

fn sign(secret_b64: &str, id: &str, ts: &str, body: &str) -> String {
    let key = STANDARD.decode(secret_b64).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[test]
fn webhooks_are_signed_and_2xx_completes() {
    let s = TestSchema::installed("run_webhook_ok");
    publish(
        &s,
        &[
            event("e1", None, &["hook"], serde_json::json!({"x": 1})),
            event("e2", None, &["hook"], serde_json::json!({"x": 2})),
        ],
    );
    let server = serve(vec![(204, "", "")]);
    let secret = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    s.cmd()
        .env("RELAYBUS_WEBHOOK_SECRET", format!("whsec_{secret}"))
        .args([
            "run",
            "--handler",
            "hook",
            "--webhook",
            &server.url,
            "--drain",
            "--completion-history",
        ])
        .timeout(Duration::from_secs(30))
        .assert()
        .success()
        .stdout("handled 2, failed attempts 0, dead 0, lease lost 0, released 0\n");
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.path, "/hook");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let id = r.header("webhook-id").unwrap();
        let ts = r.header("webhook-timestamp").unwrap();
        assert_eq!(
            r.header("webhook-signature").unwrap(),
            sign(secret, id, ts, &r.body)
        );
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["deliveryId"], id);
        assert_eq!(body["handler"], "hook");
        assert_eq!(body["attempt"], 1);
    }
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler, attempts FROM {} ORDER BY event_id",
            s.table("completions")
        )),
        ["e1|hook|1", "e2|hook|1"]
    );
}

#[test]
fn webhook_410_buries_and_retry_after_is_honoured() {
    let s = TestSchema::installed("run_webhook_fail");
    publish(&s, &[event("gone", None, &["a"], serde_json::json!({}))]);
    let gone = serve(vec![(410, "", "gone for good")]);
    s.cmd()
        .args(["run", "--handler", "a", "--webhook", &gone.url, "--drain"])
        .timeout(Duration::from_secs(30))
        .assert()
        .success()
        .stdout("handled 0, failed attempts 0, dead 1, lease lost 0, released 0\n");
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, last_error FROM {}",
            s.table("deliveries")
        )),
        ["dead|1|HTTP 410: gone for good"]
    );

    publish(&s, &[event("later", None, &["b"], serde_json::json!({}))]);
    let busy = serve(vec![(503, "Retry-After: 120\r\n", "busy")]);
    s.cmd()
        .args(["run", "--handler", "b", "--webhook", &busy.url, "--drain"])
        .timeout(Duration::from_secs(30))
        .assert()
        .success()
        .stdout("handled 0, failed attempts 1, dead 0, lease lost 0, released 0; 1 scheduled for a later attempt, not drained\n");
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, last_error, \
                    round(extract(epoch FROM available_at - updated_at)) FROM {} WHERE handler = 'b'",
            s.table("deliveries")
        )),
        ["pending|1|HTTP 503: busy|120"]
    );
}

#[test]
fn graceful_shutdown_releases_without_charging_and_hands_lanes_back() {
    let s = TestSchema::installed("run_graceful");
    let lines: Vec<String> = (0..4)
        .map(|i| event(&format!("e{i}"), None, &["h"], serde_json::json!({})))
        .collect();
    publish(&s, &lines);
    let marker = format!("{}.{}", 100 + std::process::id() % 100, std::process::id());
    let slow = format!("cat >/dev/null; exec sleep {marker}");
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &slow,
            "--lease-duration",
            "1h",
            "--shutdown-grace",
            "200ms",
            "--poll-interval",
            "50ms",
        ],
    );
    wait_in_flight(&s, 4);
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 0, failed attempts 0, dead 0, lease lost 0, released 4\n"
    );
    let survivors = StdCommand::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .unwrap();
    assert_eq!(
        stdout(&survivors),
        "",
        "aborted handlers must not outlive the worker"
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT count(*), count(lease_owner), sum(cardinality(in_flight)) FROM {}",
            s.table("lanes")
        )),
        ["256|0|0"]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, claims, count(*) FROM {} GROUP BY 1, 2, 3",
            s.table("deliveries")
        )),
        ["pending|0|1|4"]
    );
    // The lease was an hour; a second worker gets the work at once.
    s.cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "true",
            "--drain",
            "--lease-duration",
            "1h",
        ])
        .timeout(Duration::from_secs(20))
        .assert()
        .success()
        .stdout("handled 4, failed attempts 0, dead 0, lease lost 0, released 0\n");
}

#[test]
fn a_publish_wakes_an_idle_worker_long_before_its_poll_interval() {
    let s = TestSchema::installed("run_wakeup");
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &format!("cat > {}", done.display()),
            "--poll-interval",
            "1h",
        ],
    );
    // The first claim finds nothing; from then on only a wake-up can bring the event.
    wait_until("the worker's listener", Duration::from_secs(20), || {
        s.count("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'") > 0
    });
    std::thread::sleep(Duration::from_millis(200));
    publish(&s, &[event("wake", None, &["h"], serde_json::json!({}))]);
    wait_until(
        "the woken worker to handle the event",
        Duration::from_secs(20),
        || done.exists(),
    );
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}

/// A second signal aborts what runs and exits with 128 + its number: 143 after SIGTERM, 130
/// after SIGINT; the aborted delivery is released, not charged.
#[test]
fn a_second_signal_exits_with_128_plus_its_number() {
    for (second, code) in [
        (nix::sys::signal::Signal::SIGTERM, 143),
        (nix::sys::signal::Signal::SIGINT, 130),
    ] {
        let s = TestSchema::installed(&format!("run_second_{code}"));
        publish(&s, &[event("slow", None, &["h"], serde_json::json!({}))]);
        let worker = spawn_worker(
            &s,
            &[
                "--handler",
                "h",
                "--exec",
                "sleep 30",
                "--poll-interval",
                "50ms",
            ],
        );
        wait_in_flight(&s, 1);
        signal(&worker, nix::sys::signal::Signal::SIGTERM);
        std::thread::sleep(Duration::from_millis(200));
        signal(&worker, second);
        let out = finish(worker, Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "handled 0, failed attempts 0, dead 0, lease lost 0, released 1\n"
        );
    }
}

/// JSON log lines carry numbers as numbers; RELAYBUS_LOG filters by level.
#[test]
fn json_logs_keep_numbers_and_relaybus_log_filters_them() {
    let s = TestSchema::installed("run_json_logs");
    publish(&s, &[event("e1", None, &["h"], serde_json::json!({}))]);
    let out = s
        .cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "exit 3",
            "--max-attempts",
            "1",
            "--drain",
            "--log-format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let messages: Vec<&str> = lines
        .iter()
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "worker started",
            "delivery buried (dead letter)",
            "worker stopped"
        ]
    );
    assert_eq!(
        (
            &lines[1]["level"],
            &lines[1]["attempt"],
            &lines[1]["error"],
            &lines[0]["concurrency"]
        ),
        (
            &serde_json::json!("ERROR"),
            &serde_json::json!(1),
            &serde_json::json!("exit 3"),
            &serde_json::json!(10)
        )
    );
    publish(&s, &[event("e2", None, &["h"], serde_json::json!({}))]);
    let out = s
        .cmd()
        .env("RELAYBUS_LOG", "error")
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "exit 3",
            "--max-attempts",
            "1",
            "--drain",
        ])
        .output()
        .unwrap();
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("ERROR delivery buried (dead letter)"),
        "{text}"
    );
}

/// On PostgreSQL: see `a_killed_worker_s_deliveries_run_beside_a_busy_survivor_within_the_lease`.
#[test]
fn a_killed_worker_s_deliveries_run_beside_a_busy_survivor_within_the_lease() {
    let s = TestSchema::installed("run_busy_survivor");
    crate::common::drain::a_killed_worker_s_deliveries_run_beside_a_busy_survivor_within_the_lease(
        &|events| s.publish(events),
        &|args| spawn_worker(&s, args),
        10_000,
    );
}

/// A schema name of 48 or more characters made the NOTIFY channel longer than the server
/// accepts; the failure was swallowed and idle workers waited for their poll. A worker that
/// polls once an hour must still be woken at once.
#[test]
fn wake_ups_reach_workers_of_a_schema_with_a_long_name() {
    let s = TestSchema::installed("wakeup_with_a_schema_name_long_enough_to_pass_the_limit");
    assert_eq!(s.name.len(), 63);
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let app = format!("wake-{}", std::process::id());
    let worker = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
        .env("PGAPPNAME", &app)
        .args([
            "--schema",
            &s.name,
            "run",
            "--handler",
            "h",
            "--poll-interval",
            "1h",
        ])
        .args(["--exec", &format!("cat > {}", done.display())])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(Spawned::from)
        .unwrap();
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' AND query LIKE 'LISTEN %'"
    );
    wait_until("the worker's listener", Duration::from_secs(20), || {
        s.count(&listening) > 0
    });
    // The first claim found nothing; from here only a wake-up brings the event within the hour.
    std::thread::sleep(Duration::from_millis(300));
    s.publish_ids(&["wake"], "h");
    wait_until(
        "the woken worker to handle the event",
        Duration::from_secs(20),
        || done.exists(),
    );
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}
