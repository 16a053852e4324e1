//! Pause and resume, and the webhook circuit breaker, through the real binary: both engines
//! run these stories (`tests/scenarios.rs`).

use std::time::{Duration, Instant};

use assert_cmd::Command;
use serde_json::{json, Value};

use super::scenario::Target;
use super::{finish, http, signal, stderr, stdout, wait_until};

fn publish(cmd: &dyn Fn() -> Command, handler: &str, events: usize) {
    let lines: Vec<String> = (0..events)
        .map(|i| json!({"id": format!("{handler}-{i:04}"), "type": "t", "handlers": [handler]}))
        .map(|e| e.to_string())
        .collect();
    let out = cmd()
        .arg("publish")
        .write_stdin(lines.join("\n"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The deliveries of `handler` that are left, with their attempts.
fn left(cmd: &dyn Fn() -> Command, handler: &str) -> Vec<(String, i64)> {
    let out = cmd()
        .args([
            "deliveries",
            "list",
            "--handler",
            handler,
            "--limit",
            "100000",
        ])
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Value = serde_json::from_str(&stdout(&out)).unwrap();
    listed["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let status = d["status"].as_str().unwrap().to_owned();
            (status, d["attempts"].as_i64().unwrap())
        })
        .collect()
}

/// A worker of `hook` that sends one request at a time to `url` and reads the handlers table
/// every 100 ms.
fn one_at_a_time<'a>(url: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let args = ["--handler", "hook", "--webhook", url, "--concurrency", "1"];
    [&args[..], &["--poll-interval", "100ms"], more].concat()
}

/// Waits until the endpoint has answered `n` requests with 200.
fn answered(server: &http::Server, n: usize, what: &str, within: Duration) {
    wait_until(what, within, || {
        let requests = server.requests.lock().unwrap();
        requests.iter().filter(|r| r.status == 200).count() == n
    });
}

fn handled(log: &std::path::Path, handler: &str) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{handler} ")))
        .map(str::to_owned)
        .collect()
}

/// A worker runs `paused` and `flowing`; `paused` is paused while both have work: within a
/// second its deliveries stop being claimed, `flowing` keeps going, and no attempt is charged.
/// Resumed, it drains: every event handled once, at its first attempt.
pub fn a_pause_holds_one_handler_and_a_resume_drains_it(t: &dyn Target) {
    let (cmd, worker) = (&|| t.cmd(), &|args: &[&str]| t.worker(args));
    let events = t.scale(300);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handled.log");
    publish(cmd, "paused", events);
    publish(cmd, "flowing", events * 5);
    let exec = format!(
        "sleep 0.02; echo \"$RELAYBUS_HANDLER $RELAYBUS_EVENT_ID $RELAYBUS_ATTEMPT\" >> {}",
        log.display()
    );
    let config = dir.path().join("handlers.toml");
    std::fs::write(
        &config,
        format!(
            "[handlers.paused]\nexec = '''{exec}'''\n\n[handlers.flowing]\nexec = '''{exec}'''\n"
        ),
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap(), "--concurrency", "4"];
    let args = [&args[..], &["--poll-interval", "100ms"]].concat();
    let w = worker(&args);
    wait_until(
        "a few deliveries of each handler",
        Duration::from_secs(60),
        || handled(&log, "paused").len() >= 5,
    );
    let out = cmd()
        .args([
            "handlers",
            "pause",
            "paused",
            "--reason",
            "INC-1: ledger is read-only",
        ])
        .args(["--by", "ana"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "paused handler `paused`: workers stop claiming its deliveries within a second; those \
         running finish\n"
    );
    // A second, then what was claimed before it finishing.
    std::thread::sleep(Duration::from_millis(1500));
    let (stopped_at, flowing_at) = (
        handled(&log, "paused").len(),
        handled(&log, "flowing").len(),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(handled(&log, "paused").len(), stopped_at);
    let flowing = handled(&log, "flowing").len();
    assert!(flowing > flowing_at, "{flowing} > {flowing_at}");
    assert!(flowing < events * 5, "flowing ran out of work: {flowing}");
    let waiting = left(cmd, "paused");
    assert_eq!(waiting.len(), events - stopped_at);
    assert!(
        waiting.iter().all(|d| d == &("pending".to_owned(), 0)),
        "{waiting:?}"
    );
    let listed = cmd().args(["handlers", "list", "--json"]).output().unwrap();
    let listed: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let paused = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["handler"] == "paused")
        .unwrap();
    assert_eq!(
        (
            &paused["paused"],
            &paused["paused_by"],
            &paused["pause_reason"]
        ),
        (
            &json!(true),
            &json!("ana"),
            &json!("INC-1: ledger is read-only")
        )
    );
    assert_eq!(
        paused["due"].as_u64().unwrap() as usize,
        events - stopped_at
    );
    let out = cmd()
        .args(["handlers", "resume", "paused"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until("every delivery handled", Duration::from_secs(120), || {
        handled(&log, "paused").len() == events && handled(&log, "flowing").len() == events * 5
    });
    signal(&w, nix::sys::signal::Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    let logged = stderr(&out);
    assert!(logged.contains("handler paused"), "{logged}");
    assert!(logged.contains("handler resumed"), "{logged}");
    for handler in ["paused", "flowing"] {
        let mut lines = handled(&log, handler);
        lines.sort();
        lines.dedup();
        let want = if handler == "paused" {
            events
        } else {
            events * 5
        };
        assert_eq!(lines.len(), want, "each {handler} event once");
        assert!(
            lines.iter().all(|l| l.ends_with(" 1")),
            "first attempts only"
        );
    }
    assert_eq!(left(cmd, "paused"), []);
}

/// An endpoint that answers 503 for its first 60 s, then 200: the breaker opens after 10
/// failures in a row, its probe after 30 s fails, the one 60 s later succeeds, and every
/// delivery then arrives once, none dead. Counted at the server: the 10 failures and one probe
/// during the outage.
pub fn a_failing_endpoint_opens_the_breaker_and_every_delivery_arrives_once(t: &dyn Target) {
    let (cmd, worker) = (&|| t.cmd(), &|args: &[&str]| t.worker(args));
    let outage = Duration::from_secs(60);
    let started = Instant::now();
    let server = http::serve_with(move |_, at| {
        if at.duration_since(started) < outage {
            (503, "", "down for maintenance")
        } else {
            (200, "", "")
        }
    });
    publish(cmd, "hook", 20);
    let w = worker(&one_at_a_time(&server.url, &[]));
    answered(&server, 20, "every delivery", Duration::from_secs(150));
    std::thread::sleep(Duration::from_secs(1));
    signal(&w, nix::sys::signal::Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    let logged = stderr(&out);
    let requests = server.requests.lock().unwrap().clone();
    let failed: Vec<_> = requests.iter().filter(|r| r.status == 503).collect();
    assert_eq!(failed.len(), 11, "{logged}");
    let opened_at = failed[9].at;
    let probe = failed[10].at.duration_since(opened_at);
    assert!(probe >= Duration::from_secs(29), "probe after {probe:?}");
    let first_200 = requests.iter().find(|r| r.status == 200).unwrap().at;
    let second_probe = first_200.duration_since(failed[10].at);
    assert!(second_probe >= Duration::from_secs(59), "{second_probe:?}");
    let mut delivered: Vec<Value> = requests
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| serde_json::from_str::<Value>(&r.body).unwrap()["id"].clone())
        .collect();
    delivered.sort_by_key(|v| v.to_string());
    delivered.dedup();
    assert_eq!(delivered.len(), 20, "each event once");
    assert_eq!(left(cmd, "hook"), []);
    assert!(logged.contains("circuit breaker opened"), "{logged}");
    assert!(logged.contains("circuit breaker closed"), "{logged}");
}

/// Two workers configured with different thresholds for one failing endpoint: each writes its
/// settings to the handler's row when it starts, and the breaker counts against the row's, the
/// last started one's, whichever worker sends. The endpoint comes back; the operator closes the
/// breaker by hand, and every delivery arrives long before the 30 s cool-down would have ended.
/// A second close changes nothing.
pub fn a_breaker_counts_against_the_last_started_worker_s_settings_and_an_operator_closes_it(
    t: &dyn Target,
) {
    let (cmd, worker) = (&|| t.cmd(), &|args: &[&str]| t.worker(args));
    let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let serving = std::sync::Arc::clone(&up);
    let server = http::serve_with(move |_, _| {
        if serving.load(std::sync::atomic::Ordering::SeqCst) {
            (200, "", "")
        } else {
            (503, "", "down")
        }
    });
    publish(cmd, "hook", 10);
    let paused = cmd().args(["handlers", "pause", "hook"]).output().unwrap();
    assert!(paused.status.success(), "{}", stderr(&paused));
    let start = |threshold: &str| {
        worker(&one_at_a_time(
            &server.url,
            &["--breaker-threshold", threshold],
        ))
    };
    let hook = || -> Value {
        let out = cmd().args(["handlers", "list", "--json"]).output().unwrap();
        let listed: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let hook = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["handler"] == "hook");
        hook.cloned().unwrap()
    };
    let settings = |threshold: i64| {
        move || hook()["breaker_policy"] == json!({"threshold": threshold, "max_cooldown": "10m"})
    };
    let sender = start("100");
    wait_until(
        "the first worker's settings",
        Duration::from_secs(20),
        settings(100),
    );
    // The second starts while the handler is paused, and stops once its settings are in.
    let second = start("2");
    wait_until(
        "the second worker's settings",
        Duration::from_secs(20),
        settings(2),
    );
    signal(&second, nix::sys::signal::Signal::SIGTERM);
    let logged = stderr(&finish(second, Duration::from_secs(30)));
    assert!(
        logged.contains("circuit breaker settings written to the handlers table")
            && logged.contains("threshold 2, max cool-down 10m"),
        "{logged}"
    );
    let resumed = cmd().args(["handlers", "resume", "hook"]).output().unwrap();
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    // One request at a time: the second failure opens it, and nothing more is sent.
    wait_until("the breaker open", Duration::from_secs(30), || {
        hook()["breaker"] == "open"
    });
    assert_eq!(hook()["failures"], 2);
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    let closed = cmd()
        .args(["handlers", "close-breaker", "hook"])
        .output()
        .unwrap();
    assert_eq!(
        stdout(&closed),
        "closed the circuit breaker of `hook`: workers send to its endpoint again within a second\n"
    );
    answered(
        &server,
        10,
        "every delivery, before the cool-down ends",
        Duration::from_secs(20),
    );
    let again = cmd()
        .args(["handlers", "close-breaker", "hook"])
        .output()
        .unwrap();
    assert_eq!(
        stdout(&again),
        "the circuit breaker of `hook` is closed; nothing changed\n"
    );
    signal(&sender, nix::sys::signal::Signal::SIGTERM);
    let logged = stderr(&finish(sender, Duration::from_secs(30)));
    for said in [
        "circuit breaker settings changed in the handlers table",
        "threshold 2, max cool-down 10m",
        "circuit breaker opened",
    ] {
        assert!(logged.contains(said), "{said}: {logged}");
    }
    assert_eq!(left(cmd, "hook"), []);
}
