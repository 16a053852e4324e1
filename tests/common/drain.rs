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
/// and hands it back, so no lane stays held by a dead worker's expired lease.
pub fn a_dead_worker_s_lane_with_nothing_due_is_let_go(t: &dyn super::scenario::Target) {
    use relaybus::store::prelude::*;
    let dead = &t.store(relaybus::store::StoreOptions::worker(1));
    let (publish, worker) = (
        |events: &[Value]| t.publish(events),
        |args: &[&str]| t.worker(args),
    );
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

/// A worker is killed with `kill -9` while its deliveries of `x` run, beside a survivor that
/// serves `x` too and has a backlog of `backlog` deliveries of `h` (in other lanes) filling
/// every claim it makes.
/// The killed worker's deliveries run on the survivor within the lease (5 s) and 5 s more: the
/// survivor takes the dead lanes over whatever its backlog, and does not wait for it to drain.
pub fn a_killed_worker_s_deliveries_run_beside_a_busy_survivor_within_the_lease(
    publish: &dyn Fn(&[Value]),
    worker: &dyn Fn(&[&str]) -> Spawned,
    backlog: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("x.log");
    let started = dir.path().join("started.log");
    // The backlog in lanes 0..127, the victims in lanes 128..255: a lane's deliveries run in
    // due order, so a victim behind older backlog in its own lane would wait for that, which is
    // the order promised, not the takeover measured here.
    let ids = |prefix: &'static str, lanes: std::ops::Range<i16>| {
        (0..)
            .map(move |i| format!("{prefix}{i:05}"))
            .filter(move |id| lanes.contains(&relaybus::store::lane::lane_of(None, id)))
    };
    let busy: Vec<Value> = ids("b", 0..128)
        .take(backlog)
        .map(|id| json!({"id": id, "type": "t", "handlers": ["h"]}))
        .collect();
    for chunk in busy.chunks(5000) {
        publish(chunk);
    }
    let busy_log = dir.path().join("busy.log");
    let config = dir.path().join("survivor.toml");
    std::fs::write(
        &config,
        format!(
            "[handlers.h]\nexec = 'cat >/dev/null; echo >> {}; sleep 0.2'\n\n[handlers.x]\nexec = 'cat >/dev/null; echo $RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT >> {}'\n",
            busy_log.display(),
            log.display()
        ),
    )
    .unwrap();
    let lease = ["--lease-duration", "5s", "--poll-interval", "100ms"];
    let doomed_run = format!(
        "echo $RELAYBUS_EVENT_ID >> {}; exec sleep 600",
        started.display()
    );
    let lines = |path: &std::path::Path| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .count()
    };
    // The doomed worker alone holds the victims' lanes: the survivor starts once it runs them.
    let doomed = worker(&[&["--handler", "x", "--exec", &doomed_run][..], &lease].concat());
    let victims: Vec<Value> = ids("x", 128..256)
        .take(5)
        .map(|id| json!({"id": id, "type": "t", "handlers": ["x"]}))
        .collect();
    publish(&victims);
    super::wait_until(
        "the doomed worker to run the victims",
        Duration::from_secs(30),
        || lines(&started) == 5,
    );
    let survivor = worker(&[&["--config", config.to_str().unwrap()][..], &lease].concat());
    super::wait_until(
        "the survivor to be busy with its backlog",
        Duration::from_secs(30),
        || lines(&busy_log) >= 10,
    );
    super::signal(&doomed, nix::sys::signal::Signal::SIGKILL);
    let killed = std::time::Instant::now();
    drop(doomed);
    super::wait_until(
        "the killed worker's deliveries to run on the survivor",
        Duration::from_secs(60),
        || lines(&log) == 5,
    );
    let took = killed.elapsed();
    super::signal(&survivor, nix::sys::signal::Signal::SIGTERM);
    let out = finish(survivor, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        took < Duration::from_secs(10),
        "the killed worker's deliveries ran {took:?} after the kill, past the lease and 5 s"
    );
    let mut ran: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    ran.sort();
    let expected: Vec<String> = victims
        .iter()
        .map(|v| format!("{} 2", v["id"].as_str().unwrap()))
        .collect();
    assert_eq!(ran, expected, "each at its second attempt, once");
}
