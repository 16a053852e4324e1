//! The operator's commands against a real store populated by `publish` and `run`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::scenario::Target;
use crate::common::{
    finish, on_a_terminal, signal, spawn_worker, stderr, stdout, wait_in_flight, wait_until,
    TestSchema,
};

fn json_out(s: &TestSchema, args: &[&str]) -> Value {
    let out = s.cmd().arg("--json").args(args).output().unwrap();
    assert!(out.status.success(), "{:?}: {}", args, stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The deliveries of a listing's JSON.
fn listed(s: &TestSchema, args: &[&str]) -> Value {
    json_out(s, args)["deliveries"].clone()
}

/// Buries every delivery of `handler` through a worker whose command exits 65.
fn bury(s: &TestSchema, handler: &str, error: &str) {
    s.cmd()
        .args([
            "run",
            "--handler",
            handler,
            "--exec",
            &format!("cat >/dev/null; echo '{error}' >&2; exit 65"),
            "--drain",
        ])
        .timeout(Duration::from_secs(30))
        .assert()
        .success();
}

fn field<'a>(rows: &'a Value, name: &str) -> Vec<&'a str> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r[name].as_str().unwrap_or("-"))
        .collect()
}

#[test]
fn listings_filter_by_status_handler_key_event_and_type() {
    let s = TestSchema::installed("admin_list");
    s.publish(&[
        json!({"id": "e1", "type": "order.paid", "key": "k1", "handlers": ["billing", "email"]}),
        json!({"id": "e2", "type": "order.paid", "key": "k2", "handlers": ["billing"]}),
        json!({"id": "e3", "type": "user.new", "handlers": ["email"]}),
    ]);
    bury(&s, "email", "smtp down");
    let all = listed(&s, &["deliveries", "list"]);
    assert_eq!(
        all.as_array()
            .unwrap()
            .iter()
            .map(|r| format!(
                "{} {} {}",
                r["event_id"].as_str().unwrap(),
                r["handler"].as_str().unwrap(),
                r["status"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        [
            "e1 billing pending",
            "e1 email dead",
            "e2 billing pending",
            "e3 email dead"
        ]
    );
    assert_eq!(
        field(
            &listed(&s, &["deliveries", "list", "--status", "dead"]),
            "event_id"
        ),
        ["e1", "e3"]
    );
    assert_eq!(
        field(
            &listed(
                &s,
                &["deliveries", "list", "--status", "pending", "--key", "k2"]
            ),
            "event_id"
        ),
        ["e2"]
    );
    assert_eq!(
        field(
            &listed(
                &s,
                &[
                    "deliveries",
                    "list",
                    "--handler",
                    "email",
                    "--type",
                    "user.new"
                ]
            ),
            "event_id"
        ),
        ["e3"]
    );
    assert_eq!(
        field(
            &listed(
                &s,
                &["deliveries", "list", "--event", "e1", "--status", "pending"]
            ),
            "handler"
        ),
        ["billing"]
    );
    // Pages: one row at a time, each page naming where the next starts.
    let mut pages = vec![];
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["deliveries", "list", "--limit", "2"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let page = json_out(&s, &args);
        pages.push(field(&page["deliveries"], "event_id").join(" "));
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, ["e1 e1", "e2 e3"]);
    let out = s
        .cmd()
        .args(["deliveries", "list", "--limit", "1"])
        .output()
        .unwrap();
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    assert!(
        stderr(&out).starts_with("showing the first 1; the next page: --after "),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        listed(&s, &["deliveries", "list", "--status", "processing"]),
        json!([])
    );
    s.cmd()
        .args(["deliveries", "list", "--status", "completed"])
        .assert()
        .success()
        .stdout("no deliveries match\n");
    s.cmd()
        .args(["dead", "list", "--handler", "billing"])
        .assert()
        .success()
        .stdout("no dead deliveries\n");
    let dead = s.cmd().args(["dead", "list"]).output().unwrap();
    let text = stdout(&dead);
    assert!(text.starts_with("ID "), "{text}");
    assert_eq!(text.lines().count(), 3);
    assert!(
        text.lines()
            .skip(1)
            .all(|l| l.ends_with("exit 65: smtp down")),
        "{text}"
    );

    let event = json_out(&s, &["events", "show", "e1"]);
    assert_eq!(event["handlers"], json!(["billing", "email"]));
    assert_eq!(field(&event["deliveries"], "status"), ["pending", "dead"]);
    let id = all[0]["id"].as_str().unwrap();
    let shown = json_out(&s, &["deliveries", "show", id]);
    assert_eq!(
        (
            shown["status"].as_str(),
            shown["attempts"].as_i64(),
            shown["lease_token"].is_null()
        ),
        (Some("pending"), Some(0), true)
    );
    let out = s
        .cmd()
        .args(["deliveries", "show", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "error: no delivery has the id `nope`, nor one that begins or ends with it; a completed delivery is deleted (`relaybus deliveries list --status completed` lists the history, kept by workers run with --completion-history)\n");
}

/// A table shows an id's last 12 characters: that, or any unique start or end of an id, names
/// it in `deliveries show`, `events show`, `dead requeue --id` and `deliveries list --event`;
/// one that several ids share is refused, naming them.
#[test]
fn a_short_id_as_a_table_shows_it_names_the_delivery() {
    let s = TestSchema::installed("short_ids");
    s.publish(&[
        json!({"id": "order-0001", "type": "t", "handlers": ["billing"]}),
        json!({"id": "order-0002", "type": "t", "handlers": ["billing"]}),
    ]);
    bury(&s, "billing", "boom");
    let ids = s.rows(&format!(
        "SELECT id FROM {} ORDER BY id",
        s.table("deliveries")
    ));
    let listed = on_a_terminal(&s, 200, "dead list", b"");
    let shown = format!("…{}", &ids[0][ids[0].len() - 12..]);
    assert!(listed.contains(&shown), "{listed}");
    let short = &shown["…".len()..];
    let out = s
        .cmd()
        .args(["deliveries", "show", short, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["id"], ids[0].as_str());
    let out = s
        .cmd()
        .args(["events", "show", "0002", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let event: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(event["id"], "order-0002");
    let several = s.cmd().args(["events", "show", "order"]).output().unwrap();
    assert_eq!(
        (several.status.code(), stderr(&several)),
        (
            Some(2),
            "error: the id `order` matches several events (`order-0001`, `order-0002`); give more of it\n".to_owned()
        )
    );
    let out = s
        .cmd()
        .args(["dead", "requeue", "--id", short, "--yes"])
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out),
        "requeued 1 of 1 matching dead deliveries\n",
        "{}",
        stderr(&out)
    );
}

#[test]
fn processing_lanes_and_stats_are_derived_from_live_leases() {
    let s = TestSchema::installed("admin_lanes");
    s.publish(&[
        json!({"id": "a1", "type": "t", "key": "k", "handlers": ["slow"]}),
        json!({"id": "a2", "type": "t", "key": "k", "handlers": ["slow"]}),
        json!({"id": "b1", "type": "t", "handlers": ["other"]}),
    ]);
    bury(&s, "other", "nope");
    let marker = format!("{}.{}", 400 + std::process::id() % 100, std::process::id());
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "slow",
            "--exec",
            &format!("cat >/dev/null; exec sleep {marker}"),
            "--shutdown-grace",
            "100ms",
        ],
    );
    wait_in_flight(&s, 1);
    // a1 runs; a2 waits behind it (same key): pending, not processing.
    assert_eq!(
        field(
            &listed(&s, &["deliveries", "list", "--status", "processing"]),
            "event_id"
        ),
        ["a1"]
    );
    assert_eq!(
        field(
            &listed(&s, &["deliveries", "list", "--status", "pending"]),
            "event_id"
        ),
        ["a2"]
    );
    let lanes = json_out(&s, &["lanes"]);
    assert_eq!(
        lanes["summary"],
        json!({"held": 1, "owners": 1, "expired": 0, "uncharged": 0})
    );
    let lane = &lanes["lanes"].as_array().unwrap()[0];
    assert_eq!(
        (
            lane["in_flight"].as_i64(),
            lane["pending"].as_i64(),
            lane["expired"].as_bool()
        ),
        (Some(1), Some(2), Some(false))
    );
    assert_eq!(
        json_out(&s, &["lanes", "--all"])["lanes"]
            .as_array()
            .unwrap()
            .len(),
        256
    );
    let stats = json_out(&s, &["stats"]);
    let rows: Vec<String> = stats
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} due={} scheduled={} processing={} dead={} completed={}",
                r["handler"].as_str().unwrap(),
                r["due"],
                r["scheduled"],
                r["processing"],
                r["dead"],
                r["completed"]
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            "other due=0 scheduled=0 processing=0 dead=1 completed=0",
            "slow due=1 scheduled=0 processing=1 dead=0 completed=0"
        ]
    );
    let table = stdout(&s.cmd().arg("stats").output().unwrap());
    assert_eq!(
        table.lines().next().unwrap(),
        "HANDLER  STATE    DUE  SCHEDULED  PROCESSING  DEAD  COMPLETED  LAG"
    );
    assert!(
        table
            .lines()
            .last()
            .unwrap()
            .starts_with("TOTAL             1    0          1           1     0          "),
        "{table}"
    );
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    finish(worker, Duration::from_secs(30));
    let lanes = stdout(&s.cmd().arg("lanes").output().unwrap());
    assert!(
        lanes.ends_with("0 lanes held by 0 owners, 0 expired leases\n"),
        "{lanes}"
    );
}

#[test]
fn requeue_selects_only_dead_deliveries_and_asks_first() {
    let s = TestSchema::installed("admin_requeue");
    s.publish(&[
        json!({"id": "e1", "type": "order.paid", "handlers": ["billing", "crm"]}),
        json!({"id": "e2", "type": "user.new", "handlers": ["billing", "crm"]}),
        json!({"id": "e3", "type": "user.new", "handlers": ["crm", "other"]}),
    ]);
    bury(&s, "billing", "HTTP 503 from billing");
    bury(&s, "crm", "crm rejected");
    let out = s.cmd().args(["dead", "requeue"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("error: the following required arguments were not provided:\n  <--id <ID>|--handler <NAME>|--type <TYPE>|--error-contains <TEXT>|--all>\n"),
        "{}",
        stderr(&out)
    );
    // A dry run shows what it selects: the count, then some of the deliveries.
    let out = s
        .cmd()
        .args(["dead", "requeue", "--error-contains", "503", "--dry-run"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "for instance:\n");
    let shown: Vec<Vec<String>> = stdout(&out)
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert_eq!(
        shown[0].join(" "),
        "2 dead deliveries match; dry run, nothing requeued"
    );
    let events: Vec<(&str, &str)> = shown[2..]
        .iter()
        .map(|r| (r[1].as_str(), r[2].as_str()))
        .collect();
    assert_eq!(events, [("e1", "billing"), ("e2", "billing")]);
    assert!(shown[1].starts_with(&["ID".to_owned(), "EVENT".into()]));
    let out = s
        .cmd()
        .args(["dead", "requeue", "--handler", "crm", "--type", "user.new"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "error: Requeue 2 dead deliveries? Not confirmed: standard input is not a terminal; rerun with --yes to proceed\n");
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE status = 'dead'",
            s.table("deliveries")
        )),
        5
    );
    s.cmd()
        .args([
            "dead",
            "requeue",
            "--handler",
            "crm",
            "--type",
            "user.new",
            "--yes",
        ])
        .assert()
        .success()
        .stdout("requeued 2 of 2 matching dead deliveries\n");
    // `other` is pending: no selector ever touches it.
    let r = json_out(&s, &["dead", "requeue", "--all", "--yes"]);
    assert_eq!(
        (r["matched"].as_i64(), r["requeued"].as_i64()),
        (Some(3), Some(3))
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler, status, attempts, claims, last_error FROM {} ORDER BY 1, 2",
            s.table("deliveries")
        )),
        [
            "e1|billing|pending|0|2|exit 65: HTTP 503 from billing",
            "e1|crm|pending|0|2|exit 65: crm rejected",
            "e2|billing|pending|0|2|exit 65: HTTP 503 from billing",
            "e2|crm|pending|0|2|exit 65: crm rejected",
            "e3|crm|pending|0|2|exit 65: crm rejected",
            "e3|other|pending|0|0|NULL",
        ]
    );
    s.cmd()
        .args(["dead", "requeue", "--all", "--yes"])
        .assert()
        .success()
        .stdout("no dead deliveries match; nothing requeued\n");
}

/// Runs a command of `s` on a 200-column terminal and answers its question with "n".
fn answer_no_on_a_terminal(s: &TestSchema, args: &str) -> String {
    on_a_terminal(s, 200, args, b"n")
}

/// On an 80-column terminal every listing fits, and nothing is cut: long errors and keys (CJK
/// text included) wrap within their columns, ids and short columns stay whole on a row's first
/// line. No line is wider than the terminal, and every row is there.
#[test]
fn listings_fit_an_80_column_terminal() {
    let s = TestSchema::installed("admin_80_columns");
    let long_key = format!("customer-{}-鍵キー", "x".repeat(60));
    s.publish(&[
        json!({"id": "e1", "type": "order.paid.with.a.long.type.name", "key": long_key, "handlers": ["billing", "crm"]}),
        json!({"id": "e2", "type": "user.new", "key": "héllo-ключ-鍵", "handlers": ["billing"]}),
        json!({"id": "e3", "type": "user.new", "handlers": ["billing"]}),
    ]);
    bury(
        &s,
        "billing",
        &format!("HTTP 503 {}", "upstream timed out ".repeat(10)),
    );
    let ids = s.rows(&format!(
        "SELECT id FROM {} ORDER BY id",
        s.table("deliveries")
    ));
    // What the terminal showed: the lines, and the first columns of each row's first line
    // (continuation lines of wrapped cells start with spaces).
    let shown = |args: &str, columns: usize| -> (String, Vec<Vec<String>>) {
        let text = on_a_terminal(&s, 80, args, b"");
        let too_wide: Vec<&str> = text
            .lines()
            .filter(|l| unicode_width::UnicodeWidthStr::width(*l) > 80)
            .collect();
        assert_eq!(too_wide, Vec::<&str>::new(), "{args}:\n{text}");
        let cells = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with(' '))
            .map(|l| {
                l.split_whitespace()
                    .take(columns)
                    .map(str::to_owned)
                    .collect()
            })
            .collect();
        (text, cells)
    };
    let tail = |id: &String| format!("…{}", &id[id.len() - 12..]);
    let (text, rows) = shown("dead list", 3);
    assert_eq!(
        rows,
        [
            vec!["ID".to_owned(), "EVENT".into(), "HANDLER".into()],
            vec![tail(&ids[0]), "e1".into(), "billing".into()],
            vec![tail(&ids[2]), "e2".into(), "billing".into()],
            vec![tail(&ids[3]), "e3".into(), "billing".into()],
        ],
        "{text}"
    );
    // Whole: every word of each error (three rows), every character of the long key, and the
    // only ellipses are the shortened ids'.
    assert_eq!(text.matches("upstream").count(), 30, "{text}");
    let xs = |text: &str| text.replace("exit", "").matches('x').count();
    assert_eq!(xs(&text), 60, "{text}");
    assert!(text.contains("鍵キー"), "{text}");
    assert!(text.contains(" héllo-ключ-鍵 "), "{text}");
    assert_eq!(text.matches('…').count(), 3, "{text}");
    let (text, rows) = shown("deliveries list", 4);
    let row = |i: usize, event: &str, handler: &str, status: &str| {
        vec![tail(&ids[i]), event.into(), handler.into(), status.into()]
    };
    assert_eq!(
        rows[1..],
        [
            row(0, "e1", "billing", "dead"),
            row(1, "e1", "crm", "pending"),
            row(2, "e2", "billing", "dead"),
            row(3, "e3", "billing", "dead"),
        ],
        "{text}"
    );
    assert_eq!(xs(&text), 120, "{text}");
    let (text, rows) = shown("stats", 2);
    assert_eq!(
        rows,
        [
            ["HANDLER", "STATE"],
            ["billing", "running"],
            ["crm", "running"],
            ["TOTAL", "1"]
        ],
        "{text}"
    );
    let (text, rows) = shown("lanes", 1);
    assert_eq!(rows.len(), 3, "{text}");
    assert_eq!(rows[0], ["LANE"], "{text}");
    // A lane a dead worker of a long name holds: its name wraps, the lease stays whole.
    s.exec(&format!(
        "UPDATE {} SET lease_owner = 'worker-on-a-host-with-a-long-name:4242:abcdef', \
                lease_expires_at = now() - interval '1 minute' \
          WHERE lane = (SELECT lane FROM {} WHERE status = 'pending')",
        s.table("lanes"),
        s.table("deliveries")
    ));
    let (text, _) = shown("lanes", 1);
    assert!(text.contains(" LEASE UNTIL "), "{text}");
    assert!(text.contains(" (expired) "), "{text}");
    // The owner column's pieces, line after line, make the whole name.
    let at = text.lines().next().unwrap().find("OWNER").unwrap();
    let owner: String = text
        .lines()
        .skip(1)
        .take_while(|l| !l.contains(" lanes held by "))
        .map(|l| {
            l.get(at..)
                .unwrap_or("")
                .split("  ")
                .next()
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert_eq!(
        owner, "worker-on-a-host-with-a-long-name:4242:abcdef",
        "{text}"
    );
    // Advice wraps instead of being cut (doctor exits 3: a warning).
    let (text, _) = shown("doctor || true", 1);
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains("the next claim takes the lanes over"),
        "{text}"
    );
    let (text, _) = shown(&format!("deliveries show {}", ids[0]), 1);
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains(&format!(
            "exit 65: HTTP 503 {}",
            "upstream timed out ".repeat(10).trim_end()
        )),
        "{text}"
    );
    assert!(
        joined.contains("lane owner worker-on-a-host-with-a-long-name:4242:abcdef"),
        "{text}"
    );
}

/// The two rows of deliveries a confirmation showed after "for instance:" and the table's
/// header, asserting that the question followed and that answering no changed nothing.
fn sample_before<'a>(text: &'a str, question: &str) -> Vec<&'a str> {
    let shown: Vec<&str> = text
        .lines()
        // The key typed ahead is echoed first.
        .skip_while(|l| !l.ends_with("for instance:"))
        .take_while(|l| !l.contains(question))
        .collect();
    assert_eq!(shown.len(), 4, "{text}");
    assert!(shown[1].starts_with("ID "), "{text}");
    assert!(text.contains(question), "{text}");
    assert!(
        text.ends_with("not confirmed; nothing was changed\n"),
        "{text}"
    );
    shown[2..].to_vec()
}

fn dead(s: &TestSchema) -> i64 {
    s.count(&format!(
        "SELECT count(*) FROM {} WHERE status = 'dead'",
        s.table("deliveries")
    ))
}

/// Asked on a terminal (a pty from `script`), a requeue shows some of the deliveries it selects
/// before the question; answering no changes nothing and exits 0.
#[test]
fn a_requeue_asked_on_a_terminal_shows_a_sample_and_no_changes_nothing() {
    let s = TestSchema::installed("admin_requeue_tty");
    s.publish(&[
        json!({"id": "e1", "type": "order.paid", "handlers": ["billing", "crm"]}),
        json!({"id": "e2", "type": "user.new", "handlers": ["billing"]}),
    ]);
    bury(&s, "billing", "HTTP 503 from billing");
    bury(&s, "crm", "crm rejected");
    let text = answer_no_on_a_terminal(&s, "dead requeue --error-contains 503");
    let sample = sample_before(&text, "Requeue 2 dead deliveries?");
    assert!(
        sample
            .iter()
            .all(|l| l.contains("billing") && l.contains("exit 65: HTTP 503")),
        "{text}"
    );
    assert_eq!(dead(&s), 3);
}

#[test]
fn a_requeue_racing_a_running_worker_loses_nothing_and_runs_nothing_twice() {
    let s = TestSchema::installed("admin_requeue_race");
    let dead: Vec<Value> = (0..40).map(|i| json!({"id": format!("d{i:02}"), "type": "t", "key": format!("k{}", i % 4), "handlers": ["h"]})).collect();
    s.publish(&dead);
    bury(&s, "h", "first try fails");
    let live: Vec<Value> = (0..40)
        .map(|i| json!({"id": format!("l{i:02}"), "type": "t", "handlers": ["h"]}))
        .collect();
    s.publish(&live);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled");
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &format!(
                "cat >/dev/null; sleep 0.05; echo $RELAYBUS_EVENT_ID >> {}",
                log.display()
            ),
            "--poll-interval",
            "20ms",
            "--concurrency",
            "8",
            "--drain",
        ],
    );
    // Requeue while the worker is busy with the live deliveries.
    wait_until(
        "the worker's first delivery",
        Duration::from_secs(20),
        || log.exists(),
    );
    s.cmd()
        .args(["dead", "requeue", "--all", "--yes"])
        .assert()
        .success()
        .stdout("requeued 40 of 40 matching dead deliveries\n");
    let out = finish(worker, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "handled 80, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    let mut handled: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    handled.sort();
    let mut expected: Vec<String> = (0..40)
        .flat_map(|i| [format!("d{i:02}"), format!("l{i:02}")])
        .collect();
    expected.sort();
    assert_eq!(handled, expected);
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

#[test]
fn purge_keeps_every_pending_delivery_and_its_event() {
    let s = TestSchema::installed("admin_purge");
    s.publish(&[
        json!({"id": "pending-old", "type": "t", "handlers": ["h"]}),
        json!({"id": "done-old", "type": "t", "handlers": ["done"]}),
        json!({"id": "dead-old", "type": "t", "handlers": ["dies"]}),
        json!({"id": "mixed-old", "type": "t", "handlers": ["dies", "h"]}),
        json!({"id": "done-new", "type": "t", "handlers": ["done"]}),
    ]);
    s.cmd()
        .args([
            "run",
            "--handler",
            "done",
            "--noop",
            "--drain",
            "--completion-history",
        ])
        .assert()
        .success();
    bury(&s, "dies", "gone");
    s.exec(&format!(
        "UPDATE {} SET created_at = now() - interval '40 days' WHERE id LIKE '%-old'",
        s.table("events")
    ));
    s.exec(&format!(
        "UPDATE {} SET updated_at = now() - interval '40 days' WHERE status = 'dead'",
        s.table("deliveries")
    ));
    s.exec(&format!(
        "UPDATE {} SET completed_at = now() - interval '40 days' WHERE event_id = 'done-old'",
        s.table("completions")
    ));
    let out = s.cmd().arg("purge").output().unwrap();
    assert_eq!(
        stderr(&out),
        "error: nothing to purge: give --completed-older-than and/or --dead-older-than\n"
    );
    let purge = [
        "purge",
        "--completed-older-than",
        "30d",
        "--dead-older-than",
        "30d",
    ];
    s.cmd().args(purge).arg("--dry-run").assert().success()
        .stdout("would delete 2 dead deliveries, 1 completion history entries and 2 events; dry run, nothing deleted\n");
    let out = s.cmd().args(purge).output().unwrap();
    assert!(stderr(&out).contains("Not confirmed"), "{}", stderr(&out));
    s.cmd()
        .args(purge)
        .args(["--yes", "--batch-size", "1"])
        .assert()
        .success()
        .stdout("deleted 2 dead deliveries, 1 completion history entries and 2 events\n");
    assert_eq!(
        s.rows(&format!("SELECT id FROM {} ORDER BY id", s.table("events"))),
        ["done-new", "mixed-old", "pending-old"]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler, status FROM {} ORDER BY 1",
            s.table("deliveries")
        )),
        ["mixed-old|h|pending", "pending-old|h|pending"]
    );
    assert_eq!(
        s.rows(&format!("SELECT event_id FROM {}", s.table("completions"))),
        ["done-new"]
    );
    s.cmd()
        .args(purge)
        .arg("--yes")
        .assert()
        .success()
        .stdout("nothing to purge\n");
}

#[test]
fn completed_rows_kept_from_0_1_are_listed_counted_and_purged() {
    let s = TestSchema::with_fixture_0_1("admin_v01");
    s.cmd().args(["upgrade", "--yes"]).assert().success();
    assert_eq!(
        field(
            &listed(&s, &["deliveries", "list", "--status", "completed"]),
            "event_id"
        ),
        ["ev-1", "ev-6"]
    );
    let stats = json_out(&s, &["stats"]);
    assert_eq!(
        stats
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{}:{}", r["handler"].as_str().unwrap(), r["completed"]))
            .collect::<Vec<_>>(),
        ["billing:1", "crm:1", "email:0"]
    );
    s.cmd()
        .args(["purge", "--completed-older-than", "1d", "--yes"])
        .assert()
        .success()
        .stdout("deleted 2 completed deliveries and 1 events\n");
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE status = 'completed'",
            s.table("deliveries")
        )),
        0
    );
}

/// Asked on a terminal, a purge of dead letters shows some of those it would delete (only the
/// old enough ones) before the question; answering no deletes nothing.
#[test]
fn a_purge_asked_on_a_terminal_shows_a_sample_of_the_old_dead_and_no_deletes_nothing() {
    let s = TestSchema::installed("admin_purge_tty");
    s.publish(&[
        json!({"id": "old-1", "type": "t", "handlers": ["dies"]}),
        json!({"id": "old-2", "type": "t", "handlers": ["dies"]}),
        json!({"id": "recent", "type": "t", "handlers": ["dies"]}),
    ]);
    bury(&s, "dies", "gone for good");
    s.exec(&format!(
        "UPDATE {} SET updated_at = now() - interval '40 days' WHERE event_id LIKE 'old-%'",
        s.table("deliveries")
    ));
    let text = answer_no_on_a_terminal(&s, "purge --dead-older-than 30d");
    let sample = sample_before(&text, "Delete 2 dead deliveries?");
    assert!(
        sample[0].contains("old-1") && sample[1].contains("old-2"),
        "{text}"
    );
    assert_eq!(dead(&s), 3);
}

/// A handler name the store has never seen is a typo until said otherwise: every command that
/// takes one refuses it (exit 2), writing nothing, naming the closest handlers it knows.
/// `handlers pause --new` pauses a handler before its first event on purpose; `handlers
/// forget` removes the row of a handler with nothing left. A type no event has is only
/// warned about.
#[test]
fn an_unknown_handler_is_refused_everywhere_with_the_closest_names() {
    let s = TestSchema::installed("unknown_handler");
    s.publish(&[json!({"id": "e1", "type": "order.paid", "handlers": ["billing", "crm"]})]);
    let refused = "error: no handler `biling` in this store (no event names it, no delivery, \
                   no row in the handlers table); did you mean `billing`?\n";
    for args in [
        &["handlers", "pause", "biling", "--reason", "x"][..],
        &["handlers", "resume", "biling"],
        &["handlers", "close-breaker", "biling"],
        &["handlers", "forget", "biling"],
        &["dead", "list", "--handler", "biling"],
        &["deliveries", "list", "--handler", "biling"],
        &["dead", "requeue", "--handler", "biling", "--dry-run"],
    ] {
        let out = s.cmd().args(args).output().unwrap();
        assert_eq!(
            (out.status.code(), stderr(&out), stdout(&out)),
            (Some(2), refused.to_owned(), String::new()),
            "{args:?}"
        );
    }
    let far = s
        .cmd()
        .args(["handlers", "resume", "ledger"])
        .output()
        .unwrap();
    assert_eq!(
        stderr(&far),
        "error: no handler `ledger` in this store (no event names it, no delivery, no row in \
         the handlers table); the store's handlers: `billing`, `crm`\n"
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("handlers"))),
        0,
        "nothing was written"
    );
    // A handler every event names, whose deliveries are all done, is known.
    s.exec(&format!("DELETE FROM {}", s.table("deliveries")));
    s.cmd()
        .args(["dead", "list", "--handler", "crm"])
        .assert()
        .success()
        .stdout("no dead deliveries\n");
    s.cmd()
        .args([
            "handlers",
            "pause",
            "--new",
            "search-index",
            "--reason",
            "backfill first",
        ])
        .assert()
        .success();
    let again = s
        .cmd()
        .args(["handlers", "pause", "search-index", "--reason", "still"])
        .output()
        .unwrap();
    assert!(
        stdout(&again).starts_with("handler `search-index` was paused already, since "),
        "{}",
        stdout(&again)
    );
    s.cmd()
        .args(["handlers", "forget", "search-index"])
        .assert()
        .success()
        .stdout("forgot handler `search-index`: its row is gone\n");
    let warned = s
        .cmd()
        .args(["deliveries", "list", "--type", "order.payed"])
        .output()
        .unwrap();
    assert_eq!(
        (warned.status.code(), stderr(&warned)),
        (
            Some(0),
            "warning: no event has the type `order.payed`; nothing will match it\n".to_owned()
        )
    );
}
