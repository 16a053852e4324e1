//! A rolling deploy from 0.1 to 0.2: `upgrade --online` leaves the store expanded, so that 0.1
//! and 0.2 publishers both write to it while the application rolls; `upgrade --contract` ends
//! the expansion once no 0.1 publisher is left, and the store is then a fresh install's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relaybus::store::prelude::*;
use relaybus::store::{EventLimits, NewEvent, StoreOptions};

use crate::common::scenario::Target;
use crate::common::{block_on, connect, open_store, stderr, stdout, TestSchema};

/// Publishes as 0.1 did, one event with one delivery per transaction, 0.1's columns only: the
/// key's next sequence reserved in `key_sequences` (a row lock until commit), then the event and
/// its delivery. Every third event is unkeyed. Returns the ids published, in order, and every
/// statement that failed.
fn publish_as_0_1(
    s: &TestSchema,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, Vec<String>)> {
    let (events, deliveries, sequences) = (
        s.table("events"),
        s.table("deliveries"),
        s.table("key_sequences"),
    );
    std::thread::spawn(move || {
        let client = connect();
        let (mut published, mut failed) = (vec![], vec![]);
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            let id = format!("old-{n:05}");
            let key = (n % 3 != 0).then(|| format!("k{}", n % 7));
            let script = match &key {
                Some(key) => format!(
                    "BEGIN;
                     INSERT INTO {events} (id, type, key, payload) VALUES ('{id}', 't', '{key}', '{{}}');
                     WITH r AS (INSERT INTO {sequences} AS s (key, last_sequence) VALUES ('{key}', 1)
                                ON CONFLICT (key) DO UPDATE SET last_sequence = s.last_sequence + 1
                                RETURNING last_sequence)
                     INSERT INTO {deliveries} (id, event_id, handler, key, sequence)
                     SELECT 'd-{id}', '{id}', 'h', '{key}', last_sequence FROM r;
                     COMMIT;"
                ),
                None => format!(
                    "BEGIN;
                     INSERT INTO {events} (id, type, payload) VALUES ('{id}', 't', '{{}}');
                     INSERT INTO {deliveries} (id, event_id, handler) VALUES ('d-{id}', '{id}', 'h');
                     COMMIT;"
                ),
            };
            match block_on(client.batch_execute(&script)) {
                Ok(()) => published.push(id),
                Err(e) => {
                    let _ = block_on(client.batch_execute("ROLLBACK"));
                    failed.push(format!("{id}: {e:?}"));
                }
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        (published, failed)
    })
}

/// Publishes through the library, as a 0.2 application does, keyed over the same keys.
fn publish_as_0_2(
    s: &TestSchema,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, Vec<String>)> {
    let store = open_store(s, StoreOptions::admin());
    std::thread::spawn(move || {
        let (mut published, mut failed) = (vec![], vec![]);
        let mut n = 0;
        let limits = EventLimits {
            max_payload_bytes: 1024,
        };
        while !stop.load(Ordering::SeqCst) {
            let id = format!("new-{n:05}");
            let key = (n % 3 != 0).then(|| format!("k{}", n % 7));
            let event = NewEvent::new(
                id.clone(),
                "t".into(),
                key,
                serde_json::json!({}),
                Default::default(),
                vec!["h".into()],
                &limits,
            )
            .unwrap();
            match block_on(store.publish(&[event])) {
                Ok(_) => published.push(id),
                Err(e) => failed.push(format!("{id}: {e:#}")),
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        (published, failed)
    })
}

/// A 0.1 publisher writes before, during and after `upgrade --online`, a 0.2 publisher joins when
/// it returns, and a worker drains: every event of both is delivered once, keyed ones in their
/// publish order, and no statement of either failed. Then `upgrade --contract` refuses while 0.1
/// writes are recent, succeeds once they are not, and leaves a fresh install's catalog.
#[test]
fn a_rolling_deploy_delivers_every_publish_of_both_versions_once_in_order() {
    let s = TestSchema::with_fixture_0_1("rolling");
    // The fixture's own deliveries are another test's business: only what is published here.
    s.exec(&format!(
        "DELETE FROM {}; DELETE FROM {}; DELETE FROM {}",
        s.table("deliveries"),
        s.table("events"),
        s.table("key_sequences")
    ));
    let stop_old = Arc::new(AtomicBool::new(false));
    let old = publish_as_0_1(&s, Arc::clone(&stop_old));
    std::thread::sleep(Duration::from_millis(500));
    let out = s
        .cmd()
        .args(["upgrade", "--online", "--yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stop_new = Arc::new(AtomicBool::new(false));
    let new = publish_as_0_2(&s, Arc::clone(&stop_new));
    let check = s.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(
        stdout(&check).contains("0.2, expanded: 0.1 publishers accepted"),
        "{}",
        stdout(&check)
    );
    std::thread::sleep(Duration::from_millis(1500));
    stop_old.store(true, Ordering::SeqCst);
    stop_new.store(true, Ordering::SeqCst);
    let (old_ids, old_failed) = old.join().unwrap();
    let (new_ids, new_failed) = new.join().unwrap();
    assert_eq!(
        old_failed,
        Vec::<String>::new(),
        "0.1 statements that failed"
    );
    assert_eq!(
        new_failed,
        Vec::<String>::new(),
        "0.2 publishes that failed"
    );
    assert!(
        old_ids.len() > 100 && new_ids.len() > 50,
        "{} {}",
        old_ids.len(),
        new_ids.len()
    );

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    let handler = format!(
        "cat >/dev/null; echo \"$RELAYBUS_EVENT_ID ${{RELAYBUS_KEY:--}} $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let out = s
        .cmd()
        .args(["run", "--handler", "h", "--exec", &handler, "--drain"])
        .args(["--concurrency", "8", "--poll-interval", "50ms"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let mut handled: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
    // Per key, the events as published by each version, in the order they ran.
    let mut order = std::collections::HashMap::<String, Vec<String>>::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[2], "1", "first attempts only: {line}");
        if f[1] != "-" {
            order
                .entry(f[1].to_owned())
                .or_default()
                .push(f[0].to_owned());
        }
    }
    handled.sort_unstable();
    let mut expected: Vec<&str> = old_ids.iter().chain(&new_ids).map(String::as_str).collect();
    expected.sort_unstable();
    assert!(
        handled == expected,
        "every event once: {} handled of {}",
        handled.len(),
        expected.len()
    );
    // Each version's events of a key ran in the order that version published them (a key's
    // sequence is reserved at publish, so the two interleave by commit).
    for (key, ran) in order {
        for prefix in ["old-", "new-"] {
            let mine: Vec<&String> = ran.iter().filter(|id| id.starts_with(prefix)).collect();
            let mut sorted = mine.clone();
            sorted.sort();
            assert_eq!(mine, sorted, "key {key}");
        }
    }
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );

    // Contract: refused within the quiet period, then done.
    let refused = s
        .cmd()
        .args(["upgrade", "--contract", "--yes"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!(
            "0.1 publishers are still writing: {} rows since the conversion",
            s.count(&format!(
                "SELECT sum(rows)::int8 FROM {}",
                s.table("legacy_writes")
            ))
        )),
        "{}",
        stderr(&refused)
    );
    let dry = s
        .cmd()
        .args(["upgrade", "--contract", "--dry-run", "--quiet-for", "1s"])
        .output()
        .unwrap();
    assert!(
        stdout(&dry).contains("dry run: nothing was written"),
        "{}",
        stdout(&dry)
    );
    std::thread::sleep(Duration::from_secs(2));
    let done = s
        .cmd()
        .args(["upgrade", "--contract", "--yes", "--quiet-for", "1s"])
        .output()
        .unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    let again = s
        .cmd()
        .args(["upgrade", "--contract", "--yes"])
        .output()
        .unwrap();
    assert_eq!(
        (again.status.code(), stdout(&again)),
        (
            Some(0),
            "nothing to contract: relaybus schema is 0.2\n".to_owned()
        )
    );
    let fresh = TestSchema::installed("rolling_fresh");
    assert_eq!(
        crate::schema::catalog(&s),
        crate::schema::catalog(&fresh),
        "the contracted store's catalog is a fresh install's"
    );
}

/// On MongoDB the conversion (always online) leaves the store expanded too: deliveries and
/// events a 0.1 publisher writes afterwards (no `laneId`, no `handlers`) are adopted by the
/// running worker and delivered once, keyed ones in order, without any command; `--contract`
/// ends the adoption once no 0.1 write has come for the quiet period.
#[test]
fn on_mongodb_a_0_1_publisher_s_documents_are_adopted_while_expanded() {
    use mongodb::bson::{doc, DateTime, Document};
    let m = crate::common::mongo::TestMongo::with_fixture_0_1("mongo_rolling");
    let out = m.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let check = m.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(
        stdout(&check).contains("0.2, expanded"),
        "{}",
        stdout(&check)
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    let handler = format!(
        "cat >/dev/null; echo \"$RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let worker = m.worker(&[
        "--handler",
        "late",
        "--exec",
        &handler,
        "--poll-interval",
        "100ms",
    ]);
    // A 0.1 publisher's writes: five keyed events in sequence, five unkeyed ones.
    let now = DateTime::now();
    let events: Vec<Document> = (0..10)
        .map(|i| {
            let mut e =
                doc! { "_id": format!("late-{i}"), "type": "t", "payload": {}, "headers": {} };
            if i < 5 {
                e.insert("key", "late-key");
            }
            e
        })
        .collect();
    let deliveries: Vec<Document> = (0..10)
        .map(|i| {
            let mut d = doc! {
                "_id": format!("d-late-{i}"), "eventId": format!("late-{i}"), "handler": "late",
                "status": "pending", "attempts": 0, "lane": "ready", "dueAt": now,
                "createdAt": now, "updatedAt": now,
            };
            if i < 5 {
                d.insert("key", "late-key");
                d.insert("sequence", i as i64 + 1);
            }
            d
        })
        .collect();
    block_on(async {
        m.collection("events").insert_many(events).await.unwrap();
        m.collection("deliveries")
            .insert_many(deliveries)
            .await
            .unwrap();
    });
    crate::common::wait_until(
        "the 0.1 documents delivered",
        Duration::from_secs(30),
        || std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 10),
    );
    let ran: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let keyed: Vec<&String> = ran.iter().filter(|l| l.as_str() < "late-5").collect();
    assert_eq!(
        keyed,
        ["late-0 1", "late-1 1", "late-2 1", "late-3 1", "late-4 1"],
        "in sequence, once each"
    );
    let mut all = ran.clone();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 10);
    let handlers = m.find("events", doc! { "_id": "late-7" });
    assert_eq!(
        handlers[0].get_array("handlers").unwrap(),
        &vec![mongodb::bson::Bson::from("late")]
    );
    let refused = m
        .cmd()
        .args(["upgrade", "--contract", "--yes"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("0.1 publishers are still writing: 10 rows"),
        "{}",
        stderr(&refused)
    );
    std::thread::sleep(Duration::from_secs(2));
    let done = m
        .cmd()
        .args(["upgrade", "--contract", "--yes", "--quiet-for", "1s"])
        .output()
        .unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(
        stdout(&done).contains("10 rows came from 0.1 publishers"),
        "{}",
        stdout(&done)
    );
    let check = m.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(
        stdout(&check),
        format!(
            "relaybus schema 0.2 is current (database \"{}\", prefix \"relaybus_\")\n",
            m.name
        )
    );
    crate::common::signal(&worker, nix::sys::signal::Signal::SIGTERM);
    assert!(crate::common::finish(worker, Duration::from_secs(30))
        .status
        .success());
}

/// `upgrade --contract` is one transaction: killed anywhere, it has done all or nothing, and run
/// again it finishes; a second run says there is nothing to contract.
#[test]
fn a_contract_killed_anywhere_is_finished_by_a_rerun() {
    let s = TestSchema::with_fixture_0_1("contract_killed");
    s.cmd()
        .args(["upgrade", "--online", "--yes"])
        .assert()
        .success();
    for delay in [0, 15, 30, 60, 120] {
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("relaybus"))
            .env("RELAYBUS_DATABASE_URL", &s.url)
            .args([
                "--schema",
                &s.name,
                "upgrade",
                "--contract",
                "--yes",
                "--force",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
        let check = s.cmd().args(["setup", "--check"]).output().unwrap();
        assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    }
    let last = s
        .cmd()
        .args(["upgrade", "--contract", "--yes", "--force"])
        .output()
        .unwrap();
    assert!(last.status.success(), "{}", stderr(&last));
    let again = s
        .cmd()
        .args(["upgrade", "--contract", "--yes"])
        .output()
        .unwrap();
    assert_eq!(
        (again.status.code(), stdout(&again)),
        (
            Some(0),
            "nothing to contract: relaybus schema is 0.2\n".to_owned()
        )
    );
    assert_eq!(
        crate::schema::catalog(&s),
        crate::schema::catalog(&TestSchema::installed("contract_killed_fresh"))
    );
}

/// A MongoDB conversion killed in its install step (converted documents, no version, a 0.2
/// index missing) is finished by `upgrade` as by `setup`, and stays expanded.
#[test]
fn on_mongodb_upgrade_finishes_a_conversion_killed_in_its_install_step() {
    let m = crate::common::mongo::TestMongo::with_fixture_0_1("mongo_killed_install");
    m.cmd().args(["upgrade", "--yes"]).assert().success();
    crate::common::mongo::mongosh(&format!(
        "const d = db.getSiblingDB('{}'); d.relaybus_schema.deleteOne({{_id: 'version'}}); d.relaybus_deliveries.dropIndex('lane_key_sequence');",
        m.name
    ));
    let check = m.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    let out = m.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let check = m.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(
        stdout(&check).contains("0.2, expanded"),
        "{}",
        stdout(&check)
    );
}
