//! MongoDB under faults: a broken lane document, a dead worker's open transaction, a server
//! killed mid-drain, a killed worker beside a busy one.

use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use relaybus::store::lane::lane_of;
use relaybus::store::prelude::*;
use relaybus::store::{ClaimRequest, StoreOptions};
use serde_json::{json, Value};

use crate::common::mongo::{mongo_url, OwnServer, TestMongo};
use crate::common::scenario::Target;
use crate::common::{claim_request, finish, relaybus, stderr, stdout, wait_until, Spawned};

/// A lane document that lost its epoch (a hand edit, a partial restore) cannot be fenced on:
/// workers leave that lane alone, say so once, and drain every other lane; `setup` repairs it,
/// and its deliveries then run.
#[test]
fn a_lane_without_an_epoch_stops_only_that_lane_until_setup_repairs_it() {
    let m = TestMongo::installed("mongo_unsound_lane");
    let events: Vec<Value> = (0..40)
        .map(|i| json!({"id": format!("e{i:02}"), "type": "t", "handlers": ["h"]}))
        .collect();
    m.publish(&events);
    let broken = i32::from(lane_of(None, "e00"));
    let lanes = m.collection("lanes");
    crate::common::block_on(async {
        lanes
            .update_one(doc! { "_id": broken }, doc! { "$unset": { "epoch": "" } })
            .await
    })
    .unwrap();
    let in_broken = events
        .iter()
        .filter(|e| i32::from(lane_of(None, e["id"].as_str().unwrap())) == broken)
        .count();
    let w = m.worker(&["--handler", "h", "--noop", "--poll-interval", "50ms"]);
    let left = || m.find("deliveries", doc! {}).len();
    wait_until("every other lane drained", Duration::from_secs(30), || {
        left() == in_broken
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(left(), in_broken, "the unsound lane's deliveries wait");
    m.cmd().arg("setup").assert().success();
    wait_until("the repaired lane drained", Duration::from_secs(30), || {
        left() == 0
    });
    crate::common::signal(&w, nix::sys::signal::Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 40, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let logged = stderr(&out);
    assert_eq!(
        logged.matches("lane documents break the rules").count(),
        1,
        "{logged}"
    );
    assert!(logged.contains(&format!("lanes=[{broken}]")), "{logged}");
    assert!(
        logged.contains("lane documents repaired; claimed again"),
        "{logged}"
    );
    assert!(!logged.contains("claim failed"), "{logged}");
}

/// A worker died inside a transaction that wrote a delivery of its lane: the server keeps the
/// transaction (up to a minute), so the takeover cannot charge the delivery. The taking worker
/// says so once, at warn, naming the lane; `lanes` and `doctor` show the delivery waiting; once
/// the transaction is gone it is charged and runs, at its second attempt.
#[test]
fn a_takeover_waiting_for_a_dead_transaction_says_so() {
    let m = TestMongo::installed("mongo_dead_transaction");
    m.publish(&[json!({"id": "e1", "type": "t", "handlers": ["h"]})]);
    let dead = m.store(StoreOptions::worker(1));
    let short = ClaimRequest {
        lease: Duration::from_millis(300),
        ..claim_request("dead", &["h"])
    };
    let claimed = crate::common::block_on(dead.claim(&short)).unwrap().0;
    let lane = claimed[0].token.lane;
    // The dead worker's transaction, left open: it wrote the delivery.
    let client = crate::common::block_on(mongodb::Client::with_uri_str(mongo_url())).unwrap();
    let mut session = crate::common::block_on(async { client.start_session().await }).unwrap();
    crate::common::block_on(async {
        session.start_transaction().await.unwrap();
        client
            .database(&m.name)
            .collection::<Document>("relaybus_deliveries")
            .update_one(
                doc! { "eventId": "e1" },
                doc! { "$set": { "touched": true } },
            )
            .session(&mut session)
            .await
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(400));
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let heir = m.worker(&[
        "--handler",
        "h",
        "--exec",
        &format!("echo $RELAYBUS_ATTEMPT > {}", done.display()),
        "--poll-interval",
        "100ms",
    ]);
    let lanes = || -> Value {
        let out = m.cmd().args(["lanes", "--json"]).output().unwrap();
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    wait_until("the takeover to wait", Duration::from_secs(20), || {
        lanes()["summary"]["uncharged"] == 1
    });
    let listed = lanes();
    let row = listed["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lane"] == lane)
        .unwrap()
        .clone();
    assert_eq!(
        (row["uncharged"].clone(), row["in_flight"].clone()),
        (json!(1), json!(0))
    );
    let doctor = m.cmd().arg("doctor").output().unwrap();
    assert_eq!(doctor.status.code(), Some(3), "{}", stdout(&doctor));
    assert!(
        stdout(&doctor).contains(&format!("lane (deliveries) {lane} (1)")),
        "{}",
        stdout(&doctor)
    );
    crate::common::block_on(async { session.abort_transaction().await }).unwrap();
    wait_until("the delivery to run", Duration::from_secs(30), || {
        done.exists()
    });
    crate::common::signal(&heir, nix::sys::signal::Signal::SIGTERM);
    let out = finish(heir, Duration::from_secs(30));
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "2\n");
    let logged = stderr(&out);
    assert_eq!(
        logged
            .matches("deliveries are still written by another transaction")
            .count(),
        1,
        "{logged}"
    );
    assert!(
        logged.contains("WARN a taken-over lane's deliveries"),
        "{logged}"
    );
    assert!(logged.contains(&format!("lane={lane}")), "{logged}");
    assert!(
        logged.contains("the taken-over lane's deliveries are charged and run again"),
        "{logged}"
    );
}

/// The server is killed mid-drain and started again on the same data: the worker goes on by
/// itself, every event is handled, and an event that runs again does so at a higher attempt,
/// never as a first attempt twice. The server syncs each commit: one that acknowledges what it
/// has not written (SecantusDB's default, a mongod without journaling) loses claims in a
/// crash, and their deliveries run again as first attempts (14 of 1,500 in one of three such
/// runs, none in four with the sync).
#[test]
fn a_server_killed_mid_drain_redelivers_nothing_as_a_first_attempt() {
    let server = OwnServer::start(&["--sync-on-commit"]);
    let url = server.url("");
    let db = crate::common::unique("mongo_server_restart");
    let cmd = || {
        let mut cmd = relaybus();
        cmd.env("RELAYBUS_DATABASE_URL", &url)
            .args(["--schema", &db]);
        cmd
    };
    cmd().arg("setup").assert().success();
    let events: Vec<String> = (0..300)
        .map(|i| json!({"id": format!("e{i:03}"), "type": "t", "handlers": ["h"]}).to_string())
        .collect();
    let out = cmd()
        .arg("publish")
        .write_stdin(events.join("\n"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    let handler = format!(
        "cat >/dev/null; echo $RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT >> {}",
        log.display()
    );
    let worker: Spawned = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", &url)
        .args(["--schema", &db, "run", "--handler", "h", "--exec", &handler])
        .args([
            "--concurrency",
            "20",
            "--batch-size",
            "20",
            "--lease-duration",
            "5s",
        ])
        .args(["--poll-interval", "100ms", "--drain"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .into();
    let handled = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    wait_until("a third handled", Duration::from_secs(60), || {
        handled() >= 100
    });
    let _server = server.restart(&["--sync-on-commit"]);
    let out = finish(worker, Duration::from_secs(120));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let mut runs: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for line in text.lines() {
        let (id, attempt) = line.split_once(' ').unwrap();
        runs.entry(id).or_default().push(attempt);
    }
    assert_eq!(runs.len(), 300, "every event handled");
    let twice: Vec<_> = runs
        .iter()
        .filter(|(_, attempts)| {
            let mut sorted = attempts.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            sorted.len() != attempts.len()
        })
        .collect();
    assert!(twice.is_empty(), "runs at the same attempt: {twice:?}");
}

/// On MongoDB, on a server of its own: 10,000 events published beside the other tests' load
/// made the shared test server fail a publish with an internal error.
#[test]
fn a_killed_worker_s_deliveries_run_beside_a_busy_survivor_within_the_lease() {
    let server = OwnServer::start(&[]);
    let url = server.url("");
    let db = crate::common::unique("mongo_busy_survivor");
    let cmd = |args: &[&str]| {
        let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"));
        cmd.env("RELAYBUS_DATABASE_URL", &url)
            .args(["--schema", &db])
            .args(args);
        cmd
    };
    assert!(cmd(&["setup"]).output().unwrap().status.success());
    crate::common::drain::a_killed_worker_s_deliveries_run_beside_a_busy_survivor_within_the_lease(
        &|events| {
            let lines: Vec<String> = events.iter().map(Value::to_string).collect();
            let mut child = cmd(&["publish"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(child.stdin.as_mut().unwrap(), lines.join("\n").as_bytes())
                .unwrap();
            drop(child.stdin.take());
            let out = finish(child, Duration::from_secs(60));
            assert!(out.status.success(), "{}", stderr(&out));
        },
        &|args| {
            cmd(&[&["run"][..], args].concat())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
                .into()
        },
        10_000,
    );
}
