//! Defects found by trying relaybus as a hostile operator and a new user would: each test here
//! failed before its fix.

use std::process::Command as StdCommand;
use std::time::Duration;

use crate::common::http::serve;
use crate::common::scenario::Target;
use crate::common::{
    finish, relaybus, signal, spawn_worker, stderr, stdout, wait_in_flight, wait_until, Spawned,
    TestSchema,
};

fn publish(s: &TestSchema, ids: &[&str], handler: &str) {
    let events: Vec<_> = ids
        .iter()
        .map(|id| serde_json::json!({"id": id, "type": "t", "handlers": [handler]}))
        .collect();
    s.publish(&events);
}

/// A redirect is never followed: 301-303 would turn the POST into a GET without the envelope and
/// complete the delivery on its 200; 307/308 would send the signed body to whatever the
/// `Location` names. Either is a failed attempt that names the `Location`.
#[test]
fn a_webhook_redirect_is_a_failed_attempt_naming_the_location() {
    for status in [302, 307] {
        let s = TestSchema::installed(&format!("redirect_{status}"));
        publish(&s, &["e1"], "hook");
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

/// A typo in the program's name would fail every attempt until the delivery is buried: it is
/// refused at start-up, while builtins, reserved words, paths and shell syntax are left to `sh`.
#[test]
fn a_handler_whose_program_cannot_be_found_is_refused_at_start_up() {
    let s = TestSchema::installed("missing_program");
    publish(&s, &["e1"], "h");
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
/// anything, and a table that names two is refused before anything is consumed.
#[test]
fn a_config_table_names_exactly_one_way_to_run_its_handler() {
    let s = TestSchema::installed("config_noop");
    publish(&s, &["e1", "e2"], "h");
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
    std::fs::write(&config, "[handlers.h]\nnoop = true\n").unwrap();
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    let left = format!("SELECT count(*) FROM {}", s.table("deliveries"));
    assert_eq!(s.count(&left), 0);
}

#[test]
fn an_empty_handler_command_is_refused_and_nothing_is_consumed() {
    let s = TestSchema::installed("empty_exec");
    publish(&s, &["e1", "e2"], "h");
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
    publish(&s, &["e1"], "h");
    s.cmd()
        .env("RELAYBUS_WEBHOOK_SECRET", "not a secret")
        .args(["run", "--handler", "h", "--exec", "true", "--drain"])
        .assert()
        .success()
        .stdout("handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n");
}

/// Secrets can come from files, so they need not sit in the environment.
#[test]
fn the_database_url_and_the_webhook_secret_can_come_from_files() {
    let s = TestSchema::installed("secret_files");
    publish(&s, &["e1"], "hook");
    let dir = tempfile::tempdir().unwrap();
    let (url_file, secret_file) = (dir.path().join("url"), dir.path().join("secret"));
    std::fs::write(&url_file, format!("{}\n", crate::common::database_url())).unwrap();
    std::fs::write(&secret_file, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
    let server = serve(vec![(204, "", "")]);
    s.cmd()
        .env_remove("RELAYBUS_DATABASE_URL")
        .env("RELAYBUS_DATABASE_URL_FILE", &url_file)
        .env("RELAYBUS_WEBHOOK_SECRET_FILE", &secret_file)
        .args([
            "run",
            "--handler",
            "hook",
            "--webhook",
            &server.url,
            "--drain",
        ])
        .assert()
        .success()
        .stdout("handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n");
    let request = server.requests.lock().unwrap()[0].clone();
    assert!(request
        .header("webhook-signature")
        .unwrap()
        .starts_with("v1,"));
}

/// A handler runs as the worker's user; it must not read the worker's environment (the database
/// URL, the webhook secret) from /proc. Root may read any process's, so both run as `nobody`.
#[test]
fn a_handler_cannot_read_the_worker_s_environment() {
    let s = TestSchema::installed("environ");
    publish(&s, &["e1"], "h");
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
    publish(&s, &["e1"], "h");
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

/// `key=value` connection strings and TLS, as every libpq tool takes them: the worker's own
/// connections are encrypted when asked, verified against a root certificate when asked, and
/// refused when the certificate names another host.
#[test]
fn key_value_strings_and_tls_modes_reach_the_server_as_libpq_would() {
    let s = TestSchema::installed("tls");
    let db = crate::common::database_name();
    let root = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    let check = |conn: &str| {
        s.cmd()
            .env("RELAYBUS_DATABASE_URL", conn)
            .args(["setup", "--check"])
            .output()
            .unwrap()
    };
    for conn in [
        format!("host=127.0.0.1 user=postgres dbname={db} sslmode=require"),
        format!("host=localhost user=postgres dbname={db} sslmode=verify-full sslrootcert={root}"),
        format!("host=127.0.0.1 user=postgres dbname={db} sslmode=verify-ca sslrootcert={root}"),
        format!("postgres://postgres@localhost/{db}?sslmode=verify-full&sslrootcert={root}"),
    ] {
        let out = check(&conn);
        assert!(out.status.success(), "{conn}: {}", stderr(&out));
    }
    let out = check(&format!(
        "host=127.0.0.1 user=postgres dbname={db} sslmode=verify-full sslrootcert={root}"
    ));
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stderr(&out).contains("certificate not valid for name \"127.0.0.1\""),
        "{}",
        stderr(&out)
    );
    // What the server sees of a worker's own connection: its wake-up listener.
    for (mode, encrypted) in [("require", "true"), ("disable", "false")] {
        let worker = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
            .env(
                "RELAYBUS_DATABASE_URL",
                format!("host=127.0.0.1 user=postgres dbname={db} sslmode={mode}"),
            )
            .env("PGAPPNAME", format!("tls-{mode}-{}", s.name))
            .args(["--schema", &s.name, "run", "--handler", "h", "--noop"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map(Spawned::from)
            .unwrap();
        let sql = format!(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
              WHERE a.application_name = 'tls-{mode}-{}' AND a.query LIKE 'LISTEN %'",
            s.name
        );
        let mut seen = vec![];
        wait_until("the worker's listener", Duration::from_secs(20), || {
            seen = s.rows(&sql);
            !seen.is_empty()
        });
        signal(&worker, nix::sys::signal::Signal::SIGTERM);
        finish(worker, Duration::from_secs(30));
        assert_eq!(seen, [encrypted], "sslmode={mode}");
    }
}

/// No output of any command, in any failure, holds a password or a webhook secret.
#[test]
fn passwords_and_webhook_secrets_never_reach_the_output() {
    let s = TestSchema::installed("secrets");
    for conn in [
        "host=127.0.0.1 port=1 user=app password=hunter2 dbname=x",
        "postgres://app@127.0.0.1:1/x?password=hunter2",
        "postgres://app:hunter2@127.0.0.1:1/x",
        "postgres://app:hunter2@[::1/x",
        "host=127.0.0.1 password='hunter2",
        "mysql://app:hunter2@db/x",
        "postgres://app:hunter2@127.0.0.1/x?sslmode=bogus",
        "postgres://app@127.0.0.1/x?password=hunter2&sslmode=bogus",
        "mysql://app@db/x?password=hunter2",
        // Unencoded `/`, `?`, `@` in the password: every piece of it stays hidden.
        "postgres://app:hunter2/qqq1?qqq2@127.0.0.1:1/x",
        "postgres://app:hunter2@qqq1/qqq2@127.0.0.1:1/x",
        "mongodb://app:hunter2/qqq1?qqq2@127.0.0.1:1/x",
    ] {
        for args in [
            &["setup", "--check"][..],
            &["--json", "stats"],
            &["schema-sql"],
        ] {
            let out = s
                .cmd()
                .env("RELAYBUS_DATABASE_URL", conn)
                .args(args)
                .output()
                .unwrap();
            let text = format!("{}{}", stdout(&out), stderr(&out));
            assert!(!text.contains("hunter2"), "{conn} {args:?}: {text}");
            assert!(!text.contains("qqq"), "{conn} {args:?}: {text}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("handlers.toml");
    std::fs::write(
        &config,
        "[handlers.h]\nwebhook = \"http://127.0.0.1:1/\"\nwebhook_secret = \"whsec_c2VjcmV0c2VjcmV0\" oops\n",
    )
    .unwrap();
    let out = s
        .cmd()
        .args(["run", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: invalid config file `{}`: line 3, column 43: expected newline, `#`\n",
            config.display()
        )
    );
}

/// A port on 127.0.0.1 where a connection is accepted and never answered, for 10 s.
fn silent_server() -> (u16, std::thread::JoinHandle<()>) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let accepted: Vec<_> = silent.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(10));
        drop(accepted);
    });
    (port, held)
}

/// A server that accepts a connection and never answers (a half-open firewall, the wrong
/// service on the port) fails the command within the start-up bound, naming it.
#[test]
fn a_server_that_never_answers_fails_within_the_connect_timeout() {
    let (port, held) = silent_server();
    let started = std::time::Instant::now();
    let out = relaybus()
        .env(
            "RELAYBUS_DATABASE_URL",
            format!("host=127.0.0.1 port={port} user=app dbname=x"),
        )
        .env("PGCONNECT_TIMEOUT", "2")
        .args(["setup", "--check"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(69));
    assert_eq!(
        stderr(&out),
        format!(
            "error: could not connect to PostgreSQL at 127.0.0.1:{port}/x as app: no answer \
             within 2s (connect_timeout, or PGCONNECT_TIMEOUT); check RELAYBUS_DATABASE_URL \
             (set in the environment) and that the server is running\n"
        )
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
    drop(held);
}

/// Of several hosts, one that accepts and never answers costs its own start-up bound, and the
/// next one is tried, as libpq does: a command given a silent host first and the test server
/// second succeeds after the bound (and within 8 s on a loaded machine).
#[test]
fn a_silent_host_costs_its_bound_and_the_next_host_answers() {
    let s = TestSchema::installed("multi_host");
    let (port, held) = silent_server();
    let started = std::time::Instant::now();
    s.cmd()
        .env(
            "RELAYBUS_DATABASE_URL",
            format!(
                "host=127.0.0.1,127.0.0.1 port={port},5432 user=postgres dbname={} \
                 connect_timeout=2 target_session_attrs=read-write",
                crate::common::database_name()
            ),
        )
        .args(["setup", "--check"])
        .assert()
        .success();
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(2) && took < Duration::from_secs(8),
        "{took:?}"
    );
    drop(held);
}

/// Without a URL the libpq variables say everything, as for psql.
#[test]
fn the_libpq_variables_are_enough_to_connect() {
    let s = TestSchema::installed("libpq_env");
    let db = crate::common::database_name();
    s.cmd()
        .env_remove("RELAYBUS_DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", "5432")
        .env("PGUSER", "postgres")
        .env("PGDATABASE", &db)
        .env("PGSSLMODE", "require")
        .args(["setup", "--check"])
        .assert()
        .success();
}

/// A schema name of 48 or more characters made the NOTIFY channel longer than the server
/// accepts; the failure was swallowed and idle workers waited for their poll. A worker that
/// polls once an hour must still be woken at once.
#[test]
fn wake_ups_reach_workers_of_a_schema_with_a_long_name() {
    let s = TestSchema::installed("wakeup_with_a_schema_name_long_enough_to_pass_the_limit");
    assert_eq!(s.name.len(), 63);
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let app = format!("wake-{}", std::process::id());
    let worker = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
        .env("PGAPPNAME", &app)
        .args([
            "--schema",
            &s.name,
            "run",
            "--handler",
            "h",
            "--poll-interval",
            "1h",
        ])
        .args(["--exec", &format!("cat > {}", done.display())])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(Spawned::from)
        .unwrap();
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' AND query LIKE 'LISTEN %'"
    );
    wait_until("the worker's listener", Duration::from_secs(20), || {
        s.count(&listening) > 0
    });
    // The first claim found nothing; from here only a wake-up brings the event within the hour.
    std::thread::sleep(Duration::from_millis(300));
    publish(&s, &["wake"], "h");
    wait_until(
        "the woken worker to handle the event",
        Duration::from_secs(20),
        || done.exists(),
    );
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let out = finish(worker, Duration::from_secs(30));
    assert_eq!(
        stdout(&out),
        "handled 1, failed attempts 0, dead 0, lease lost 0, released 0\n"
    );
}

/// The setup lock queues upgraders: a second upgrade waits for the first however long it
/// converts (its --lock-timeout guards the tables, not the queue), then finds the store
/// current and says so, instead of failing after the timeout.
#[test]
fn an_upgrade_waits_for_the_setup_lock_and_finds_the_store_converted() {
    let s = TestSchema::with_fixture_0_1("upgrade_waits");
    let script = stdout(
        &s.cmd()
            .args(["schema-sql", "--from", "0.1"])
            .output()
            .unwrap(),
    );
    let key: i64 = script
        .lines()
        .find_map(|l| l.strip_prefix("SELECT pg_advisory_xact_lock("))
        .and_then(|r| r.strip_suffix(");"))
        .unwrap()
        .parse()
        .unwrap();
    let holder = crate::common::connect();
    crate::common::block_on(
        holder.batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({key})")),
    )
    .unwrap();
    let mut waiter = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
        .args([
            "--schema",
            &s.name,
            "--lock-timeout",
            "300ms",
            "upgrade",
            "--yes",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(Spawned::from)
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the upgrade stopped waiting"
    );
    // The lock's holder converts the store, as a first upgrade would, and commits.
    crate::common::block_on(holder.batch_execute(&script)).unwrap();
    crate::common::block_on(holder.batch_execute("COMMIT")).unwrap();
    let out = finish(waiter, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("found: schema 0.1\n"), "{text}");
    assert!(
        text.ends_with(
            "relaybus schema is 0.2 now: another session converted it while this one waited \
             for the setup lock; nothing was changed\n"
        ),
        "{text}"
    );
}

/// A runtime role with the grants `schema-sql --grants` renders runs publish, workers and the
/// admin commands, and `setup` on a current store reports it current instead of failing on
/// privileges it need not have.
#[test]
fn a_runtime_role_with_the_rendered_grants_runs_everything_but_schema_changes() {
    struct Role(String);
    impl Drop for Role {
        fn drop(&mut self) {
            let admin = crate::common::connect();
            let _ = crate::common::block_on(admin.batch_execute(&format!(
                "DROP OWNED BY \"{0}\"; DROP ROLE IF EXISTS \"{0}\"",
                self.0
            )));
        }
    }
    let s = TestSchema::installed("runtime_role");
    let db = crate::common::database_name();
    let role = Role(format!("rb_app_{}", std::process::id()));
    s.exec(&format!(
        "DROP ROLE IF EXISTS \"{0}\"; CREATE ROLE \"{0}\" LOGIN",
        role.0
    ));
    let grants = s
        .cmd()
        .args(["schema-sql", "--grants", &role.0])
        .output()
        .unwrap();
    assert!(grants.status.success(), "{}", stderr(&grants));
    s.exec(&stdout(&grants));
    let url = format!("postgres://{}@127.0.0.1:5432/{db}", role.0);
    let as_role = |args: &[&str]| {
        let out = s
            .cmd()
            .env("RELAYBUS_DATABASE_URL", &url)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(
        as_role(&["setup"]),
        format!(
            "relaybus schema 0.2 already installed (schema \"{}\", prefix \"relaybus_\"); nothing to do\n",
            s.name
        )
    );
    as_role(&["setup", "--check"]);
    as_role(&["upgrade", "--dry-run"]);
    as_role(&[
        "publish",
        "--type",
        "t",
        "--id",
        "e1",
        "--handler",
        "h",
        "--handler",
        "dies",
    ]);
    as_role(&["run", "--handler", "h", "--exec", "true", "--drain"]);
    as_role(&[
        "run",
        "--handler",
        "dies",
        "--exec",
        "exit 65",
        "--drain",
        "--completion-history",
    ]);
    as_role(&["dead", "list"]);
    as_role(&["dead", "requeue", "--all", "--yes"]);
    as_role(&["deliveries", "list"]);
    as_role(&["events", "show", "e1"]);
    as_role(&["lanes"]);
    as_role(&["stats"]);
    as_role(&[
        "purge",
        "--completed-older-than",
        "0s",
        "--dead-older-than",
        "0s",
        "--yes",
    ]);
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", &url)
        .args(["--schema", "elsewhere_entirely", "setup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a new store needs the owner");
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

/// `CREATE TABLE IF NOT EXISTS` does not look at the table it finds: setup took an
/// application's `events` for its own, and purge then deleted the application's rows. Objects
/// of relaybus's names must have relaybus's shape; an empty prefix and PostgreSQL's own schemas
/// are refused.
#[test]
fn setup_refuses_to_adopt_an_application_s_table() {
    let s = TestSchema::new("foreign_table");
    s.exec(&format!(
        "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".app_events (id text PRIMARY KEY, title text); \
         INSERT INTO \"{0}\".app_events VALUES ('a', 'keep me')",
        s.name
    ));
    let out = s
        .cmd()
        .args(["--prefix", "app_", "setup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!(
            "error: objects of relaybus's names that are not relaybus's are in the way: \
             `{}.app_events` (it has no column created_at, headers, key, payload, type); choose \
             another --schema or --prefix, or move them; nothing was changed\n",
            s.name
        )
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = '{}' AND c.relkind = 'r'",
            s.name
        )),
        ["app_events"]
    );
    for (args, message) in [
        (["--prefix", "", "setup"], "error: invalid prefix ``: it is empty; pass a name like `relaybus_`\n"),
        (
            ["--schema", "information_schema", "setup"],
            "error: invalid schema `information_schema`: it is a schema of PostgreSQL's own; pass a name like `public`\n",
        ),
    ] {
        let out = relaybus()
            .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
            .args(args)
            .output()
            .unwrap();
        assert_eq!((out.status.code(), stderr(&out)), (Some(2), message.to_owned()));
    }
}

/// libpq's default host is the server's Unix socket, over which TLS never runs: a command with
/// nothing but the libpq variables reaches a local server.
#[test]
fn the_unix_socket_default_connects_without_tls() {
    let s = TestSchema::installed("unix_socket");
    let db = crate::common::database_name();
    for conn in [
        format!("host=/var/run/postgresql user=postgres dbname={db}"),
        format!("host=/var/run/postgresql user=postgres dbname={db} sslmode=require"),
    ] {
        let out = relaybus()
            .env("RELAYBUS_DATABASE_URL", &conn)
            .args(["--schema", &s.name, "setup", "--check"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{conn}: {}", stderr(&out));
    }
    let out = relaybus()
        .env_remove("RELAYBUS_DATABASE_URL")
        .env("PGUSER", "postgres")
        .env("PGDATABASE", &db)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .args(["--schema", &s.name, "setup", "--check"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}
