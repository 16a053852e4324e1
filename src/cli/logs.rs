//! The worker's log: `tracing` events as text or JSON lines on stderr, filtered by `-v` or
//! RELAYBUS_LOG, and on a terminal written above the live status line.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("unknown log format `{s}` (text or json)")),
        }
    }
}

/// Writes each log line whole, with the status line taken away while it does.
#[derive(Clone)]
struct Lines(Option<ProgressBar>);

struct Line {
    bar: Option<ProgressBar>,
    text: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let write = || {
            let _ = std::io::stderr().lock().write_all(&self.text);
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            bar: self.0.clone(),
            text: Vec::new(),
        }
    }
}

/// Starts the log: RELAYBUS_LOG (`warn`, `relaybus=debug`, ...) when set, else relaybus's
/// events from info on (debug with -v, everything's debug with -vv). Returns the status line
/// to draw, when stderr is a terminal and the log is text.
pub(super) fn start(format: LogFormat, verbose: u8) -> Result<Option<ProgressBar>> {
    let filter = match std::env::var("RELAYBUS_LOG") {
        Ok(spec) => EnvFilter::try_new(&spec)
            .map_err(|e| super::UsageError(format!("invalid RELAYBUS_LOG `{spec}`: {e}")))?,
        Err(_) => EnvFilter::new(match verbose {
            0 => "warn,relaybus=info",
            1 => "warn,relaybus=debug",
            _ => "debug",
        }),
    };
    let terminal = std::io::stderr().is_terminal();
    let status = (terminal && format == LogFormat::Text).then(|| {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {wide_msg}").expect("a valid template"),
        );
        bar
    });
    let writer = Lines(status.clone());
    let installed = match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_target(false)
            .with_ansi(terminal)
            .with_writer(writer)
            .try_init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_target(false)
            .with_env_filter(filter)
            .with_writer(writer)
            .try_init(),
    };
    installed
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("could not start the log")?;
    Ok(status)
}
