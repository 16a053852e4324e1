//! The MongoDB store end to end: the README's walk-through with the same output shapes as on
//! PostgreSQL, the 0.1 conversion of the fixture, the seed's concurrency cases, parking,
//! exactly-once across worker processes, `kill -9`, and `schema-sql` rendered without a
//! server.

use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use relaybus::store::lane::lane_of;
use relaybus::store::prelude::*;
use relaybus::store::{ClaimRequest, EventLimits, NewEvent, StoreOptions};
use serde_json::{json, Value};

use crate::common::drain::three_workers_drain_exactly_once;
use crate::common::http::serve;
use crate::common::mongo::{mongo_url, OwnServer, TestMongo};
use crate::common::scenario::Target;
use crate::common::{
    claim_request, finish, relaybus, stderr, stdout, wait_until, Spawned, TestSchema,
};

/// A command of the walk-through, on either engine.
struct Engine {
    url: String,
    schema: String,
}

impl Engine {
    fn cmd(&self) -> assert_cmd::Command {
        let mut cmd = crate::common::relaybus();
        cmd.env("RELAYBUS_DATABASE_URL", &self.url)
            .env_remove("RELAYBUS_WEBHOOK_SECRET")
            .args(["--schema", &self.schema]);
        cmd
    }

    /// Runs a step, asserting success; its stdout.
    fn step(&self, args: &[&str], stdin: &str) -> String {
        let out = self.cmd().args(args).write_stdin(stdin).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    }
}

/// A JSON value with what differs between runs replaced: ids, times, durations and epochs.
fn shape(v: &Value) -> Value {
    let id = |s: &str| s.parse::<ulid::Ulid>().is_ok();
    let time = |s: &str| s.len() >= 19 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T';
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        "lag_seconds" | "epoch" | "lane_epoch" | "seconds" => {
                            json!(if v.is_null() { "null" } else { "<n>" })
                        }
                        _ => shape(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::String(s) if id(s) => json!("<id>"),
        Value::String(s) if time(s) => json!("<time>"),
        other => other.clone(),
    }
}

/// The walk-through of README's "Try it": every step's output, with ids and times replaced.
fn walk_through(engine: &Engine) -> Vec<Value> {
    let hook = serve(vec![(200, "", "ok")]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("handlers.toml");
    std::fs::write(
        &config,
        format!(
            "[handlers.billing]\nwebhook = \"{}\"\n\n[handlers.email]\nexec = \"exit 65\"\n",
            hook.url
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let events = [
        json!({"id": "o1", "type": "order.paid", "key": "c1", "payload": {"amount": 12.50}}),
        json!({"id": "o2", "type": "order.paid", "key": "c1", "payload": {"amount": 3}}),
        json!({"id": "o3", "type": "user.new", "payload": {"n": 123456789012345678901234567890_u128}}),
    ];
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    let mut seen = vec![];
    let text = |s: String| json!(s);
    let parsed = |s: String| shape(&serde_json::from_str::<Value>(&s).unwrap());
    seen.push(parsed(engine.step(&["setup", "--json"], "")));
    seen.push(text(engine.step(
        &["publish", "--handler", "billing", "--handler", "email"],
        &lines.join("\n"),
    )));
    seen.push(text(
        engine.step(&["run", "--config", config, "--drain"], ""),
    ));
    assert_eq!(hook.requests.lock().unwrap().len(), 3);
    seen.push(parsed(engine.step(&["dead", "list", "--json"], "")));
    seen.push(parsed(engine.step(&["stats", "--json"], "")));
    seen.push(text(
        engine.step(&["dead", "requeue", "--handler", "email", "--yes"], ""),
    ));
    seen.push(parsed(engine.step(&["deliveries", "list", "--json"], "")));
    seen.push(text(engine.step(
        &[
            "run",
            "--handler",
            "email",
            "--exec",
            "cat >/dev/null",
            "--drain",
        ],
        "",
    )));
    seen.push(parsed(engine.step(&["events", "show", "o3", "--json"], "")));
    seen.push(parsed(engine.step(&["lanes", "--json"], "")));
    seen.push(parsed(engine.step(
        &[
            "purge",
            "--completed-older-than",
            "0s",
            "--dead-older-than",
            "0s",
            "--yes",
            "--json",
        ],
        "",
    )));
    seen.push(parsed(engine.step(&["stats", "--json"], "")));
    seen
}

#[test]
fn the_walk_through_gives_the_same_output_on_mongodb_as_on_postgresql() {
    let pg = TestSchema::new("walk_pg");
    let mongo = TestMongo::new("walk_mongo");
    let on_pg = walk_through(&Engine {
        url: crate::common::database_url(),
        schema: pg.name.clone(),
    });
    let on_mongo = walk_through(&Engine {
        url: mongo_url(),
        schema: mongo.name.clone(),
    });
    assert_eq!(on_pg.len(), on_mongo.len());
    for (i, (p, m)) in on_pg.iter().zip(&on_mongo).enumerate() {
        assert_eq!(p, m, "step {i}:\nPostgreSQL {p:#}\nMongoDB {m:#}");
    }
    // The exact payload reached the store and the handler.
    assert_eq!(
        on_mongo[8]["payload"],
        json!({"n": 123456789012345678901234567890_u128})
    );
    assert_eq!(
        on_mongo[2],
        json!("handled 3, failed attempts 0, dead 3, lease lost 0, released 0\n")
    );
}

fn event(id: &str, key: Option<&str>) -> NewEvent {
    NewEvent::new(
        id.into(),
        "t".into(),
        key.map(Into::into),
        json!({"id": id}),
        Default::default(),
        vec!["h".into()],
        &EventLimits {
            max_payload_bytes: 1 << 20,
        },
    )
    .unwrap()
}

fn request(owner: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        lease,
        ..claim_request(owner, &["h"])
    }
}

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

/// The fixture after the conversion: every delivery converted, nothing completed runs again.
fn assert_converted(m: &TestMongo) {
    let deliveries = m.find("deliveries", doc! {});
    let state: Vec<String> = deliveries
        .iter()
        .map(|d| {
            format!(
                "{} {} {} lane={} claims={} ready={} lease={}",
                d.get_str("_id").unwrap(),
                d.get_str("status").unwrap(),
                d.get_i32("attempts").unwrap(),
                d.get_i32("laneId").unwrap(),
                d.get_i32("claims").unwrap(),
                d.get_str("lane").unwrap() == "ready",
                d.contains_key("leaseToken") || d.contains_key("leaseOwner"),
            )
        })
        .collect();
    let lane = |k: &str| relaybus::store::lane::lane_of(Some(k), "");
    let unkeyed = |e: &str| relaybus::store::lane::lane_of(None, e);
    assert_eq!(
        state,
        [
            format!(
                "d-1a completed 1 lane={} claims=0 ready=true lease=false",
                lane("order-7")
            ),
            format!(
                "d-1b pending 2 lane={} claims=0 ready=true lease=false",
                lane("order-7")
            ),
            format!(
                "d-2a pending 0 lane={} claims=0 ready=true lease=false",
                lane("order-7")
            ),
            format!(
                "d-3a pending 1 lane={} claims=0 ready=true lease=false",
                unkeyed("ev-3")
            ),
            format!(
                "d-4a dead 25 lane={} claims=0 ready=true lease=false",
                unkeyed("ev-4")
            ),
            format!(
                "d-4b pending 3 lane={} claims=0 ready=true lease=false",
                unkeyed("ev-4")
            ),
            format!(
                "d-5a dead 25 lane={} claims=0 ready=true lease=false",
                lane("héllo-ключ-鍵")
            ),
            format!(
                "d-6a completed 1 lane={} claims=0 ready=true lease=false",
                unkeyed("ev-6")
            ),
        ]
    );
    let handlers: Vec<String> = m
        .find("events", doc! {})
        .iter()
        .map(|e| {
            let h: Vec<&str> = e
                .get_array("handlers")
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap())
                .collect();
            format!(
                "{} {} {}",
                e.get_str("_id").unwrap(),
                h.join(","),
                e.get_datetime("createdAt")
                    .unwrap()
                    .try_to_rfc3339_string()
                    .unwrap()
            )
        })
        .collect();
    assert_eq!(
        handlers,
        [
            "ev-1 billing,email 2026-01-01T10:00:00Z",
            "ev-2 billing 2026-01-01T10:00:01Z",
            "ev-3 email 2026-01-01T10:00:02Z",
            "ev-4 crm,email 2026-01-01T10:00:03Z",
            "ev-5 billing 2026-01-01T10:00:04Z",
            "ev-6 crm 2026-01-01T10:00:05Z",
        ]
    );
    assert_eq!(m.find("lanes", doc! {}).len(), 256);
    m.cmd().args(["setup", "--check"]).assert().success();
}

/// What the conversion touches, to compare runs.
fn snapshot(m: &TestMongo) -> Vec<Document> {
    let mut all = vec![];
    for c in ["events", "deliveries", "key_sequences", "lanes", "schema"] {
        for mut d in m.find(c, doc! {}) {
            d.insert("collection", c);
            all.push(d);
        }
    }
    all
}

fn index_names(m: &TestMongo) -> Vec<String> {
    let mut names =
        crate::common::block_on(async { m.collection("deliveries").list_index_names().await })
            .unwrap();
    names.sort();
    names
}

/// The conversion reports its progress a batch at a time: each step from 0, ending at the
/// documents it rewrote.
#[test]
fn upgrade_reports_the_documents_each_step_has_rewritten() {
    let m = TestMongo::with_fixture_0_1("mongo_upgrade_progress");
    let reports = crate::common::upgrade_reports(&m.store(StoreOptions::admin()));
    assert_eq!(reports, [(1, vec![0, 8]), (2, vec![0, 6]), (3, vec![0])]);
    assert_converted(&m);
}

#[test]
fn upgrade_converts_the_0_1_fixture_and_a_second_run_changes_nothing() {
    let m = TestMongo::with_fixture_0_1("mongo_upgrade");
    let before = snapshot(&m);
    let dry = m.cmd().args(["upgrade", "--dry-run"]).output().unwrap();
    assert!(dry.status.success(), "{}", stderr(&dry));
    let text = stdout(&dry);
    assert!(text.starts_with("found: schema 0.1\nrows: 6 events, 8 deliveries (2 pending, 2 processing -> pending, 2 completed kept, 2 dead)\nsteps:\n"), "{text}");
    assert!(
        text.contains("  1. deliveries-lanes: set each delivery's laneId"),
        "{text}"
    );
    assert!(text.contains(" [8 rows]\n  2. events-handlers: "), "{text}");
    assert!(text.contains(" [6 rows]\n  3. install: drop the 0.1 indexes, found by definition whatever their names; create the 0.2 collections and indexes, seed the 256 lanes, record the version; drops relaybus_deliveries.handler_1_createdAt_1, relaybus_deliveries.key_1_handler_1_sequence_1, relaybus_deliveries.status_1_completedAt_1, relaybus_deliveries.status_1_lane_1_dueAt_1, relaybus_deliveries.status_1_leaseExpiresAt_1, relaybus_deliveries.status_1_updatedAt_1; creates relaybus_deliveries.lane_due, relaybus_deliveries.lane_key_sequence, relaybus_deliveries.dead_updated, relaybus_events.created, relaybus_completions.completed, relaybus_schema, relaybus_lanes, relaybus_completions, relaybus_handlers\n"), "{text}");
    assert!(text.ends_with("locks: none on the collections: the conversion runs in batches of 1,000 documents under relaybus's setup lock; stop 0.1 workers first\ndry run: nothing was written\n"), "{text}");
    assert_eq!(snapshot(&m), before);

    let out = m.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "upgraded database \"{}\" from 0.1 to 0.2 in ",
            m.name
        )),
        "{}",
        stdout(&out)
    );
    assert_converted(&m);
    assert_eq!(
        index_names(&m),
        [
            "_id_",
            "dead_updated",
            "eventId_1_handler_1",
            "lane_due",
            "lane_key_sequence"
        ]
    );
    // 0.1's unique (eventId, handler) index is 0.2's: kept, never dropped and made again.
    m.cmd().args(["setup", "--check"]).assert().success();
    let first = snapshot(&m);
    let again = m.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(
        stdout(&again).starts_with("relaybus schema is 0.2, expanded: 0.1 publishers accepted (no 0.1 write since the conversion); nothing to upgrade."),
        "{}",
        stdout(&again)
    );
    m.cmd().arg("setup").assert().success();
    assert_eq!(snapshot(&m), first);

    assert_the_converted_fixture_drains(&m);
}

/// The converted fixture works: a worker runs its pending deliveries once each, the parked 0.1
/// follower once its head has, and exits.
fn assert_the_converted_fixture_drains(m: &TestMongo) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    let command = format!(
        "echo \"$RELAYBUS_HANDLER $RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let config = dir.path().join("handlers.toml");
    std::fs::write(
        &config,
        format!("[handlers.billing]\nexec = '''{command}'''\n[handlers.email]\nexec = '''{command}'''\n"),
    )
    .unwrap();
    let worker = m.worker(&["--config", config.to_str().unwrap(), "--drain"]);
    let out = crate::common::finish(worker, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut runs: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    runs.sort();
    assert_eq!(runs, ["billing ev-2 1", "email ev-1 3", "email ev-3 2"]);
}

/// The install script of relaybus before it refused a 0.1 store, applied over one, recorded 0.2
/// over documents no worker could claim. `setup --check`, `upgrade --dry-run` and `doctor` find
/// them whatever the version document says, `setup` converts them, and a worker drains them.
#[test]
fn a_0_1_store_installed_over_is_found_converted_and_drained() {
    let m = TestMongo::with_fixture_0_1("mongo_installed_over");
    let install = stdout(&m.cmd().arg("schema-sql").output().unwrap());
    let unguarded = install.replace("  throw new Error(", "  print(");
    assert_ne!(unguarded, install);
    crate::common::mongo::mongosh(&unguarded);
    let version = m.find("schema", doc! { "_id": "version" });
    assert_eq!(version[0].get_str("version").unwrap(), "0.2");
    let check = m.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(check.status.code(), Some(1));
    assert_eq!(
        stderr(&check),
        format!(
            "relaybus schema is 0.1 in database \"{}\", prefix \"relaybus_\", expected 0.2; run \
             `relaybus upgrade --dry-run` to see the conversion, then `relaybus upgrade`\n",
            m.name
        )
    );
    let plan = m
        .cmd()
        .args(["upgrade", "--dry-run", "--json"])
        .output()
        .unwrap();
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let rows: Vec<&Value> = plan["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["rows"])
        .collect();
    assert_eq!(rows, [&json!(8), &json!(6), &Value::Null]);
    let doctor = m.cmd().arg("doctor").output().unwrap();
    assert_eq!(doctor.status.code(), Some(1));
    assert!(
        stdout(&doctor).contains("the schema is 0.1"),
        "{}",
        stdout(&doctor)
    );
    m.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema 0.1 -> 0.2 (database \"{}\", prefix \"relaybus_\")\n",
        m.name
    ));
    assert_converted(&m);
    assert_the_converted_fixture_drains(&m);
}

#[test]
fn a_conversion_that_stopped_halfway_is_finished_by_setup() {
    let m = TestMongo::with_fixture_0_1("mongo_halfway");
    // What a crash after the first batch of the first step leaves.
    crate::common::block_on(async {
        m.collection("deliveries")
            .update_one(
                doc! { "_id": "d-3a" },
                doc! {
                    "$set": { "laneId": i32::from(relaybus::store::lane::lane_of(None, "ev-3")), "claims": 0, "status": "pending", "lane": "ready" },
                    "$unset": { "leaseOwner": "", "leaseToken": "", "leaseExpiresAt": "" },
                },
            )
            .await
            .unwrap();
    });
    m.cmd().args(["setup", "--check"]).assert().code(1);
    m.cmd().arg("setup").assert().success();
    assert_converted(&m);
}

#[test]
fn upgrade_refuses_live_0_1_leases_unless_forced() {
    let m = TestMongo::with_fixture_0_1("mongo_live_leases");
    crate::common::block_on(async {
        m.collection("deliveries")
            .update_one(
                doc! { "_id": "d-3a" },
                doc! { "$set": { "leaseExpiresAt": Bson::DateTime(mongodb::bson::DateTime::parse_rfc3339_str("2999-01-01T00:00:00Z").unwrap()) } },
            )
            .await
            .unwrap();
    });
    let before = snapshot(&m);
    let out = m.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error: 1 deliveries are still leased by 0.1 workers (until 2999-01-01T00:00:00+00:00); stop every 0.1 worker first, then run `relaybus upgrade --force` (or wait until the leases expire)"), "{}", stderr(&out));
    assert_eq!(
        m.cmd().arg("setup").output().unwrap().status.code(),
        Some(1)
    );
    assert_eq!(snapshot(&m), before);
    m.cmd()
        .args(["upgrade", "--yes", "--force"])
        .assert()
        .success();
    assert_converted(&m);
}

#[test]
fn setup_check_sees_a_redefined_index_and_setup_repairs_it() {
    let m = TestMongo::installed("mongo_redefined");
    crate::common::block_on(async {
        let deliveries = m.collection("deliveries");
        deliveries.drop_index("dead_updated").await.unwrap();
        deliveries
            .create_index(
                mongodb::IndexModel::builder()
                    .keys(doc! { "updatedAt": 1 })
                    .options(
                        mongodb::options::IndexOptions::builder()
                            .name("dead_updated".to_owned())
                            .build(),
                    )
                    .build(),
            )
            .await
            .unwrap();
    });
    let out = m.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("relaybus schema is 0.2 (incomplete) in database \"{}\", prefix \"relaybus_\", expected 0.2; run `relaybus setup`\n", m.name)
    );
    m.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema 0.2 (incomplete) -> 0.2 (database \"{}\", prefix \"relaybus_\")\n",
        m.name
    ));
    m.cmd().args(["setup", "--check"]).assert().success();
}

/// A 0.2 store installed before the handlers collection existed is not current until `setup`
/// creates it.
#[test]
fn a_0_2_store_without_the_handlers_collection_is_completed_by_setup() {
    let m = TestMongo::installed("no_handlers_collection");
    crate::common::block_on(async { m.collection("handlers").drop().await }).unwrap();
    let out = m.cmd().args(["handlers", "list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("is incomplete (no version row, a table or collection missing"),
        "{}",
        stderr(&out)
    );
    m.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema 0.2 (incomplete) -> 0.2 (database \"{}\", prefix \"relaybus_\")\n",
        m.name
    ));
    m.cmd()
        .args(["handlers", "pause", "--new", "h", "--by", "ana"])
        .assert()
        .success();
    let listed = m
        .cmd()
        .args(["handlers", "list", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(
        (
            &listed[0]["handler"],
            &listed[0]["paused_by"],
            &listed[0]["breaker"]
        ),
        (&json!("h"), &json!("ana"), &json!("closed"))
    );
}

/// `schema-sql` on a MongoDB URL renders a `mongosh` script without connecting: the URL points
/// at a port where nothing listens.
#[test]
fn schema_sql_renders_mongosh_scripts_without_a_server() {
    let render = |args: &[&str]| {
        let out = crate::common::relaybus()
            .env("RELAYBUS_DATABASE_URL", "mongodb://127.0.0.1:1/app")
            .args(["--prefix", "rb_", "schema-sql"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let install = render(&[]);
    assert!(install.starts_with(&format!(
        "// relaybus {} MongoDB schema 0.2: install\n// database \"app\", prefix \"rb_\"; rendered by `relaybus schema-sql`.\n",
        env!("CARGO_PKG_VERSION")
    )), "{install}");
    for line in [
        "const rb = db.getSiblingDB(\"app\");",
        "ensureIndex(rb.getCollection(\"rb_deliveries\"), {\"laneId\":1,\"dueAt\":1,\"_id\":1}, {\"name\":\"lane_due\",\"partialFilterExpression\":{\"status\":\"pending\",\"lane\":\"ready\"}});",
        "ensureIndex(rb.getCollection(\"rb_deliveries\"), {\"eventId\":1,\"handler\":1}, {\"name\":\"eventId_handler_unique\",\"unique\":true});",
        "rb.getCollection(\"rb_schema\").updateOne({ _id: \"version\" }, { $set: { version: \"0.2\" } }, { upsert: true });",
    ] {
        assert!(install.contains(line), "{line}\n{install}");
    }
    let convert = render(&["--from", "0.1"]);
    assert!(convert.contains("// step deliveries-lanes: "), "{convert}");
    assert!(convert.contains("function laneOf(text) {"), "{convert}");
    // The conversion ends with the install, less its refusal of a 0.1 store.
    let (refusal, installing) = install
        .split_once("\n// The collections, created before any transaction writes to them.")
        .unwrap();
    assert!(
        refusal.contains(" holds a relaybus 0.1 store: "),
        "{install}"
    );
    assert!(
        !convert.contains(" holds a relaybus 0.1 store: "),
        "{convert}"
    );
    assert!(convert.ends_with(installing), "{convert}");
    let grants = render(&["--grants", "worker"]);
    assert!(
        grants.contains("rb.createRole({ role: \"worker\", privileges, roles: [] });"),
        "{grants}"
    );
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

/// The rendered scripts run under mongosh: the install makes a store `setup --check` calls
/// current, and the conversion, applied twice to the 0.1 fixture, converts it once.
#[test]
fn the_mongosh_scripts_install_and_convert_as_setup_does() {
    let fresh = TestMongo::new("mongosh_install");
    let install = stdout(&fresh.cmd().arg("schema-sql").output().unwrap());
    crate::common::mongo::mongosh(&install);
    crate::common::mongo::mongosh(&install);
    fresh.cmd().args(["setup", "--check"]).assert().success();
    assert_eq!(fresh.find("lanes", doc! {}).len(), 256);

    let old = TestMongo::with_fixture_0_1("mongosh_convert");
    let convert = stdout(
        &old.cmd()
            .args(["schema-sql", "--from", "0.1"])
            .output()
            .unwrap(),
    );
    crate::common::mongo::mongosh(&convert);
    assert_converted(&old);
    assert_eq!(
        index_names(&old),
        [
            "_id_",
            "dead_updated",
            "eventId_1_handler_1",
            "lane_due",
            "lane_key_sequence"
        ]
    );
    old.cmd().args(["setup", "--check"]).assert().success();
    let first = snapshot(&old);
    crate::common::mongo::mongosh(&convert);
    assert_eq!(snapshot(&old), first);
}

/// The install script run over a 0.1 store would record 0.2 without converting, stranding its
/// deliveries: it refuses, names the conversion script, and changes nothing.
#[test]
fn the_install_script_refuses_a_0_1_store() {
    let old = TestMongo::with_fixture_0_1("mongosh_install_over_0_1");
    let before = snapshot(&old);
    let install = stdout(&old.cmd().arg("schema-sql").output().unwrap());
    let (ok, text) = crate::common::mongo::try_mongosh(&install);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "database {} holds a relaybus 0.1 store: apply the conversion that `relaybus \
             schema-sql --from 0.1` renders instead; nothing was changed",
            old.name
        )),
        "{text}"
    );
    assert_eq!(snapshot(&old), before);
    let convert = stdout(
        &old.cmd()
            .args(["schema-sql", "--from", "0.1"])
            .output()
            .unwrap(),
    );
    crate::common::mongo::mongosh(&convert);
    crate::common::mongo::mongosh(&install);
    assert_converted(&old);
}

/// A standalone server has no transactions a worker can rely on and no change stream to wake
/// it: `setup` and `run` refuse it, saying why and what to do.
#[test]
fn a_standalone_server_is_refused_with_why() {
    let server = OwnServer::start(&["--standalone"]);
    for args in [&["setup"][..], &["run", "--handler", "h", "--noop"]] {
        let out = relaybus()
            .env("RELAYBUS_DATABASE_URL", server.url(""))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "error: MongoDB at {} is a standalone server; relaybus needs a replica set (a \
                 single node is enough) or a sharded cluster, since deliveries are completed in \
                 transactions and workers are woken by a change stream, neither of which a \
                 standalone server has: start mongod with --replSet rs0 and run rs.initiate() \
                 once\n",
                server.url("")
            )
        );
    }
}

/// What failed, in one sentence and with the exit code the README gives: a refused connection
/// (69) names the address and the refusal, not the driver's topology and labels; a wrong
/// password (69) is named as bad credentials; a URL that does not parse is a usage error (2) in
/// `bench` as everywhere.
#[test]
fn connection_failures_say_what_failed_in_one_sentence() {
    let port = crate::common::cluster::free_port();
    let refused =
        format!("mongodb://127.0.0.1:{port}/?directConnection=true&serverSelectionTimeoutMS=2000");
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", &refused)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert_eq!(
        stderr(&out),
        format!(
            "error: could not connect to MongoDB at {refused}: 127.0.0.1:{port}: Connection \
             refused (os error 111); check RELAYBUS_DATABASE_URL (set in the environment) and \
             that the server is running\n"
        )
    );
    let server = OwnServer::start(&[]);
    crate::common::block_on(async {
        let client = mongodb::Client::with_uri_str(server.url("")).await.unwrap();
        let user = doc! { "createUser": "app", "pwd": "right", "roles": ["root"] };
        client.database("admin").run_command(user).await.unwrap();
    });
    let server = server.restart(&["--auth"]);
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", server.url("app:wrong@"))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let text = stderr(&out);
    assert!(
        text.contains(": bad credentials (authentication failed: "),
        "{text}"
    );
    assert!(
        !text.contains("wrong") && !text.contains("labels"),
        "{text}"
    );
    // Reached without credentials: the server answers, and refuses the first command.
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", server.url(""))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stderr(&out).contains(": the server requires authentication, or this user lacks the privileges: give a user and password in the URL"),
        "{}",
        stderr(&out)
    );
    // A server that answers as a member of another replica set.
    let other = format!(
        "{}&replicaSet=elsewhere",
        server
            .url("app:right@")
            .replace("directConnection=true&", "")
    );
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", &other)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stderr(&out).contains("no member of the replica set `elsewhere` answered"),
        "{}",
        stderr(&out)
    );
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", "mongodb://app:p@127.0.0.1:99999/")
        .args(["bench", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "error: invalid connection string `mongodb://app:***@127.0.0.1:99999/`: An invalid \
         argument was provided: invalid server address 127.0.0.1:99999: the port must be an \
         integer between 1 and 65535, got 99999\n"
    );
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
