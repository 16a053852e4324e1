//! What a worker refuses at start, before it claims anything: a handler it cannot run, a config
//! table that does not say how, a value out of range, a secret that signs nothing.

use crate::common::scenario::Target;
use crate::common::{relaybus, stderr, TestSchema};

/// A typo in the program's name would fail every attempt until the delivery is buried: it is
/// refused at start-up, while builtins, reserved words, paths and shell syntax are left to `sh`.
#[test]
fn a_handler_whose_program_cannot_be_found_is_refused_at_start_up() {
    let s = TestSchema::installed("missing_program");
    s.publish_ids(&["e1"], "h");
    let out = s
        .cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--exec",
            "relaybus-no-such-program --flag",
        ])
        .arg("--drain")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: handler `h`: `relaybus-no-such-program` is not a command sh can find (not a \
         builtin, and not on PATH=/usr/bin:/bin); every attempt would fail\n"
    );
    let out = s
        .cmd()
        .args(["run", "--handler", "h", "--exec", "./relaybus-missing.sh"])
        .arg("--drain")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        1
    );
    for command in [
        "exit 0",
        "if true; then exit 0; fi",
        "X=1 true",
        "$(echo true)",
        "/bin/true",
    ] {
        let out = s
            .cmd()
            .args(["run", "--handler", "h", "--exec", command, "--drain"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{command}: {}", stderr(&out));
    }
}

/// An unset variable in a deploy script makes an empty command, which `sh -c` runs
/// successfully: every delivery would be completed and deleted unhandled.
/// A config table names one way to run its handler: `noop = true` completes without running
/// anything, and a table that names two, or a breaker for a handler that is not a webhook, is
/// refused before anything is consumed.
#[test]
fn a_config_table_names_exactly_one_way_to_run_its_handler() {
    let s = TestSchema::installed("config_noop");
    s.publish_ids(&["e1", "e2"], "h");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("handlers.toml");
    std::fs::write(&config, "[handlers.h]\nexec = \"true\"\nnoop = true\n").unwrap();
    let run = || {
        s.cmd()
            .args(["run", "--drain", "--config", config.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = run();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).ends_with(
            "handler `h`: give exactly one of `exec`, `webhook`, `sql` or `noop = true`\n"
        ),
        "{}",
        stderr(&out)
    );
    // Only a webhook has a circuit breaker.
    std::fs::write(
        &config,
        "[handlers.h]\nexec = \"true\"\nbreaker_threshold = 3\n",
    )
    .unwrap();
    let out = run();
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (
            Some(2),
            "error: handler `h`: `breaker_threshold` and `breaker_max_cooldown` apply to a \
             `webhook` handler only\n"
                .to_owned()
        )
    );
    std::fs::write(&config, "[handlers.h]\nnoop = true\n").unwrap();
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    let left = format!("SELECT count(*) FROM {}", s.table("deliveries"));
    assert_eq!(s.count(&left), 0);
}

#[test]
fn an_empty_handler_command_is_refused_and_nothing_is_consumed() {
    let s = TestSchema::installed("empty_exec");
    s.publish_ids(&["e1", "e2"], "h");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("handlers.toml");
    std::fs::write(&config, "[handlers.h]\nexec = \"  \"\n").unwrap();
    let cases: [&[&str]; 3] = [
        &["--handler", "h", "--exec", ""],
        &["--handler", "h", "--exec", "   "],
        &["--config", config.to_str().unwrap()],
    ];
    for args in cases {
        let out = s
            .cmd()
            .arg("run")
            .args(args)
            .arg("--drain")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            stderr(&out),
            "error: handler `h`: the command is empty; give a command to run, or --noop to \
             complete deliveries without running anything\n"
        );
    }
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE status = 'pending'",
            s.table("deliveries")
        )),
        2
    );
}

/// Every duration and count has a range, checked before connecting: no panic, no worker that
/// takes over its own lanes, no statement that fails forever on an interval out of range.
#[test]
fn durations_and_counts_out_of_range_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("handlers.toml");
    std::fs::write(&config, "[handlers.h]\nexec = \"true\"\ntimeout = \"0s\"\n").unwrap();
    let config = config.to_str().unwrap().to_owned();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--handler", "h", "--noop", "--drain"];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            run(&["--completion-window", "18446744073709551615s"]),
            2,
            "out of range: give a duration from 0s to 1s",
        ),
        (
            run(&["--shutdown-grace", "300000000000y"]),
            2,
            "--shutdown-grace",
        ),
        (
            run(&["--lease-duration", "0s"]),
            2,
            "0s is out of range: give a duration from 1s to 1day",
        ),
        (run(&["--lease-duration", "1ns"]), 2, "1ns is out of range"),
        (
            run(&["--lease-duration", "1000000y"]),
            2,
            "--lease-duration",
        ),
        (run(&["--poll-interval", "0s"]), 2, "from 1ms to 1day"),
        (run(&["--max-attempts", "0"]), 2, "--max-attempts"),
        (
            vec![
                "purge".into(),
                "--dead-older-than".into(),
                "1000000y".into(),
            ],
            2,
            "--dead-older-than",
        ),
        (
            vec!["--lock-timeout".into(), "0s".into(), "setup".into()],
            2,
            "--lock-timeout",
        ),
        (
            vec![
                "run".into(),
                "--config".into(),
                config.clone(),
                "--drain".into(),
            ],
            2,
            "handler `h`: `timeout`: 0s is out of range: give a duration from 1ms to 1day",
        ),
    ];
    for (args, code, message) in cases {
        let out = relaybus()
            .env(
                "RELAYBUS_DATABASE_URL",
                "postgres://nobody@127.0.0.1:1/nothing",
            )
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
}

/// A webhook secret is checked where it is used: an empty key is refused, and a bad secret in
/// the environment does not stop a worker whose handlers are all shell commands.
#[test]
fn a_webhook_secret_is_checked_only_where_it_signs() {
    let s = TestSchema::installed("webhook_secret");
    let out = s
        .cmd()
        .args([
            "run",
            "--handler",
            "h",
            "--webhook",
            "http://127.0.0.1:1/",
            "--webhook-secret",
            "whsec_",
            "--drain",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: handler `h`: invalid --webhook-secret (or RELAYBUS_WEBHOOK_SECRET): the webhook \
         secret has no key after `whsec_`\n"
    );
    s.publish_ids(&["e1"], "h");
    s.cmd()
        .env("RELAYBUS_WEBHOOK_SECRET", "not a secret")
        .args(["run", "--handler", "h", "--exec", "true", "--drain"])
        .assert()
        .success()
        .stdout("handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n");
}
