//! publish: flags, NDJSON, idempotency and per-key sequences.

use std::collections::HashMap;
use std::time::Duration;

use relaybus::store::prelude::*;

use relaybus::store::{EventLimits, NewEvent, StoreOptions};
use serde_json::json;

use crate::common::scenario::Target;
use crate::common::{connect, open_store, runtime, stderr, stdout, wait_until, TestSchema};

#[test]
fn publish_from_flags_writes_one_event_and_its_deliveries() {
    let s = TestSchema::installed("publish_flags");
    s.cmd()
        .args([
            "publish",
            "--type",
            "order.paid",
            "--key",
            "order-7",
            "--id",
            "ev-1",
            "--handler",
            "billing",
            "--handler",
            "email",
            "--header",
            "trace=abc",
            "--data",
            r#"{"total": 42}"#,
        ])
        .assert()
        .success()
        .stdout("ev-1\n");
    assert_eq!(
        s.rows(&format!(
            "SELECT id, type, key, payload, headers, handlers::text FROM {}",
            s.table("events")
        )),
        [r#"ev-1|order.paid|order-7|{"total": 42}|{"trace": "abc"}|{billing,email}"#]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler, lane, key, sequence, status, attempts, claims FROM {} ORDER BY handler",
            s.table("deliveries")
        )),
        ["ev-1|billing|251|order-7|1|pending|0|0", "ev-1|email|251|order-7|1|pending|0|0"]
    );
}

/// Generated ids are ULIDs: 26 characters, in creation order under the test database's
/// collation, so new rows go to the right edge of the keys. They are also 10 characters shorter
/// than a UUID's text in every delivery row, key entry and in-flight list.
#[test]
fn generated_event_and_delivery_ids_are_ulids_in_creation_order() {
    let s = TestSchema::installed("publish_generated_ids");
    let events: Vec<_> = (0..50)
        .map(|i| json!({"type": "t", "payload": i, "handlers": ["h"]}))
        .collect();
    s.publish(&events);
    for (table, column) in [
        ("events", "id"),
        ("deliveries", "id"),
        ("deliveries", "event_id"),
    ] {
        let ids = s.rows(&format!(
            "SELECT {column} FROM {} ORDER BY {column}",
            s.table(table)
        ));
        assert_eq!(ids.len(), 50);
        assert!(
            ids.iter()
                .all(|id| id.len() == 26 && id.parse::<ulid::Ulid>().is_ok()),
            "{table}.{column}: {ids:?}"
        );
    }
    assert_eq!(
        s.rows(&format!(
            "SELECT e.payload::text FROM {} d JOIN {} e ON e.id = d.event_id ORDER BY d.id",
            s.table("deliveries"),
            s.table("events")
        )),
        (0..50).map(|i| i.to_string()).collect::<Vec<_>>()
    );
}

#[test]
fn republishing_adds_deliveries_only_for_new_handlers() {
    let s = TestSchema::installed("publish_idempotent");
    let publish = |handlers: &[&str]| {
        let mut args = vec!["publish", "--json", "--type", "t", "--id", "ev-1"];
        for h in handlers {
            args.extend(["--handler", h]);
        }
        let out = s.cmd().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["deliveries"].clone()
    };
    assert_eq!(publish(&["a", "b"]), 2);
    assert_eq!(publish(&["a", "b"]), 0);
    // `a` completes: its delivery row is deleted, and a redelivery of the event must not run it.
    s.exec(&format!(
        "DELETE FROM {} WHERE handler = 'a'",
        s.table("deliveries")
    ));
    assert_eq!(publish(&["a", "b", "c"]), 1);
    assert_eq!(
        s.rows(&format!(
            "SELECT handler FROM {} ORDER BY handler",
            s.table("deliveries")
        )),
        ["b", "c"]
    );
    assert_eq!(
        s.rows(&format!("SELECT handlers::text FROM {}", s.table("events"))),
        ["{a,b,c}"]
    );
}

#[test]
fn ndjson_is_published_in_atomic_batches_and_a_bad_line_is_named() {
    let s = TestSchema::installed("publish_ndjson");
    let input = [
        r#"{"id": "e1", "type": "a", "handlers": ["h"]}"#,
        r#"{"id": "e2", "type": "a", "key": "k", "payload": {"n": 2}}"#,
        r#"{"id": "e3", "type": "a", "handlers": ["h", "i"]}"#,
        r#"{"id": "e4", "handlers": ["h"]}"#,
        r#"{"id": "e5", "type": "a"}"#,
    ]
    .join("\n");
    let out = s
        .cmd()
        .args(["publish", "--handler", "dflt", "--batch-size", "2"])
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: invalid event on line 4: missing `type`; nothing of its batch was written; 2 events \
         of earlier batches (lines 1-2) were published; to go on, publish the input from line 3\n"
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler FROM {} ORDER BY 1, 2",
            s.table("deliveries")
        )),
        ["e1|h", "e2|dflt"]
    );
    let out = s
        .cmd()
        .args(["publish", "--max-payload-bytes", "10"])
        .write_stdin(
            "{\"type\": \"a\", \"handlers\": [\"h\"], \"payload\": \"0123456789\"}\nnot json\n",
        )
        .output()
        .unwrap();
    assert_eq!(
        stderr(&out),
        "error: invalid event on line 1: payload is 12 bytes, over the limit of 10 \
         (--max-payload-bytes); nothing of its batch was written; nothing of the input was \
         published\n"
    );
    let out = s
        .cmd()
        .arg("publish")
        .write_stdin("{\"type\": \"a\"}\n")
        .output()
        .unwrap();
    assert!(stderr(&out).contains("line 1: no handlers: give `handlers` (or --handler)"));
    let ok = s
        .cmd()
        .args(["publish", "--handler", "h"])
        .write_stdin("{\"id\": \"x1\", \"type\": \"a\"}\n\n{\"id\": \"x2\", \"type\": \"a\"}\n")
        .output()
        .unwrap();
    assert_eq!(stdout(&ok), "x1\nx2\n");
}

#[test]
fn publish_refuses_an_uninstalled_or_0_1_store() {
    let s = TestSchema::with_fixture_0_1("publish_v01");
    let out = s
        .cmd()
        .args(["publish", "--type", "a", "--handler", "h"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: the database is at schema 0.1; run `relaybus upgrade --dry-run` to see the conversion, then `relaybus upgrade`\n"
    );
}

#[test]
fn eight_concurrent_publishers_get_gapless_per_key_sequences_in_their_own_order() {
    let s = TestSchema::installed("publish_concurrent");
    let limits = EventLimits {
        max_payload_bytes: 1 << 20,
    };
    crate::common::block_on(async {
        let mut tasks = vec![];
        for p in 0..8 {
            let store = open_store(&s, StoreOptions::publisher());
            let limits = limits.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..40 {
                    let batch: Vec<NewEvent> = (0..(i % 3 + 1))
                        .map(|j| {
                            NewEvent::new(
                                format!("p{p}-{i}-{j}"),
                                "t".into(),
                                Some(format!("key-{}", (i + j) % 3)),
                                json!({"p": p}),
                                Default::default(),
                                vec!["h1".into(), "h2".into()],
                                &limits,
                            )
                            .unwrap()
                        })
                        .collect();
                    store.publish(&batch).await.unwrap();
                    // Publishing the same batch again must add nothing.
                    assert!(store.publish(&batch).await.unwrap().is_empty());
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let total_events = 8 * (0..40).map(|i| i % 3 + 1).sum::<i64>();
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("events"))),
        total_events
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        2 * total_events
    );
    // Per key: sequences are 1..n without gaps, shared by both handlers of an event.
    let rows = s.query(&format!(
        "SELECT key, count(DISTINCT sequence), min(sequence), max(sequence), \
                count(*) FILTER (WHERE handler = 'h1'), count(DISTINCT (event_id, sequence)) \
           FROM {} GROUP BY key ORDER BY key",
        s.table("deliveries")
    ));
    let mut per_key_total = 0;
    for r in &rows {
        let (distinct, min, max, events, pairs): (i64, i64, i64, i64, i64) =
            (r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
        assert_eq!((distinct, min, max, pairs), (events, 1, events, events));
        per_key_total += events;
    }
    assert_eq!(per_key_total, total_events);
    assert_eq!(
        s.rows(&format!(
            "SELECT key, last_sequence FROM {} ORDER BY key",
            s.table("key_sequences")
        )),
        rows.iter()
            .map(|r| format!("{}|{}", r.get::<_, String>(0), r.get::<_, i64>(4)))
            .collect::<Vec<_>>()
    );
    // Each publisher published sequentially, so its events of one key are in increasing order.
    let seq = s.query(&format!(
        "SELECT event_id, key, sequence FROM {} WHERE handler = 'h1'",
        s.table("deliveries")
    ));
    let mut last: HashMap<(String, String), (usize, usize, i64)> = HashMap::new();
    let mut ordered: Vec<(usize, usize, usize, String, i64)> = seq
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            let parts: Vec<usize> = id[1..].split('-').map(|x| x.parse().unwrap()).collect();
            (
                parts[0],
                parts[1],
                parts[2],
                r.get::<_, String>(1),
                r.get::<_, i64>(2),
            )
        })
        .collect();
    ordered.sort();
    for (p, i, j, key, sequence) in ordered {
        if let Some(&(pi, pj, prev)) = last.get(&(p.to_string(), key.clone())) {
            assert!(
                sequence > prev,
                "publisher {p}: event {i}-{j} after {pi}-{pj} on {key}"
            );
        }
        last.insert((p.to_string(), key), (i, j, sequence));
    }
}

/// A republish may add handlers; it must not say something else. A differing one was accepted
/// silently, the first payload kept, and a handler it added got the old payload.
#[test]
fn a_republish_with_other_content_is_refused_naming_the_id() {
    let s = TestSchema::installed("publish_conflict");
    let publish = |args: &[&str]| {
        s.cmd()
            .args([
                "publish",
                "--type",
                "order.paid",
                "--id",
                "ev-1",
                "--key",
                "k",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let first = publish(&["--handler", "a", "--data", r#"{"total": 42}"#]);
    assert!(first.status.success(), "{}", stderr(&first));
    // The same content adds a handler; the text output says when nothing was added.
    let again = publish(&["--handler", "b", "--data", r#"{"total":42}"#]);
    assert_eq!(
        (stdout(&again), stderr(&again)),
        ("ev-1\n".into(), String::new())
    );
    let nothing = publish(&["--handler", "b", "--data", r#"{"total": 42}"#]);
    assert_eq!(
        stderr(&nothing),
        "nothing new: every event was published before with these handlers; no delivery was added\n"
    );
    for other in [
        vec!["--handler", "c", "--data", r#"{"total": 43}"#],
        vec![
            "--handler",
            "c",
            "--data",
            r#"{"total": 42}"#,
            "--header",
            "x=y",
        ],
    ] {
        let out = publish(&other);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stderr(&out),
            "error: event `ev-1` was published before with another type, key, payload or headers \
             (publish it again only with the same content, to add handlers; or use a new id); \
             nothing of its batch was written\n"
        );
    }
    let ndjson = [
        r#"{"id": "ev-2", "type": "t", "handlers": ["a"]}"#,
        r#"{"id": "ev-1", "type": "order.paid", "key": "k", "payload": {"total": 44}, "handlers": ["c"]}"#,
    ]
    .join("\n");
    let out = s.cmd().arg("publish").write_stdin(ndjson).output().unwrap();
    assert!(stderr(&out).starts_with(
        "error: could not publish the events of lines 1-2: event `ev-1` was published before"
    ));
    assert!(
        stderr(&out).ends_with("nothing of the input was published\n"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler FROM {} ORDER BY 1, 2",
            s.table("deliveries")
        )),
        ["ev-1|a", "ev-1|b"]
    );
}

/// One event twice in an input: with the same content it stands once (its handlers united),
/// counted once; with other content the batch is refused.
#[test]
fn the_same_id_twice_in_an_input_is_one_event_or_a_conflict() {
    let s = TestSchema::installed("publish_twice");
    let twice = [
        r#"{"id": "e1", "type": "t", "handlers": ["a"]}"#,
        r#"{"id": "e1", "type": "t", "handlers": ["b"]}"#,
    ]
    .join("\n");
    let out = s
        .cmd()
        .args(["--json", "publish"])
        .write_stdin(twice)
        .output()
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (summary["events"].as_i64(), summary["deliveries"].as_i64()),
        (Some(1), Some(2))
    );
    let differing = [
        r#"{"id": "e2", "type": "t", "handlers": ["a"]}"#,
        r#"{"id": "e2", "type": "u", "handlers": ["a"]}"#,
    ]
    .join("\n");
    let out = s
        .cmd()
        .arg("publish")
        .write_stdin(differing)
        .output()
        .unwrap();
    assert_eq!(
        stderr(&out),
        "error: could not publish the events of lines 1-2: event `e2` appears twice in the batch \
         with different content; nothing of its batch was written; nothing of the input was \
         published\n"
    );
}

/// What the database would refuse is named with its line before anything is sent, and every
/// failure says what earlier batches committed and where to go on.
#[test]
fn a_failing_line_is_named_with_what_was_committed_before_it() {
    let s = TestSchema::installed("publish_lines");
    let input: Vec<u8> = [
        r#"{"id": "e1", "type": "t", "handlers": ["h"]}"#,
        r#"{"id": "e2", "type": "t", "handlers": ["h"]}"#,
        r#"{"id": "e3", "type": "t", "handlers": ["h"], "payload": {"text": "a\u0000b"}}"#,
    ]
    .join("\n")
    .into_bytes();
    let out = s
        .cmd()
        .args(["publish", "--batch-size", "2"])
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(
        stderr(&out),
        "error: invalid event on line 3: `payload` holds a NUL character (\\u0000), which \
         PostgreSQL cannot store; nothing of its batch was written; 2 events of earlier batches \
         (lines 1-2) were published; to go on, publish the input from line 3\n"
    );
    let mut input: Vec<u8> = [
        r#"{"id": "e4", "type": "t", "handlers": ["h"]}"#,
        r#"{"id": "e5", "type": "t", "handlers": ["h"]}"#,
    ]
    .join("\n")
    .into_bytes();
    input.extend(b"\n\xff\xfe not text\n");
    let out = s
        .cmd()
        .args(["publish", "--batch-size", "2"])
        .write_stdin(input)
        .output()
        .unwrap();
    assert!(
        stderr(&out).starts_with("error: invalid event on line 3: the line is not valid UTF-8;"),
        "{}",
        stderr(&out)
    );
    let long_key = format!(
        r#"{{"type": "t", "key": "{}", "handlers": ["h"]}}"#,
        "k".repeat(2000)
    );
    let out = s
        .cmd()
        .arg("publish")
        .write_stdin(long_key)
        .output()
        .unwrap();
    assert_eq!(
        stderr(&out),
        "error: invalid event on line 1: `key` is 2000 bytes, over the limit of 1024; nothing of \
         its batch was written; nothing of the input was published\n"
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("events"))),
        4
    );
}

/// A publish inserts new events without ON CONFLICT; one that loses the race to a concurrent
/// publish of the same id fails on the key and runs the republish statement, which sees the
/// other's rows. The other publish here is a transaction held open until the publish waits on
/// its key.
#[test]
fn a_publish_that_races_another_for_an_id_runs_again_and_adds_only_new_handlers() {
    let s = TestSchema::installed("publish_race");
    let other = connect();
    crate::common::block_on(other.batch_execute(&format!(
            "BEGIN; \
             INSERT INTO {} (id, type, payload, handlers) VALUES ('e1', 't', '{{\"n\": 1}}', '{{a}}'); \
             INSERT INTO {} (id, event_id, handler, lane) VALUES ('other', 'e1', 'a', 0)",
            s.table("events"),
            s.table("deliveries")
        )))
        .unwrap();
    let store = open_store(&s, StoreOptions::publisher());
    let limits = EventLimits {
        max_payload_bytes: 1 << 20,
    };
    let event = |id: &str| {
        let handlers = vec!["a".into(), "b".into()];
        NewEvent::new(
            id.into(),
            "t".into(),
            None,
            json!({"n": 1}),
            Default::default(),
            handlers,
            &limits,
        )
        .unwrap()
    };
    let batch = vec![event("e1"), event("e2")];
    let publish = runtime().spawn(async move { store.publish(&batch).await });
    wait_until(
        "the publish to wait on the other's key",
        Duration::from_secs(10),
        || {
            s.count(
                "SELECT count(*) FROM pg_stat_activity \
              WHERE wait_event_type = 'Lock' AND query LIKE '-- Publish of a batch whose events are all new%'",
            ) == 1
        },
    );
    crate::common::block_on(other.batch_execute("COMMIT")).unwrap();
    let published = crate::common::block_on(publish).unwrap().unwrap();
    let pairs: Vec<_> = published
        .iter()
        .map(|d| format!("{} {}", d.event_id, d.handler))
        .collect();
    assert_eq!(pairs, ["e1 b", "e2 a", "e2 b"]);
    assert_eq!(
        s.rows(&format!(
            "SELECT id, array_to_string(handlers, ',') FROM {} ORDER BY id",
            s.table("events")
        )),
        ["e1|a,b", "e2|a,b"]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, handler, id = 'other' FROM {} ORDER BY event_id, handler",
            s.table("deliveries")
        )),
        ["e1|a|true", "e1|b|false", "e2|a|false", "e2|b|false"]
    );
}
