//! How `relaybus top` draws a board: ratatui widgets into a buffer of any size, so the live
//! view, `top --once` and the tests draw the same cells.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{
    Block, Cell, Clear, HighlightSpacing, Paragraph, Row, Sparkline, Table, TableState, Widget,
    Wrap,
};

use super::super::output::{age, short_id};
use super::board::{seconds, Board, HandlerLine, LaneState, Snapshot};
use crate::store::{DeliveryDetail, HandlerBacklog};

/// Lanes on one row of the map.
const MAP_WIDTH: usize = 64;
/// The lane map's rows and its border.
pub(super) const LANES_HEIGHT: u16 = 256 / MAP_WIDTH as u16 + 2;

/// What the operator is looking at beside the board.
#[derive(Default)]
pub struct Screen {
    /// The store, as the header names it.
    pub source: String,
    pub interval: std::time::Duration,
    /// Index of the selected handler.
    pub selected: usize,
    /// The selected handler's dead letters and keys, while its panel is open, and the selected
    /// dead letter.
    pub detail: Option<(HandlerBacklog, usize)>,
    /// A delivery opened from the dead letters.
    pub delivery: Option<DeliveryDetail>,
    /// A question waiting for the operator's answer.
    pub dialog: Option<Dialog>,
    pub help: bool,
    /// The last failure to read the store or to act, until a read succeeds.
    pub error: Option<String>,
    /// What the last action did.
    pub said: Option<String>,
    /// No colour (`NO_COLOR`).
    pub plain: bool,
}

/// An action waiting for its confirmation.
pub enum Dialog {
    /// Pause the handler, for the reason typed so far.
    Pause {
        handler: String,
        reason: String,
    },
    Resume {
        handler: String,
    },
    Requeue {
        handler: String,
        dead: i64,
    },
}

impl Dialog {
    fn text(&self) -> (String, Vec<Line<'static>>) {
        match self {
            Dialog::Pause { handler, reason } => (
                format!(" Pause `{handler}` "),
                vec![
                    Line::from("Workers stop claiming its deliveries; those running finish."),
                    Line::from(format!("Reason: {reason}_")),
                    Line::from(""),
                    Line::from("Enter pauses · Esc cancels"),
                ],
            ),
            Dialog::Resume { handler } => (
                format!(" Resume `{handler}` "),
                vec![
                    Line::from("Workers claim its deliveries again within a second."),
                    Line::from(""),
                    Line::from("y resumes · any other key cancels"),
                ],
            ),
            Dialog::Requeue { handler, dead } => (
                format!(" Requeue `{handler}` "),
                vec![
                    Line::from(format!(
                        "Give its {dead} dead deliveries a fresh attempt budget, due now."
                    )),
                    Line::from(""),
                    Line::from("y requeues · any other key cancels"),
                ],
            ),
        }
    }
}

impl Screen {
    fn style(&self, s: Style) -> Style {
        if self.plain {
            Style::default().add_modifier(s.add_modifier)
        } else {
            s
        }
    }
}

/// Draws the board and what the screen shows over it into `area`.
pub fn render(board: &Board, screen: &Screen, area: Rect, buf: &mut Buffer) {
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(board, screen, header, buf);
    render_footer(screen, footer, buf);
    let Some(snapshot) = &board.snapshot else {
        Paragraph::new("reading the store…").render(body, buf);
        return;
    };
    // The handlers take what the rest leaves, as a process list does in `top`; with a handler's
    // panel open they keep a third.
    match &screen.detail {
        Some((backlog, selected)) => {
            let listed = (snapshot.handlers.len().max(1) as u16 + 3).min(body.height / 3);
            let [handlers, detail] =
                Layout::vertical([Constraint::Length(listed), Constraint::Fill(1)]).areas(body);
            render_handlers(snapshot, screen, handlers, buf);
            render_detail(snapshot, screen, backlog, *selected, detail, buf);
        }
        None => {
            let workers = (snapshot.workers.len().max(1) as u16 + 3).min(body.height / 3);
            let [handlers, workers, lanes] = Layout::vertical([
                Constraint::Fill(1),
                Constraint::Length(workers),
                Constraint::Length(LANES_HEIGHT),
            ])
            .areas(body);
            render_handlers(snapshot, screen, handlers, buf);
            render_workers(snapshot, workers, buf);
            render_lanes(board, snapshot, screen, lanes, buf);
        }
    }
    if let Some(d) = &screen.delivery {
        render_delivery(d, area, buf);
    }
    if let Some(d) = &screen.dialog {
        let (title, lines) = d.text();
        let popup = centered(area, 64, lines.len() as u16 + 2);
        Clear.render(popup, buf);
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(title))
            .render(popup, buf);
    }
    if screen.help {
        render_help(area, buf);
    }
}

fn render_header(board: &Board, screen: &Screen, area: Rect, buf: &mut Buffer) {
    let mut spans = vec![
        Span::styled(" relaybus top ", screen.style(Style::new().bold())),
        Span::raw(format!(" {}", screen.source)),
    ];
    if let Some(s) = &board.snapshot {
        spans.push(Span::raw(format!(
            "  {}  every {}",
            s.at.format("%H:%M:%S"),
            humantime::format_duration(screen.interval)
        )));
        if let Some(r) = s.deleted_per_second {
            spans.push(Span::raw(format!("  deleted {}/s", rate(r))));
        }
    }
    Paragraph::new(Line::from(spans)).render(area, buf);
}

fn render_footer(screen: &Screen, area: Rect, buf: &mut Buffer) {
    let line = if let Some(e) = &screen.error {
        Line::from(Span::styled(
            format!(" {e}"),
            screen.style(Style::new().fg(Color::Red).bold()),
        ))
    } else if let Some(s) = &screen.said {
        Line::from(format!(" {s}"))
    } else if screen.detail.is_some() {
        Line::from(" ↑↓ dead letter  Enter open  R requeue  p pause  r resume  Esc back  ? help")
    } else {
        Line::from(" ↑↓ handler  Enter details  p pause  r resume  R requeue  q quit  ? help")
    };
    Paragraph::new(line).render(area, buf);
}

/// A rate for a narrow cell: `0`, `12.5`, `1,234`, `12k`.
fn rate(r: f64) -> String {
    match r {
        r if r < 100.0 && r.fract() != 0.0 => format!("{r:.1}"),
        r if r < 10_000.0 => thousands(r.round() as i64),
        r => format!("{}k", thousands((r / 1000.0).round() as i64)),
    }
}

/// A count with thousands separated: `20,000`.
fn thousands(n: i64) -> String {
    indicatif::HumanCount(n.max(0) as u64).to_string()
}

/// A figure, right-aligned in its cell.
fn right(text: String) -> Cell<'static> {
    Cell::from(Line::from(text).right_aligned())
}

fn or_dash(r: Option<f64>) -> String {
    r.map(rate).unwrap_or_else(|| "-".into())
}

/// One handler's row; wide, a pause's reason is in its state.
fn handler_row<'a>(
    h: &'a HandlerLine,
    now: chrono::DateTime<chrono::Utc>,
    wide: bool,
    screen: &Screen,
) -> Row<'a> {
    let s = &h.stats;
    let state = match (h.state, h.breaker_open_until) {
        ("breaker-open", Some(until)) => {
            format!("open {}", age(seconds(until - now).max(0.0)))
        }
        ("paused", _) if wide => match &h.pause_reason {
            Some(r) => format!("paused: {r}"),
            None => "paused".into(),
        },
        ("probe-due", _) => "probe".into(),
        (state, _) => state.into(),
    };
    let style = match h.state {
        "running" => Style::new(),
        "paused" => Style::new().fg(Color::Yellow),
        _ => Style::new().fg(Color::Red),
    };
    Row::new([
        Cell::from(s.handler.clone()),
        Cell::from(state).style(screen.style(style)),
        right(thousands(s.due)),
        right(thousands(s.scheduled)),
        right(thousands(s.processing)),
        right(thousands(s.dead)),
        right(or_dash(h.per_second)),
        right(or_dash(h.per_second_last_minute)),
        right(s.lag_seconds.map(age).unwrap_or_else(|| "-".into())),
    ])
}

/// The handlers' frame: its title says when rates cannot be shown; narrow, the selected
/// handler's pause is under the table, having no column.
fn handlers_block(snapshot: &Snapshot, screen: &Screen, wide: bool) -> Block<'static> {
    let title = if snapshot.handlers.iter().any(|h| h.per_second.is_some())
        || snapshot.handlers.is_empty()
    {
        " Handlers "
    } else {
        " Handlers (rates need a completion history: run --completion-history) "
    };
    let mut block = Block::bordered().title(title);
    if let Some(h) = snapshot.handlers.get(screen.selected) {
        if !wide && h.state == "paused" {
            block = block.title_bottom(format!(
                " {} paused by {}{} ",
                h.stats.handler,
                h.paused_by.as_deref().unwrap_or("-"),
                h.pause_reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ));
        }
    }
    block
}

/// Each shown handler's newest rates, beside its row: the table scrolled by `offset` rows.
fn render_sparks(
    snapshot: &Snapshot,
    offset: usize,
    screen: &Screen,
    area: Rect,
    buf: &mut Buffer,
) {
    // Beside the rows the table shows, scrolled as it scrolled them; the newest rates.
    let shown = &snapshot.handlers[offset.min(snapshot.handlers.len())..];
    let block = Block::bordered().title(" completions per interval ");
    let inner = block.inner(area);
    block.render(area, buf);
    for (i, h) in shown.iter().enumerate() {
        let y = inner.y + 1 + i as u16;
        if y >= inner.bottom() {
            break;
        }
        let newest = &h.spark[h.spark.len().saturating_sub(inner.width as usize)..];
        Sparkline::default()
            .data(newest)
            .style(screen.style(Style::new().fg(Color::Green)))
            .render(Rect::new(inner.x, y, inner.width, 1), buf);
    }
}

fn render_handlers(snapshot: &Snapshot, screen: &Screen, area: Rect, buf: &mut Buffer) {
    let wide = area.width >= 120;
    let now = snapshot.at;
    let rows: Vec<Row> = snapshot
        .handlers
        .iter()
        .map(|h| handler_row(h, now, wide, screen))
        .collect();
    let longest = snapshot
        .handlers
        .iter()
        .map(|h| h.stats.handler.chars().count());
    let name = if wide {
        Constraint::Length(longest.max().unwrap_or(0).clamp(12, 40) as u16)
    } else {
        Constraint::Min(12)
    };
    let widths = [
        name,
        Constraint::Length(if wide { 32 } else { 10 }),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(7),
    ];
    // Wide, the table takes what its columns need and the rates' sparklines the rest.
    let [table_area, spark_area] = if wide {
        let columns: u16 = widths
            .iter()
            .map(|w| match w {
                Constraint::Length(n) => *n + 1,
                _ => 0,
            })
            .sum();
        Layout::horizontal([Constraint::Length(columns + 3), Constraint::Fill(1)]).areas(area)
    } else {
        [area, Rect::default()]
    };
    let header = Row::new(
        [Cell::from("HANDLER"), Cell::from("STATE")]
            .into_iter()
            .chain(["DUE", "SCHED", "RUN", "DEAD", "/S", "/S 1M", "LAG"].map(|h| right(h.into()))),
    )
    .style(Style::new().bold());
    let block = handlers_block(snapshot, screen, wide);
    let mut state = TableState::new().with_selected(Some(screen.selected));
    ratatui::widgets::StatefulWidget::render(
        Table::new(rows, widths)
            .header(header)
            .column_spacing(1)
            .block(block)
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .highlight_symbol(">")
            .highlight_spacing(HighlightSpacing::Always),
        table_area,
        buf,
        &mut state,
    );
    if !spark_area.is_empty() {
        render_sparks(snapshot, state.offset(), screen, spark_area, buf);
    }
}

fn render_workers(snapshot: &Snapshot, area: Rect, buf: &mut Buffer) {
    let now = snapshot.at;
    let rows: Vec<Row> = snapshot
        .workers
        .iter()
        .map(|w| {
            let lease = match w.worker.lease_expires_at {
                Some(t) if t > now => format!("{} left", age(seconds(t - now))),
                Some(t) => format!("ended {} ago", age(seconds(now - t))),
                None => "-".into(),
            };
            Row::new([
                w.worker.owner.clone(),
                w.worker.lanes.to_string(),
                w.worker.in_flight.to_string(),
                lease,
                w.renewed_seconds_ago
                    .map(|s| format!("{} ago", age(s)))
                    .unwrap_or_else(|| "-".into()),
            ])
        })
        .collect();
    let widths = [
        Constraint::Fill(1),
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(16),
        Constraint::Length(11),
    ];
    let title = format!(" Workers: {} ", snapshot.workers.len());
    Table::new(rows, widths)
        .header(Row::new(["WORKER", "LANES", "RUN", "LEASE", "RENEWED"]).style(Style::new().bold()))
        .column_spacing(1)
        .block(Block::bordered().title(title))
        .render(area, buf);
}

fn render_lanes(board: &Board, snapshot: &Snapshot, screen: &Screen, area: Rect, buf: &mut Buffer) {
    let [map_area, hot_area] = Layout::horizontal([
        Constraint::Length(MAP_WIDTH as u16 + 2),
        Constraint::Fill(1),
    ])
    .areas(area);
    let lines: Vec<Line> = board
        .lanes()
        .chunks(MAP_WIDTH)
        .map(|chunk| {
            Line::from(
                chunk
                    .iter()
                    .map(|l| {
                        let state = LaneState::of(l);
                        let colour = match state {
                            LaneState::Free => Color::DarkGray,
                            LaneState::Held => Color::Green,
                            LaneState::Busy => Color::Yellow,
                            LaneState::Waiting => Color::Magenta,
                            LaneState::Expired => Color::Red,
                        };
                        Span::styled(
                            state.glyph().to_string(),
                            screen.style(Style::new().fg(colour)),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let s = &snapshot.lanes;
    let title = format!(
        " Lanes: {} held, {} busy, {} waiting, {} expired ",
        s.held, s.busy, s.waiting, s.expired
    );
    Paragraph::new(lines)
        .block(Block::bordered().title(title))
        .render(map_area, buf);
    let wide = hot_area.width >= 40;
    let owners = snapshot
        .hot_lanes
        .iter()
        .map(|h| h.owner.as_deref().map_or(1, |o| o.chars().count()))
        .max()
        .unwrap_or(0);
    let hot: Vec<Line> = snapshot
        .hot_lanes
        .iter()
        .map(|h| {
            let mut line = format!("{:>3} {:>7}", h.lane, thousands(h.pending));
            if wide {
                let lag = h.oldest_due.filter(|&t| t <= snapshot.at);
                line += &format!(
                    "  {:<owners$}  {}",
                    h.owner.as_deref().unwrap_or("-"),
                    lag.map_or_else(|| "-".into(), |t| age(seconds(snapshot.at - t)))
                );
            }
            Line::from(line)
        })
        .collect();
    let title = if wide {
        " Hot lanes: lane, pending, owner, lag "
    } else {
        " Hot lanes "
    };
    Paragraph::new(hot)
        .block(Block::bordered().title(title))
        .render(hot_area, buf);
}

fn render_detail(
    snapshot: &Snapshot,
    screen: &Screen,
    backlog: &HandlerBacklog,
    selected: usize,
    area: Rect,
    buf: &mut Buffer,
) {
    let handler = snapshot
        .handlers
        .get(screen.selected)
        .map(|h| h.stats.handler.as_str())
        .unwrap_or("-");
    let [dead_area, keys_area] =
        Layout::horizontal([Constraint::Fill(2), Constraint::Fill(1)]).areas(area);
    let now = snapshot.at;
    let rows: Vec<Row> = backlog
        .dead
        .iter()
        .map(|d| {
            Row::new([
                short_id(d.id.as_deref().unwrap_or("-"), false),
                d.updated_at
                    .map(|t| age(seconds(now - t)))
                    .unwrap_or_else(|| "-".into()),
                d.last_error.clone().unwrap_or_else(|| "-".into()),
            ])
        })
        .collect();
    let mut state = TableState::new().with_selected(Some(selected));
    ratatui::widgets::StatefulWidget::render(
        Table::new(
            rows,
            [
                Constraint::Length(13),
                Constraint::Length(8),
                Constraint::Fill(1),
            ],
        )
        .header(Row::new(["DELIVERY", "DIED", "LAST ERROR"]).style(Style::new().bold()))
        .column_spacing(1)
        .block(Block::bordered().title(format!(" Dead letters of `{handler}`, newest first ")))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">")
        .highlight_spacing(HighlightSpacing::Always),
        dead_area,
        buf,
        &mut state,
    );
    let rows: Vec<Row> = backlog
        .keys
        .iter()
        .map(|k| {
            Row::new([
                k.key.clone(),
                thousands(k.pending),
                k.oldest_due
                    .filter(|&t| t <= now)
                    .map(|t| age(seconds(now - t)))
                    .unwrap_or_else(|| "-".into()),
            ])
        })
        .collect();
    Table::new(
        rows,
        [
            Constraint::Fill(1),
            Constraint::Length(7),
            Constraint::Length(7),
        ],
    )
    .header(Row::new(["KEY", "PENDING", "LAG"]).style(Style::new().bold()))
    .column_spacing(1)
    .block(Block::bordered().title(" Longest keys "))
    .render(keys_area, buf);
}

fn render_delivery(d: &DeliveryDetail, area: Rect, buf: &mut Buffer) {
    let lines: Vec<Line> = super::super::deliveries::detail_lines(d)
        .into_iter()
        .map(|(k, v)| Line::from(format!("{k:<12} {v}")))
        .collect();
    let popup = centered(area, area.width.saturating_sub(4), lines.len() as u16 + 4);
    Clear.render(popup, buf);
    Paragraph::new(Text::from(lines))
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(" Delivery (Esc closes) "))
        .render(popup, buf);
}

fn render_help(area: Rect, buf: &mut Buffer) {
    let lines = [
        "↑ ↓ / k j   select a handler (or a dead letter in its panel)",
        "Enter       open the handler's dead letters and longest keys,",
        "            or the selected dead letter",
        "p           pause the handler (asks for a reason)",
        "r           resume it",
        "R           requeue its dead letters",
        "Esc         close a panel or a question",
        "q, Ctrl-C   quit",
        "",
        "Rates count completions (run --completion-history); `deleted`",
        "in the header is every deletion the store's counters saw.",
        "Lanes: . free  o held  # held with a backlog",
        "       + backlog without a worker  x lease ended",
    ];
    let popup = centered(area, 70, lines.len() as u16 + 2);
    Clear.render(popup, buf);
    Paragraph::new(lines.into_iter().map(Line::from).collect::<Vec<_>>())
        .block(Block::bordered().title(" Keys (any key closes) "))
        .render(popup, buf);
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    )
}

/// The cells of a buffer as lines of text, trailing blanks cut.
pub fn lines(buf: &Buffer) -> Vec<String> {
    let area = buf.area;
    (area.top()..area.bottom())
        .map(|y| {
            let line: String = (area.left()..area.right())
                .map(|x| buf[(x, y)].symbol())
                .collect();
            line.trim_end().to_owned()
        })
        .collect()
}
