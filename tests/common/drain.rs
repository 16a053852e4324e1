//! The three-worker drain that both engines must pass through the real binary: every delivery
//! handled once, at its first attempt, and each key's deliveries in publish order.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::{finish, stderr, stdout, Spawned};

/// Publishes `events` events for handlers `alpha` and `beta`, two thirds of them keyed over
/// `keys` keys, with `publish`; drains them with three workers started by `worker`; and checks
/// what the handlers logged. The engine's own leftovers are for the caller to check.
pub fn three_workers_drain_exactly_once(
    publish: &dyn Fn(&[Value]),
    worker: &dyn Fn(&[&str]) -> Spawned,
    events: usize,
    keys: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    let mut per_key = HashMap::new();
    let published: Vec<Value> = (0..events)
        .map(|i| {
            let key = (i % 3 != 0).then(|| format!("key-{}", i % keys));
            let n = key.as_ref().map(|k| {
                let c = per_key.entry(k.clone()).or_insert(0);
                *c += 1;
                *c
            });
            json!({"id": format!("ev-{i:04}"), "type": "t", "key": key,
                   "handlers": ["alpha", "beta"], "payload": {"n": n}})
        })
        .collect();
    publish(&published);
    // Each line is shorter than PIPE_BUF, so appends from concurrent processes never interleave.
    let command = format!(
        "n=$(sed -n 's/.*\"payload\":{{\"n\":\\([0-9]*\\)}}.*/\\1/p'); echo \"$RELAYBUS_HANDLER $RELAYBUS_EVENT_ID ${{RELAYBUS_KEY:--}} ${{n:--}} $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let config = dir.path().join("handlers.toml");
    std::fs::write(
        &config,
        format!(
            "[handlers.alpha]\nexec = '''{command}'''\n\n[handlers.beta]\nexec = '''{command}'''\n"
        ),
    )
    .unwrap();
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--drain",
        "--poll-interval",
        "50ms",
        "--concurrency",
        "8",
    ];
    let workers: Vec<Spawned> = (0..3).map(|_| worker(&args)).collect();
    let mut handled = 0;
    for w in workers {
        let out = finish(w, Duration::from_secs(180));
        assert!(out.status.success(), "{}", stderr(&out));
        let summary = stdout(&out);
        handled += summary
            .strip_prefix("handled ")
            .and_then(|r| r.split(',').next())
            .unwrap()
            .parse::<usize>()
            .unwrap();
        assert!(
            summary.ends_with(", failed attempts 0, dead 0, lease lost 0, released 0\n"),
            "{summary}"
        );
    }
    assert_eq!(handled, 2 * events);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!((f.len(), f[4]), (5, "1"), "first attempts only: {line}");
        *seen.entry((f[0].into(), f[1].into())).or_default() += 1;
        if f[2] != "-" {
            let n: u64 = f[3].parse().unwrap();
            let prev = last.insert((f[0].into(), f[2].into()), n).unwrap_or(0);
            assert_eq!(n, prev + 1, "per-key order of {} on {}", f[0], f[2]);
        }
    }
    assert_eq!(seen.len(), 2 * events);
    assert!(seen.values().all(|&c| c == 1));
}

/// A worker died after its deliveries were done: its lane's lease expires with their ids still
/// listed in flight and nothing due in it. A worker that is running (its claims name the lanes
/// they hold, and look for new ones only where work is due) takes the lane over within seconds
/// and hands it back, so no lane stays held by a dead worker's expired lease. `publish` writes
/// events, `dead` is a store of the dead worker's, `worker` starts `run`.
pub fn a_dead_worker_s_lane_with_nothing_due_is_let_go(
    publish: &dyn Fn(&[Value]),
    dead: &relaybus::store::AnyStore,
    worker: &dyn Fn(&[&str]) -> Spawned,
) {
    use relaybus::store::prelude::*;
    let w = worker(&[
        "--handler",
        "h",
        "--exec",
        "cat >/dev/null",
        "--poll-interval",
        "100ms",
    ]);
    let held_by = |owner: &str| -> Vec<i16> {
        super::block_on(dead.lanes())
            .unwrap()
            .into_iter()
            .filter(|l| l.owner.as_deref() == Some(owner))
            .map(|l| l.lane)
            .collect()
    };
    // The running worker serves `h` only; the dead one ran `other`.
    publish(&[json!({"id": "e1", "type": "t", "handlers": ["other"]})]);
    let request = relaybus::store::ClaimRequest {
        lease: Duration::from_millis(300),
        ..super::claim_request("dead", &["other"])
    };
    let claimed = super::block_on(dead.claim(&request)).unwrap().0;
    assert_eq!(claimed.len(), 1);
    super::block_on(dead.complete(&[claimed[0].token.clone()], false)).unwrap();
    assert_eq!(held_by("dead"), [claimed[0].token.lane]);
    super::wait_until(
        "the running worker to take the dead worker's lane over",
        Duration::from_secs(10),
        || held_by("dead").is_empty(),
    );
    super::signal(&w, nix::sys::signal::Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
}
