//! The functions an application publishes with in its own transaction (`relaybus_publish`,
//! `relaybus_publish_many`): the rows `relaybus publish` writes, its refusals in its words, the
//! grants the README gives, and the README's examples run as they are written; on MongoDB, the
//! documents the README tells an application to write, and `doctor`'s checks of them.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use mongodb::bson::{doc, Bson};
use serde_json::{json, Value};

use crate::common::mongo::{mongosh, TestMongo};
use crate::common::scenario::Target;
use crate::common::{
    block_on, connect_to, finish, installed, rows_of, signal, stderr, stdout, wait_until, Spawned,
    TestDatabase, TestRole, TestSchema,
};

/// A ULID, as both the command and the functions generate ids.
const GENERATED: &str = "'^[0-9A-HJKMNP-TV-Z]{26}$'";

/// Publishes through `relaybus publish --json`: the ids it printed and the deliveries it
/// created, or its error message.
fn by_command(s: &TestSchema, events: &[Value]) -> Result<(Vec<String>, i64), String> {
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    let out = s
        .cmd()
        .args(["publish", "--json"])
        .write_stdin(lines.join("\n"))
        .output()
        .unwrap();
    if !out.status.success() {
        let error: Value = serde_json::from_str(&stderr(&out)).unwrap();
        return Err(error["error"]["message"].as_str().unwrap().to_owned());
    }
    let summary: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let ids = summary["ids"].as_array().unwrap();
    Ok((
        ids.iter().map(|i| i.as_str().unwrap().to_owned()).collect(),
        summary["deliveries"].as_i64().unwrap(),
    ))
}

/// Publishes through `relaybus_publish_many`: a row per event, or the error's SQLSTATE and
/// message.
fn by_function(s: &TestSchema, events: &[Value]) -> Result<Vec<(String, i32)>, (String, String)> {
    let sql = format!(
        "SELECT event_id, deliveries FROM {}($1::text::jsonb)",
        s.table("publish_many")
    );
    let events = Value::Array(events.to_vec()).to_string();
    match block_on(s.client.query(&sql, &[&events])) {
        Ok(rows) => Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect()),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
            Err((db.code().code().to_owned(), db.message().to_owned()))
        }
    }
}

/// What a store holds, generated ids spelled `new`: its events, deliveries and key sequences.
/// Every delivery must be in the lane of its key, or of its event id when it has none.
fn stored(s: &TestSchema) -> Vec<String> {
    let mask =
        |column: &str| format!("CASE WHEN {column} ~ {GENERATED} THEN 'new' ELSE {column} END");
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE lane <> \"{}\".relaybus_lane_of(coalesce(key, event_id)) \
               OR id !~ {GENERATED}",
            s.table("deliveries"),
            s.name
        )),
        0,
        "deliveries outside their lane, or with an id that is not a ULID"
    );
    [
        format!(
            "SELECT {}, type, key, payload, headers, handlers::text FROM {} ORDER BY 1, key",
            mask("id"),
            s.table("events")
        ),
        format!(
            "SELECT {}, handler, lane, key, sequence, status, attempts, claims, last_error, \
                    completed_at FROM {} ORDER BY key, sequence, 1, handler",
            mask("event_id"),
            s.table("deliveries")
        ),
        format!(
            "SELECT key, last_sequence FROM {} ORDER BY key",
            s.table("key_sequences")
        ),
    ]
    .iter()
    .flat_map(|sql| s.rows(sql))
    .collect()
}

fn masked(id: &str) -> String {
    let generated = id.len() == 26 && id.bytes().all(|b| b.is_ascii_alphanumeric());
    if generated { "new" } else { id }.to_owned()
}

/// The same events published by the command and by the function, in the same steps, leave the
/// same rows and report the same ids and deliveries: keyed, unkeyed, several handlers, an id
/// twice in one input, a generated id, a republish that adds a handler and one that adds none;
/// and a conflicting republish is refused by both with nothing of its call written.
#[test]
fn the_function_writes_the_rows_the_command_writes() {
    let command = TestSchema::installed("publish_sql_command");
    let function = TestSchema::installed("publish_sql_function");
    let steps = [
        vec![
            json!({"id": "e1", "type": "order.placed", "key": "k1", "payload": {"total": 42}, "headers": {"trace": "t1"}, "handlers": ["billing", "email"]}),
            json!({"id": "e2", "type": "order.viewed", "payload": [1, "two", null], "handlers": ["crm"]}),
            json!({"id": "e3", "type": "order.paid", "key": "k1", "handlers": ["billing"]}),
            json!({"id": "e1", "type": "order.placed", "key": "k1", "payload": {"total": 42}, "headers": {"trace": "t1"}, "handlers": ["email", "audit"]}),
            json!({"type": "order.shipped", "key": "k2", "payload": serde_json::from_str::<Value>("1.50").unwrap(), "handlers": ["billing"]}),
        ],
        vec![
            json!({"id": "e1", "type": "order.placed", "key": "k1", "payload": {"total": 42}, "headers": {"trace": "t1"}, "handlers": ["billing", "ledger"]}),
            json!({"id": "e2", "type": "order.viewed", "payload": [1, "two", null], "handlers": ["crm"]}),
            json!({"id": "e5", "type": "order.paid", "key": "k1", "handlers": ["billing", "email"]}),
        ],
    ];
    let returned = [
        vec![("e1", 3), ("e2", 1), ("e3", 1), ("new", 1)],
        vec![("e1", 1), ("e2", 0), ("e5", 2)],
    ];
    for (events, expected) in steps.iter().zip(returned) {
        let (ids, deliveries) = by_command(&command, events).unwrap();
        let rows = by_function(&function, events).unwrap();
        let rows: Vec<(String, i32)> = rows.into_iter().map(|(id, n)| (masked(&id), n)).collect();
        let expected: Vec<(String, i32)> = expected
            .iter()
            .map(|(id, n)| (id.to_string(), *n))
            .collect();
        assert_eq!(rows, expected);
        let mut listed: Vec<String> = ids.iter().map(|id| masked(id)).collect();
        listed.dedup();
        assert_eq!(
            listed,
            rows.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>()
        );
        assert_eq!(
            deliveries,
            i64::from(rows.iter().map(|(_, n)| n).sum::<i32>())
        );
    }
    let after = stored(&command);
    assert_eq!(stored(&function), after);
    assert_eq!(
        after,
        [
            r#"e1|order.placed|k1|{"total": 42}|{"trace": "t1"}|{billing,email,audit,ledger}"#,
            r#"e2|order.viewed|NULL|[1, "two", null]|{}|{crm}"#,
            "e3|order.paid|k1|NULL|{}|{billing}",
            "e5|order.paid|k1|NULL|{}|{billing,email}",
            r#"new|order.shipped|k2|1.50|{}|{billing}"#,
            "e1|audit|193|k1|1|pending|0|0|NULL|NULL",
            "e1|billing|193|k1|1|pending|0|0|NULL|NULL",
            "e1|email|193|k1|1|pending|0|0|NULL|NULL",
            "e3|billing|193|k1|2|pending|0|0|NULL|NULL",
            "e1|ledger|193|k1|3|pending|0|0|NULL|NULL",
            "e5|billing|193|k1|4|pending|0|0|NULL|NULL",
            "e5|email|193|k1|4|pending|0|0|NULL|NULL",
            "new|billing|8|k2|1|pending|0|0|NULL|NULL",
            "e2|crm|150|NULL|NULL|pending|0|0|NULL|NULL",
            "k1|4",
            "k2|1",
        ]
    );

    // A new event beside a republish of e2 with another payload: both refuse, naming e2.
    let conflicting = [
        json!({"id": "e6", "type": "order.placed", "handlers": ["billing"]}),
        json!({"id": "e2", "type": "order.viewed", "payload": [2], "handlers": ["crm"]}),
    ];
    let refused = by_command(&command, &conflicting).unwrap_err();
    assert!(
        refused
            .contains("event `e2` was published before with another type, key, payload or headers"),
        "{refused}"
    );
    assert_eq!(
        by_function(&function, &conflicting),
        Err((
            "23RB1".to_owned(),
            "relaybus: event `e2` was published before with another type, key, payload or \
             headers (publish it again only with the same content, to add handlers; or use a new \
             id); nothing was published"
                .to_owned()
        ))
    );
    // One id twice in a call with different content.
    let twice = [
        json!({"id": "e7", "type": "a", "handlers": ["billing"]}),
        json!({"id": "e7", "type": "b", "handlers": ["billing"]}),
    ];
    assert!(by_command(&command, &twice)
        .unwrap_err()
        .contains("event `e7` appears twice in the batch with different content"));
    assert_eq!(
        by_function(&function, &twice),
        Err((
            "23RB1".to_owned(),
            "relaybus: event `e7` appears twice in the call with different content; nothing \
             was published"
                .to_owned()
        ))
    );
    assert_eq!(stored(&command), after);
    assert_eq!(stored(&function), after);
}

/// Every event the command refuses, the function refuses with the same reason (SQLSTATE 22023),
/// naming its place in the call, and nothing of the call is written. A payload of exactly the
/// limit (its compact JSON text, as the command measures it) is published by both.
#[test]
fn the_function_refuses_what_the_command_refuses_in_its_words() {
    let command = TestSchema::installed("publish_sql_refuse_command");
    let function = TestSchema::installed("publish_sql_refuse_function");
    let long = "x".repeat(1025);
    // {"a": "..."} compact: 8 bytes around the string.
    let at_limit = json!({"a": "y".repeat((1 << 20) - 8)});
    let over_limit = json!({"a": "y".repeat((1 << 20) - 7)});
    let bad = [
        (json!([1]), "expected a JSON object"),
        (
            json!({"type": "t", "handlers": ["h"], "when": 1}),
            "unknown field `when` (expected id, type, key, payload, headers, handlers)",
        ),
        (
            json!({"id": 5, "type": "t", "handlers": ["h"]}),
            "`id` must be a string",
        ),
        (
            json!({"id": "", "type": "t", "handlers": ["h"]}),
            "`id` is empty",
        ),
        (json!({"type": "", "handlers": ["h"]}), "`type` is empty"),
        (
            json!({"type": ["t"], "handlers": ["h"]}),
            "`type` must be a string",
        ),
        (json!({"handlers": ["h"]}), "missing `type`"),
        (
            json!({"type": null, "key": 1, "handlers": ["h"]}),
            "missing `type`",
        ),
        (
            json!({"type": "t", "key": "", "handlers": ["h"]}),
            "`key` is empty",
        ),
        (
            json!({"type": "t", "key": 7, "handlers": ["h"]}),
            "`key` must be a string",
        ),
        (
            json!({"type": "t", "headers": ["a"], "handlers": ["h"]}),
            "`headers` must be an object",
        ),
        (
            json!({"type": "t", "handlers": "h"}),
            "`handlers` must be an array of strings",
        ),
        (
            json!({"type": "t", "handlers": ["h", ""]}),
            "`handlers` must hold non-empty strings",
        ),
        (
            json!({"type": "t", "handlers": [3]}),
            "`handlers` must hold non-empty strings",
        ),
        (
            json!({"type": "t", "handlers": []}),
            "no handlers: give `handlers`",
        ),
        (json!({"type": "t"}), "no handlers: give `handlers`"),
        (
            json!({"id": long, "type": "t", "handlers": ["h"]}),
            "`id` is 1025 bytes, over the limit of 1024",
        ),
        (
            json!({"type": "t", "key": long, "handlers": ["h"]}),
            "`key` is 1025 bytes, over the limit of 1024",
        ),
        (
            json!({"type": "t", "handlers": ["h", long]}),
            "`handler` is 1025 bytes, over the limit of 1024",
        ),
        (
            json!({"type": "t", "payload": over_limit, "handlers": ["h"]}),
            "payload is 1048577 bytes, over the limit of 1048576",
        ),
    ];
    let good = json!({"id": "ok", "type": "t", "handlers": ["h"]});
    for (event, reason) in &bad {
        let refused = by_command(&command, &[good.clone(), event.clone()]).unwrap_err();
        let said = refused
            .replace(" (--max-payload-bytes)", "")
            .replace(" (or --handler)", "");
        assert_eq!(
            said.split("; ").next().unwrap(),
            format!("invalid event on line 2: {reason}"),
            "{event}"
        );
        assert_eq!(
            by_function(&function, &[good.clone(), event.clone()]),
            Err((
                "22023".to_owned(),
                format!("relaybus: invalid event 2: {reason}; nothing was published")
            )),
            "{event}"
        );
    }
    for s in [&command, &function] {
        assert_eq!(
            s.count(&format!("SELECT count(*) FROM {}", s.table("events"))),
            0
        );
    }
    let event = json!({"id": "big", "type": "t", "payload": at_limit, "handlers": ["h"]});
    assert_eq!(
        by_command(&command, std::slice::from_ref(&event)),
        Ok((vec!["big".into()], 1))
    );
    assert_eq!(
        by_function(&function, &[event]),
        Ok(vec![("big".into(), 1)])
    );
    let not_array = format!("SELECT * FROM {}('{{}}')", function.table("publish_many"));
    let err = block_on(function.client.query(&not_array, &[])).unwrap_err();
    assert_eq!(
        err.as_db_error().unwrap().message(),
        "relaybus: `events` must be a JSON array of events"
    );
}

/// Ids the function generates are ULIDs in the order of the calls that made them, as the
/// command's are, and each delivery sits in the lane of its event id.
#[test]
fn generated_ids_are_time_ordered_ulids_in_their_lanes() {
    let s = TestSchema::installed("publish_sql_ids");
    let publish = format!(
        "SELECT event_id FROM {}(type => 't', payload => '{{}}', handlers => ARRAY['h'])",
        s.table("publish")
    );
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(s.query(&publish)[0].get::<_, String>(0));
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
    assert!(ids.iter().all(|id| masked(id) == "new"), "{ids:?}");
    stored(&s);
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE key IS NULL AND sequence IS NULL",
            s.table("deliveries")
        )),
        20
    );
}

/// Two open transactions publish the same new id: the second waits for the first, and fails
/// with a unique violation (23505) when it commits, as the README says; run again, it is a
/// republish that adds nothing.
#[test]
fn a_concurrent_publish_of_the_same_new_id_fails_with_a_unique_violation_then_republishes() {
    let s = TestSchema::installed("publish_sql_race");
    let publish = format!(
        "SELECT event_id, deliveries FROM {}(type => 't', payload => '1', handlers => ARRAY['h'], id => 'race')",
        s.table("publish")
    );
    let first = connect_to(&s.url);
    block_on(first.batch_execute("BEGIN")).unwrap();
    block_on(first.query(&publish, &[])).unwrap();
    let second = std::thread::spawn({
        let (url, publish) = (s.url.clone(), publish.clone());
        move || {
            let client = connect_to(&url);
            let failed = block_on(client.query(&publish, &[])).unwrap_err();
            let retried = block_on(client.query_one(&publish, &[])).unwrap();
            (
                failed.as_db_error().map(|e| e.code().code().to_owned()),
                (retried.get::<_, String>(0), retried.get::<_, i32>(1)),
            )
        }
    });
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query = '{}'",
        publish.replace('\'', "''")
    );
    wait_until(
        "the second publish to wait",
        Duration::from_secs(10),
        || s.count(&waiting) == 1,
    );
    block_on(first.batch_execute("COMMIT")).unwrap();
    assert_eq!(
        second.join().unwrap(),
        (Some("23505".to_owned()), ("race".to_owned(), 0))
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        1
    );
}

/// A role with only the grants the README gives publishes through the functions and can do
/// nothing else to the store: no insert, no read, no update. A role without the grants cannot
/// publish.
#[test]
fn a_role_with_the_readme_s_grants_publishes_and_nothing_more() {
    let db = TestDatabase::new("publish_sql_grants");
    let admin = connect_to(&db.url);
    let run = |args: &[&str]| {
        let out = crate::common::relaybus()
            .env("RELAYBUS_DATABASE_URL", &db.url)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    };
    run(&["setup"]);
    let app = TestRole::new("app", &db.url);
    let other = TestRole::new("other", &db.url);
    let grants =
        readme_block("REVOKE EXECUTE").replace(" TO app;", &format!(" TO \"{}\";", app.name));
    block_on(admin.batch_execute(&grants)).unwrap();
    let as_app = connect_to(&app.url());
    let publish = "SELECT * FROM relaybus_publish(type => 't', id => 'e1', payload => '{}', handlers => ARRAY['h'])";
    let row = block_on(as_app.query_one(publish, &[])).unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i32>(1)),
        ("e1".into(), 1)
    );
    let many = r#"SELECT * FROM relaybus_publish_many('[{"id": "e2", "type": "t", "key": "k", "handlers": ["h"]}]')"#;
    assert_eq!(block_on(as_app.query(many, &[])).unwrap().len(), 1);
    let denied = |client: &tokio_postgres::Client, sql: &str| {
        let e = block_on(client.batch_execute(sql)).unwrap_err();
        e.as_db_error().map(|d| d.code().code().to_owned())
    };
    let insufficient = Some("42501".to_owned());
    assert_eq!(
        denied(
            &as_app,
            "INSERT INTO relaybus_events (id, type, payload) VALUES ('x', 't', 'null')"
        ),
        insufficient
    );
    assert_eq!(
        denied(&as_app, "SELECT * FROM relaybus_deliveries"),
        insufficient
    );
    assert_eq!(
        denied(&as_app, "UPDATE relaybus_lanes SET epoch = epoch + 1"),
        insufficient
    );
    let as_other = connect_to(&other.url());
    assert_eq!(denied(&as_other, publish), insufficient);
    run(&["doctor"]);
    let stored = rows_of(&admin, "SELECT id, key FROM relaybus_events ORDER BY id");
    assert_eq!(stored, ["e1|NULL", "e2|k"]);
}

/// The code block of README.md whose first line starts with `first_line`, without its fences.
fn readme_block(first_line: &str) -> String {
    let readme = include_str!("../README.md");
    let at = readme
        .match_indices(&format!("\n{first_line}"))
        .map(|(at, _)| at + 1)
        .find(|&at| {
            readme[..at - 1]
                .rsplit('\n')
                .next()
                .unwrap()
                .starts_with("```")
        })
        .unwrap_or_else(|| panic!("README.md has no code block starting with {first_line}"));
    let code = &readme[at..];
    code[..code.find("\n```\n").unwrap() + 1].to_owned()
}

/// A database with relaybus installed in `public` and the README's `orders` table.
fn with_orders(test: &str) -> TestDatabase {
    let db = TestDatabase::new(test);
    let out = crate::common::relaybus()
        .env("RELAYBUS_DATABASE_URL", &db.url)
        .arg("setup")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    block_on(connect_to(&db.url).batch_execute(&readme_block("CREATE TABLE orders"))).unwrap();
    db
}

/// The channel's notifications, counted by a session of its own that listens on it.
struct Listener {
    received: Arc<AtomicUsize>,
    _client: tokio_postgres::Client,
}

impl Listener {
    fn new(url: &str, channel: &str) -> Self {
        block_on(async {
            let (client, mut conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let received = Arc::new(AtomicUsize::new(0));
            let counted = received.clone();
            tokio::spawn(async move {
                let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                while let Some(Ok(message)) = messages.next().await {
                    if let tokio_postgres::AsyncMessage::Notification(_) = message {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await
                .unwrap();
            Self {
                received,
                _client: client,
            }
        })
    }

    fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

/// Runs a README example in `db` (`DATABASE_URL`): what it printed, once it succeeded.
fn run_example(db: &TestDatabase, program: &mut std::process::Command) -> String {
    let out = program.env("DATABASE_URL", &db.url).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// The orders, and the events with their deliveries' handlers, keys and sequences.
fn written(db: &TestDatabase) -> Vec<String> {
    rows_of(
        &connect_to(&db.url),
        "SELECT line FROM ( \
           SELECT 1 AS n, concat_ws('|', 'order', id, total) AS line FROM orders \
           UNION ALL \
           SELECT 2, concat_ws('|', e.id, e.type, e.key, e.payload, e.handlers, coalesce( \
                    string_agg(d.handler || ':' || d.sequence, ',' ORDER BY d.handler), 'NULL')) \
             FROM relaybus_events e LEFT JOIN relaybus_deliveries d ON d.event_id = e.id \
            GROUP BY e.id) w ORDER BY n, line",
    )
}

/// The README's psql example, run by psql: the order and its event commit together.
#[test]
fn the_readme_s_psql_example_publishes_with_the_order() {
    let db = with_orders("publish_sql_psql");
    run_example(
        &db,
        std::process::Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &db.url, "-c"])
            .arg(readme_block("BEGIN;")),
    );
    let mut rows = written(&db);
    let id = rows[1].split('|').next().unwrap().to_owned();
    assert_eq!(masked(&id), "new", "{rows:?}");
    rows[1] = rows[1].replacen(&id, "ID", 1);
    assert_eq!(
        rows,
        [
            "order|o-7|42",
            r#"ID|order.placed|o-7|{"order": "o-7", "total": 42}|{billing,email}|billing:1,email:1"#
        ]
    );
}

/// The README's Python example against a real server, beside a running worker that polls only
/// once a minute: the rolled-back order publishes nothing and wakes no one; the committed one
/// wakes the worker once, at commit, and its delivery runs within seconds.
#[test]
fn the_readme_s_python_example_publishes_at_commit_and_wakes_the_worker() {
    let db = with_orders("publish_sql_python");
    let python = installed("install-example-libraries.sh")
        .lines()
        .next()
        .unwrap()
        .to_owned();
    let listener = Listener::new(&db.url, "public.relaybus_wakeup");
    let dir = tempfile::tempdir().unwrap();
    let handled = dir.path().join("handled");
    let addr = format!("127.0.0.1:{}", crate::common::cluster::free_port());
    let worker: Spawned = std::process::Command::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", &db.url)
        .args(["run", "--handler", "billing", "--exec"])
        .arg(format!(
            "cat >/dev/null; echo \"$RELAYBUS_KEY\" >> {}",
            handled.display()
        ))
        .args(["--poll-interval", "60s", "--metrics-addr", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .into();
    // Past its first claim the worker sleeps until a wake-up or a minute.
    wait_until("the worker's first claim", Duration::from_secs(20), || {
        crate::common::http::probe(&format!("http://{addr}/readyz"))
            .is_ok_and(|(status, _)| status == 200)
    });
    let script = dir.path().join("place_order.py");
    std::fs::write(&script, readme_block("import os")).unwrap();
    let printed = run_example(&db, std::process::Command::new(&python).arg(&script));
    assert_eq!(printed, "order o-2 needs an approval\n");
    let committed = Instant::now();
    let lines = || std::fs::read_to_string(&handled).unwrap_or_default();
    wait_until("the delivery handled", Duration::from_secs(10), || {
        !lines().is_empty()
    });
    let took = committed.elapsed();
    let rows = written(&db);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0], "order|o-1|42");
    assert!(
        rows[1].ends_with(r#"|order.placed|o-1|{"order": "o-1", "total": 42}|{billing}|NULL"#),
        "{rows:?}: the event, its delivery handled"
    );
    assert_eq!(lines(), "o-1\n");
    wait_until("the wake-up", Duration::from_secs(5), || {
        listener.received() > 0
    });
    assert!(
        took < Duration::from_secs(5),
        "handled {took:?} after the commit"
    );
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
    assert_eq!(
        listener.received(),
        1,
        "one wake-up, for the committed order"
    );
}

/// The README's Node.js example, with pg: it prints the event's generated id, stored with the
/// order.
#[test]
fn the_readme_s_node_example_publishes_with_the_order() {
    let db = with_orders("publish_sql_node");
    let node_path = installed("install-example-libraries.sh")
        .lines()
        .nth(1)
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("place_order.js");
    std::fs::write(&script, readme_block("const { Client }")).unwrap();
    let printed = run_example(
        &db,
        std::process::Command::new("node")
            .arg(&script)
            .env("NODE_PATH", &node_path),
    );
    let id = printed.trim();
    assert_eq!(masked(id), "new", "{id}");
    assert_eq!(
        written(&db),
        [
            "order|o-3|7".to_owned(),
            format!(
                r#"{id}|order.placed|o-3|{{"order": "o-3", "total": 7}}|{{billing}}|billing:1"#
            )
        ]
    );
}

/// On MongoDB, the README's documents written in an application's transaction by `mongosh`: the
/// event takes the next sequence of its key after one `relaybus publish` wrote, and a worker
/// runs both in that order. `doctor` finds them sound; documents that break the rules are named
/// in its `publish` check, and its fix repairs what it can.
#[test]
fn on_mongodb_the_readme_s_documents_run_in_key_order_and_doctor_names_mistakes() {
    let m = TestMongo::installed("publish_mongo_readme");
    m.cmd()
        .args(["publish", "--type", "order.created", "--key", "o-8"])
        .args(["--id", "o-8-created", "--handler", "billing"])
        .assert()
        .success();
    mongosh(&readme_block("// FNV-1a (32 bits)").replace(
        "getDatabase(\"shop\")",
        &format!("getDatabase(\"{}\")", m.name),
    ));
    let orders = block_on(async {
        let c = m.collection("deliveries").client().database(&m.name);
        c.collection::<mongodb::bson::Document>("orders")
            .count_documents(doc! { "_id": "o-8", "total": 42 })
            .await
    });
    assert_eq!(orders.unwrap(), 1);
    let lane = i32::from(relaybus::store::lane::lane_of(Some("o-8"), ""));
    let mut deliveries: Vec<(String, i32, i64)> = m
        .find("deliveries", doc! {})
        .iter()
        .map(|d| {
            (
                d.get_str("eventId").unwrap().to_owned(),
                d.get_i32("laneId").unwrap(),
                d.get("sequence").and_then(Bson::as_i64).unwrap(),
            )
        })
        .collect();
    deliveries.sort_by_key(|d| d.2);
    assert_eq!(
        deliveries,
        [
            ("o-8-created".to_owned(), lane, 1),
            ("o-8-placed".to_owned(), lane, 2)
        ]
    );
    assert_eq!(
        publish_check(&m),
        (0, "ok".to_owned(), PUBLISH_OK.to_owned())
    );

    let dir = tempfile::tempdir().unwrap();
    let handled = dir.path().join("handled");
    let worker = m.worker(&[
        "--handler",
        "billing",
        "--exec",
        &format!(
            "cat >/dev/null; echo $RELAYBUS_EVENT_ID >> {}",
            handled.display()
        ),
    ]);
    let lines = || std::fs::read_to_string(&handled).unwrap_or_default();
    wait_until("both handled", Duration::from_secs(20), || {
        lines().lines().count() == 2
    });
    assert_eq!(lines(), "o-8-created\no-8-placed\n");
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    assert!(finish(worker, Duration::from_secs(30)).status.success());

    let lane_of = |key: &str| relaybus::store::lane::lane_of(Some(key), "");
    mongosh(&format!(
        "const d = db.getSiblingDB('{}');
         const delivery = (id, event, handler, laneId, key, sequence) => ({{ _id: id, eventId: event,
           handler, laneId, key, sequence, status: 'pending', attempts: 0, claims: 0, lane: 'ready',
           dueAt: new Date(), createdAt: new Date(), updatedAt: new Date(), lastError: null, completedAt: null }});
         d.relaybus_events.insertMany([
           {{ _id: 'e-wrong', type: 't', key: null, payload: null, headers: {{}}, handlers: ['h'] }},
           {{ _id: 'e-double', type: 't', key: null, payload: null, headers: {{}}, handlers: ['h'] }},
           {{ _id: 'e-unlisted', type: 't', key: null, payload: null, headers: {{}}, handlers: ['h'] }},
           {{ _id: 'e-keyed', type: 't', key: 'k', payload: null, headers: {{}}, handlers: ['h'] }}]);
         d.relaybus_deliveries.insertMany([
           delivery('d-wrong', 'e-wrong', 'h', {wrong}, null, null),
           delivery('d-double', 'e-double', 'h', 2.5, null, null),
           delivery('d-unlisted', 'e-unlisted', 'other', {unlisted}, null, null),
           delivery('d-orphan', 'e-missing', 'h', {missing}, null, null),
           delivery('d-unsequenced', 'e-keyed', 'h', {keyed}, 'k', null)]);",
        m.name,
        wrong = (lane_of("e-wrong") + 1) % 256,
        unlisted = lane_of("e-unlisted"),
        missing = lane_of("e-missing"),
        keyed = lane_of("k"),
    ));
    assert_eq!(
        publish_check(&m),
        (
            1,
            "fail".to_owned(),
            "2 deliveries not in the lane of their key or event id (`laneId` not an integer, or \
             another lane), so never claimed or out of their key's order: \"d-double\", \
             \"d-wrong\"; 1 delivery with a key and no integer `sequence`, out of their key's \
             order: \"d-unsequenced\"; 1 delivery of events that do not exist, which fail every \
             attempt: \"d-orphan\"; 1 event without the handlers of their deliveries in \
             `handlers`, which a republish would run again: \"e-unlisted\""
                .to_owned()
        )
    );
    let fix = stdout(&m.cmd().args(["doctor", "--fix-sql"]).output().unwrap());
    mongosh(&fix);
    assert_eq!(
        publish_check(&m),
        (
            1,
            "fail".to_owned(),
            "1 delivery with a key and no integer `sequence`, out of their key's order: \
             \"d-unsequenced\""
                .to_owned()
        ),
        "{fix}"
    );
    assert_eq!(
        m.find("events", doc! { "_id": "e-unlisted" })[0]
            .get_array("handlers")
            .unwrap(),
        &vec![Bson::from("h"), Bson::from("other")]
    );
    assert!(m.find("deliveries", doc! { "_id": "d-orphan" }).is_empty());
    block_on(async {
        m.collection("deliveries")
            .delete_one(doc! { "_id": "d-unsequenced" })
            .await
    })
    .unwrap();
    assert_eq!(
        publish_check(&m),
        (0, "ok".to_owned(), PUBLISH_OK.to_owned())
    );
}

const PUBLISH_OK: &str = "every delivery in its lane, with its event and a sequence where keyed";

/// `doctor`'s exit code, and the verdict and findings of its `publish` check.
fn publish_check(m: &TestMongo) -> (i32, String, String) {
    let out = m.cmd().args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "publish")
        .unwrap_or_else(|| panic!("no publish check: {report}"));
    (
        out.status.code().unwrap(),
        check["verdict"].as_str().unwrap().to_owned(),
        check["found"].as_str().unwrap().to_owned(),
    )
}
