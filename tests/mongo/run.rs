//! Workers on MongoDB: parked followers of a running key, exactly once across processes, a
//! killed worker's deliveries, change-stream wake-ups, replay.

use std::time::Duration;

use mongodb::bson::doc;
use relaybus::store::prelude::*;
use relaybus::store::{ClaimRequest, NewEvent, StoreOptions};
use serde_json::{json, Value};

use super::{event, request};
use crate::common::drain::three_workers_drain_exactly_once;
use crate::common::mongo::TestMongo;
use crate::common::scenario::Target;
use crate::common::{finish, stderr, stdout, wait_until};

/// A deep queue behind one running delivery of a key: the first claim parks the followers it
/// reads (out of the claim index), each completion readies exactly the next one, and the key
/// runs in order.
#[test]
fn followers_of_a_running_key_are_parked_and_released_one_at_a_time() {
    let m = TestMongo::new("parking");
    let store = m.store(StoreOptions::worker(2));
    let parked = || {
        m.find("deliveries", doc! { "lane": "parked" })
            .iter()
            .map(|d| d.get_str("eventId").unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    crate::common::block_on(async {
        store.setup(false).await.unwrap();
        let events: Vec<NewEvent> = (0..30)
            .map(|i| event(&format!("e{i:02}"), Some("k")))
            .collect();
        store.publish(&events).await.unwrap();
    });
    let req = request("w", Duration::from_secs(30));
    let first = crate::common::block_on(store.claim(&req)).unwrap().0;
    assert_eq!(first[0].event_id, "e00");
    assert_eq!(first.len(), 1);
    let expected: Vec<String> = (1..30).map(|i| format!("e{i:02}")).collect();
    assert_eq!(parked(), expected);
    let head = m.find("deliveries", doc! { "eventId": "e00" });
    assert_eq!(head[0].get_i32("holdsBack"), Ok(1));
    let mut token = first[0].token.clone();
    for i in 1..30 {
        crate::common::block_on(store.complete(&[token], false)).unwrap();
        assert_eq!(parked().len(), 29 - i, "after e{:02} completed", i - 1);
        let next = crate::common::block_on(store.claim(&ClaimRequest {
            outstanding: vec![],
            ..req.clone()
        }))
        .unwrap()
        .0;
        assert_eq!(
            next.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(),
            [format!("e{i:02}")]
        );
        token = next[0].token.clone();
    }
    crate::common::block_on(store.complete(&[token], false)).unwrap();
    assert_eq!(m.find("deliveries", doc! {}).len(), 0);
}

#[test]
fn three_workers_handle_keyed_and_unkeyed_deliveries_exactly_once_in_key_order() {
    let m = TestMongo::installed("mongo_exactly_once");
    three_workers_drain_exactly_once(&|events| m.publish(events), &|args| m.worker(args), 200, 7);
    assert_eq!(m.find("deliveries", doc! {}).len(), 0);
    assert_eq!(m.find("lanes", doc! { "owner": { "$ne": null } }).len(), 0);
}

#[test]
fn a_killed_worker_s_deliveries_run_again_after_its_lease_charged_one_attempt() {
    let m = TestMongo::installed("mongo_kill9");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    let events: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("e{i:02}"), "type": "t", "handlers": ["h"]}))
        .collect();
    m.publish(&events);
    let command = format!(
        "echo \"$RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}; sleep 30",
        log.display()
    );
    let mut doomed = m.worker(&[
        "--handler",
        "h",
        "--exec",
        &command,
        "--concurrency",
        "20",
        "--lease-duration",
        "2s",
    ]);
    wait_until("20 handlers running", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 20)
    });
    doomed.kill().unwrap();
    let out = finish(doomed, Duration::from_secs(10));
    assert!(!out.status.success());
    let command = format!(
        "echo \"$RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let heir = m.worker(&[
        "--handler",
        "h",
        "--exec",
        &command,
        "--drain",
        "--poll-interval",
        "100ms",
    ]);
    let out = finish(heir, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 20, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let mut runs: Vec<&str> = text.lines().collect();
    runs.sort_unstable();
    let expected: Vec<String> = (0..20)
        .flat_map(|i| [format!("e{i:02} 1"), format!("e{i:02} 2")])
        .collect();
    assert_eq!(runs, expected);
    assert_eq!(m.find("deliveries", doc! {}).len(), 0);
}

/// The change stream wakes a worker whose poll interval is an hour. The stream's opening is a
/// wake-up of its own, which the metrics endpoint counts: after it, only a change event can
/// bring the published delivery.
#[test]
fn a_publish_wakes_an_idle_worker_through_the_change_stream() {
    let m = TestMongo::installed("mongo_wakeup");
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let addr = format!("127.0.0.1:{}", crate::common::cluster::free_port());
    let worker = m.worker(&[
        "--handler",
        "h",
        "--exec",
        &format!("cat > {}", done.display()),
        "--poll-interval",
        "1h",
        "--metrics-addr",
        &addr,
    ]);
    let wake_ups = || {
        let scrape = crate::common::block_on(async {
            match reqwest::get(format!("http://{addr}/metrics")).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            }
        });
        scrape
            .lines()
            .find_map(|l| l.strip_prefix("relaybus_wake_ups_total "))
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    wait_until("the change stream to open", Duration::from_secs(20), || {
        wake_ups() >= 1
    });
    // The opening's wake-up was a claim that found nothing.
    std::thread::sleep(Duration::from_millis(300));
    m.publish(&[json!({"id": "wake", "type": "t", "handlers": ["h"]})]);
    wait_until(
        "the woken worker to handle the event",
        Duration::from_secs(20),
        || done.exists(),
    );
    assert!(wake_ups() >= 2);
    crate::common::signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    // The change event itself woke the worker: the stream never failed (a stream that fails
    // on each event and wakes the worker by opening again looks the same from outside).
    assert!(
        !stderr(&out).contains("wake-up connection lost"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_sql_handler_is_refused_on_mongodb_before_anything_is_claimed() {
    let m = TestMongo::installed("mongo_sql_handler");
    m.publish(&[json!({"id": "e1", "type": "t", "handlers": ["h"]})]);
    let out = m
        .cmd()
        .args(["run", "--handler", "h", "--sql", "SELECT 1", "--drain"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("SQL handlers run only on a PostgreSQL store, in the transaction that completes the delivery; on MongoDB use an --exec or --webhook handler"),
        "{}",
        stderr(&out)
    );
    let pending = m.find("deliveries", doc! { "status": "pending", "attempts": 0 });
    assert_eq!(pending.len(), 1);
}

/// As on PostgreSQL (`replay::again_makes_a_completed_row_kept_from_0_1_the_new_delivery`).
#[test]
fn again_makes_a_completed_delivery_kept_from_0_1_the_new_delivery() {
    let m = TestMongo::installed("mongo_replay_kept_0_1");
    m.publish(&[json!({"id": "e1", "type": "t", "key": "k1", "handlers": ["billing"]})]);
    let kept = doc! { "$set": { "status": "completed", "attempts": 2, "completedAt": mongodb::bson::DateTime::now() } };
    crate::common::block_on(async {
        m.collection("deliveries")
            .update_one(doc! { "eventId": "e1" }, kept)
            .await
    })
    .unwrap();
    let replay = |again: &[&str]| -> Value {
        let out = m
            .cmd()
            .args([
                "--json",
                "events",
                "replay",
                "--handler",
                "billing",
                "--yes",
            ])
            .args(again)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert_eq!(replay(&[])["skipped"]["delivered"], 1);
    assert_eq!(replay(&["--again"])["replayed"], 1);
    let left = m.find("deliveries", doc! { "eventId": "e1" });
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        (
            left[0].get_str("status"),
            left[0].get_i32("attempts"),
            left[0].get_i64("sequence")
        ),
        (Ok("pending"), Ok(0), Ok(2))
    );
}
