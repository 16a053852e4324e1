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

    pub fn print_json(&self, value: &impl Serialize) -> Result<()> {
        // Rendered first, so a closed pipe shows as the I/O error it is.
        let text = serde_json::to_string_pretty(value)?;
        self.line(text)
    }

    /// Progress for a person watching: only when stderr is a terminal.
    pub fn progress(&self, text: impl AsRef<str>) {
        if io::stderr().is_terminal() {
            eprintln!("{}", text.as_ref());
        }
    }

    /// A plain-text table with aligned columns.
    pub fn table(&self, headers: &[&str], rows: &[Vec<String>]) -> Result<()> {
        let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
        for row in rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let render = |cells: Vec<&str>| {
            let mut line = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  "));
                }
            }
            line.trim_end().to_owned()
        };
        self.line(render(headers.to_vec()))?;
        for row in rows {
            self.line(render(row.iter().map(String::as_str).collect()))?;
        }
        Ok(())
    }
}

/// Asks before destructive work: `--yes` answers for scripts; on a terminal the user is asked
/// (no by default); anywhere else the command refuses, as a usage error, rather than guess.
pub(super) fn confirm(question: &str, yes: bool) -> Result<bool> {
    if yes {
        return Ok(true);
    }
    if !(io::stdin().is_terminal() && io::stderr().is_terminal()) {
        super::usage!("{question} Not confirmed: standard input is not a terminal; rerun with --yes to proceed");
    }
    Ok(dialoguer::Confirm::new()
        .with_prompt(question)
        .default(false)
        .interact()?)
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

/// A text cut to `max` characters for a table cell, on one line.
pub(super) fn cell(text: Option<&str>, max: usize) -> String {
    let Some(text) = text else {
        return "-".into();
    };
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        line
    } else {
        line.chars().take(max.saturating_sub(1)).collect::<String>() + "…"
    }
}
