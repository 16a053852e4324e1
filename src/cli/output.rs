//! Where results go: stdout gets the result (a table, or JSON with `--json`), stderr gets
//! progress, prompts and errors. Nothing decorative is printed when stdout is not a terminal.

use std::io::{self, IsTerminal, Write};

use anyhow::Result;
use serde::Serialize;

pub struct Output {
    pub json: bool,
}

impl Output {
    pub fn new(json: bool) -> Self {
        Self { json }
    }

    /// Writes one line of result to stdout.
    pub fn line(&self, text: impl AsRef<str>) -> Result<()> {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "{}", text.as_ref())?;
        Ok(())
    }

    /// Writes a paragraph of result. On a terminal it is wrapped between words to the
    /// terminal's width, continuation lines indented by `indent`; elsewhere it stays one line,
    /// for scripts that read lines.
    pub fn paragraph(&self, text: impl AsRef<str>, indent: usize) -> Result<()> {
        if !self.terminal() {
            return self.line(text);
        }
        let indent = " ".repeat(indent);
        let options = textwrap::Options::with_termwidth()
            .subsequent_indent(&indent)
            .wrap_algorithm(textwrap::WrapAlgorithm::FirstFit);
        self.line(textwrap::fill(text.as_ref(), options))
    }

    pub fn print_json(&self, value: &impl Serialize) -> Result<()> {
        // Rendered first, so a closed pipe shows as the I/O error it is.
        let text = serde_json::to_string_pretty(value)?;
        self.line(text)
    }

    /// A progress bar on stderr for a person watching: hidden when stderr is not a terminal.
    /// With a total it shows the bar, the count and the time left; without one a spinner, the
    /// count and the rate. It ticks on its own, so the elapsed time moves while a long step runs.
    pub fn progress(&self, total: Option<u64>, unit: &str) -> indicatif::ProgressBar {
        if !io::stderr().is_terminal() {
            return indicatif::ProgressBar::hidden();
        }
        // Bytes read get byte units (`1.2 MiB/8.0 MiB`); anything else is counted.
        let (pos, len, rate, unit) = match unit {
            "bytes" => ("{bytes}", "{total_bytes}", "{bytes_per_sec}", String::new()),
            _ => (
                "{human_pos}",
                "{human_len}",
                "{per_sec}",
                format!(" {unit}"),
            ),
        };
        let (bar, template) = match total {
            Some(n) => (
                indicatif::ProgressBar::new(n),
                format!("{{msg}} {{wide_bar}} {pos}/{len}{unit} {{elapsed}}, {{eta}} left"),
            ),
            None => (
                indicatif::ProgressBar::new_spinner(),
                format!("{{spinner}} {{msg}} {pos}{unit} ({rate}) {{elapsed}}"),
            ),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(&template).expect("a valid progress template"),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        bar
    }

    /// A table with aligned columns and no borders, a row per line. On a terminal it fits the
    /// terminal's width by wrapping the cells of the `wrapping` columns
    /// (long text a reader must see whole: errors, keys, advice) over several lines; the other
    /// columns (ids, names, states, times, counts) stay whole on one line. Nothing is cut.
    pub fn table_wrapping(
        &self,
        wrapping: &[usize],
        headers: &[&str],
        rows: &[Vec<String>],
    ) -> Result<()> {
        self.print_table(headers, rows, Fit(wrapping))
    }

    fn print_table(&self, headers: &[&str], rows: &[Vec<String>], fit: Fit) -> Result<()> {
        let width = self
            .terminal()
            .then(|| comfy_table::Table::new().width())
            .flatten();
        for line in table_lines(headers, rows, width.map(usize::from), fit) {
            self.line(line)?;
        }
        Ok(())
    }

    /// Whether stdout is a terminal a person reads (ids are shortened there).
    pub fn terminal(&self) -> bool {
        io::stdout().is_terminal()
    }
}

/// Asks before destructive work: `--yes` answers for scripts; on a terminal the user is asked
/// (no by default); anywhere else the command refuses, as a usage error, rather than guess.
pub(super) fn confirm(question: &str, yes: bool) -> Result<bool> {
    if yes {
        return Ok(true);
    }
    if !can_ask() {
        super::usage!("{question} Not confirmed: standard input is not a terminal; rerun with --yes to proceed");
    }
    Ok(dialoguer::Confirm::new()
        .with_prompt(question)
        .default(false)
        .interact()?)
}

/// Whether a person can be asked: standard input and standard error are a terminal.
pub(super) fn can_ask() -> bool {
    io::stdin().is_terminal() && io::stderr().is_terminal()
}

/// What a command that was not confirmed says before it exits 0.
pub(super) fn declined() -> Result<std::process::ExitCode> {
    eprintln!("not confirmed; nothing was changed");
    Ok(std::process::ExitCode::SUCCESS)
}

/// A timestamp for tables: UTC to the second.
pub(super) fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

/// How wide a wrapping column other than the last may be (padding included).
const WRAP_AT: u16 = 26;

/// How a table is made to fit a terminal: the cells of these columns wrap onto more lines; the
/// others stay whole.
#[derive(Clone, Copy)]
struct Fit<'a>(&'a [usize]);

/// A table's lines, made to fit `width` when one is given.
fn table_lines(
    headers: &[&str],
    rows: &[Vec<String>],
    width: Option<usize>,
    fit: Fit,
) -> Vec<String> {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    if let Some(width) = width {
        table
            .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
            .set_width(u16::try_from(width).unwrap_or(u16::MAX));
    }
    table.set_header(headers.iter().copied());
    for row in rows {
        table.add_row(row.iter().map(String::as_str));
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, 2));
        let last = fit.0.last() == Some(&i);
        if !fit.0.contains(&i) {
            column.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
        } else if !last {
            // The last wrapping column (an error, a finding) takes the room the others leave.
            column.set_constraint(comfy_table::ColumnConstraint::UpperBoundary(
                comfy_table::Width::Fixed(WRAP_AT),
            ));
        }
    }
    table.lines().map(|l| l.trim_end().to_owned()).collect()
}

/// An id as a table shows it: whole, or on a terminal its last 12 characters (the random part of
/// relaybus's time-ordered ids) after an ellipsis.
pub(super) fn short_id(id: &str, whole: bool) -> String {
    let chars: Vec<char> = id.chars().collect();
    if whole || chars.len() <= 13 {
        id.to_owned()
    } else {
        format!("…{}", chars[chars.len() - 12..].iter().collect::<String>())
    }
}

/// A moment relative to now, for a terminal: `5m 2s ago`, `in 2h 0m`.
pub(super) fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    let seconds = (chrono::Utc::now() - t).num_milliseconds() as f64 / 1000.0;
    if seconds >= 0.0 {
        format!("{} ago", age(seconds))
    } else {
        format!("in {}", age(-seconds))
    }
}

/// A duration for people: `334d 6h`, `2h 5m`, `4m 12s`, `3.2s`.
pub(super) fn age(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    let whole = s as u64;
    let (d, h, m, sec) = (
        whole / 86_400,
        whole / 3_600 % 24,
        whole / 60 % 60,
        whole % 60,
    );
    match (d, h) {
        (0, 0) => format!("{m}m {sec}s"),
        (0, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// A text for a table cell: its words on one line, whole (the table wraps it).
pub(super) fn cell(text: Option<&str>) -> String {
    match text {
        Some(text) => text.split_whitespace().collect::<Vec<_>>().join(" "),
        None => "-".into(),
    }
}
