//! What the operator sees while a worker runs: counters, a live status line on a terminal, and
//! otherwise one structured log line per event of note (text or JSON). Nothing here ever prints
//! a password or a webhook secret: callers pass only ids, names and error texts.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{Map, Value};

use super::metrics::{Ended, Metrics};

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

#[derive(Default, Debug)]
pub struct Counters {
    pub handled: AtomicU64,
    pub failed: AtomicU64,
    pub dead: AtomicU64,
    pub lease_lost: AtomicU64,
    pub released: AtomicU64,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub handled: u64,
    pub failed: u64,
    pub dead: u64,
    pub lease_lost: u64,
    pub released: u64,
}

impl Counters {
    pub fn summary(&self) -> Summary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            handled: get(&self.handled),
            failed: get(&self.failed),
            dead: get(&self.dead),
            lease_lost: get(&self.lease_lost),
            released: get(&self.released),
        }
    }
}

pub struct Reporter {
    pub metrics: Metrics,
    format: LogFormat,
    /// A live status line is drawn only when stderr is a terminal.
    live: bool,
    status_drawn: Mutex<bool>,
    pub counters: Counters,
    started: Instant,
    quiet: bool,
}

impl Reporter {
    pub fn new(format: LogFormat) -> Self {
        Self {
            metrics: Metrics::new(false),
            format,
            live: std::io::stderr().is_terminal(),
            status_drawn: Mutex::new(false),
            counters: Counters::default(),
            started: Instant::now(),
            quiet: false,
        }
    }

    /// A reporter that also records the metrics `run --metrics-addr` serves.
    pub fn with_metrics(self) -> Self {
        Self {
            metrics: Metrics::new(true),
            ..self
        }
    }

    /// A reporter that logs nothing, for benchmark workers (their output is the report).
    pub fn quiet(format: LogFormat) -> Self {
        Self {
            quiet: true,
            ..Self::new(format)
        }
    }

    /// Counts how a delivery's attempt ended, in the summary and per handler.
    pub fn ended(&self, how: Ended, handler: &str) {
        let counter = match how {
            Ended::Handled => &self.counters.handled,
            Ended::Failed => &self.counters.failed,
            Ended::Buried => &self.counters.dead,
            Ended::LeaseLost => &self.counters.lease_lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.metrics.ended(how, handler);
    }

    /// One log line: `ts level msg k=v ...`, or a JSON object with `--log-format json`.
    pub fn log(&self, level: &str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
        if self.quiet {
            return;
        }
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let line = match self.format {
            LogFormat::Json => {
                let mut obj = Map::new();
                obj.insert("ts".into(), Value::String(ts));
                obj.insert("level".into(), Value::String(level.into()));
                obj.insert("msg".into(), Value::String(msg.into()));
                for (k, v) in fields {
                    obj.insert((*k).into(), Value::String(v.to_string()));
                }
                Value::Object(obj).to_string()
            }
            LogFormat::Text => {
                let mut line = format!("{ts} {level:<5} {msg}");
                for (k, v) in fields {
                    let v = v.to_string();
                    if v.contains(char::is_whitespace) || v.contains('"') || v.is_empty() {
                        line.push_str(&format!(" {k}={v:?}"));
                    } else {
                        line.push_str(&format!(" {k}={v}"));
                    }
                }
                line
            }
        };
        let mut drawn = self.status_drawn.lock().expect("reporter lock");
        let mut err = std::io::stderr().lock();
        if *drawn {
            let _ = write!(err, "\r\x1b[2K");
            *drawn = false;
        }
        let _ = writeln!(err, "{line}");
    }

    /// Redraws the status line (terminal only).
    pub fn status(&self, in_flight: usize) {
        if !self.live || self.quiet {
            return;
        }
        let s = self.counters.summary();
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let line = format!(
            "handled {}  failed {}  dead {}  in flight {}  rate {:.0}/s",
            s.handled,
            s.failed,
            s.dead,
            in_flight,
            s.handled as f64 / secs
        );
        let mut drawn = self.status_drawn.lock().expect("reporter lock");
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        *drawn = true;
    }
}
