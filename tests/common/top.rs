//! `relaybus top` on both engines: the view drawn from a store in a known state, cell for cell
//! at 80x24 and 200x50 (the same cells on either engine), and `top --once --json` beside
//! `stats --json` and `workers --json`.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use relaybus::cli::top::{render, sample, Board, Sample, Screen};
use relaybus::store::prelude::*;
use relaybus::store::{AnyStore, StoreOptions};
use serde_json::{json, Value};

use super::scenario::Target;
use super::{block_on, claim_request, stderr};

/// Who the test's claim says it is.
pub const OWNER: &str = "host-a:4242:abcdef";

/// The moment the view's samples are pinned to, so that ages and leases draw the same cells
/// on every run.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 7, 3, 0, 0).unwrap()
}

fn events(
    handler: &str,
    prefix: &str,
    ids: std::ops::Range<usize>,
    key: &dyn Fn(usize) -> String,
) -> Vec<Value> {
    ids.map(|i| json!({"id": format!("{prefix}-{i:02}"), "type": "order.paid", "key": key(i), "handlers": [handler]}))
        .collect()
}

/// Runs billing's due deliveries to completion, with a completion history.
fn drain_billing(t: &dyn Target) {
    let out = t
        .cmd()
        .args([
            "run",
            "--handler",
            "billing",
            "--exec",
            "true",
            "--drain",
            "--completion-history",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A sample with its clocks pinned: taken at `at`, every due delivery 90 s before `t0`, every lease
/// ending `lease` after `t0`, and no counters (which move with the server's other work).
fn pinned(store: &AnyStore, at: DateTime<Utc>, lease: Duration) -> Sample {
    let mut s = block_on(sample(store)).unwrap();
    s.at = at;
    for (stats, _) in &mut s.handlers {
        stats.lag_seconds = stats.lag_seconds.map(|_| 90.0);
    }
    for l in &mut s.lanes {
        if l.lease_expires_at.is_some() {
            l.lease_expires_at = Some(t0() + lease);
        }
        if l.oldest_due.is_some() {
            l.oldest_due = Some(t0() - chrono::Duration::seconds(90));
        }
    }
    s.deleted = None;
    s
}

/// The store: billing with 10 completions and then 5 more between the samples; mailer paused;
/// crm with a dead letter, two deliveries of one key due, and its breaker open; search-index
/// with two deliveries of one key, the first claimed by `OWNER`.
fn known_state(t: &dyn Target, store: &AnyStore) -> Board {
    t.publish(&events("billing", "b", 0..10, &|i| format!("order-{i}")));
    drain_billing(t);
    t.publish(&events("billing", "b", 10..15, &|i| format!("order-{i}")));
    t.publish(&events("mailer", "m", 0..3, &|i| format!("mail-{i}")));
    t.publish(&events("crm", "c", 0..1, &|_| "crm-0".into()));
    let out = t
        .cmd()
        .args([
            "run",
            "--handler",
            "crm",
            "--exec",
            "echo 'HTTP 503 from crm' >&2; exit 65",
            "--drain",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    t.publish(&events("crm", "c", 1..3, &|_| "crm-0".into()));
    t.publish(&events("search-index", "s", 0..2, &|_| "order-7".into()));
    block_on(async {
        store
            .change_handler("mailer", &|c| {
                c.pause("ops@host-a", Some("INC-42 smtp down"), t0())
            })
            .await
            .unwrap();
        store
            .change_handler("crm", &|c| {
                c.failures = 10;
                c.opened = 1;
                c.open_until = Some(t0() + chrono::Duration::seconds(25));
                true
            })
            .await
            .unwrap();
        // Long enough to outlast the test: the lease the view shows is pinned.
        let mut claim = claim_request(OWNER, &["search-index"]);
        claim.lease = Duration::from_secs(600);
        let (claimed, _) = store.claim(&claim).await.unwrap();
        assert_eq!(claimed.len(), 1, "the key's first delivery");
    });
    let mut board = Board::new();
    board.update(pinned(store, t0(), Duration::from_secs(30)));
    drain_billing(t);
    board.update(pinned(
        store,
        t0() + chrono::Duration::seconds(1),
        Duration::from_secs(31),
    ));
    board
}

fn drawn(board: &Board, screen: &Screen, width: u16, height: u16) -> Vec<String> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal
        .draw(|f| render(board, screen, f.area(), f.buffer_mut()))
        .unwrap();
    relaybus::cli::top::lines(terminal.backend().buffer())
}

pub const AT_80X24: &str = r#"
 relaybus top  test store  03:00:01  every 1s
┌ Handlers ────────────────────────────────────────────────────────────────────┐
│ HANDLER           STATE          DUE  SCHED   RUN  DEAD     /S  /S 1M     LAG│
│>billing           running          0      0     0     0      5      5       -│
│ crm               open 24.0s       2      0     0     1      0      0  1m 30s│
│ mailer            paused           3      0     0     0      0      0  1m 30s│
│ search-index      running          1      0     1     0      0      0  1m 30s│
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
└──────────────────────────────────────────────────────────────────────────────┘
┌ Workers: 1 ──────────────────────────────────────────────────────────────────┐
│WORKER                                LANES RUN   LEASE            RENEWED    │
│host-a:4242:abcdef                    1     1     30.0s left       0.0s ago   │
└──────────────────────────────────────────────────────────────────────────────┘
┌ Lanes: 0 held, 1 busy, 4 waiting, 0 expired ───────────────────┐┌ Hot lanes ─┐
│........................+.......................................││186       2 │
│................................................................││251       2 │
│...........................................+..............+.....││ 24       1 │
│.................+.........................................#....││171       1 │
└────────────────────────────────────────────────────────────────┘└────────────┘
 ↑↓ handler  Enter details  p pause  r resume  R requeue  q quit  ? help
"#;

pub const CRM_AT_80X24: &str = r#"
 relaybus top  test store  03:00:01  every 1s
┌ Handlers ────────────────────────────────────────────────────────────────────┐
│ HANDLER           STATE          DUE  SCHED   RUN  DEAD     /S  /S 1M     LAG│
│ billing           running          0      0     0     0      5      5       -│
│>crm               open 24.0s       2      0     0     1      0      0  1m 30s│
│ mailer            paused           3      0     0     0      0      0  1m 30s│
│ search-index      running          1      0     1     0      0      0  1m 30s│
└──────────────────────────────────────────────────────────────────────────────┘
┌ Dead letters of `crm`, newest first ──────────────┐┌ Longest keys ───────────┐
│ DELIVERY      DIED     LAST ERROR                 ││KEY       PENDING LAG    │
│>…000000000C00 43.0s    exit 65: HTTP 503 from crm ││crm-0     2       1m 31s │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
│                                                   ││                         │
└───────────────────────────────────────────────────┘└─────────────────────────┘
 ↑↓ dead letter  Enter open  R requeue  p pause  r resume  Esc back  ? help
"#;

pub const AT_200X50: &str = r#"
 relaybus top  test store  03:00:01  every 1s
┌ Handlers ──────────────────────────────────────────────────────────────────────────────────────┐┌ completions per interval ──────────────────────────────────────────────────────────────────────────┐
│ HANDLER      STATE                                DUE  SCHED   RUN  DEAD     /S  /S 1M     LAG ││                                                                                                    │
│>billing      running                                0      0     0     0      5      5       - ││█                                                                                                   │
│ crm          open 24.0s                             2      0     0     1      0      0  1m 30s ││                                                                                                    │
│ mailer       paused: INC-42 smtp down               3      0     0     0      0      0  1m 30s ││                                                                                                    │
│ search-index running                                1      0     1     0      0      0  1m 30s ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
│                                                                                                ││                                                                                                    │
└────────────────────────────────────────────────────────────────────────────────────────────────┘└────────────────────────────────────────────────────────────────────────────────────────────────────┘
┌ Workers: 1 ──────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────┐
│WORKER                                                                                                                                                        LANES RUN   LEASE            RENEWED    │
│host-a:4242:abcdef                                                                                                                                            1     1     30.0s left       0.0s ago   │
└──────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────┘
┌ Lanes: 0 held, 1 busy, 4 waiting, 0 expired ───────────────────┐┌ Hot lanes: lane, pending, owner, lag ──────────────────────────────────────────────────────────────────────────────────────────────┐
│........................+.......................................││186       2  -                   1m 31s                                                                                             │
│................................................................││251       2  host-a:4242:abcdef  1m 31s                                                                                             │
│...........................................+..............+.....││ 24       1  -                   1m 31s                                                                                             │
│.................+.........................................#....││171       1  -                   1m 31s                                                                                             │
└────────────────────────────────────────────────────────────────┘└────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────┘
 ↑↓ handler  Enter details  p pause  r resume  R requeue  q quit  ? help
"#;

pub fn the_view_shows_handlers_workers_and_lanes_cell_for_cell(t: &dyn Target) {
    let store = t.store(StoreOptions::admin());
    let board = known_state(t, &store);
    let mut screen = Screen {
        source: "test store".into(),
        interval: Duration::from_secs(1),
        plain: true,
        ..Screen::default()
    };
    for (size, expected) in [((200, 50), AT_200X50), ((80, 24), AT_80X24)] {
        let got = drawn(&board, &screen, size.0, size.1).join("\n");
        assert_eq!(got, expected.trim_matches('\n'), "at {size:?}:\n{got}");
    }
    // mailer selected: its pause's reason under the table.
    screen.selected = 2;
    let got = drawn(&board, &screen, 80, 24);
    assert_eq!(
        got[12],
        "└ mailer paused by ops@host-a: INC-42 smtp down ───────────────────────────────┘",
        "{}",
        got.join("\n")
    );
    // crm's panel: its dead letter (id and time pinned: ids are random) and its key.
    let mut backlog = block_on(store.backlog("crm", 50)).unwrap();
    assert_eq!(backlog.dead.len(), 1);
    backlog.dead[0].id = Some("01JDEAD0000000000000000C00".into());
    backlog.dead[0].updated_at = Some(t0() - chrono::Duration::seconds(42));
    for k in &mut backlog.keys {
        k.oldest_due = Some(t0() - chrono::Duration::seconds(90));
    }
    screen.selected = 1;
    screen.detail = Some((backlog, 0));
    let got = drawn(&board, &screen, 80, 24).join("\n");
    assert_eq!(got, CRM_AT_80X24.trim_matches('\n'), "crm's panel:\n{got}");
    once_matches_stats_and_workers(t);
}

/// `top --once --json` shows what `stats --json` and `workers --json` show.
fn once_matches_stats_and_workers(t: &dyn Target) {
    let json = |args: &[&str]| -> Value {
        let out = t.cmd().arg("--json").args(args).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let top = json(&["top", "--once", "--interval", "200ms"]);
    let stats = json(&["stats"]);
    let workers = json(&["workers"]);
    let figures = [
        "handler",
        "due",
        "scheduled",
        "processing",
        "dead",
        "completed",
    ];
    let pick = |rows: &Value| -> Vec<Vec<Value>> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| figures.iter().map(|f| r[f].clone()).collect())
            .collect()
    };
    assert_eq!(pick(&top["handlers"]), pick(&stats), "{top}\n{stats}");
    let states: Vec<(&Value, &Value)> = top["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (&h["handler"], &h["state"]))
        .collect();
    assert_eq!(
        states,
        [
            (&json!("billing"), &json!("running")),
            (&json!("crm"), &json!("probe-due")),
            (&json!("mailer"), &json!("paused")),
            (&json!("search-index"), &json!("running")),
        ]
    );
    assert_eq!(top["handlers"][2]["pause_reason"], "INC-42 smtp down");
    let top_workers: Vec<Value> = top["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let mut w = w.clone();
            w.as_object_mut().unwrap().remove("renewed_seconds_ago");
            w
        })
        .collect();
    assert_eq!(json!(top_workers), workers["workers"], "{top}");
    assert_eq!(top["lanes"]["busy"], 1, "{top}");
    assert_eq!(top["lane_map"].as_str().unwrap().len(), 256);
}
