//! `events list` and `events replay` as an operator types them: what is refused before anything
//! is written, the question on a terminal, and the listing's pages. The rules of replay are the
//! conformance suite's; the replay killed halfway is `common::replay`'s, on both engines.

use serde_json::{json, Value};

use crate::common::scenario::Target;
use crate::common::{on_a_terminal, stderr, TestSchema};

fn store_with_events(name: &str) -> TestSchema {
    let s = TestSchema::installed(name);
    s.publish(&[
        json!({"id": "e1", "type": "order.paid", "key": "k1", "handlers": ["billing"]}),
        json!({"id": "e2", "type": "order.refunded", "key": "k1", "handlers": ["billing"]}),
        json!({"id": "e3", "type": "user.created", "handlers": ["crm"]}),
    ]);
    s
}

fn search_deliveries(s: &TestSchema) -> i64 {
    s.count(&format!(
        "SELECT count(*) FROM {} WHERE handler = 'search'",
        s.table("deliveries")
    ))
}

/// Each refusal exits 2 with its reason on stderr and writes nothing.
#[test]
fn a_replay_that_cannot_be_meant_is_refused_and_writes_nothing() {
    let s = store_with_events("replay_refused");
    let refused = |args: &[&str], reason: &str| {
        let out = s
            .cmd()
            .args(["events", "replay"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(reason), "{args:?}: {}", stderr(&out));
    };
    refused(&["--handler", "biling", "--yes"], "did you mean `billing`?");
    refused(
        &["--handler", "search", "--new"],
        "rerun with --yes to proceed",
    );
    refused(
        &[
            "--handler",
            "search",
            "--new",
            "--yes",
            "--since",
            "yesterday",
        ],
        "--since `yesterday` is neither a time",
    );
    refused(
        &["--handler", "search", "--new", "--yes", "--event", "e9"],
        "--event `e9`: no event has this id",
    );
    refused(
        &["--handler", "", "--new", "--yes"],
        "--handler must be a name",
    );
    assert_eq!(search_deliveries(&s), 0);
}

#[test]
fn a_replay_asks_on_a_terminal_after_counting_what_it_would_do() {
    let s = store_with_events("replay_terminal");
    let shown = on_a_terminal(
        &s,
        200,
        "events replay --handler search --new --type 'order.*'",
        b"n",
    );
    assert!(
        shown.contains(
            "would replay 2 events to `search` (e1 to e2, 1 lane)\n\
             Replay the selected events to `search`?"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("not confirmed; nothing was changed"),
        "{shown}"
    );
    assert_eq!(search_deliveries(&s), 0);
    let shown = on_a_terminal(&s, 200, "events replay --handler search --new", b"y");
    assert!(
        shown.contains("replayed 3 events to `search` (e1 to e3, 2 lanes)"),
        "{shown}"
    );
    assert_eq!(search_deliveries(&s), 3);
    let shown = on_a_terminal(&s, 200, "events replay --handler search", b"");
    assert!(
        shown.contains("replayed no event to `search`; skipped 3 of 3 matching events: 3 pending"),
        "nothing to replay, nothing asked: {shown}"
    );
}

#[test]
fn events_are_listed_a_page_at_a_time_with_the_filters_of_replay() {
    let s = store_with_events("replay_list");
    let list = |args: &[&str]| -> (Value, String) {
        let out = s
            .cmd()
            .args(["--json", "events", "list"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        (serde_json::from_slice(&out.stdout).unwrap(), stderr(&out))
    };
    let ids = |v: &Value| -> Vec<String> {
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (first, _) = list(&["--limit", "2"]);
    assert_eq!(
        (ids(&first), &first["next_after"]),
        (vec!["e1".into(), "e2".into()], &json!("e2"))
    );
    let (rest, _) = list(&["--after", "e2"]);
    assert_eq!(
        (ids(&rest), &rest["next_after"]),
        (vec!["e3".into()], &Value::Null)
    );
    assert_eq!(
        rest["events"][0],
        json!({"id": "e3", "type": "user.created", "key": null,
               "created_at": rest["events"][0]["created_at"], "handlers": ["crm"]})
    );
    assert_eq!(
        ids(&list(&["--type", "order.*", "--since", "e2"]).0),
        ["e2"]
    );
    assert_eq!(ids(&list(&["--handler", "crm"]).0), ["e3"]);
    assert_eq!(ids(&list(&["--key", "k1", "--until", "e1"]).0), ["e1"]);
    assert_eq!(
        ids(&list(&["--since", "1h", "--event", "e3", "--event", "e1"]).0),
        ["e1", "e3"]
    );
    let (none, warned) = list(&["--type", "order.pad"]);
    assert_eq!(ids(&none), Vec::<String>::new());
    assert!(
        warned.contains("no event has the type `order.pad`"),
        "{warned}"
    );
    let out = s
        .cmd()
        .args(["events", "list", "--handler", "crn"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("did you mean `crm`?"),
        "{}",
        stderr(&out)
    );
}

/// A completed delivery kept from 0.1 is a delivery that completed: skipped without --again,
/// and with it made the new delivery in place (the event and handler keep one row).
#[test]
fn again_makes_a_completed_row_kept_from_0_1_the_new_delivery() {
    let s = store_with_events("replay_kept_0_1");
    let deliveries = s.table("deliveries");
    s.exec(&format!(
        "UPDATE {deliveries} SET status = 'completed', completed_at = now(), attempts = 2 \
          WHERE event_id = 'e1'"
    ));
    let replay = |again: &[&str]| -> Value {
        let out = s
            .cmd()
            .args([
                "--json",
                "events",
                "replay",
                "--handler",
                "billing",
                "--key",
                "k1",
                "--yes",
            ])
            .args(again)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let once = replay(&[]);
    assert_eq!(
        (&once["replayed"], &once["skipped"]),
        (
            &json!(0),
            &json!({"pending": 1, "scheduled": 0, "dead": 0, "delivered": 1})
        )
    );
    let again = replay(&["--again"]);
    assert_eq!(
        (&again["replayed"], &again["first_event"]),
        (&json!(1), &json!("e1"))
    );
    let rows = s.rows(&format!(
        "SELECT status || ' ' || attempts || ' ' || (completed_at IS NULL) || ' ' || \
                (sequence > 2) FROM {deliveries} WHERE event_id = 'e1'"
    ));
    assert_eq!(rows, ["pending 0 true true"]);
}
