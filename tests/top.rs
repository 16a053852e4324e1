//! `relaybus top` as an operator runs it: the real binary in a pseudo-terminal against a real
//! PostgreSQL and a running worker, its screen read back as a terminal shows it (`vt100`).
//! `tests/common/top.rs` draws the view cell for cell on both engines.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{native_pty_system, Child, CommandBuilder, MasterPty, PtySize};
use serde_json::json;

use crate::common::cluster::TestCluster;
use crate::common::scenario::Target;
use crate::common::{relaybus, spawn_worker, stderr, wait_until, TestSchema};

/// The view in a pseudo-terminal of 80x24.
struct Tty {
    screen: Arc<Mutex<vt100::Parser>>,
    /// Every byte the view wrote, escape sequences included.
    raw: Arc<Mutex<Vec<u8>>>,
    keys: Box<dyn Write + Send>,
    child: Box<dyn Child + Send + Sync>,
    _master: Box<dyn MasterPty + Send>,
}

impl Tty {
    fn open(url: &str, schema: &str, args: &[&str]) -> Self {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows: 24,
                cols: 80,
                pixel_width: 0,
                pixel_height: 0,
            })
            .unwrap();
        let mut cmd = CommandBuilder::new(assert_cmd::cargo::cargo_bin("relaybus"));
        cmd.args(["--database-url", url, "--schema", schema, "top"]);
        cmd.args(args);
        cmd.env("TERM", "xterm-256color");
        let child = pty.slave.spawn_command(cmd).unwrap();
        drop(pty.slave);
        let screen = Arc::new(Mutex::new(vt100::Parser::new(24, 80, 0)));
        let raw = Arc::new(Mutex::new(Vec::new()));
        let mut reader = pty.master.try_clone_reader().unwrap();
        let (s, r) = (screen.clone(), raw.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().process(&buf[..n]);
                r.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Tty {
            screen,
            raw,
            keys: pty.master.take_writer().unwrap(),
            child,
            _master: pty.master,
        }
    }

    fn contents(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    /// Waits until the screen shows what `done` looks for, at most 30 s; returns the screen.
    fn wait(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let shown = self.contents();
            if done(&shown) {
                return shown;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the view never showed {what}:\n{shown}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn press(&mut self, keys: &str) {
        self.keys.write_all(keys.as_bytes()).unwrap();
        self.keys.flush().unwrap();
    }

    /// Waits for the view to exit, at most 10 s; its exit code.
    fn exit_code(&mut self) -> u32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.exit_code();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the view did not exit:\n{}",
                self.contents()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the view left the terminal as it found it: after it last entered the alternate
    /// screen, it left it and showed the cursor again.
    fn restored(&self) -> bool {
        let start = Instant::now();
        loop {
            let raw = self.raw.lock().unwrap().clone();
            let text = String::from_utf8_lossy(&raw);
            let entered = text.rfind("\x1b[?1049h");
            let rest = entered.map(|at| &text[at..]).unwrap_or_default();
            if rest.contains("\x1b[?1049l") && rest.contains("\x1b[?25h") {
                return true;
            }
            if start.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tty {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// The cells of a handler's row, selected (`>`) or not: name, state, due, scheduled, running,
/// dead, rates, lag.
fn row<'a>(screen: &'a str, handler: &str) -> Vec<&'a str> {
    screen
        .lines()
        .map(|l| l.trim_matches(|c| c == '│' || c == ' ' || c == '>'))
        .find(|l| l.starts_with(&format!("{handler} ")))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default()
}

/// The handler's completions per second over the last interval, when the view shows one.
fn rate(screen: &str, handler: &str) -> Option<f64> {
    let cells = row(screen, handler);
    cells
        .iter()
        .position(|c| *c == "running" || *c == "paused")
        .and_then(|state| cells.get(state + 5))
        .and_then(|r| r.replace(',', "").parse().ok())
}

fn paused(s: &TestSchema) -> Vec<String> {
    s.rows(&format!(
        "SELECT handler, paused_at IS NOT NULL AS paused, pause_reason FROM {}",
        s.table("handlers")
    ))
}

#[test]
fn an_operator_watches_the_rate_rise_pauses_and_resumes_a_handler_and_quits() {
    let s = TestSchema::installed("top_live");
    let events: Vec<_> = (0..20_000)
        .map(|i| json!({"id": format!("e-{i:05}"), "type": "t", "handlers": ["billing"]}))
        .collect();
    s.publish(&events);
    let mut tty = Tty::open(&s.url, &s.name, &["--interval", "300ms"]);
    let shown = tty.wait("billing, due", |shown| row(shown, "billing").len() >= 9);
    assert_eq!(
        row(&shown, "billing")[1..8],
        ["running", "20,000", "0", "0", "0", "-", "-"],
        "no completion history yet: no rate\n{shown}"
    );
    let _worker = spawn_worker(
        &s,
        &[
            "--handler",
            "billing",
            "--sql",
            "SELECT 1",
            "--completion-history",
        ],
    );
    let shown = tty.wait("billing's rate rising", |shown| {
        rate(shown, "billing").is_some_and(|r| r > 0.0)
    });
    assert!(shown.contains("Workers: 1"), "{shown}");

    tty.press("p");
    tty.wait("the pause dialog", |shown| {
        shown.contains("Pause `billing`")
    });
    tty.press("INC-7 ledger read-only\r");
    wait_until(
        "billing paused in the store",
        Duration::from_secs(10),
        || paused(&s) == ["billing|true|INC-7 ledger read-only"],
    );
    tty.wait("billing paused", |shown| {
        row(shown, "billing").get(1) == Some(&"paused") && shown.contains("paused `billing`")
    });

    tty.press("r");
    tty.wait("the resume dialog", |shown| {
        shown.contains("Resume `billing`")
    });
    tty.press("y");
    wait_until(
        "billing resumed in the store",
        Duration::from_secs(10),
        || paused(&s) == ["billing|false|NULL"],
    );
    tty.wait("billing running", |shown| {
        row(shown, "billing").get(1) == Some(&"running")
    });

    tty.press("q");
    assert_eq!(tty.exit_code(), 0);
    assert!(tty.restored(), "the terminal was not restored");
}

#[test]
fn an_operator_opens_a_dead_letter_and_requeues_the_handler_s_dead_letters() {
    let s = TestSchema::installed("top_requeue");
    let events: Vec<_> = (0..3)
        .map(|i| json!({"id": format!("e-{i}"), "type": "t", "handlers": ["crm"]}))
        .collect();
    s.publish(&events);
    let out = s
        .cmd()
        .args(["run", "--handler", "crm", "--drain", "--exec"])
        .arg("echo 'HTTP 503 from crm' >&2; exit 65")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let statuses = || {
        s.rows(&format!(
            "SELECT status, count(*) FROM {} GROUP BY status",
            s.table("deliveries")
        ))
    };
    assert_eq!(statuses(), ["dead|3"]);
    let mut tty = Tty::open(&s.url, &s.name, &["--interval", "300ms"]);
    tty.wait("crm's three dead letters", |shown| {
        row(shown, "crm").get(5) == Some(&"3")
    });
    tty.press("\r");
    tty.wait("crm's panel", |shown| {
        shown.contains("Dead letters of `crm`, newest first")
            && shown.matches("exit 65: HTTP 503 from crm").count() == 3
    });
    tty.press("\r");
    let shown = tty.wait("the dead letter", |shown| {
        shown.contains("Delivery (Esc closes)")
    });
    for field in ["handler      crm", "status       dead", "attempts     1"] {
        assert!(shown.contains(field), "{field}:\n{shown}");
    }
    tty.press("\x1b");
    tty.wait("the panel again", |shown| {
        !shown.contains("Delivery (Esc closes)")
    });
    tty.press("R");
    tty.wait("the requeue question", |shown| {
        shown.contains("Requeue `crm`") && shown.contains("Give its 3 dead deliveries")
    });
    tty.press("y");
    wait_until(
        "crm's dead letters requeued",
        Duration::from_secs(10),
        || statuses() == ["pending|3"],
    );
    tty.wait("the requeue said", |shown| {
        shown.contains("requeued 3 dead deliveries of `crm`")
    });
    tty.press("q");
    assert_eq!(tty.exit_code(), 0);
    assert!(tty.restored(), "the terminal was not restored");
}

#[test]
fn a_terminate_signal_restores_the_terminal() {
    let s = TestSchema::installed("top_sigterm");
    let mut tty = Tty::open(&s.url, &s.name, &[]);
    tty.wait("the view", |shown| shown.contains("Workers: 0"));
    let pid = tty.child.process_id().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(tty.exit_code(), 0);
    assert!(tty.restored(), "the terminal was not restored");
}

/// A store that goes away shows as an error in the view, which reads it again once it is back.
#[test]
fn a_lost_store_shows_in_the_view_until_it_is_back() {
    let cluster = TestCluster::start();
    let url = cluster.url();
    let setup = relaybus()
        .args(["--database-url", &url, "setup"])
        .output()
        .unwrap();
    assert!(setup.status.success(), "{}", stderr(&setup));
    let mut tty = Tty::open(&url, "public", &["--interval", "300ms"]);
    tty.wait("the view", |shown| shown.contains("Workers: 0"));
    cluster.stop();
    let shown = tty.wait("the error", |shown| {
        shown
            .lines()
            .last()
            .is_some_and(|l| l.contains("could not"))
    });
    assert!(
        shown.contains("Workers: 0"),
        "the last sample stays:\n{shown}"
    );
    cluster.start_again();
    tty.wait("the view again", |shown| {
        shown.lines().last().is_some_and(|l| l.contains("q quit"))
    });
    tty.press("q");
    assert_eq!(tty.exit_code(), 0);
    assert!(tty.restored(), "the terminal was not restored");
}

#[test]
fn without_a_terminal_top_points_to_once_and_stats() {
    let s = TestSchema::installed("top_no_tty");
    let out = s.cmd().arg("top").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: `relaybus top` draws on a terminal, and stdout is not one; for scripts use \
         `relaybus top --once` (with --json) or `relaybus stats --json`\n"
    );
    let out = s
        .cmd()
        .args(["top", "--once", "--interval", "50ms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("50ms is out of range: give a duration from 200ms to 1h"),
        "{}",
        stderr(&out)
    );
}

/// The README's picture of the view is the one the tests draw (`tests/common/top.rs`).
#[test]
fn the_readme_shows_the_view_the_tests_draw() {
    let readme = include_str!("../README.md");
    let drawn = crate::common::top::AT_80X24.trim_matches('\n');
    assert!(
        readme.contains(&format!("```text\n{drawn}\n```")),
        "README.md's `relaybus top` block differs from tests/common/top.rs's AT_80X24"
    );
}
