//! `run --metrics-addr`: a real worker scraped over real HTTP.

use std::time::Duration;

use serde_json::json;

use crate::common::cluster::free_port;
use crate::common::http::probe;
use crate::common::scenario::Target;
use crate::common::{finish, signal, spawn_worker, stdout, wait_in_flight, wait_until, TestSchema};

/// Status and body of a GET.
fn get(url: &str) -> (u16, String) {
    crate::common::block_on(async {
        let response = reqwest::get(url).await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    })
}

/// The value of one series in a scrape, if present.
fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[test]
fn a_scrape_counts_what_the_worker_handled_and_readyz_turns_unready_on_shutdown() {
    let s = TestSchema::installed("metrics");
    let base = format!("http://127.0.0.1:{}", free_port());
    let events: Vec<_> = (0..20)
        .map(|i| json!({"id": format!("e{i}"), "type": "t", "handlers": ["h"]}))
        .collect();
    s.publish(&events);
    let addr = base.trim_start_matches("http://");
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            "cat >/dev/null; [ \"$RELAYBUS_EVENT_ID\" = slow ] && sleep 3; exit 0",
            "--poll-interval",
            "50ms",
            "--metrics-addr",
            addr,
        ],
    );
    let handled = "relaybus_deliveries_handled_total{handler=\"h\"}";
    let mut scrape = String::new();
    wait_until("20 handled in a scrape", Duration::from_secs(20), || {
        scrape = std::net::TcpStream::connect(addr)
            .ok()
            .map(|_| get(&format!("{base}/metrics")).1)
            .unwrap_or_default();
        value(&scrape, handled) == Some(20.0)
    });
    for (series, expected) in [
        ("relaybus_deliveries_in_flight", 0.0),
        (
            "relaybus_handler_duration_seconds_count{handler=\"h\"}",
            20.0,
        ),
        ("relaybus_deliveries_buried_total{handler=\"h\"}", 0.0),
    ] {
        assert_eq!(value(&scrape, series), Some(expected), "{series}\n{scrape}");
    }
    assert!(value(&scrape, "relaybus_claims_total").unwrap() >= 1.0);
    // Read from the store when first scraped, so whatever was due then.
    assert!(value(&scrape, "relaybus_lag_seconds{handler=\"h\"}").is_some());
    assert!(scrape.ends_with("# EOF\n"), "{scrape}");
    assert!(!scrape.contains("e1"), "an event id in a label:\n{scrape}");
    assert_eq!(get(&format!("{base}/healthz")), (200, "ok\n".into()));
    assert_eq!(get(&format!("{base}/readyz")), (200, "ready\n".into()));

    // A delivery still running when SIGTERM comes keeps the worker in its grace period: not
    // ready from the signal on, although it still serves.
    s.publish(&[json!({"id": "slow", "type": "t", "handlers": ["h"]})]);
    wait_in_flight(&s, 1);
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let mut readiness = (0, String::new());
    wait_until("readyz to turn unready", Duration::from_secs(2), || {
        readiness = get(&format!("{base}/readyz"));
        readiness.0 != 200
    });
    assert_eq!(readiness, (503, "not ready: shutting down\n".into()));
    let out = finish(worker, Duration::from_secs(30));
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "handled 21, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}

/// Idle connections fill every slot of the endpoint, some never sending a byte and some after
/// a request kept alive: health and readiness still answer within a second, each new
/// connection closing the oldest.
#[test]
fn probes_answer_while_idle_connections_hold_every_slot() {
    use std::io::{Read, Write};
    let s = TestSchema::installed("probes");
    let addr = format!("127.0.0.1:{}", free_port());
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--noop",
            "--poll-interval",
            "50ms",
            "--metrics-addr",
            &addr,
        ],
    );
    let base = format!("http://{addr}");
    wait_until("the worker ready", Duration::from_secs(20), || {
        probe(&format!("{base}/readyz")).is_ok_and(|r| r.0 == 200)
    });
    let mut idle: Vec<std::net::TcpStream> = (0..40)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    for _ in 0..10 {
        let mut kept = std::net::TcpStream::connect(&addr).unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = [0u8; 64];
        let n = kept.read(&mut answer).unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
        idle.push(kept);
    }
    for path in ["healthz", "readyz", "healthz", "readyz"] {
        let answer = probe(&format!("{base}/{path}"));
        let expected = if path == "healthz" { "ok\n" } else { "ready\n" };
        assert_eq!(answer, Ok((200, expected.to_owned())), "/{path}");
    }
    drop(idle);
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    assert!(finish(worker, Duration::from_secs(30)).status.success());
}

/// A worker started while its only handler is paused claims nothing, and is ready: it does what
/// the operator asked, and `/readyz` says why nothing runs. Resumed, it works.
#[test]
fn a_worker_started_during_a_pause_is_ready_and_says_why_nothing_runs() {
    let s = TestSchema::installed("ready_paused");
    s.publish(&[json!({"id": "e1", "type": "t", "handlers": ["h"]})]);
    s.cmd()
        .args(["handlers", "pause", "h", "--reason", "deploy"])
        .assert()
        .success();
    let addr = format!("127.0.0.1:{}", free_port());
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--noop",
            "--poll-interval",
            "50ms",
            "--metrics-addr",
            &addr,
        ],
    );
    let readyz = format!("http://{addr}/readyz");
    let mut answer = Err(String::new());
    // Until its first claim returns the worker says it is starting.
    wait_until("the first claim", Duration::from_secs(20), || {
        answer = probe(&readyz);
        answer
            .as_ref()
            .is_ok_and(|(_, text)| !text.contains("starting"))
    });
    assert_eq!(
        answer,
        Ok((
            200,
            "ready: nothing is claimed: `h` is paused (deploy)\n".to_owned()
        ))
    );
    s.cmd().args(["handlers", "resume", "h"]).assert().success();
    let left = format!("SELECT count(*) FROM {}", s.table("deliveries"));
    wait_until("the delivery handled", Duration::from_secs(10), || {
        s.count(&left) == 0
    });
    assert_eq!(probe(&readyz), Ok((200, "ready\n".to_owned())));
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}
