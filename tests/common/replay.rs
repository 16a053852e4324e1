//! The replay that both engines must pass through the real binary: a handler added after
//! thousands of events gets each of them once, in key order, even when the replay is killed
//! halfway and run again, and the handler the events were published for gets nothing extra.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::time::Duration;

use relaybus::store::prelude::*;
use relaybus::store::{AnyStore, StoreOptions};
use serde_json::{json, Value};

use super::scenario::Target;
use super::{block_on, finish, stderr, Spawned};

const KEYS: usize = 50;
/// Events published for both handlers after the others: `search` has a pending delivery of
/// each before the replay, which skips them, and the replayed events of their keys follow them.
const BOTH: usize = 10;

/// The replay's steps against one store.
struct Replaying<'a> {
    t: &'a dyn Target,
    store: AnyStore,
}

impl Replaying<'_> {
    fn run(&self, args: &[&str], stdin: &str) -> String {
        let out = self
            .t
            .cmd()
            .args(args)
            .timeout(Duration::from_secs(180))
            .write_stdin(stdin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    fn spawn(&self, args: &[&str]) -> Spawned {
        self.t
            .binary()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
            .into()
    }

    fn replay(&self, extra: &[&str]) -> Value {
        let args = [
            &["events", "replay", "--handler", "search", "--new", "--json"],
            extra,
        ]
        .concat();
        serde_json::from_str(&self.run(&args, "")).unwrap()
    }

    /// Pending deliveries of a handler.
    fn due(&self, handler: &str) -> i64 {
        block_on(self.store.stats())
            .unwrap()
            .into_iter()
            .find(|s| s.handler == handler)
            .map_or(0, |s| s.due + s.scheduled + s.processing)
    }
}

fn key(i: usize) -> String {
    format!("k{:02}", i % KEYS)
}

/// 5,000 events over 50 keys (on the MongoDB test server 1,000: it drains keyed deliveries
/// beside a backlog at about 15 a second).
pub fn a_replay_killed_halfway_and_run_again_delivers_each_event_once_in_key_order(
    target: &dyn Target,
) {
    let events = target.scale(5000);
    let t = &Replaying {
        t: target,
        store: target.store(StoreOptions::admin()),
    };
    let lines: Vec<String> = (0..events)
        .map(|i| json!({"id": format!("ev-{i:05}"), "type": if i % 5 == 0 { "user.created" } else { "order.paid" }, "key": key(i), "handlers": ["billing"], "payload": {}}).to_string())
        .chain((events..events + BOTH).map(|i| {
            json!({"id": format!("ev-{i:05}"), "type": "order.paid", "key": key(i), "handlers": ["billing", "search"], "payload": {}}).to_string()
        }))
        .collect();
    for chunk in lines.chunks(1000) {
        t.run(&["publish"], &chunk.join("\n"));
    }
    let lanes: BTreeSet<i16> = (0..KEYS)
        .map(|k| relaybus::store::lane::lane_of(Some(&key(k)), ""))
        .collect();
    let planned = t.replay(&["--dry-run"]);
    assert_eq!(
        planned,
        json!({
            "handler": "search", "dry_run": true, "interrupted": false,
            "matched": events + BOTH, "replayed": events,
            "skipped": {"pending": BOTH, "scheduled": 0, "dead": 0, "delivered": 0},
            "by_type": {"order.paid": events * 4 / 5, "user.created": events / 5},
            "first_event": "ev-00000", "last_event": format!("ev-{:05}", events - 1), "lanes": lanes.len(),
            "stopped_after": null,
        })
    );
    assert_eq!(t.due("search"), BOTH as i64, "a dry run writes nothing");

    // Killed once a few of its 50 batches committed.
    let replay = t.spawn(&[
        "events",
        "replay",
        "--handler",
        "search",
        "--new",
        "--yes",
        "--batch-size",
        "100",
    ]);
    // Looked at every 200 ms: a MongoDB test server serves one request at a time.
    let start = std::time::Instant::now();
    while t.due("search") < (BOTH + events / 5) as i64 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the replay did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    super::signal(&replay, nix::sys::signal::Signal::SIGKILL);
    let out = finish(replay, Duration::from_secs(10));
    assert!(!out.status.success());
    let done = t.due("search");
    assert!(
        done < (events + BOTH) as i64,
        "the replay was killed before it ended ({done})"
    );
    // The batch the server was running when the client died may still commit, whole (one
    // statement on PostgreSQL): the rerun finds it pending with the rest of what was done.
    let rest = t.replay(&["--yes"]);
    let pending = rest["skipped"]["pending"].as_i64().unwrap();
    assert!(
        done <= pending && pending <= done + 100,
        "{done} seen, {rest}"
    );
    assert_eq!(
        (&rest["replayed"], &rest["skipped"]),
        (
            &json!(events as i64 + BOTH as i64 - pending),
            &json!({"pending": pending, "scheduled": 0, "dead": 0, "delivered": 0})
        )
    );
    assert_eq!(
        t.replay(&["--yes"])["replayed"],
        0,
        "a third run makes nothing"
    );
    assert_eq!(t.due("search"), (events + BOTH) as i64);
    assert_eq!(
        t.due("billing"),
        (events + BOTH) as i64,
        "billing got nothing extra"
    );

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("search.log");
    let command = format!(
        "cat >/dev/null; echo \"$RELAYBUS_KEY $RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let worker = t.spawn(&[
        "run",
        "--handler",
        "search",
        "--exec",
        &command,
        "--drain",
        "--concurrency",
        "16",
        "--poll-interval",
        "50ms",
    ]);
    let out = finish(worker, Duration::from_secs(600));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let mut per_key: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!((f.len(), f[2]), (3, "1"), "first attempts only: {line}");
        per_key.entry(f[0]).or_default().push(f[1]);
    }
    assert_eq!(per_key.len(), KEYS);
    for (k, handled) in per_key {
        // The events published for both handlers came first in their keys; then the replay, in
        // publish order.
        let k_of = |i: &usize| key(*i) == k;
        let expected: Vec<String> = (events..events + BOTH)
            .filter(k_of)
            .chain((0..events).filter(k_of))
            .map(|i| format!("ev-{i:05}"))
            .collect();
        assert_eq!(handled, expected, "the order of key {k}");
    }
    assert_eq!(t.due("search"), 0);
    assert_eq!(t.due("billing"), (events + BOTH) as i64);
}
