//! The command line itself: its definition, exit codes, and the generated files.

use std::process::Stdio;
use std::time::Duration;

use assert_cmd::Command;
use clap::CommandFactory;
use relaybus::cli::generate::{completions, man_pages};
use relaybus::cli::Cli;

use crate::common::{finish, stderr, TestSchema};

#[test]
fn the_command_definition_is_consistent() {
    Cli::command().debug_assert();
    relaybus::cli::command().debug_assert();
}

/// Every option and argument any help shows, with its command's path, and whether it is empty.
fn shown_arguments(cmd: &clap::Command, path: String, found: &mut Vec<(String, String, bool)>) {
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let help = a.get_long_help().or(a.get_help()).map(|h| h.to_string());
        found.push((
            path.clone(),
            a.get_id().to_string(),
            help.unwrap_or_default().trim().is_empty(),
        ));
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        shown_arguments(sub, format!("{path} {}", sub.get_name()), found);
    }
}

#[test]
fn every_option_shown_has_a_description_and_only_where_it_applies() {
    let mut cmd = relaybus::cli::command();
    cmd.build();
    let mut found = vec![];
    shown_arguments(&cmd, "relaybus".into(), &mut found);
    let blank: Vec<String> = found
        .iter()
        .filter(|(_, _, blank)| *blank)
        .map(|(path, id, _)| format!("{path} {id}"))
        .collect();
    assert_eq!(blank, Vec::<String>::new());
    let shown = |path: &str| -> Vec<&str> {
        found
            .iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, id, _)| id.as_str())
            .collect()
    };
    assert_eq!(shown("relaybus completions"), ["shell", "help", "version"]);
    assert!(!shown("relaybus schema-sql").contains(&"lock_timeout"));
    assert!(!shown("relaybus dead list").contains(&"lock_timeout"));
    assert!(shown("relaybus dead list").contains(&"database_url"));
    assert!(shown("relaybus setup").contains(&"lock_timeout"));
    assert!(shown("relaybus upgrade").contains(&"lock_timeout"));
    assert!(!found.iter().any(|(p, _, _)| p.contains("bench-worker")));
}

fn relaybus() -> Command {
    let mut cmd = crate::common::relaybus();
    cmd.env_remove("RELAYBUS_DATABASE_URL");
    cmd
}

#[test]
fn exit_codes() {
    // Usage errors are clap's: 2, with the usage on stderr.
    let out = relaybus().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = relaybus().args(["run", "--exec", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--handler <NAME>"));
    let out = relaybus()
        .args(["run", "--concurrency", "0", "--handler", "h", "--noop"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = relaybus()
        .args(["purge", "--dead-older-than", "soon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A server that does not answer is 69 (EX_UNAVAILABLE), with what to do next.
    let out = relaybus()
        .args(["--database-url", "postgres://x@127.0.0.1:1/x", "stats"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("error: could not connect to PostgreSQL at 127.0.0.1:1/x as x: "));
    relaybus().arg("--help").assert().success().code(0);
    relaybus()
        .args(["schema-sql", "--prefix", "x_"])
        .assert()
        .success();
}

/// What is wrong with what was typed is 2 also when it is found after parsing; `setup --check`
/// tells "not current" (1) from "no server" (69); with --json the error is JSON on stderr.
#[test]
fn usage_errors_found_after_parsing_are_2_and_errors_are_json_with_json() {
    let s = TestSchema::new("exit_after_parse");
    for (args, message) in [
        (
            vec!["run", "--drain"],
            "error: nothing to run: give --handler NAME",
        ),
        (
            vec!["purge", "--yes"],
            "error: nothing to purge: give --completed-older-than",
        ),
        (
            vec!["dead", "requeue", "--yes"],
            "error: the following required arguments were not provided",
        ),
        (
            vec!["--prefix", "Bad", "stats"],
            "error: invalid prefix `Bad`",
        ),
        (
            vec!["run", "--config", "/nonexistent.toml"],
            "error: could not read",
        ),
    ] {
        let out = s.cmd().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with(message),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let out = s.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = relaybus()
        .args([
            "--database-url",
            "postgres://x@127.0.0.1:1/x",
            "setup",
            "--check",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let out = s.cmd().args(["--json", "run", "--drain"]).output().unwrap();
    let error: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(
        error,
        serde_json::json!({"error": {
            "message": "nothing to run: give --handler NAME with --exec CMD or --webhook URL, or --config FILE",
            "exit_code": 2,
        }})
    );
}

/// `relaybus ... | head` closes the pipe: writing to it is the reader's choice, not a failure,
/// for text and JSON alike. The read end is closed before the child starts, and each output is
/// larger than a buffer (the JSON list of 300 deliveries is over 100 KB), so the writes fail
/// while the command is still printing, not only at the final flush.
#[test]
fn closing_the_output_pipe_is_not_an_error() {
    let s = TestSchema::installed("closed_pipe");
    let events: String = (0..300)
        .map(|i| format!("{{\"type\":\"t\",\"payload\":{{\"n\":{i}}}}}\n"))
        .collect();
    s.cmd()
        .args(["publish", "--handler", "h", "--json"])
        .write_stdin(events)
        .assert()
        .success();
    for args in [
        &["schema-sql"][..],
        &["--json", "deliveries", "list", "--limit", "300"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("relaybus"));
        cmd.env("RELAYBUS_DATABASE_URL", crate::common::database_url())
            .args(["--schema", &s.name])
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped());
        let out = finish(cmd.spawn().unwrap(), Duration::from_secs(30));
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

/// Every command's `--help` as the binary prints it for an 80-column terminal, with nothing of
/// the environment shown, named as the man pages are (`relaybus-dead-list.txt`).
fn help_pages() -> Vec<(String, Vec<u8>)> {
    fn walk(cmd: &clap::Command, path: Vec<&str>, pages: &mut Vec<(String, Vec<u8>)>) {
        let out = relaybus()
            .env_clear()
            .env("COLUMNS", "80")
            .args(&path[1..])
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{path:?}: {}", stderr(&out));
        pages.push((format!("{}.txt", path.join("-")), out.stdout));
        for sub in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            walk(sub, [path.as_slice(), &[sub.get_name()]].concat(), pages);
        }
    }
    let mut cmd = relaybus::cli::command();
    cmd.build();
    let mut pages = vec![];
    walk(&cmd, vec!["relaybus"], &mut pages);
    pages
}

/// Texts of a command set as written (a paragraph of several lines: the descriptions with
/// examples), with the command's path.
fn written_texts(cmd: &clap::Command, path: String, found: &mut Vec<(String, String)>) {
    for text in [cmd.get_long_about(), cmd.get_after_long_help()]
        .into_iter()
        .flatten()
    {
        for paragraph in text.to_string().split("\n\n") {
            if paragraph.lines().count() > 1 {
                found.extend(paragraph.lines().map(|l| (path.clone(), l.to_owned())));
            }
        }
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written_texts(sub, format!("{path} {}", sub.get_name()), found);
    }
}

/// Help fits an 80-column terminal: no line of any `--help` is wider, and what is set as
/// written is written within 80 columns, so that the terminal never breaks it into ragged lines.
#[test]
fn every_help_fits_80_columns() {
    let wide = |l: &str| unicode_width::UnicodeWidthStr::width(l) > 80;
    let mut too_wide: Vec<String> = help_pages()
        .iter()
        .flat_map(|(name, page)| {
            String::from_utf8_lossy(page)
                .lines()
                .filter(|l| wide(l))
                .map(|l| format!("{name}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut written = vec![];
    written_texts(&relaybus::cli::command(), "relaybus".into(), &mut written);
    too_wide.extend(
        written
            .iter()
            .filter(|(_, l)| wide(l))
            .map(|(path, l)| format!("{path}: {l}")),
    );
    assert_eq!(too_wide, Vec::<String>::new());
}

/// `completions/` and `man/` are generated from the command definition, and `tests/help/` holds
/// what `--help` prints, so that a change to any help shows in review. Refresh them with
/// `RELAYBUS_REGENERATE=1 cargo test generated_files` and commit the result.
#[test]
fn generated_files_are_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut expected: Vec<(std::path::PathBuf, Vec<u8>)> = vec![];
    for (shell, file) in [
        (clap_complete::Shell::Bash, "relaybus.bash"),
        (clap_complete::Shell::Zsh, "_relaybus"),
        (clap_complete::Shell::Fish, "relaybus.fish"),
    ] {
        expected.push((root.join("completions").join(file), completions(shell)));
    }
    for (name, page) in man_pages().unwrap() {
        expected.push((root.join("man").join(name), page));
    }
    for (name, page) in help_pages() {
        expected.push((root.join("tests/help").join(name), page));
    }
    if std::env::var_os("RELAYBUS_REGENERATE").is_some() {
        for dir in ["completions", "man", "tests/help"] {
            let _ = std::fs::remove_dir_all(root.join(dir));
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        for (path, content) in &expected {
            std::fs::write(path, content).unwrap();
        }
        return;
    }
    let mut stale = vec![];
    for (path, content) in &expected {
        if std::fs::read(path).ok().as_deref() != Some(content.as_slice()) {
            stale.push(path.strip_prefix(root).unwrap().display().to_string());
        }
    }
    for dir in ["completions", "man", "tests/help"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if !expected.iter().any(|(p, _)| *p == path) {
                stale.push(format!(
                    "{} (no longer generated)",
                    path.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files: {}; run `RELAYBUS_REGENERATE=1 cargo test generated_files` and commit them",
        stale.join(", ")
    );
}

/// When no server answers, the advice names where the URL came from, and with nothing given,
/// which server libpq's variables and defaults chose.
#[test]
fn a_refused_connection_names_where_the_url_came_from() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = format!(
        "error: could not connect to PostgreSQL at 127.0.0.1:{port}/x as app: Connection refused \
         (os error 111); "
    );
    let out = relaybus()
        .args([
            "--database-url",
            &format!("postgres://app@127.0.0.1:{port}/x"),
            "lanes",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert_eq!(
        stderr(&out),
        format!("{refused}check --database-url and that the server is running\n")
    );
    let out = relaybus()
        .env_remove("RELAYBUS_DATABASE_URL_FILE")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", port.to_string())
        .env("PGUSER", "app")
        .env("PGDATABASE", "x")
        .arg("lanes")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert_eq!(
        stderr(&out),
        format!(
            "{refused}no --database-url, RELAYBUS_DATABASE_URL or RELAYBUS_DATABASE_URL_FILE was \
             given, so libpq's variables (PGHOST=127.0.0.1, PGPORT={port}, PGUSER=app, \
             PGDATABASE=x) and defaults chose this server; give --database-url, or start a \
             server there\n"
        )
    );
}

/// `bench --list` says what each cell is, as a table and as JSON with one shape per cell.
#[test]
fn bench_list_describes_every_cell() {
    let out = relaybus()
        .args(["bench", "--list", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let cells: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cells.len(), 26);
    for c in &cells {
        let keys: Vec<&String> = c.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["cell", "scenario", "description"], "{c}");
    }
    assert_eq!(
        cells[13],
        serde_json::json!({
            "cell": "disp-1i-tuned",
            "scenario": "dispatch",
            "description": "drain: 1 worker, 1 handler, unkeyed; concurrency 200, batch 200, pool 40, poll 50ms"
        })
    );
    let out = relaybus().args(["bench", "--list"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("CELL                 WHAT IT MEASURES\npub-p1-b1            1 publisher, 1/transaction, 1 handler, unkeyed\n"), "{text}");
}

/// A man page sets a help text's examples without filling, as the help shows them.
#[test]
fn man_pages_keep_the_layout_of_examples() {
    let pages = man_pages().unwrap();
    let purge = pages
        .iter()
        .find(|(name, _)| name == "relaybus-purge.1")
        .map(|(_, page)| String::from_utf8_lossy(page).into_owned())
        .unwrap();
    assert!(
        purge.contains(
            ".nf\n  relaybus purge \\-\\-dead\\-older\\-than 30d \\-\\-completed\\-older\\-than 7d \\-\\-dry\\-run\n  relaybus purge \\-\\-completed\\-older\\-than 7d \\-\\-yes\n.fi\n"
        ),
        "{purge}"
    );
}
