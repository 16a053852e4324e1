//! `relaybus doctor`: a healthy store passes; a store broken in each way the doctor knows is
//! named with its fix, and the printed fix makes it pass again; health warnings exit 3.

use std::process::Output;

use crate::common::mongo::{mongo_url, mongosh, TestMongo};
use crate::common::scenario::Target;
use crate::common::{stderr, stdout, TestSchema};

/// The status, check and subject of every line of the table, and the exit code.
fn findings(out: &Output) -> (Option<i32>, Vec<String>) {
    let text = stdout(out);
    let rows = text
        .lines()
        .skip(1)
        .filter(|l| !l.contains(" checks: "))
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect();
    (out.status.code(), rows)
}

fn doctor(s: &TestSchema, args: &[&str]) -> Output {
    s.cmd().arg("doctor").args(args).output().unwrap()
}

const HEALTHY: [&str; 11] = [
    "ok table tables",
    "ok index indexes",
    "ok lanes relaybus_lanes",
    "ok version relaybus_schema",
    "ok vacuum relaybus_deliveries",
    "ok vacuum relaybus_lanes",
    "ok hot relaybus_lanes",
    "ok cleanup cluster",
    "ok session postgres",
    "ok replication cluster",
    "ok leases lanes",
];

#[test]
fn a_healthy_store_passes_every_check() {
    let s = TestSchema::installed("doctor_healthy");
    let out = doctor(&s, &[]);
    assert_eq!(
        findings(&out),
        (Some(0), HEALTHY.map(String::from).to_vec()),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).ends_with("11 checks: 11 ok, 0 warnings, 0 failures\n"));
    let json: serde_json::Value = serde_json::from_slice(&doctor(&s, &["--json"]).stdout).unwrap();
    assert_eq!(
        (json["ok"].as_u64(), json["failures"].as_u64()),
        (Some(11), Some(0))
    );
    assert_eq!(json["checks"][0]["verdict"], "ok");
    assert_eq!(json["checks"][0]["fix"], serde_json::Value::Null);
    let fix = stdout(&doctor(&s, &["--fix-sql"]));
    assert!(fix.ends_with("-- nothing to repair\n"), "{fix}");
}

/// Each kind of drift: how it is made, and the finding the doctor reports for it.
const DRIFTS: [(&str, &str, &[&str]); 12] = [
    ("missing table", "DROP TABLE {s}.relaybus_completions", &["FAIL table relaybus_completions"]),
    ("missing column", "ALTER TABLE {s}.relaybus_deliveries DROP COLUMN claims", &["FAIL column relaybus_deliveries.claims"]),
    ("extra column", "ALTER TABLE {s}.relaybus_events ADD COLUMN note text", &["warn column relaybus_events.note"]),
    ("redefined column", "ALTER TABLE {s}.relaybus_lanes ALTER COLUMN epoch TYPE int, ALTER COLUMN epoch DROP NOT NULL", &["FAIL column relaybus_lanes.epoch"]),
    ("missing index", "DROP INDEX {s}.relaybus_deliveries_lane_due_idx", &["FAIL index relaybus_deliveries_lane_due_idx"]),
    ("redefined index", "DROP INDEX {s}.relaybus_deliveries_dead_idx; CREATE INDEX relaybus_deliveries_dead_idx ON {s}.relaybus_deliveries (updated_at)", &["FAIL index relaybus_deliveries_dead_idx"]),
    ("0.1 index", "CREATE INDEX handler_created ON {s}.relaybus_deliveries (handler, created_at)", &["FAIL index handler_created"]),
    ("index of the processing status", "CREATE INDEX stuck ON {s}.relaybus_deliveries (updated_at) WHERE status = 'processing'", &["warn index stuck"]),
    ("storage parameters", "ALTER TABLE {s}.relaybus_lanes RESET (fillfactor); ALTER TABLE {s}.relaybus_deliveries SET (fillfactor = 70)", &["FAIL storage relaybus_deliveries", "FAIL storage relaybus_lanes"]),
    ("missing lanes", "DELETE FROM {s}.relaybus_lanes WHERE lane IN (3, 200)", &["FAIL lanes relaybus_lanes"]),
    ("lanes outside 0..255", "ALTER TABLE {s}.relaybus_lanes DROP CONSTRAINT relaybus_lanes_lane_check; INSERT INTO {s}.relaybus_lanes (lane) VALUES (300)", &["FAIL lanes relaybus_lanes"]),
    ("version row", "DELETE FROM {s}.relaybus_schema", &["FAIL version relaybus_schema"]),
];

#[test]
fn every_kind_of_drift_is_named_with_a_fix_that_repairs_it() {
    for (kind, breaks, finding) in DRIFTS {
        let s = TestSchema::installed(&format!("doctor_{}", kind.replace([' ', '.'], "_")));
        s.exec(&breaks.replace("{s}", &format!("\"{}\"", s.name)));
        let out = doctor(&s, &[]);
        let (code, rows) = findings(&out);
        let failing: Vec<&str> = rows
            .iter()
            .map(String::as_str)
            .filter(|r| !r.starts_with("ok "))
            .collect();
        let expected = if finding[0].starts_with("warn") { 3 } else { 1 };
        assert_eq!(
            (code, failing),
            (Some(expected), finding.to_vec()),
            "{kind}: {}",
            stdout(&out)
        );
        let fix = doctor(&s, &["--fix-sql"]);
        assert!(fix.status.success(), "{kind}: {}", stderr(&fix));
        s.exec(&format!("BEGIN;\n{}\nCOMMIT;", stdout(&fix)));
        let after = doctor(&s, &[]);
        assert_eq!(
            findings(&after).0,
            Some(0),
            "{kind} after the fix:\n{}\n{}",
            stdout(&fix),
            stdout(&after)
        );
        // A lane the fix restores is free to take, as the install leaves it.
        assert_eq!(
            s.count(&format!(
                "SELECT count(*) FROM {} WHERE lease_owner IS NOT NULL",
                s.table("lanes")
            )),
            0,
            "{kind}: lanes with an owner after the fix:\n{}",
            stdout(&fix)
        );
    }
}

#[test]
fn health_findings_are_warnings_with_advice() {
    let s = TestSchema::installed("doctor_health");
    s.publish(&[serde_json::json!({"id": "e1", "type": "t", "handlers": ["billing"]})]);
    s.cmd()
        .args([
            "run",
            "--handler",
            "billing",
            "--exec",
            "exit 65",
            "--drain",
        ])
        .assert()
        .success();
    // A lane left behind by a worker that died.
    s.exec(&format!(
        "UPDATE {} SET lease_owner = 'gone', lease_expires_at = now() - interval '1 minute' WHERE lane = 9",
        s.table("lanes")
    ));
    let out = s
        .cmd()
        .args(["--no-prepared-statements", "doctor"])
        .output()
        .unwrap();
    let (code, rows) = findings(&out);
    let warnings: Vec<&String> = rows.iter().filter(|r| r.starts_with("warn")).collect();
    assert_eq!(
        (code, warnings),
        (
            Some(3),
            vec![
                &"warn session postgres".to_owned(),
                &"warn dead billing".to_owned(),
                &"warn leases lanes".to_owned()
            ]
        ),
        "{}",
        stdout(&out)
    );
    let text = stdout(&out);
    for advice in [
        "1 dead letters; see why with `relaybus dead list --handler billing`, then requeue or purge them",
        "1 lanes are held by expired leases of gone; their workers died or froze",
        "ALTER ROLE \"postgres\" SET jit = off",
    ] {
        assert!(text.contains(advice), "{advice}\n{text}");
    }
}

#[test]
fn doctor_on_mongodb_names_drift_and_its_mongosh_fix_repairs_it() {
    let healthy = TestMongo::installed("doctor_mongo_healthy");
    let out = healthy.cmd().arg("doctor").output().unwrap();
    assert_eq!(
        findings(&out),
        (
            Some(0),
            [
                "ok table collections",
                "ok index indexes",
                "ok lanes relaybus_lanes",
                "ok version relaybus_schema",
                "ok parking relaybus_deliveries",
                "ok publish relaybus_deliveries",
                "ok leases lanes"
            ]
            .map(String::from)
            .to_vec()
        ),
        "{}",
        stdout(&out)
    );
    // Two deliveries of key `k`, in its lane, of events that list them: only parked.
    let parked = format!(
        "d.relaybus_events.insertMany([{{_id: 'e1', type: 't', key: 'k', handlers: ['h']}}, {{_id: 'e2', type: 't', key: 'k', handlers: ['h']}}]); \
         d.relaybus_deliveries.insertMany([{{_id: 'a', eventId: 'e1', handler: 'h', laneId: {lane}, key: 'k', sequence: 1, status: 'pending', lane: 'parked', dueAt: new Date()}}, {{_id: 'b', eventId: 'e2', handler: 'h', laneId: {lane}, key: 'k', sequence: 2, status: 'pending', lane: 'parked', dueAt: new Date()}}])",
        lane = relaybus::store::lane::lane_of(Some("k"), "")
    );
    let drifts: [(&str, &str, &str); 7] = [
        ("missing", "d.relaybus_completions.drop()", "FAIL table relaybus_completions"),
        ("redefined", "d.relaybus_deliveries.dropIndex('dead_updated'); d.relaybus_deliveries.createIndex({updatedAt: 1}, {name: 'dead_updated'})", "FAIL index relaybus_deliveries.dead_updated"),
        ("lanes", "d.relaybus_lanes.deleteOne({_id: 9}); d.relaybus_lanes.insertOne({_id: 300, epoch: 0})", "FAIL lanes relaybus_lanes"),
        ("unsound", "d.relaybus_lanes.updateOne({_id: 7}, {$unset: {epoch: ''}}); d.relaybus_lanes.updateOne({_id: 8}, {$set: {inFlight: 'x'}})", "FAIL lanes relaybus_lanes"),
        ("version", "d.relaybus_schema.deleteOne({_id: 'version'})", "FAIL version relaybus_schema"),
        ("retired", "d.relaybus_deliveries.createIndex({status: 1, lane: 1, dueAt: 1}, {name: 'old_claim'})", "FAIL index relaybus_deliveries.old_claim"),
        ("parked", &parked, "FAIL parking relaybus_deliveries"),
    ];
    for (kind, breaks, finding) in drifts {
        let m = TestMongo::installed(&format!("doctor_mongo_{kind}"));
        mongosh(&format!(
            "const d = db.getSiblingDB('{}'); {breaks}",
            m.name
        ));
        let out = m.cmd().arg("doctor").output().unwrap();
        let (code, rows) = findings(&out);
        let failing: Vec<&String> = rows.iter().filter(|r| !r.starts_with("ok ")).collect();
        assert_eq!(
            (code, failing),
            (Some(1), vec![&finding.to_owned()]),
            "{kind}: {}",
            stdout(&out)
        );
        let fix = stdout(&m.cmd().args(["doctor", "--fix-sql"]).output().unwrap());
        mongosh(&fix);
        let after = m.cmd().arg("doctor").output().unwrap();
        assert_eq!(
            findings(&after).0,
            Some(0),
            "{kind} after the fix:\n{fix}\n{}",
            stdout(&after)
        );
    }
    // An application's index is listed, and kept.
    let m = TestMongo::installed("doctor_mongo_foreign");
    mongosh(&format!(
        "db.getSiblingDB('{}').relaybus_deliveries.createIndex({{handler: 1, createdAt: -1}}, {{name: 'app_by_handler'}})",
        m.name
    ));
    let out = m.cmd().arg("doctor").output().unwrap();
    let (code, rows) = findings(&out);
    let index: Vec<&String> = rows.iter().filter(|r| r.contains(" index ")).collect();
    assert_eq!(
        (code, index),
        (
            Some(3),
            vec![
                &"ok index indexes".to_owned(),
                &"warn index relaybus_deliveries.app_by_handler".to_owned()
            ]
        ),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(r#"not relaybus's: {"handler":1,"createdAt":-1}"#),
        "{}",
        stdout(&out)
    );
    let _ = mongo_url();
}
