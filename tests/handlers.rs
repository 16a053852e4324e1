//! What handlers see and do: shell handlers against real programs (ones that write a lot, leave
//! background jobs behind, or log before they read; the attempt is the command's own exit, and no
//! output grows the worker), the environment and payload they are given, webhooks that redirect,
//! and handlers that die with a killed worker.

use std::process::Command as StdCommand;
use std::time::Duration;

use crate::common::http::serve;
use crate::common::scenario::Target;
use crate::common::{
    finish, signal, spawn_worker, stderr, stdout, wait_in_flight, wait_until, TestSchema,
};

fn event(id: &str, payload: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"id": id, "type": "t", "handlers": ["h"], "payload": payload})
}

/// The peak resident memory of a process, in kB, from the kernel.
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A handler that writes 100 MB to stderr costs the worker only the tail it keeps: its memory
/// stays under 64 MB at its peak, and `last_error` holds the last 2,048 bytes, ending with what
/// the handler wrote last.
#[test]
fn a_hundred_megabytes_on_stderr_keep_the_worker_small_and_the_error_its_tail() {
    let s = TestSchema::installed("stderr_flood");
    s.publish(&[event("e1", serde_json::json!({}))]);
    let w = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            "head -c 100000000 /dev/zero | tr '\\0' x >&2; printf '\\nthe end\\n' >&2; exit 3",
            "--max-attempts",
            "1",
            "--timeout",
            "50s",
            "--poll-interval",
            "50ms",
        ],
    );
    let dead = format!(
        "SELECT count(*) FROM {} WHERE status = 'dead'",
        s.table("deliveries")
    );
    wait_until("the delivery buried", Duration::from_secs(55), || {
        s.count(&dead) == 1
    });
    let peak = peak_rss_kb(w.id());
    signal(&w, nix::sys::signal::Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 0, failed attempts 0, dead 1, lease lost 0, released 0\n",
        "{}",
        stderr(&out)
    );
    assert!(peak < 64 * 1024, "the worker peaked at {peak} kB");
    let error: String =
        s.query(&format!("SELECT last_error FROM {}", s.table("deliveries")))[0].get(0);
    // The tail is 2,048 bytes, "x…x\nthe end\n", trimmed of its last newline.
    let expected = format!("exit 3: {}\nthe end", "x".repeat(2048 - 9));
    assert!(
        error == expected,
        "last_error is {} bytes: {error:.80}…",
        error.len()
    );
}

/// The attempt ends when `sh` exits: a background job left in the handler's process group
/// holds its stderr open, yet the delivery completes at its first attempt, long before the
/// timeout; the job is killed with the group a second later. One that left the group
/// (`setsid`) is left running.
#[test]
fn background_jobs_do_not_hold_the_delivery_past_the_command_s_exit() {
    let s = TestSchema::installed("background_jobs");
    // The sleeps' arguments are built by the shell, so that only they match, not the worker.
    let seconds = format!("{}.{}", 400 + std::process::id() % 100, std::process::id());
    let (in_group, detached) = (format!("{seconds}1"), format!("{seconds}2"));
    let running = |m: &str| {
        let found = StdCommand::new("pgrep")
            .args(["-f", &format!("sleep {m}")])
            .output()
            .unwrap();
        !stdout(&found).is_empty()
    };
    let job = format!(
        "s={seconds}; if [ \"$RELAYBUS_EVENT_ID\" = e1 ]; then sleep ${{s}}1 & else setsid sleep ${{s}}2 & fi; echo ok"
    );
    let w = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &job,
            "--timeout",
            "20s",
            "--completion-history",
            "--poll-interval",
            "50ms",
        ],
    );
    s.publish(&[event("e1", serde_json::json!({}))]);
    s.publish(&[event("e2", serde_json::json!({}))]);
    let completed = format!("SELECT count(*) FROM {}", s.table("completions"));
    wait_until("both deliveries completed", Duration::from_secs(10), || {
        s.count(&completed) == 2
    });
    assert!(
        running(&detached),
        "the job that left the group was not started"
    );
    wait_until(
        "the job in the group killed",
        Duration::from_secs(5),
        || !running(&in_group),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let detached_lives = running(&detached);
    let _ = StdCommand::new("pkill")
        .args(["-f", &format!("sleep {detached}")])
        .status();
    assert!(detached_lives, "the job that left the group was killed");
    signal(&w, nix::sys::signal::Signal::SIGTERM);
    let out = finish(w, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 2, failed attempts 0, dead 0, lease lost 0, released 0\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT event_id, attempts FROM {} ORDER BY 1",
            s.table("completions")
        )),
        ["e1|1", "e2|1"]
    );
}

/// A handler that logs 100 kB before it reads a 200,000-byte envelope: the worker writes the
/// envelope while it reads stderr, so neither waits on a full pipe, and the handler gets the
/// whole envelope.
#[test]
fn a_large_envelope_and_a_handler_that_logs_before_reading_do_not_deadlock() {
    let s = TestSchema::installed("pipe_deadlock");
    let blob = "a".repeat(200_000);
    s.publish(&[event("e1", serde_json::json!({ "blob": blob }))]);
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("envelope.json");
    let job = format!(
        "head -c 100000 /dev/zero | tr '\\0' y >&2; cat > {}",
        got.display()
    );
    s.cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            &job,
            "--timeout",
            "20s",
            "--max-attempts",
            "1",
            "--drain",
        ])
        .timeout(Duration::from_secs(30))
        .assert()
        .success()
        .stdout("handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n");
    let envelope: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&got).unwrap()).unwrap();
    assert_eq!(envelope["payload"]["blob"].as_str(), Some(blob.as_str()));
}

/// A redirect is never followed: 301-303 would turn the POST into a GET without the envelope and
/// complete the delivery on its 200; 307/308 would send the signed body to whatever the
/// `Location` names. Either is a failed attempt that names the `Location`.
#[test]
fn a_webhook_redirect_is_a_failed_attempt_naming_the_location() {
    for status in [302, 307] {
        let s = TestSchema::installed(&format!("redirect_{status}"));
        s.publish_ids(&["e1"], "hook");
        let target = serve(vec![(200, "", "ok")]);
        let header: &'static str =
            Box::leak(format!("Location: {}\r\n", target.url).into_boxed_str());
        let redirecting = serve(vec![(status, header, "")]);
        s.cmd()
            .args([
                "run",
                "--handler",
                "hook",
                "--webhook",
                &redirecting.url,
                "--drain",
            ])
            .assert()
            .success()
            .stdout(
                "handled 0, failed attempts 1, dead 0, lease lost 0, released 0; \
                 1 scheduled for a later attempt, not drained\n",
            );
        let requests = redirecting.requests.lock().unwrap().clone();
        assert_eq!(
            requests
                .iter()
                .map(|r| r.method.as_str())
                .collect::<Vec<_>>(),
            ["POST"]
        );
        assert_eq!(
            target.requests.lock().unwrap().len(),
            0,
            "the redirect was followed"
        );
        assert_eq!(
            s.rows(&format!(
                "SELECT status, attempts, last_error FROM {}",
                s.table("deliveries")
            )),
            [format!(
                "pending|1|HTTP {status}: redirect to {} not followed; point the webhook at the final URL",
                target.url
            )]
        );
    }
}

/// A handler runs as the worker's user; it must not read the worker's environment (the database
/// URL, the webhook secret) from /proc. Root may read any process's, so both run as `nobody`.
#[test]
fn a_handler_cannot_read_the_worker_s_environment() {
    let s = TestSchema::installed("environ");
    s.publish_ids(&["e1"], "h");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let result = dir.path().join("result");
    let probe = format!(
        "if cat /proc/$PPID/environ >/dev/null 2>&1; then echo readable; else echo protected; fi > {}",
        result.display()
    );
    let out = StdCommand::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
        .args([
            "--schema",
            &s.name,
            "run",
            "--handler",
            "h",
            "--exec",
            &probe,
            "--drain",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "protected\n");
}

/// A worker killed with SIGKILL cannot stop its handlers; the kernel does, so a delivery that
/// another worker takes over does not run twice at once.
#[test]
fn handlers_die_with_a_killed_worker() {
    let s = TestSchema::installed("pdeathsig");
    s.publish_ids(&["e1"], "h");
    let marker = format!("{}.{}", 500 + std::process::id() % 100, std::process::id());
    let worker = spawn_worker(
        &s,
        &[
            "--handler",
            "h",
            "--exec",
            &format!("cat >/dev/null; exec sleep {marker}"),
        ],
    );
    wait_in_flight(&s, 1);
    let running = || {
        let out = StdCommand::new("pgrep")
            .args(["-f", &format!("sleep {marker}")])
            .output()
            .unwrap();
        !stdout(&out).is_empty()
    };
    wait_until("the handler to start", Duration::from_secs(10), running);
    signal(&worker, nix::sys::signal::Signal::SIGKILL);
    finish(worker, Duration::from_secs(10));
    wait_until(
        "the handler to die with its worker",
        Duration::from_secs(10),
        || !running(),
    );
}

/// A payload reaches the store and the handler exactly as published, every digit of a large
/// number included (it was rounded through a 64-bit float).
/// What README's "Concepts" says a PostgreSQL store keeps of a payload, exactly: values and
/// digits; not key order, whitespace, a duplicate key's first value, or a number's notation.
#[test]
fn a_payload_reaches_the_handler_as_the_readme_says_jsonb_keeps_it() {
    let s = TestSchema::installed("payload_fidelity");
    let payload =
        r#"{"zeta": [1e-7, -0.0, 1.50, 12345678901234567890.123456789], "id": 1, "id": 2}"#;
    s.cmd()
        .arg("publish")
        .write_stdin(format!(
            r#"{{"id": "e1", "type": "t", "handlers": ["h"], "payload": {payload}}}"#
        ))
        .assert()
        .success();
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    s.cmd()
        .args(["run", "--handler", "h", "--drain"])
        .args(["--exec", &format!("cat > {}", seen.display())])
        .assert()
        .success();
    let envelope = std::fs::read_to_string(&seen).unwrap();
    assert!(
        envelope.contains(
            r#""payload":{"id":2,"zeta":[0.0000001,0.0,1.50,12345678901234567890.123456789]}"#
        ),
        "{envelope}"
    );
}

#[test]
fn numbers_in_payloads_keep_every_digit() {
    let s = TestSchema::installed("big_numbers");
    let payload =
        r#"{"amount":123456789012345678901234567890,"rate":0.1000000000000000055511151231257827}"#;
    s.cmd()
        .arg("publish")
        .write_stdin(format!(
            r#"{{"id": "e1", "type": "t", "handlers": ["h"], "payload": {payload}}}"#
        ))
        .assert()
        .success();
    s.cmd()
        .args([
            "publish",
            "--type",
            "t",
            "--id",
            "e2",
            "--handler",
            "h",
            "--data",
            payload,
        ])
        .assert()
        .success();
    assert_eq!(
        s.rows(&format!(
            "SELECT payload::text FROM {} ORDER BY id",
            s.table("events")
        )),
        [r#"{"rate": 0.1000000000000000055511151231257827, "amount": 123456789012345678901234567890}"#;
            2]
    );
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    s.cmd()
        .args(["run", "--handler", "h", "--drain", "--concurrency", "1"])
        .args([
            "--exec",
            &format!("cat >> {}; echo >> {}", seen.display(), seen.display()),
        ])
        .assert()
        .success();
    let lines = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(lines.lines().count(), 2);
    for line in lines.lines() {
        let envelope: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            envelope["payload"]["amount"].to_string(),
            "123456789012345678901234567890"
        );
        assert_eq!(
            envelope["payload"]["rate"].to_string(),
            "0.1000000000000000055511151231257827"
        );
        assert!(
            line.contains(r#""amount":123456789012345678901234567890"#),
            "{line}"
        );
    }
}
