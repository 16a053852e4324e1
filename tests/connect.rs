//! Connecting as libpq would (key-value strings, TLS modes, the libpq variables, the Unix
//! socket, several hosts), within the connect timeout, and never showing a secret.

use std::process::Command as StdCommand;
use std::time::Duration;

use crate::common::http::serve;
use crate::common::scenario::Target;
use crate::common::{finish, relaybus, signal, stderr, stdout, wait_until, Spawned, TestSchema};

/// Secrets can come from files, so they need not sit in the environment.
#[test]
fn the_database_url_and_the_webhook_secret_can_come_from_files() {
    let s = TestSchema::installed("secret_files");
    s.publish_ids(&["e1"], "hook");
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
