//! `relaybus top`: handlers, workers and lanes live on one screen, with the operator's actions
//! (pause, resume, requeue, a delivery's details) a key and a confirmation away. Every read is
//! a statement `stats`, `handlers list`, `lanes` or `dead list` makes; every action is the
//! store call its command makes. `docs/design/top.md` says what a refresh costs.

mod board;
mod view;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use futures_util::StreamExt;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use tokio::sync::{mpsc, Notify};

pub use board::{Board, HandlerLine, HotLane, LaneSummary, Sample, Snapshot, WorkerLine};
pub use view::{lines, render, Dialog, Screen};

use super::{usage, within, GlobalArgs, Output};
use crate::bounds::Bounds;
use crate::store::bench::BenchStore;
use crate::store::prelude::*;
use crate::store::{AnyStore, Engine, RequeueSelector, StoreOptions};

/// Watch handlers, workers and lanes live; pause, resume and requeue.
///
/// A full-screen view, read again every --interval: per handler its state,
/// due, scheduled, running and dead deliveries, completions per second and
/// the lag; the workers with their leases; the 256 lanes. Enter opens a
/// handler's dead letters and longest keys; p, r and R pause, resume and
/// requeue it, each after a confirmation; ? lists the keys; q quits.
///
///   relaybus top
///   relaybus top --interval 5s
///   relaybus top --once --json
///
/// Rates count the completion history (workers run with --completion-history).
/// Without a terminal it refuses; --once prints one snapshot (two reads,
/// --interval apart, for the rates) as text or --json.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct TopArgs {
    /// How often the store is read.
    #[arg(long, default_value = "1s", value_parser = within(INTERVAL), value_name = "DURATION")]
    pub interval: Duration,
    /// Print one snapshot and exit.
    #[arg(long)]
    pub once: bool,
}

const INTERVAL: Bounds = Bounds::new(Duration::from_millis(200), Duration::from_secs(3600));

/// How long a read of the store may take before the view says so and tries again.
const READ_LIMIT: Duration = Duration::from_secs(15);

/// Dead letters and keys a handler's panel shows.
const DETAIL_ROWS: i64 = 50;

/// One read of the store. The handlers' figures and the lanes' each read the pending
/// deliveries, so they are read side by side, on connections of their own.
pub async fn sample(store: &AnyStore) -> Result<Sample> {
    // The counters are a figure beside the rest: a store that refuses them still shows.
    let deleted = async {
        Ok(store
            .server_counters()
            .await
            .ok()
            .and_then(|c| c.tables.get("deliveries").map(|t| t[3])))
    };
    let lanes = async { Ok(store.lanes().await?) };
    let (handlers, lanes, deleted) =
        tokio::try_join!(super::handlers::states(store), lanes, deleted)?;
    Ok(Sample {
        at: chrono::Utc::now(),
        handlers,
        lanes,
        deleted,
    })
}

/// The store as the header names it.
fn source(store: &AnyStore) -> String {
    let ns = store.namespace();
    let engine = match store.engine() {
        Engine::Postgres => "postgres",
        Engine::Mongo => "mongodb",
    };
    format!("{engine} {}/{}", ns.schema(), ns.prefix())
}

/// The lines of the view for a board, `width` columns wide and as high as its content needs.
pub fn snapshot_text(board: &Board, screen: &Screen, width: u16) -> Vec<String> {
    let height = board.snapshot.as_ref().map_or(3, |s| {
        let rows = |n: usize| n.max(1) as u16 + 3;
        2 + rows(s.handlers.len()) + rows(s.workers.len()) + view::LANES_HEIGHT
    });
    let mut buf = Buffer::empty(Rect::new(0, 0, width, height));
    render(board, screen, buf.area, &mut buf);
    lines(&buf)
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: TopArgs) -> Result<ExitCode> {
    if !args.once && !std::io::stdout().is_terminal() {
        usage!(
            "`relaybus top` draws on a terminal, and stdout is not one; for scripts use \
             `relaybus top --once` (with --json) or `relaybus stats --json`"
        );
    }
    // A connection for each of a sample's reads, so that they run side by side.
    let store = g.open(StoreOptions {
        pool_size: 3,
        ..StoreOptions::admin()
    })?;
    store.require_current().await?;
    let mut screen = Screen {
        source: source(&store),
        interval: args.interval,
        plain: std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
        ..Screen::default()
    };
    if args.once {
        let mut board = Board::new();
        board.update(sample(&store).await?);
        tokio::time::sleep(args.interval).await;
        board.update(sample(&store).await?);
        if out.json {
            out.print_json(&board.snapshot)?;
        } else {
            screen.plain = true;
            let width = if out.terminal() {
                textwrap::termwidth().clamp(80, u16::MAX as usize) as u16
            } else {
                80
            };
            for line in snapshot_text(&board, &screen, width) {
                out.line(line)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut terminal = ratatui::try_init()?;
    let result = live(Arc::new(store), &mut terminal, screen).await;
    ratatui::try_restore()?;
    result.map(|()| ExitCode::SUCCESS)
}

/// Reads the store every interval, and at once when woken, until the view is gone.
fn sampler(
    store: Arc<AnyStore>,
    interval: Duration,
    wake: Arc<Notify>,
) -> mpsc::Receiver<Result<Sample>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let read = match tokio::time::timeout(READ_LIMIT, sample(&store)).await {
                Ok(read) => read,
                Err(_) => Err(anyhow::anyhow!(
                    "the store did not answer within {}; reading again",
                    humantime::format_duration(READ_LIMIT)
                )),
            };
            if tx.send(read).await.is_err() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = wake.notified() => {}
            }
        }
    });
    rx
}

async fn live(
    store: Arc<AnyStore>,
    terminal: &mut ratatui::DefaultTerminal,
    mut screen: Screen,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let wake = Arc::new(Notify::new());
    let mut samples = sampler(store.clone(), screen.interval, wake.clone());
    let mut keys = EventStream::new();
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut board = Board::new();
    loop {
        terminal.draw(|f| render(&board, &screen, f.area(), f.buffer_mut()))?;
        tokio::select! {
            read = samples.recv() => match read {
                Some(Ok(sample)) => {
                    let handlers = sample.handlers.len();
                    board.update(sample);
                    // A handler forgotten since: the selection stays on the list.
                    screen.selected = screen.selected.min(handlers.saturating_sub(1));
                    screen.error = None;
                    if screen.detail.is_some() {
                        open_detail(&store, &board, &mut screen).await;
                    }
                }
                Some(Err(e)) => screen.error = Some(format!("{e:#}")),
                None => return Ok(()),
            },
            key = keys.next() => match key {
                Some(Ok(Event::Key(k))) if k.kind == KeyEventKind::Press => {
                    match on_key(&store, &board, &mut screen, k).await {
                        Next::Quit => return Ok(()),
                        // What the action changed shows at once, not an interval later.
                        Next::Read => wake.notify_one(),
                        Next::Stay => {}
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            },
            _ = terminate.recv() => return Ok(()),
            _ = interrupt.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
        }
    }
}

/// What the loop does after a key.
#[derive(PartialEq, Eq)]
enum Next {
    Stay,
    /// The store changed: read it now.
    Read,
    Quit,
}

fn selected(board: &Board, screen: &Screen) -> Option<String> {
    board
        .snapshot
        .as_ref()?
        .handlers
        .get(screen.selected)
        .map(|h| h.stats.handler.clone())
}

async fn open_detail(store: &AnyStore, board: &Board, screen: &mut Screen) {
    let Some(handler) = selected(board, screen) else {
        return;
    };
    match store.backlog(&handler, DETAIL_ROWS).await {
        Ok(backlog) => {
            let at = screen.detail.as_ref().map_or(0, |(_, i)| *i);
            let at = at.min(backlog.dead.len().saturating_sub(1));
            screen.detail = Some((backlog, at));
        }
        Err(e) => screen.error = Some(format!("{e:#}")),
    }
}

/// What a key does; every change of the store goes through the call its command makes.
async fn on_key(store: &AnyStore, board: &Board, screen: &mut Screen, k: KeyEvent) -> Next {
    if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
        return Next::Quit;
    }
    if screen.help {
        screen.help = false;
        return Next::Stay;
    }
    if let Some(dialog) = screen.dialog.take() {
        return on_dialog_key(store, screen, dialog, k.code).await;
    }
    if screen.delivery.is_some() {
        if matches!(k.code, KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q')) {
            screen.delivery = None;
        }
        return Next::Stay;
    }
    screen.said = None;
    let handlers = board.snapshot.as_ref().map_or(0, |s| s.handlers.len());
    match k.code {
        KeyCode::Char('q') => return Next::Quit,
        KeyCode::Char('?') => screen.help = true,
        KeyCode::Up | KeyCode::Char('k') => match &mut screen.detail {
            Some((_, i)) => *i = i.saturating_sub(1),
            None => screen.selected = screen.selected.saturating_sub(1),
        },
        KeyCode::Down | KeyCode::Char('j') => match &mut screen.detail {
            Some((b, i)) => *i = (*i + 1).min(b.dead.len().saturating_sub(1)),
            None => screen.selected = (screen.selected + 1).min(handlers.saturating_sub(1)),
        },
        KeyCode::Esc => screen.detail = None,
        KeyCode::Enter => match &screen.detail {
            Some((backlog, i)) => {
                if let Some(id) = backlog.dead.get(*i).and_then(|d| d.id.clone()) {
                    match store.show_delivery(&id).await {
                        Ok(found) => screen.delivery = found,
                        Err(e) => screen.error = Some(format!("{e:#}")),
                    }
                }
            }
            None => open_detail(store, board, screen).await,
        },
        KeyCode::Char('p') => {
            if let Some(handler) = selected(board, screen) {
                screen.dialog = Some(Dialog::Pause {
                    handler,
                    reason: String::new(),
                });
            }
        }
        KeyCode::Char('r') => {
            if let Some(handler) = selected(board, screen) {
                screen.dialog = Some(Dialog::Resume { handler });
            }
        }
        KeyCode::Char('R') => {
            if let Some(handler) = selected(board, screen) {
                match store.count_dead(&for_handler(&handler)).await {
                    Ok(0) => screen.said = Some(format!("`{handler}` has no dead deliveries")),
                    Ok(dead) => screen.dialog = Some(Dialog::Requeue { handler, dead }),
                    Err(e) => screen.error = Some(format!("{e:#}")),
                }
            }
        }
        _ => {}
    }
    Next::Stay
}

/// A key while a dialog asks: Enter or `y` does what it asks, Esc or any other key cancels.
async fn on_dialog_key(
    store: &AnyStore,
    screen: &mut Screen,
    dialog: Dialog,
    code: KeyCode,
) -> Next {
    screen.said = match (dialog, code) {
        (Dialog::Pause { handler, reason }, KeyCode::Enter) => {
            let reason = (!reason.trim().is_empty()).then(|| reason.trim().to_owned());
            let by = super::handlers::operator();
            let now = chrono::Utc::now();
            act(
                store
                    .change_handler(&handler, &|c| c.pause(&by, reason.as_deref(), now))
                    .await,
                format!("paused `{handler}`"),
                screen,
            )
        }
        (
            Dialog::Pause {
                handler,
                mut reason,
            },
            code,
        ) => {
            match code {
                KeyCode::Char(c) => reason.push(c),
                KeyCode::Backspace => {
                    reason.pop();
                }
                KeyCode::Esc => return Next::Stay,
                _ => {}
            }
            screen.dialog = Some(Dialog::Pause { handler, reason });
            return Next::Stay;
        }
        (Dialog::Resume { handler }, KeyCode::Char('y')) => act(
            store.change_handler(&handler, &|c| c.resume()).await,
            format!("resumed `{handler}`"),
            screen,
        ),
        (Dialog::Requeue { handler, .. }, KeyCode::Char('y')) => {
            match store.requeue(&for_handler(&handler)).await {
                Ok(ids) => Some(format!(
                    "requeued {} dead deliveries of `{handler}`",
                    ids.len()
                )),
                Err(e) => {
                    screen.error = Some(format!("{e:#}"));
                    None
                }
            }
        }
        _ => {
            screen.said = Some("cancelled; nothing was changed".into());
            return Next::Stay;
        }
    };
    // The read this asks for refreshes an open panel too.
    Next::Read
}

/// The requeue `dead requeue --handler NAME` makes.
fn for_handler(handler: &str) -> RequeueSelector {
    RequeueSelector {
        handler: Some(handler.to_owned()),
        ..RequeueSelector::default()
    }
}

/// What a change of a handler's row says: `done`, or that nothing changed.
fn act(
    changed: crate::store::Result<Option<crate::store::handlers::HandlerRow>>,
    done: String,
    screen: &mut Screen,
) -> Option<String> {
    match changed {
        Ok(Some(_)) => Some(done),
        Ok(None) => Some("nothing to change".into()),
        Err(e) => {
            screen.error = Some(format!("{e:#}"));
            None
        }
    }
}
