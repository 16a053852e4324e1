//! `relaybus workers` on both engines: a running worker shows with its host, process, lanes and
//! deliveries in flight; once it is killed, its leases show as expired.

use std::time::Duration;

use serde_json::{json, Value};

use super::scenario::Target;
use super::{finish, stderr};

pub fn a_worker_shows_its_host_process_lanes_and_expired_leases(t: &dyn Target) {
    let workers = || -> Value {
        let out = t.cmd().args(["--json", "workers"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert_eq!(workers(), json!({"workers": []}));
    let lane = |id: &str| relaybus::store::lane::lane_of(None, id);
    assert_ne!(lane("w1"), lane("w2"), "two lanes");
    t.publish(&[
        json!({"id": "w1", "type": "t", "handlers": ["h"]}),
        json!({"id": "w2", "type": "t", "handlers": ["h"]}),
    ]);
    let w = t.worker(&[
        "--handler",
        "h",
        "--exec",
        "sleep 60",
        "--lease-duration",
        "2s",
        "--poll-interval",
        "100ms",
    ]);
    let start = std::time::Instant::now();
    let shown = loop {
        let shown = workers();
        if shown["workers"][0]["in_flight"] == 2 {
            break shown;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{shown}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let one = &shown["workers"][0];
    assert_eq!(shown["workers"].as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(
        (
            &one["host"],
            &one["pid"],
            &one["lanes"],
            &one["expired_lanes"]
        ),
        (
            &json!(relaybus::identity::hostname()),
            &json!(w.id()),
            &json!(2),
            &json!(0)
        ),
        "{shown}"
    );
    let owner = one["owner"].as_str().unwrap();
    assert!(owner.starts_with(&format!("{}:{}:", relaybus::identity::hostname(), w.id())));
    super::signal(&w, nix::sys::signal::Signal::SIGKILL);
    let out = finish(w, Duration::from_secs(10));
    assert!(!out.status.success(), "{}", stderr(&out));
    std::thread::sleep(Duration::from_millis(2500));
    let dead = workers();
    assert_eq!(
        (
            &dead["workers"][0]["owner"],
            &dead["workers"][0]["expired_lanes"]
        ),
        (&json!(owner), &json!(2)),
        "{dead}"
    );
}
