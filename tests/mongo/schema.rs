//! The MongoDB schema: the 0.1 conversion of the fixture, repairs by `setup`, and the
//! `mongosh` scripts `schema-sql` renders without a server.

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use relaybus::store::StoreOptions;
use serde_json::{json, Value};

use crate::common::mongo::TestMongo;
use crate::common::scenario::Target;
use crate::common::{stderr, stdout};

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
        stderr(&out)
            .contains("is incomplete (no version row, a table, column or collection missing"),
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
